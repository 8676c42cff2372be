"""Hash-keyed fixture directories (seeds/hash-keyed-fixtures.md).

A fixture is ``<sha256>.json`` holding a canned answer::

    {"request_digest": "<hash>", "description": "...",
     "response": {"content": "...", "tool_calls": null, "finish_reason": "stop",
                  "usage": {"prompt_tokens": 12, "completion_tokens": 34}}}

The hash is a SHA-256 over DocsGPT's stub's own canonicalisation of the request
(`canonical`, `request_digest`, as its ``_compute_request_digest``): model, messages
reduced to role and content (always, None when absent) plus
name/tool_call_id/tool_calls when present, entries that are not objects skipped, and
tool_choice -- no tools and no response_format, unlike chaosllm's digest. The
request itself is not in the file, so a fixture becomes an exchange keyed by its
hash (`Keying.HASH_KEYED`): the exact matcher computes this digest of an incoming
request only when such fixtures are loaded and looks it up in a second dict, still
O(1).

The answer is built once, at load time, as the stub serves it: a
``chat.completion`` body, and the frames of a stream -- content split into ~5
deltas by character length, only the last carrying ``finish_reason``; tool
calls as one delta holding the whole ``tool_calls`` array, then an empty delta
carrying ``finish_reason`` -- recorded as chunks, which the OpenAI provider
replays verbatim. ``usage.total_tokens`` is always the sum; a missing
``completion_tokens`` is estimated from the content as the stub does
(`estimate_tokens`: ``max(1, len // 4)``, 0 for none). A missing ``prompt_tokens``
is 0 here (the request is not known when the fixture is loaded): the engine serves
the stub's estimate over the request's messages, and the request's model, through
`chaosllm.core.mock_llm.for_request` (the usage the fixture gave is kept in
``meta["usage"]``).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

from chaosllm.errors import RecordingError
from chaosllm.model import JSON, Exchange, Keying, RecordedChunk, RecordedRequest, RecordedResponse
from chaosllm.providers.openai_chat import DONE_FRAME, sse_frame
from chaosllm.store.formats.base import FixtureFormat, Location

__all__ = [
    "FIXTURE_NAME",
    "FORMAT",
    "MESSAGE_KEYS",
    "MODEL",
    "canonical",
    "canonical_messages",
    "completion",
    "detect",
    "estimate_tokens",
    "looks_like",
    "messages_text",
    "parse",
    "parse_file",
    "request_digest",
    "stream_frames",
]

FIXTURE_NAME = re.compile(r"[0-9a-f]{64}")
"""The stem of a fixture file: a lower-case hex SHA-256."""

MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_call_id", "tool_calls"})
_OPTIONAL_KEYS = ("name", "tool_call_id", "tool_calls")

MODEL = "mock-llm"
"""The ``model`` of the answers (the request, hence its model, is not in the fixture)."""

STREAM_PIECES = 5

_RESPONSE_KEYS = frozenset({"content", "tool_calls", "finish_reason", "usage"})


def canonical_messages(messages: Any) -> list[dict[str, Any]]:
    """The messages as the stub's ``_canonical_messages`` keeps them: ``role`` and
    ``content`` always (None when absent, as the openai SDK sends an assistant turn that
    only calls tools), ``name``/``tool_call_id``/``tool_calls`` when present; entries that
    are not objects are skipped."""
    if not messages or not isinstance(messages, list):
        return []
    out: list[dict[str, Any]] = []
    for msg in messages:
        if not isinstance(msg, dict):
            continue
        entry: dict[str, Any] = {"role": msg.get("role"), "content": msg.get("content")}
        for key in _OPTIONAL_KEYS:
            if key in msg:
                entry[key] = msg[key]
        out.append(entry)
    return out


def canonical(payload: JSON) -> dict[str, Any]:
    """What the fixture hash covers, exactly as DocsGPT's stub (``_compute_request_digest``)
    computes it: its code, not the seed document's snippet, is the reference."""
    return {
        "model": payload.get("model"),
        "messages": canonical_messages(payload.get("messages")),
        "tool_choice": payload.get("tool_choice"),
    }


def request_digest(payload: JSON) -> str:
    """The fixture hash of a request body (``<hash>.json`` is the fixture answering it)."""
    blob = json.dumps(canonical(payload), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def looks_like(data: JSON) -> bool:
    """Whether parsed JSON has the shape of a hash-keyed fixture."""
    return (
        isinstance(data, dict)
        and isinstance(data.get("response"), dict)
        and "request" not in data
        and "chaosllm" not in data
        and bool(_RESPONSE_KEYS & data["response"].keys())
    )


def _require(cond: bool, source: str, problem: str) -> None:
    if not cond:
        raise RecordingError(source, problem)


def estimate_tokens(text: str) -> int:
    """The stub's estimate (``_estimate_tokens``): 0 for no text, else ~4 characters a token."""
    return max(1, len(text) // 4) if text else 0


def messages_text(messages: Any) -> str:
    """The text parts of the messages, one a line (the stub's ``_messages_text``): string
    contents and the ``text`` of content parts."""
    if not messages or not isinstance(messages, list):
        return ""
    parts: list[str] = []
    for msg in messages:
        if not isinstance(msg, dict):
            continue
        content = msg.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    parts.append(part["text"])
    return "\n".join(parts)


def completion(response: dict[str, Any], digest: str) -> dict[str, Any]:
    """The ``chat.completion`` body the stub answers with (fixture already validated)."""
    content = response.get("content")
    calls = response.get("tool_calls") or None
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    usage = response.get("usage") or {}
    prompt = usage.get("prompt_tokens", 0)
    completion_tokens = usage.get("completion_tokens", estimate_tokens(content or ""))
    return {
        "id": "chatcmpl-mock-" + digest[:24],
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": response.get("finish_reason") or "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt + completion_tokens,
        },
    }


def _pieces(text: str, count: int = STREAM_PIECES) -> list[str]:
    """`text` in about `count` pieces of equal length (at least one piece)."""
    if not text:
        return [text]
    size = math.ceil(len(text) / count)
    return [text[i : i + size] for i in range(0, len(text), size)]


def stream_frames(body: dict[str, Any]) -> list[str]:
    """The SSE frames of an answer built by `completion`, as the stub streams it."""
    base = {
        "id": body["id"],
        "object": "chat.completion.chunk",
        "created": body["created"],
        "model": body["model"],
    }
    choice = body["choices"][0]
    message = choice["message"]
    finish = choice["finish_reason"]

    def frame(delta: dict[str, Any], finish_reason: str | None = None) -> str:
        return sse_frame(
            {
                **base,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
                ],
            }
        )

    calls = message.get("tool_calls")
    if calls:
        delta: dict[str, Any] = {
            "role": "assistant",
            "content": message["content"] or None,
            "tool_calls": [{"index": i, **call} for i, call in enumerate(calls)],
        }
        frames = [frame(delta), frame({}, finish)]
    else:
        pieces = _pieces(message["content"] or "")
        frames = []
        for i, piece in enumerate(pieces):
            delta = {"role": "assistant", "content": piece} if i == 0 else {"content": piece}
            frames.append(frame(delta, finish if i == len(pieces) - 1 else None))
    frames.append(DONE_FRAME)
    return frames


def _check_response(response: dict[str, Any], source: str) -> None:
    content = response.get("content")
    calls = response.get("tool_calls")
    _require(
        content is None or isinstance(content, str), source, '"response.content" must be a string'
    )
    _require(
        calls is None or isinstance(calls, list),
        source,
        '"response.tool_calls" must be an array or null',
    )
    _require(
        isinstance(content, str) or bool(calls),
        source,
        '"response.content" is required when there are no "tool_calls"',
    )
    for i, call in enumerate(calls or ()):
        where = f'"response.tool_calls[{i}]"'
        _require(
            isinstance(call, dict) and isinstance(call.get("function"), dict),
            source,
            f'{where} must be an object with a "function" object (OpenAI tool-call shape)',
        )
        function = call["function"]
        _require(
            isinstance(function.get("name"), str), source, f"{where}.function.name must be a string"
        )
        arguments = function.get("arguments")
        _require(
            isinstance(arguments, str),
            source,
            f"{where}.function.arguments must be a JSON string, not "
            f"{'an object' if isinstance(arguments, dict) else type(arguments).__name__}"
            f' (e.g. "{{\\"city\\":\\"London\\"}}")',
        )
        _require(isinstance(call.get("id"), str), source, f"{where}.id must be a string")
    finish = response.get("finish_reason")
    _require(
        finish is None or isinstance(finish, str),
        source,
        '"response.finish_reason" must be a string',
    )
    usage = response.get("usage")
    _require(
        usage is None
        or (
            isinstance(usage, dict)
            and all(
                isinstance(usage.get(k, 0), int) and not isinstance(usage.get(k), bool)
                for k in ("prompt_tokens", "completion_tokens")
            )
        ),
        source,
        '"response.usage" must be an object with integer prompt_tokens/completion_tokens',
    )


def parse(data: JSON, *, source: str, scenario: str, stem: str) -> Exchange:
    """The exchange of one fixture file (`stem`: its name without ``.json``)."""
    _require(
        FIXTURE_NAME.fullmatch(stem) is not None,
        source,
        "a hash-keyed fixture must be named <sha256>.json (64 lower-case hex digits: "
        "the hash of the request it answers)",
    )
    _require(looks_like(data), source, 'a hash-keyed fixture is an object with a "response" object')
    response = data["response"]
    _check_response(response, source)
    body = completion(response, stem)
    chunks = tuple(RecordedChunk(f) for f in stream_frames(body))
    stored = data.get("request_digest")
    usage = response.get("usage")
    meta: dict[str, Any] = {
        "format": "hash-keyed",
        "usage": {k: usage[k] for k in ("prompt_tokens", "completion_tokens") if k in usage}
        if isinstance(usage, dict)
        else {},
    }
    if isinstance(data.get("description"), str):
        meta["description"] = data["description"]
    if isinstance(data.get("_comment"), str):  # DocsGPT's fixtures describe themselves so
        meta["comment"] = data["_comment"]
        meta.setdefault("description", data["_comment"])
    return Exchange(
        provider="openai.chat",
        request=RecordedRequest(method="POST", path="/v1/chat/completions", body={"messages": []}),
        response=RecordedResponse(status=200, body=body, stream=True, chunks=chunks),
        digest=stem,
        name=f"{scenario}/{stem}",
        scenario=scenario,
        meta=meta,
        source=source,
        stored_digest=stored if isinstance(stored, str) else None,
        keyed_by=Keying.HASH_KEYED,
    )


def detect(path: Path, data: JSON) -> bool:
    """A hash-keyed fixture, whatever its name (`parse` says when the name is wrong)."""
    return looks_like(data)


def parse_file(data: JSON, at: Location) -> list[Exchange]:
    return [parse(data, source=at.source, scenario=at.scenario, stem=at.stem)]


FORMAT = FixtureFormat(
    name="hash-keyed",
    shape='a hash-keyed fixture (<sha256>.json holding a "response" object)',
    detect=detect,
    parse=parse_file,
    keying=Keying.HASH_KEYED,
    alias_digest=request_digest,
)
