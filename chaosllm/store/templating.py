"""Workspace templating and id remapping: replaying a recording in a new workspace. Pure.

Why (seeds/completion-test-api.md): an agent's recorded tool calls carry the
absolute path of the workspace it was recorded in, and ids minted during that
run (tool-call ids, a session id a tool returned) that later requests echo
back. Replayed somewhere else, both differ.

Workspace templating
    Recordings say ``<WORKSPACE>`` where the record-time workspace was. The test
    tells chaosllm the live one (``POST /__workspace {"path": ...}``). Incoming
    requests are keyed with the live path turned back into ``<WORKSPACE>``
    (`tokenize_workspace`), so they match their recordings exactly, and answers
    are served with ``<WORKSPACE>`` replaced by the live path
    (`substitute_workspace`; JSON-escaped inside tool-call arguments and other
    JSON text, so a Windows path stays valid JSON).

Id remapping
    When a recording is served for a request that is not identical to it (nearest
    or sequence matching), the recording's own request is aligned with the incoming
    conversation, message by message: differing tool-call ids and tool_call_ids
    pair directly, and two texts that are the same once their id-shaped tokens
    (UUIDs, ``prefix_123``/``prefix-abc1`` ids, long letter-and-digit tokens) are
    masked pair those tokens in order (`learn_id_map`). The answer is served with
    every recorded id replaced by the live one (`remap_ids`), so a multi-step flow
    refers to the ids of this run.

`adapt` does both to an exchange: body, and recorded stream frames when they
can be rewritten frame by frame (a token split across two frames cannot: the
frames are then dropped, and the provider renders the stream from the body).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from chaosllm.errors import InvalidRequest
from chaosllm.model import JSON, Exchange, RecordedChunk

__all__ = [
    "WORKSPACE_TOKEN",
    "adapt",
    "learn_id_map",
    "remap_ids",
    "resolve_trace_answer",
    "resolve_trace_arguments",
    "substitute_workspace",
    "tokenize_workspace",
    "trace_tool_results",
]

WORKSPACE_TOKEN = "<WORKSPACE>"

_ID = re.compile(
    r"""
    (?<![\w-])(?:
        [0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}
      | [A-Za-z][A-Za-z0-9]*[_-](?=[A-Za-z0-9_-]*[0-9])[A-Za-z0-9][A-Za-z0-9_-]*
      | (?=[A-Za-z]*[0-9])(?=[0-9]*[A-Za-z])[A-Za-z0-9]{12,}
    )(?![\w-])""",
    re.VERBOSE,
)
"""Tokens shaped like ids minted at run time."""

_MASK = "\x00"


def _escaped(text: str) -> str:
    """`text` as it appears inside a JSON string."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _walk(value: JSON, fix: Callable[[str, str | None], str], key: str | None = None) -> JSON:
    """`value` with every string value passed through ``fix(string, its key)``; the same
    object when nothing changed."""
    if isinstance(value, str):
        return fix(value, key)
    if isinstance(value, dict):
        changed = False
        out: dict[str, Any] = {}
        for k, v in value.items():
            new = _walk(v, fix, k)
            changed = changed or new is not v
            out[k] = new
        return out if changed else value
    if isinstance(value, list):
        items = [_walk(v, fix, key) for v in value]
        return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
    return value


def tokenize_workspace(body: JSON, workspace: str | None) -> JSON:
    """`body` with the live `workspace` path (raw, or JSON-escaped inside JSON text)
    replaced by ``<WORKSPACE>`` in every string; `body` itself when it has none."""
    if not workspace:
        return body
    root = workspace.rstrip("/\\") or workspace
    variants = sorted({root, _escaped(root)}, key=len, reverse=True)
    pattern = re.compile(
        r"(?<![\w.-])(?:" + "|".join(re.escape(v) for v in variants) + r")(?![\w.-])"
    )

    def fix(text: str, key: str | None) -> str:
        if not any(v in text for v in variants):
            return text
        new = pattern.sub(WORKSPACE_TOKEN, text)
        return new if new != text else text

    return _walk(body, fix)


def _is_json_text(text: str, key: str | None) -> bool:
    if key == "arguments":
        return True
    stripped = text.lstrip()
    if not stripped.startswith(("{", "[")):
        return False
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def substitute_workspace(value: JSON, workspace: str | None) -> JSON:
    """`value` with ``<WORKSPACE>`` replaced by the live path (JSON-escaped in tool-call
    arguments and other JSON text); `value` itself when it has no token."""
    if not workspace:
        return value
    root = workspace.rstrip("/\\") or workspace
    escaped = _escaped(root)

    def fix(text: str, key: str | None) -> str:
        if WORKSPACE_TOKEN not in text:
            return text
        return text.replace(WORKSPACE_TOKEN, escaped if _is_json_text(text, key) else root)

    return _walk(value, fix)


def _texts(content: JSON) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        ]
    return []


class _IdMap:
    def __init__(self) -> None:
        self.mapping: dict[str, str] = {}

    def pair(self, recorded: Any, live: Any) -> None:
        if (
            isinstance(recorded, str)
            and isinstance(live, str)
            and recorded != live
            and recorded
            and live
        ):
            self.mapping.setdefault(recorded, live)

    def pair_text(self, recorded: str, live: str) -> None:
        if recorded == live:
            return
        old, new = _ID.findall(recorded), _ID.findall(live)
        if not old or len(old) != len(new):
            return
        if _ID.sub(_MASK, recorded) != _ID.sub(_MASK, live):
            return
        for a, b in zip(old, new, strict=True):
            self.pair(a, b)


def learn_id_map(recorded: JSON, live: JSON) -> dict[str, str]:
    """``{recorded id: live id}`` from aligning a recording's request with the incoming
    one (both canonical request bodies), message by message from the start."""
    ids = _IdMap()
    old = recorded.get("messages") if isinstance(recorded, dict) else None
    new = live.get("messages") if isinstance(live, dict) else None
    if not isinstance(old, list) or not isinstance(new, list):
        return {}
    for a, b in zip(old, new, strict=False):
        if not isinstance(a, dict) or not isinstance(b, dict) or a.get("role") != b.get("role"):
            continue
        ids.pair(a.get("tool_call_id"), b.get("tool_call_id"))
        calls_a, calls_b = a.get("tool_calls"), b.get("tool_calls")
        if isinstance(calls_a, list) and isinstance(calls_b, list) and len(calls_a) == len(calls_b):
            for x, y in zip(calls_a, calls_b, strict=True):
                if not isinstance(x, dict) or not isinstance(y, dict):
                    continue
                ids.pair(x.get("id"), y.get("id"))
                fx, fy = x.get("function"), y.get("function")
                if (
                    isinstance(fx, dict)
                    and isinstance(fy, dict)
                    and isinstance(fx.get("arguments"), str)
                    and isinstance(fy.get("arguments"), str)
                ):
                    ids.pair_text(fx["arguments"], fy["arguments"])
        texts_a, texts_b = _texts(a.get("content")), _texts(b.get("content"))
        if len(texts_a) == len(texts_b):
            for x, y in zip(texts_a, texts_b, strict=True):
                ids.pair_text(x, y)
    return ids.mapping


def remap_ids(value: JSON, mapping: Mapping[str, str]) -> JSON:
    """`value` with every whole-token occurrence of a recorded id replaced by its live id;
    `value` itself when none occurs."""
    if not mapping:
        return value
    keys = sorted(mapping, key=len, reverse=True)
    pattern = re.compile(r"(?<![\w-])(?:" + "|".join(re.escape(k) for k in keys) + r")(?![\w-])")

    def fix(text: str, key: str | None) -> str:
        new = pattern.sub(lambda m: mapping[m.group(0)], text)
        return text if new == text else new

    return _walk(value, fix)


def _rewrite_frame(frame: str, rewrite: Callable[[JSON], JSON]) -> str:
    lines = frame.split("\n")
    changed = False
    for i, line in enumerate(lines):
        if not line.startswith("data:"):
            continue
        payload = line[5:].removeprefix(" ")
        try:
            data = json.loads(payload)
        except ValueError:
            continue
        new = rewrite(data)
        if new is not data:
            lines[i] = "data: " + json.dumps(new, separators=(",", ":"), ensure_ascii=False)
            changed = True
    return "\n".join(lines) if changed else frame


def adapt(
    exchange: Exchange,
    live: JSON,
    *,
    workspace: str | None,
    remap: bool,
    assemble: Callable[[Sequence[str]], JSON],
) -> tuple[Exchange, dict[str, str]]:
    """`exchange` as it must be served for the live request `live` (its keyed body): the
    workspace substituted, and, with `remap`, the ids learnt from aligning its recorded
    request with `live` remapped. Returns the exchange (itself when nothing changes)
    and the id map."""
    mapping = learn_id_map(exchange.request.body, live) if remap else {}
    if not workspace and not mapping:
        return exchange, mapping

    def rewrite(value: JSON) -> JSON:
        return remap_ids(substitute_workspace(value, workspace), mapping)

    response = exchange.response
    body = rewrite(response.body)
    chunks = response.chunks
    if chunks is not None:
        frames = [_rewrite_frame(c.data, rewrite) for c in chunks]
        pairs = list(zip(frames, chunks, strict=True))
        if body is not response.body or any(f is not c.data for f, c in pairs):
            try:
                faithful = assemble(frames) == rewrite(assemble([c.data for c in chunks]))
            except (ValueError, TypeError, AttributeError):
                faithful = False
            chunks = tuple(RecordedChunk(f, c.delay_ms) for f, c in pairs) if faithful else None
    if body is response.body and chunks is response.chunks:
        return exchange, mapping
    return replace(exchange, response=replace(response, body=body, chunks=chunks)), mapping


# -- trace arguments (IronClaw's TraceLlm) -----------------------------------------------

_TOOL_OUTPUT = re.compile(r"\A\s*<tool_output\b[^>]*>\n?(.*?)\n?</tool_output>\s*\Z", re.DOTALL)
_USER_TOOL_RESULT = re.compile(
    r"\A\[Tool (?:`([^`]*)`|(\S+))\s*returned:\s*(.*?)\]?\s*\Z", re.DOTALL
)


def _tool_output(content: str) -> str:
    """A tool message's content without the safety layer's ``<tool_output>`` wrapper."""
    wrapped = _TOOL_OUTPUT.match(content)
    return wrapped.group(1) if wrapped else content


def _parse_result(text: str) -> JSON:
    """A tool result as JSON: the text parsed, or read as a Python ``repr`` (an
    orchestrator's ``str(dict)``); None when it is neither."""
    try:
        value: JSON = json.loads(text)
    except ValueError:
        pass
    else:
        return value
    try:
        literal = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    try:
        return json.loads(json.dumps(literal))  # only JSON-shaped values survive
    except (TypeError, ValueError):
        return None


def _message_text(content: JSON) -> str:
    return "".join(_texts(content))


def trace_tool_results(messages: JSON) -> tuple[dict[str, list[JSON]], dict[str, str]]:
    """What a request's conversation says its tools returned: the parsed result of each
    ``tool`` message by ``tool_call_id`` (for ``$trace_result`` bindings), and the
    template variables (``{{call_id.field}}``, and ``{{tool:NAME.field}}`` from a
    ``[Tool `NAME` returned: {...}]`` user message) of their top-level scalar fields."""
    observed: dict[str, list[JSON]] = {}
    variables: dict[str, str] = {}
    if not isinstance(messages, list):
        return observed, variables
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        text = _message_text(message.get("content"))
        if role == "tool" and isinstance(message.get("tool_call_id"), str):
            key: str = message["tool_call_id"]
            result = _parse_result(_tool_output(text))
            if result is not None:
                observed.setdefault(key, []).append(result)
        elif role == "user" and (said := _USER_TOOL_RESULT.match(text)) is not None:
            key = "tool:" + (said.group(1) if said.group(1) is not None else said.group(2))
            result = _parse_result(said.group(3).strip())
        else:
            continue
        if isinstance(result, dict):
            for field_name, value in result.items():
                if isinstance(value, bool):
                    variables[f"{key}.{field_name}"] = "true" if value else "false"
                elif isinstance(value, str):
                    variables[f"{key}.{field_name}"] = value
                elif isinstance(value, int | float):
                    variables[f"{key}.{field_name}"] = json.dumps(value)
    return observed, variables


def _pointer(document: JSON, pointer: str) -> tuple[bool, JSON]:
    """RFC 6901: (found, the value at `pointer` in `document`)."""
    if pointer == "":
        return True, document
    if not pointer.startswith("/"):
        return False, None
    value = document
    for raw in pointer[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict) and token in value:
            value = value[token]
        elif (
            isinstance(value, list)
            and token.isdigit()
            and (token == "0" or not token.startswith("0"))
            and int(token) < len(value)
        ):
            value = value[int(token)]
        else:
            return False, None
    return True, value


def _bind(value: JSON, observed: Mapping[str, list[JSON]]) -> JSON:
    if isinstance(value, list):
        return [_bind(v, observed) for v in value]
    if not isinstance(value, dict):
        return value
    if "$trace_result" not in value:
        return {k: _bind(v, observed) for k, v in value.items()}
    if len(value) != 1:
        raise InvalidRequest(
            "invalid $trace_result: the marker object must contain only $trace_result",
            code="trace_binding",
        )
    marker = value["$trace_result"]
    call_id = marker.get("tool_call_id") if isinstance(marker, dict) else None
    pointer = marker.get("pointer") if isinstance(marker, dict) else None
    if not (isinstance(call_id, str) and call_id and isinstance(pointer, str) and pointer):
        raise InvalidRequest(
            "invalid $trace_result: expected a non-empty tool_call_id and JSON Pointer",
            code="trace_binding",
        )
    results = observed.get(call_id, [])
    if not results:
        raise InvalidRequest(
            f"the trace binds a tool-call argument to the result of tool call {call_id!r}, "
            f"but the request has no tool message (with a JSON result) for it",
            code="trace_binding",
        )
    if len(results) > 1:
        raise InvalidRequest(
            f"the trace binds to the result of tool call {call_id!r}, but the request has "
            f"{len(results)} tool results with that id",
            code="trace_binding",
        )
    found, bound = _pointer(results[0], pointer)
    if not found:
        raise InvalidRequest(
            f"the result of tool call {call_id!r} has no JSON Pointer {pointer!r} "
            f"(the trace binds a tool-call argument to it)",
            code="trace_binding",
        )
    return bound


def _fill(text: str, variables: Mapping[str, str]) -> str:
    if text.startswith("{{") and text.endswith("}}") and text.count("{{") == 1:
        whole = variables.get(text[2:-2].strip())
        if whole is not None:
            return whole
    result = text
    while (start := result.find("{{")) != -1:
        end = result.find("}}", start)
        if end == -1:
            break
        resolved = variables.get(result[start + 2 : end].strip())
        if resolved is None:
            break  # an unresolved template stays as it is, and stops the pass
        result = result[:start] + resolved + result[end + 2 :]
    return result


def _template(value: JSON, variables: Mapping[str, str]) -> JSON:
    if isinstance(value, str):
        return _fill(value, variables)
    if isinstance(value, list):
        return [_template(v, variables) for v in value]
    if isinstance(value, dict):
        return {k: _template(v, variables) for k, v in value.items()}
    return value


def resolve_trace_arguments(arguments: JSON, messages: JSON) -> JSON:
    """Recorded tool-call `arguments` (a JSON value) as IronClaw's ``TraceLlm`` replays
    them for a request whose conversation is `messages`: every
    ``{"$trace_result": {"tool_call_id": ..., "pointer": "/..."}}`` replaced by the
    value at that JSON Pointer in the live result of that tool call, then every
    ``{{call_id.field}}`` / ``{{tool:NAME.field}}`` template filled from the tool
    results of the conversation. Raises `InvalidRequest` when a binding cannot be
    resolved (the step is then not served)."""
    observed, variables = trace_tool_results(messages)
    bound = _bind(arguments, observed)
    return _template(bound, variables) if variables else bound


def resolve_trace_answer(body: JSON, request: JSON) -> JSON:
    """A trace step's ``chat.completion`` answer `body` with its tool calls' arguments
    resolved for the live `request` (`resolve_trace_arguments`); `body` itself when
    none has a binding or template."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list):
        return body
    messages = request.get("messages") if isinstance(request, dict) else None
    changed = False
    new_choices: list[JSON] = []
    for choice in choices:
        message = choice.get("message") if isinstance(choice, dict) else None
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if not isinstance(calls, list):
            new_choices.append(choice)
            continue
        new_calls: list[JSON] = []
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            arguments = function.get("arguments") if isinstance(function, dict) else None
            if not isinstance(arguments, str) or (
                "$trace_result" not in arguments and "{{" not in arguments
            ):
                new_calls.append(call)
                continue
            try:
                value = json.loads(arguments)
            except ValueError:
                new_calls.append(call)
                continue
            resolved = resolve_trace_arguments(value, messages)
            if resolved == value:
                new_calls.append(call)
                continue
            text = json.dumps(resolved, separators=(",", ":"), ensure_ascii=False)
            assert isinstance(call, dict) and isinstance(function, dict)
            new_calls.append({**call, "function": {**function, "arguments": text}})
            changed = True
        assert isinstance(choice, dict) and isinstance(message, dict)
        new_choices.append({**choice, "message": {**message, "tool_calls": new_calls}})
    if not changed:
        return body
    assert isinstance(body, dict)
    return {**body, "choices": new_choices}
