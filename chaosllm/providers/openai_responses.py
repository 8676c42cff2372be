"""OpenAI Responses API (``POST /v1/responses``): requests, plans, errors, stream assembly.

Theory of operation
-------------------
The digest covers what decides the answer (model, instructions, input, tools,
tool_choice, text.format) and nothing of transport, sampling or storage
(stream, temperature, max_output_tokens, store, metadata), so a streamed and a
non-streamed request hit the same recording.

A non-stream request gets the `response` object as JSON. A stream request
replays recorded frames verbatim when the recording has them; otherwise the
frames are rendered from the response the way the API streams it, each one
``event: <type>`` + ``data: {"type": <type>, "sequence_number": n, ...}``:
``response.created``, ``response.in_progress``, then per output item
``response.output_item.added``, its parts and deltas (``content_part.*`` and
``output_text.delta``/``.done`` for a message, ``function_call_arguments.delta``
/``.done`` for a function call, ``reasoning_summary_part.*`` and
``reasoning_summary_text.*`` for a reasoning summary),
``response.output_item.done``, and finally ``response.completed`` carrying the
full response (usage, status). A stream has no ``[DONE]``.

How it breaks (the fault hooks): the *answer* frames are every frame before
the terminal lifecycle event (``response.completed``/``failed``/``incomplete``
or an ``error`` event): the per-item ``*.done`` events belong to the items, the
answer is only finished (status, usage) by ``response.completed``, so a cut
stream never has it. An error mid-stream is an ``event: error`` frame, the
API's in-band error event (`ResponseErrorEvent`: ``code``, ``message``,
``param``, ``sequence_number``); ``response.failed`` would have to repeat the
stream's response id, which the hook does not know, and the SDK's stream
helper refuses a lifecycle event whose id changed.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from chaosllm.errors import InvalidRequest
from chaosllm.model import JSON, Exchange, Framing, Piece, ResponsePlan
from chaosllm.providers.base import canonical_json, sha256_digest
from chaosllm.providers.openai_common import (
    KIND_TYPES,
    argument_pieces,
    cut_json,
    error_body,
    error_type_for_status,
    expect,
    require_object_with_model,
    text_pieces,
    type_name,
)

__all__ = ["OpenAIResponses", "iter_events", "sse_event"]

JSON_HEADERS = (("content-type", "application/json"),)
SSE_HEADERS = (
    ("content-type", "text/event-stream; charset=utf-8"),
    ("cache-control", "no-cache"),
)
TERMINAL_EVENTS = frozenset(
    {"response.completed", "response.failed", "response.incomplete", "error"}
)
INPUT_ROLES = frozenset({"user", "assistant", "system", "developer"})

_TYPED_FIELDS: tuple[tuple[str, str, tuple[type, ...]], ...] = (
    ("stream", "a boolean", (bool,)),
    ("instructions", "a string", (str,)),
    ("tools", "an array", (list,)),
    ("text", "an object", (dict,)),
    ("reasoning", "an object", (dict,)),
    ("metadata", "an object", (dict,)),
    ("max_output_tokens", "an integer", (int,)),
    ("store", "a boolean", (bool,)),
)


def sse_event(payload: Mapping[str, Any]) -> str:
    """One Responses stream frame: ``event: <type>`` and its JSON data."""
    return (
        f"event: {payload['type']}\ndata: "
        + json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
        + "\n\n"
    )


def iter_events(frames: Sequence[str]) -> Iterator[tuple[str | None, str]]:
    """``(event name, data)`` of each SSE event in `frames`."""
    for frame in frames:
        for event in frame.replace("\r\n", "\n").split("\n\n"):
            name = None
            data: list[str] = []
            for line in event.split("\n"):
                if line.startswith("event:"):
                    name = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
            if data:
                yield name, "\n".join(data)


def _event_types(data: bytes) -> list[str]:
    types = []
    for name, payload in iter_events([data.decode("utf-8", "replace")]):
        try:
            parsed = json.loads(payload)
        except json.JSONDecodeError:
            parsed = None
        kind = parsed.get("type") if isinstance(parsed, dict) else None
        types.append(kind if isinstance(kind, str) else (name or ""))
    return types


def _strip_status(item: JSON) -> JSON:
    if isinstance(item, dict):
        return {k: v for k, v in item.items() if k != "status"}
    return item


class OpenAIResponses:
    """The `openai.responses` provider (``POST /v1/responses``)."""

    name = "openai.responses"
    paths = ("/v1/responses", "/responses")

    # -- requests ---------------------------------------------------------------

    def validate(self, body: JSON) -> None:
        body = require_object_with_model(body)
        if "input" not in body:
            raise InvalidRequest(
                "Missing required parameter: 'input'.",
                param="input",
                code="missing_required_parameter",
            )
        items = body["input"]
        expect(
            isinstance(items, (str, list)),
            f"Invalid type for 'input': expected one of a string or array of input items, "
            f"but got {type_name(items)} instead.",
            "input",
        )
        for i, item in enumerate(items if isinstance(items, list) else []):
            where = f"input[{i}]"
            expect(
                isinstance(item, dict),
                f"Invalid type for '{where}': expected an object, but got "
                f"{type_name(item)} instead.",
                where,
            )
            kind = item.get("type", "message")
            if kind == "message":
                role = item.get("role")
                if role is None:
                    raise InvalidRequest(
                        f"Missing required parameter: '{where}.role'.",
                        param=f"{where}.role",
                        code="missing_required_parameter",
                    )
                expect(
                    role in INPUT_ROLES,
                    f"Invalid value: {json.dumps(role)}. Supported values are: "
                    + ", ".join(f"'{r}'" for r in sorted(INPUT_ROLES))
                    + ".",
                    f"{where}.role",
                    "invalid_value",
                )
                expect(
                    isinstance(item.get("content"), (str, list)),
                    f"Invalid type for '{where}.content': expected one of a string or "
                    f"array of input content, but got {type_name(item.get('content'))} "
                    f"instead.",
                    f"{where}.content",
                )
            elif kind == "function_call_output":
                for key in ("call_id", "output"):
                    if key not in item:
                        raise InvalidRequest(
                            f"Missing required parameter: '{where}.{key}'.",
                            param=f"{where}.{key}",
                            code="missing_required_parameter",
                        )
            elif kind == "function_call":
                for key in ("call_id", "name", "arguments"):
                    expect(
                        isinstance(item.get(key), str),
                        f"Missing required parameter: '{where}.{key}'.",
                        f"{where}.{key}",
                        "missing_required_parameter",
                    )
        for key, kind_name, types in _TYPED_FIELDS:
            value = body.get(key)
            if value is not None:
                expect(
                    isinstance(value, types)
                    and not (bool not in types and isinstance(value, bool)),
                    f"Invalid type for '{key}': expected {kind_name}, but got "
                    f"{type_name(value)} instead.",
                    key,
                )
        for i, tool in enumerate(body.get("tools") or []):
            expect(
                isinstance(tool, dict) and isinstance(tool.get("type"), str),
                f"Missing required parameter: 'tools[{i}].type'.",
                f"tools[{i}].type",
                "missing_required_parameter",
            )
            if tool.get("type") == "function":
                expect(
                    isinstance(tool.get("name"), str),
                    f"Missing required parameter: 'tools[{i}].name'.",
                    f"tools[{i}].name",
                    "missing_required_parameter",
                )

    def canonical(self, body: JSON) -> JSON:
        items = body.get("input")
        text = body.get("text")
        return {
            "model": body.get("model"),
            "instructions": body.get("instructions"),
            # An output item passed back as input keeps its content, not its status.
            "input": [_strip_status(i) for i in items] if isinstance(items, list) else items,
            "tools": body.get("tools"),
            "tool_choice": body.get("tool_choice"),
            "text_format": text.get("format") if isinstance(text, dict) else None,
        }

    def digest(self, body: JSON) -> str:
        return sha256_digest(self.canonical(body))

    def match_text(self, body: JSON) -> str:
        return canonical_json(self.canonical(body))

    def turn_text(self, body: JSON) -> str:
        items = self.canonical(body)["input"]
        if isinstance(items, list):
            return canonical_json(items[-1] if items else None)
        return canonical_json(items)

    def wants_stream(self, body: JSON) -> bool:
        return bool(isinstance(body, dict) and body.get("stream") is True)

    # -- responses --------------------------------------------------------------

    def render(self, exchange: Exchange, body: JSON, *, timing: float) -> ResponsePlan:
        response = exchange.response
        is_answer = (
            response.status < 400
            and isinstance(response.body, dict)
            and response.body.get("object") == "response"
        )
        if not is_answer or not self.wants_stream(body):
            key: tuple[Any, ...] = ("json",)
        elif response.chunks is not None:
            key = ("chunks", timing)
        else:
            key = ("sse",)
        plan = exchange.cache.get(key)
        if plan is None:
            plan = exchange.cache[key] = self._render(exchange, key, timing)
        return plan

    def _render(self, exchange: Exchange, key: tuple[Any, ...], timing: float) -> ResponsePlan:
        response = exchange.response
        headers = tuple(response.headers)
        if key[0] == "json":
            data = json.dumps(response.body, ensure_ascii=False).encode("utf-8")
            return ResponsePlan(
                status=response.status,
                headers=JSON_HEADERS + headers,
                pieces=(Piece(data, frame=False),),
            )
        if key[0] == "chunks":
            assert response.chunks is not None
            pieces = tuple(
                Piece(c.data.encode("utf-8"), c.delay_ms * timing) for c in response.chunks
            )
        else:
            pieces = tuple(Piece(f.encode("utf-8")) for f in self.stream_frames(response.body))
        return ResponsePlan(
            status=response.status,
            headers=SSE_HEADERS + headers,
            pieces=pieces,
            framing=Framing.CHUNKED,
        )

    def stream_frames(self, response: Mapping[str, Any]) -> list[str]:
        """SSE frames equivalent to a `response` object, as the API would stream it."""
        frames: list[str] = []

        def emit(type_: str, **fields: Any) -> None:
            frames.append(sse_event({"type": type_, "sequence_number": len(frames), **fields}))

        pending = copy.deepcopy(dict(response))
        pending.update(
            status="in_progress", output=[], usage=None, error=None, incomplete_details=None
        )
        if "completed_at" in pending:
            pending["completed_at"] = None
        emit("response.created", response=pending)
        emit("response.in_progress", response=pending)
        for index, item in enumerate(response.get("output") or []):
            self._item_frames(emit, index, item)
        status = response.get("status") or "completed"
        terminal = {"failed": "response.failed", "incomplete": "response.incomplete"}.get(
            status, "response.completed"
        )
        emit(terminal, response=response)
        return frames

    @staticmethod
    def _item_frames(emit: Any, index: int, item: Mapping[str, Any]) -> None:
        kind = item.get("type")
        item_id = item.get("id")
        at = {"item_id": item_id, "output_index": index}
        if kind == "message":
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "content": []},
            )
            for part_index, part in enumerate(item.get("content") or []):
                where = {**at, "content_index": part_index}
                if part.get("type") == "output_text":
                    emit(
                        "response.content_part.added",
                        **where,
                        part={**part, "text": "", "annotations": []},
                    )
                    text = part.get("text") or ""
                    for piece in text_pieces(text) if text else []:
                        emit("response.output_text.delta", **where, delta=piece, logprobs=[])
                    emit(
                        "response.output_text.done",
                        **where,
                        text=text,
                        logprobs=part.get("logprobs") or [],
                    )
                elif part.get("type") == "refusal":
                    emit("response.content_part.added", **where, part={**part, "refusal": ""})
                    refusal = part.get("refusal") or ""
                    for piece in text_pieces(refusal) if refusal else []:
                        emit("response.refusal.delta", **where, delta=piece)
                    emit("response.refusal.done", **where, refusal=refusal)
                else:
                    emit("response.content_part.added", **where, part=part)
                emit("response.content_part.done", **where, part=part)
        elif kind == "function_call":
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "arguments": ""},
            )
            arguments = item.get("arguments") or ""
            for piece in argument_pieces(arguments):
                emit("response.function_call_arguments.delta", **at, delta=piece)
            emit("response.function_call_arguments.done", **at, arguments=arguments)
        elif kind == "reasoning":
            emit("response.output_item.added", output_index=index, item={**item, "summary": []})
            for summary_index, summary in enumerate(item.get("summary") or []):
                where = {**at, "summary_index": summary_index}
                emit(
                    "response.reasoning_summary_part.added",
                    **where,
                    part={"type": "summary_text", "text": ""},
                )
                text = summary.get("text") or ""
                for piece in text_pieces(text) if text else []:
                    emit("response.reasoning_summary_text.delta", **where, delta=piece)
                emit("response.reasoning_summary_text.done", **where, text=text)
                emit(
                    "response.reasoning_summary_part.done",
                    **where,
                    part={"type": "summary_text", "text": text},
                )
        else:
            emit("response.output_item.added", output_index=index, item=item)
        emit("response.output_item.done", output_index=index, item=item)

    def render_error(
        self,
        status: int,
        message: str,
        *,
        kind: str,
        code: str | None = None,
        param: str | None = None,
        stream: bool = False,
    ) -> ResponsePlan:
        type_ = KIND_TYPES.get(kind) or error_type_for_status(status)[0]
        data = json.dumps(error_body(message, type_, code, param), ensure_ascii=False)
        return ResponsePlan(
            status=status, headers=JSON_HEADERS, pieces=(Piece(data.encode("utf-8"), frame=False),)
        )

    # -- assembly ---------------------------------------------------------------

    def assemble(self, frames: Sequence[str]) -> JSON:
        """The response a stream finishes with; without a terminal event, the response
        rebuilt from its items (completed ones whole, open ones from their deltas)."""
        started: dict[str, Any] = {}
        items: dict[int, dict[str, Any]] = {}
        for _, data in iter_events(frames):
            event = json.loads(data)
            if not isinstance(event, dict):
                continue
            kind = event.get("type")
            if kind in ("response.completed", "response.failed", "response.incomplete"):
                result: dict[str, Any] = event["response"]
                return result
            if kind == "error":
                return error_body(
                    event.get("message") or "",
                    "server_error",
                    event.get("code"),
                    event.get("param"),
                )
            if kind in ("response.created", "response.in_progress"):
                started = copy.deepcopy(event["response"])
            elif kind in ("response.output_item.added", "response.output_item.done"):
                items[event["output_index"]] = copy.deepcopy(event["item"])
            elif kind == "response.content_part.added":
                content = items[event["output_index"]].setdefault("content", [])
                content.append(copy.deepcopy(event["part"]))
            elif kind in ("response.output_text.delta", "response.refusal.delta"):
                part = items[event["output_index"]]["content"][event["content_index"]]
                key = "text" if kind == "response.output_text.delta" else "refusal"
                part[key] = part.get(key, "") + event["delta"]
            elif kind == "response.function_call_arguments.delta":
                item = items[event["output_index"]]
                item["arguments"] = item.get("arguments", "") + event["delta"]
            elif kind == "response.reasoning_summary_part.added":
                summary = items[event["output_index"]].setdefault("summary", [])
                summary.append(copy.deepcopy(event["part"]))
            elif kind == "response.reasoning_summary_text.delta":
                part = items[event["output_index"]]["summary"][event["summary_index"]]
                part["text"] = part.get("text", "") + event["delta"]
        started["output"] = [items[i] for i in sorted(items)]
        return started

    def stream_complete(self, frames: Sequence[str]) -> bool:
        last: list[str] = []
        for frame in frames:
            last = _event_types(frame.encode("utf-8")) or last
        return bool(last) and last[-1] in TERMINAL_EVENTS

    # -- what faults need -------------------------------------------------------

    def answer_frame_count(self, plan: ResponsePlan) -> int:
        for i, piece in enumerate(plan.pieces):
            if any(t in TERMINAL_EVENTS for t in _event_types(piece.data)):
                return i
        return len(plan.pieces)

    def stream_error_frame(self, message: str, *, status: int) -> bytes:
        _, code = error_type_for_status(status)
        code = "rate_limit_exceeded" if status == 429 else code or "server_error"
        # The hook does not see the stream it ends: sequence_number cannot continue it.
        return sse_event(
            {"type": "error", "code": code, "message": message, "param": None, "sequence_number": 0}
        ).encode("utf-8")

    def error_answer(self, message: str, *, status: int, code: str | None = None) -> JSON:
        type_, default_code = error_type_for_status(status)
        return error_body(message, type_, code or default_code)

    def empty_answer(self, body: JSON) -> JSON:
        empty = copy.deepcopy(body)
        message = next((i for i in empty.get("output") or [] if i.get("type") == "message"), None)
        item = {
            "type": "message",
            "id": (message or {}).get("id", "msg_chaosllm_empty"),
            "status": "completed",
            "role": "assistant",
            "content": [],
        }
        empty["output"] = [item]
        empty["status"] = "completed"
        usage = empty.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("input_tokens"), int):
            usage.update(
                output_tokens=0,
                total_tokens=usage["input_tokens"],
                output_tokens_details={"reasoning_tokens": 0},
            )
        return empty

    def break_tool_arguments(self, body: JSON) -> JSON | None:
        broken = copy.deepcopy(body)
        found = False
        for item in broken.get("output") or []:
            if isinstance(item, dict) and item.get("type") == "function_call":
                item["arguments"] = cut_json(item.get("arguments") or "")
                found = True
        return broken if found else None

    # -- fallback ---------------------------------------------------------------

    def fallback(self, body: JSON, digest: str) -> JSON:
        text = f"[chaosllm fallback] No recording matches this request (digest {digest})."
        return {
            "id": "resp_chaosllm" + digest[:24],
            "object": "response",
            "created_at": 0,
            "status": "completed",
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions") if isinstance(body, dict) else None,
            "model": body.get("model", "") if isinstance(body, dict) else "",
            "output": [
                {
                    "type": "message",
                    "id": "msg_chaosllm" + digest[:24],
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            ],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": 0,
                "input_tokens_details": {"cache_write_tokens": 0, "cached_tokens": 0},
                "output_tokens": 0,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 0,
            },
        }
