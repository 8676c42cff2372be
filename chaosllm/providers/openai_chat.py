"""OpenAI Chat Completions: canonical requests, plans, error envelopes, stream assembly.

Theory of operation
-------------------
The digest covers what decides the answer (model, messages reduced to
role/content/name/tool_call_id/tool_calls, tools, tool_choice,
response_format) and nothing of transport or sampling, so a streamed and a
non-streamed request hit the same recording.

A recording made from a stream keeps its exact frames: a stream request
replays them verbatim (their bytes, their recorded gaps scaled by `timing`).
Otherwise frames are rendered from the assembled body the way the API streams
them: a role delta, reasoning deltas, content (or refusal) deltas of a few
words each, tool calls (one delta with index, id, type and name, then argument
fragments), the finish chunk, the usage chunk when
``stream_options.include_usage`` is set, and ``data: [DONE]``.
A non-stream request gets the assembled body as JSON, whichever way it was
recorded.
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

__all__ = [
    "CANONICAL_MESSAGE_KEYS",
    "OpenAIChat",
    "error_body",
    "error_type_for_status",
    "iter_frame_payloads",
    "sse_frame",
]

CANONICAL_MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_call_id", "tool_calls"})
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
REASONING_KEYS = ("reasoning_content", "reasoning")

JSON_HEADERS = (("content-type", "application/json"),)
SSE_HEADERS = (
    ("content-type", "text/event-stream; charset=utf-8"),
    ("cache-control", "no-cache"),
)
DONE_FRAME = "data: [DONE]\n\n"

_TYPED_FIELDS: tuple[tuple[str, str, tuple[type, ...]], ...] = (
    ("stream", "a boolean", (bool,)),
    ("tools", "an array", (list,)),
    ("stream_options", "an object", (dict,)),
    ("response_format", "an object", (dict,)),
    ("n", "an integer", (int,)),
)


def sse_frame(payload: JSON) -> str:
    return "data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False) + "\n\n"


def iter_frame_payloads(frames: Sequence[str]) -> Iterator[str]:
    """The `data` field of each SSE event in `frames` (multi-line data joined by newlines)."""
    for frame in frames:
        for event in frame.replace("\r\n", "\n").split("\n\n"):
            lines = [ln[5:].removeprefix(" ") for ln in event.split("\n") if ln.startswith("data:")]
            if lines:
                yield "\n".join(lines)


class OpenAIChat:
    """The `openai.chat` provider (``POST /v1/chat/completions``)."""

    name = "openai.chat"
    paths = ("/v1/chat/completions", "/chat/completions")

    # -- requests ---------------------------------------------------------------

    def validate(self, body: JSON) -> None:
        body = require_object_with_model(body)
        if "messages" not in body:
            raise InvalidRequest(
                "Missing required parameter: 'messages'.",
                param="messages",
                code="missing_required_parameter",
            )
        messages = body["messages"]
        expect(
            isinstance(messages, list),
            f"Invalid type for 'messages': expected an array, but got "
            f"{type_name(messages)} instead.",
            "messages",
        )
        expect(
            len(messages) > 0,
            "Invalid 'messages': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.",
            "messages",
            "empty_array",
        )
        for i, message in enumerate(messages):
            expect(
                isinstance(message, dict),
                f"Invalid type for 'messages[{i}]': expected an object, but got "
                f"{type_name(message)} instead.",
                f"messages[{i}]",
            )
            role = message.get("role")
            if role is None:
                raise InvalidRequest(
                    f"Missing required parameter: 'messages[{i}].role'.",
                    param=f"messages[{i}].role",
                    code="missing_required_parameter",
                )
            expect(
                role in ROLES,
                f"Invalid value: {json.dumps(role)}. Supported values are: "
                + ", ".join(f"'{r}'" for r in sorted(ROLES))
                + ".",
                f"messages[{i}].role",
                "invalid_value",
            )
            content = message.get("content")
            expect(
                content is None or isinstance(content, (str, list)),
                f"Invalid type for 'messages[{i}].content': expected one of a string or "
                f"array of objects, but got {type_name(content)} instead.",
                f"messages[{i}].content",
            )
            if role == "tool":
                expect(
                    isinstance(message.get("tool_call_id"), str),
                    f"Missing required parameter: 'messages[{i}].tool_call_id'.",
                    f"messages[{i}].tool_call_id",
                    "missing_required_parameter",
                )
        for key, kind, types in _TYPED_FIELDS:
            value = body.get(key)
            if value is not None:
                expect(
                    isinstance(value, types)
                    and not (bool not in types and isinstance(value, bool)),
                    f"Invalid type for '{key}': expected {kind}, but got "
                    f"{type_name(body[key])} instead.",
                    key,
                )

    def canonical(self, body: JSON) -> JSON:
        return {
            "model": body.get("model"),
            "messages": [
                {k: v for k, v in m.items() if k in CANONICAL_MESSAGE_KEYS}
                if isinstance(m, dict)
                else m
                for m in body.get("messages", [])
            ],
            "tools": body.get("tools"),
            "tool_choice": body.get("tool_choice"),
            "response_format": body.get("response_format"),
        }

    def digest(self, body: JSON) -> str:
        return sha256_digest(self.canonical(body))

    def match_text(self, body: JSON) -> str:
        return canonical_json(self.canonical(body))

    def turn_text(self, body: JSON) -> str:
        messages = self.canonical(body)["messages"]
        return canonical_json(messages[-1] if messages else None)

    def wants_stream(self, body: JSON) -> bool:
        return bool(isinstance(body, dict) and body.get("stream") is True)

    @staticmethod
    def include_usage(body: JSON) -> bool:
        options = body.get("stream_options") if isinstance(body, dict) else None
        return isinstance(options, dict) and options.get("include_usage") is True

    # -- responses --------------------------------------------------------------

    def render(self, exchange: Exchange, body: JSON, *, timing: float) -> ResponsePlan:
        stream = self.wants_stream(body)
        response = exchange.response
        is_answer = (
            response.status < 400 and isinstance(response.body, dict) and "choices" in response.body
        )
        if not is_answer or not stream:
            # A JSON answer (or a recorded error answer, whatever was asked).
            key: tuple[Any, ...] = ("json",)
        elif response.chunks is not None:
            key = ("chunks", timing)
        else:
            key = ("sse", self.include_usage(body))
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
            pieces = tuple(
                Piece(f.encode("utf-8"))
                for f in self.stream_frames(response.body, include_usage=key[1])
            )
        return ResponsePlan(
            status=response.status,
            headers=SSE_HEADERS + headers,
            pieces=pieces,
            framing=Framing.CHUNKED,
        )

    def stream_frames(self, completion: Mapping[str, Any], *, include_usage: bool) -> list[str]:
        """SSE frames equivalent to a `chat.completion` body, as the API would stream it."""
        base: dict[str, Any] = {
            "id": completion.get("id", "chatcmpl-chaosllm"),
            "object": "chat.completion.chunk",
            "created": completion.get("created", 0),
            "model": completion.get("model", ""),
        }
        for key in ("service_tier", "system_fingerprint"):
            if key in completion:
                base[key] = completion[key]

        def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> str:
            payload = dict(base)
            payload["choices"] = [
                {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
            ]
            if include_usage:
                payload["usage"] = None
            return sse_frame(payload)

        frames: list[str] = []
        for choice in completion.get("choices", []):
            index = choice.get("index", 0)
            message = choice.get("message") or {}
            content = message.get("content")
            first: dict[str, Any] = {
                "role": message.get("role", "assistant"),
                "content": "" if isinstance(content, str) else None,
            }
            if "refusal" in message:
                first["refusal"] = None
            frames.append(chunk(index, first))
            for key in REASONING_KEYS:
                if isinstance(message.get(key), str) and message[key]:
                    frames.extend(chunk(index, {key: p}) for p in text_pieces(message[key]))
            if isinstance(message.get("content"), str) and message["content"]:
                frames.extend(chunk(index, {"content": p}) for p in text_pieces(message["content"]))
            if isinstance(message.get("refusal"), str) and message["refusal"]:
                frames.extend(chunk(index, {"refusal": p}) for p in text_pieces(message["refusal"]))
            for call_index, call in enumerate(message.get("tool_calls") or []):
                function = call.get("function") or {}
                frames.append(
                    chunk(
                        index,
                        {
                            "tool_calls": [
                                {
                                    "index": call_index,
                                    "id": call.get("id"),
                                    "type": call.get("type", "function"),
                                    "function": {"name": function.get("name"), "arguments": ""},
                                }
                            ]
                        },
                    )
                )
                frames.extend(
                    chunk(
                        index,
                        {"tool_calls": [{"index": call_index, "function": {"arguments": piece}}]},
                    )
                    for piece in argument_pieces(function.get("arguments") or "")
                )
            frames.append(chunk(index, {}, choice.get("finish_reason") or "stop"))
        if include_usage:
            payload = dict(base)
            payload["choices"] = []
            payload["usage"] = completion.get("usage")
            frames.append(sse_frame(payload))
        frames.append(DONE_FRAME)
        return frames

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
        completion: dict[str, Any] = {}
        choices: dict[int, dict[str, Any]] = {}
        for data in iter_frame_payloads(frames):
            if data.strip() == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk and "choices" not in chunk:
                return chunk
            if not completion:
                completion = {
                    "id": chunk.get("id"),
                    "object": "chat.completion",
                    "created": chunk.get("created"),
                    "model": chunk.get("model"),
                }
                for key in ("service_tier", "system_fingerprint"):
                    if key in chunk:
                        completion[key] = chunk[key]
            if chunk.get("usage"):
                completion["usage"] = chunk["usage"]
            for c in chunk.get("choices") or []:
                state = choices.setdefault(
                    c.get("index", 0),
                    {
                        "index": c.get("index", 0),
                        "message": {"role": "assistant", "content": None},
                        "logprobs": None,
                        "finish_reason": None,
                        "_calls": {},
                    },
                )
                _merge_delta(state, c.get("delta") or {})
                if c.get("finish_reason") is not None:
                    state["finish_reason"] = c["finish_reason"]
        result_choices = []
        for index in sorted(choices):
            state = choices[index]
            calls = state.pop("_calls")
            if calls:
                state["message"]["tool_calls"] = [calls[i] for i in sorted(calls)]
            result_choices.append(state)
        completion["choices"] = result_choices
        completion.setdefault("usage", None)
        return completion

    def stream_complete(self, frames: Sequence[str]) -> bool:
        last = None
        for data in iter_frame_payloads(frames):
            last = data
        if last is None:
            return False
        if last.strip() == "[DONE]":
            return True
        try:
            chunk = json.loads(last)
        except json.JSONDecodeError:
            return False
        # The API ends a stream that fails with an error event (and no [DONE]).
        return isinstance(chunk, dict) and "error" in chunk and "choices" not in chunk

    # -- what faults need -------------------------------------------------------

    def answer_frame_count(self, plan: ResponsePlan) -> int:
        for i, piece in enumerate(plan.pieces):
            if _frame_finishes(piece.data):
                return i
        return len(plan.pieces)

    def stream_error_frame(self, message: str, *, status: int) -> bytes:
        type_, code = error_type_for_status(status)
        return sse_frame(error_body(message, type_, code)).encode("utf-8")

    def error_answer(self, message: str, *, status: int, code: str | None = None) -> JSON:
        type_, default_code = error_type_for_status(status)
        return error_body(message, type_, code or default_code)

    def empty_answer(self, body: JSON) -> JSON:
        empty = copy.deepcopy(body)
        for choice in empty.get("choices") or []:
            message = choice.setdefault("message", {})
            for key in ("tool_calls", "function_call", *REASONING_KEYS):
                message.pop(key, None)
            message["content"] = None
            if "refusal" in message:
                message["refusal"] = None
            choice["finish_reason"] = "stop"
        usage = empty.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            usage.update(completion_tokens=0, total_tokens=usage["prompt_tokens"])
            usage.pop("completion_tokens_details", None)
        return empty

    def break_tool_arguments(self, body: JSON) -> JSON | None:
        broken = copy.deepcopy(body)
        found = False
        for choice in broken.get("choices") or []:
            for call in (choice.get("message") or {}).get("tool_calls") or []:
                function = call.setdefault("function", {})
                function["arguments"] = cut_json(function.get("arguments") or "")
                found = True
        return broken if found else None

    # -- fallback ---------------------------------------------------------------

    def fallback(self, body: JSON, digest: str) -> JSON:
        return {
            "id": "chatcmpl-chaosllm" + digest[:24],
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "") if isinstance(body, dict) else "",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": f"[chaosllm fallback] No recording matches this request "
                        f"(digest {digest}).",
                        "refusal": None,
                        "annotations": [],
                    },
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }


def _frame_finishes(data: bytes) -> bool:
    """Whether an SSE frame finishes the answer: finish chunk, usage chunk, [DONE] or error."""
    for payload in iter_frame_payloads([data.decode("utf-8", "replace")]):
        if payload.strip() == "[DONE]":
            return True
        try:
            chunk = json.loads(payload)
        except json.JSONDecodeError:
            continue
        if not isinstance(chunk, dict):
            continue
        choices = chunk.get("choices")
        if "error" in chunk or choices == []:
            return True
        if isinstance(choices, list) and any(
            isinstance(c, dict) and c.get("finish_reason") for c in choices
        ):
            return True
    return False


def _merge_delta(state: dict[str, Any], delta: Mapping[str, Any]) -> None:
    message = state["message"]
    for key, value in delta.items():
        if key == "role":
            message["role"] = value
        elif key == "tool_calls":
            for call in value or []:
                slot = state["_calls"].setdefault(
                    call.get("index", 0),
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                if call.get("id"):
                    slot["id"] = call["id"]
                if call.get("type"):
                    slot["type"] = call["type"]
                function = call.get("function") or {}
                if function.get("name"):
                    slot["function"]["name"] += function["name"]
                if function.get("arguments"):
                    slot["function"]["arguments"] += function["arguments"]
        elif isinstance(value, str):
            message[key] = (message.get(key) or "") + value
        elif key not in message:
            message[key] = value
