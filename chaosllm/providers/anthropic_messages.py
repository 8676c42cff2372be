"""Anthropic Messages: canonical requests, plans, error envelopes, stream assembly.

Theory of operation
-------------------
The digest covers what decides the answer (model, system, messages reduced to
role/content, tools, tool_choice; ``cache_control`` markers dropped) and
nothing of transport or sampling (max_tokens, temperature, stream, metadata),
so a streamed and a non-streamed request hit the same recording.

A stream is a sequence of named events, each frame ``event: <type>`` and
``data: <json>``: ``message_start`` (the message with empty content),
per content block ``content_block_start``, ``content_block_delta``
(``text_delta``, ``input_json_delta`` with ``partial_json`` fragments,
``thinking_delta`` then one ``signature_delta``) and ``content_block_stop``,
one ``ping`` after the first block starts, then ``message_delta`` (stop
reason, output token count) and ``message_stop``. A stream that fails ends
with an ``error`` event instead. Recorded frames replay verbatim; otherwise
frames are rendered from the assembled message, and `assemble` is their
inverse.

Faults: the frames that finish an answer are ``message_delta``,
``message_stop`` (and ``error``). A message's ``tool_use.input`` is a JSON
object, so it cannot be invalid JSON in a JSON body: ``malformed_tool_args``
marks each input as the cut JSON text it would have streamed (a string, only
inside chaosllm) with ``stop_reason: max_tokens``; a stream carries that text
in its ``partial_json`` deltas (invalid JSON once joined), and a JSON body
carries what the API returns for a tool call cut off by ``max_tokens``: the
``tool_use`` block with an empty ``input`` object and ``stop_reason:
max_tokens``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from chaosllm.errors import InvalidRequest
from chaosllm.model import JSON, Piece, ResponsePlan
from chaosllm.providers import facts
from chaosllm.providers.base import Parts, Provider
from chaosllm.providers.codec import Codec
from chaosllm.providers.conversation import ANTHROPIC_CHECKS
from chaosllm.providers.equivalence import one_text, text_contents, without_keys
from chaosllm.providers.errors import Errors
from chaosllm.providers.failures import ErrorKind, Failure
from chaosllm.providers.faulthooks import ArgumentCuts, FaultHooks
from chaosllm.providers.ratelimits import RateLimitState, rfc3339
from chaosllm.providers.sse import event_frame, event_types, iter_events, one_event
from chaosllm.providers.text import estimated_tokens, filtered_blocks, text_pieces, type_name

__all__ = ["AnthropicMessages", "iter_events", "sse_event"]

sse_event = event_frame
"""One Messages stream frame: ``event: <type>`` and its JSON data (`sse.event_frame`)."""

ROLES = ("user", "assistant")

_STATUS_ERROR_TYPES: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_KIND_TYPES: Mapping[str, str] = {
    ErrorKind.INVALID_REQUEST: "invalid_request_error",
    ErrorKind.NOT_FOUND: "not_found_error",
}

CONTEXT_WINDOW = 200_000
"""The context window "prompt is too long" states (Claude's)."""
_FAILURE_STATUSES: Mapping[Failure, int] = {
    Failure.QUOTA_EXHAUSTED: 400,  # "credit balance is too low": invalid_request_error
    Failure.OVERLOADED: 529,
}
"""One frame: ``event: <type>`` and the compact JSON payload (`sse.event_frame`)."""


_TEXT_BLOCKS = frozenset({"text"})
"""The content blocks holding text a user wrote (``match.contains`` reads them)."""
_CALLS = frozenset({"tool_use", "server_tool_use"})
"""The content blocks of an answer that call a tool (``match.tool`` reads their names)."""


def _error_type(status: int) -> str:
    """The Anthropic error `type` a real API uses for an HTTP status."""
    if status in _STATUS_ERROR_TYPES:
        return _STATUS_ERROR_TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def _json_pieces(text: str) -> list[str]:
    """`partial_json` fragments as the API streams them: a few characters at a time."""
    return [text[i : i + 10] for i in range(0, len(text), 10)]


def _fail(message: str, param: str, code: str = "invalid_request_error") -> InvalidRequest:
    return InvalidRequest(message, param=param, code=code)


_AUTO_KEYS = frozenset({"type", "disable_parallel_tool_use"})
_STREAMING_ONLY = ("eager_input_streaming",)
"""Members of a tool that change how its input is streamed, not the answer."""


def _strip_cache_control(value: JSON) -> JSON:
    if isinstance(value, dict):
        return {k: _strip_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip_cache_control(v) for v in value]
    return value


def _validate_blocks(blocks: list[Any], where: str) -> None:
    for j, block in enumerate(blocks):
        if not isinstance(block, dict):
            raise _fail(
                f"{where}.{j}: Input should be a valid dictionary or object to extract fields from",
                f"{where}.{j}",
            )
        if not isinstance(block.get("type"), str):
            raise _fail(f"{where}.{j}.type: Field required", f"{where}.{j}.type")


def _list_type(value: object) -> str:
    return type_name(value, array="a list")


class AnthropicMessagesCodec(Codec):
    """`AnthropicMessages`'s codec: its requests' canonical form, its answers' framing."""

    conversation = ANTHROPIC_CHECKS
    minted_prefixes = ("msg_", "toolu_", "srvtoolu_")

    # -- requests ---------------------------------------------------------------

    def validate(self, body: JSON) -> None:
        if not isinstance(body, dict):
            raise _fail(f"Input should be an object, but got {_list_type(body)}.", "body")
        for key in ("model", "max_tokens", "messages"):
            if key not in body:
                raise _fail(f"{key}: Field required", key)
        if not isinstance(body["model"], str):
            raise _fail("model: Input should be a valid string", "model")
        max_tokens = body["max_tokens"]
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
            raise _fail("max_tokens: Input should be a valid integer", "max_tokens")
        if max_tokens < 1:
            raise _fail("max_tokens: Input should be greater than or equal to 1", "max_tokens")
        messages = body["messages"]
        if not isinstance(messages, list):
            raise _fail("messages: Input should be a valid list", "messages")
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                raise _fail(
                    f"messages.{i}: Input should be a valid dictionary or object to "
                    f"extract fields from",
                    f"messages.{i}",
                )
            if "role" not in message:
                raise _fail(f"messages.{i}.role: Field required", f"messages.{i}.role")
            if message["role"] not in ROLES:
                raise _fail(
                    f"messages.{i}.role: Input should be 'user' or 'assistant'",
                    f"messages.{i}.role",
                )
            if "content" not in message:
                raise _fail(f"messages.{i}.content: Field required", f"messages.{i}.content")
            content = message["content"]
            if isinstance(content, list):
                _validate_blocks(content, f"messages.{i}.content")
            elif not isinstance(content, str):
                raise _fail(
                    f"messages.{i}.content: Input should be a valid string or a valid "
                    f"list, but got {_list_type(content)}",
                    f"messages.{i}.content",
                )
        system = body.get("system")
        if isinstance(system, list):
            _validate_blocks(system, "system")
        elif system is not None and not isinstance(system, str):
            raise _fail("system: Input should be a valid string or a valid list", "system")
        for key, types, kind in (
            ("stream", (bool,), "boolean"),
            ("tools", (list,), "list"),
            ("tool_choice", (dict,), "dictionary"),
            ("metadata", (dict,), "dictionary"),
        ):
            if key in body and body[key] is not None and not isinstance(body[key], types):
                raise _fail(f"{key}: Input should be a valid {kind}", key)

    def written(self, body: JSON) -> JSON:
        return _strip_cache_control(
            {
                "model": body.get("model"),
                "system": body.get("system"),
                "messages": [
                    {k: v for k, v in m.items() if k in ("role", "content")}
                    if isinstance(m, dict)
                    else m
                    for m in body.get("messages", [])
                ],
                "tools": body.get("tools"),
                "tool_choice": body.get("tool_choice"),
            }
        )

    def equivalent(self, written: Any) -> Any:
        """``system`` and a message's content as one text block are their string; a tool's
        ``eager_input_streaming`` (how its input streams, not what it is) is dropped;
        ``tool_choice: {"type": "auto"}`` is the default."""
        messages = text_contents(written["messages"])
        choice = written["tool_choice"]
        if (
            isinstance(choice, dict)
            and choice.get("type") == "auto"
            and not choice.get("disable_parallel_tool_use")
            and set(choice) <= _AUTO_KEYS
        ):
            choice = None
        return {
            **written,
            "system": one_text(written["system"]),
            "messages": messages,
            "tools": without_keys(written["tools"], _STREAMING_ONLY),
            "tool_choice": choice,
        }

    # -- responses --------------------------------------------------------------

    def is_answer(self, body: JSON) -> bool:
        return isinstance(body, dict) and body.get("type") == "message"

    def _json_answer(self, body: JSON) -> JSON:
        """A broken tool input (a string, see the module doc) is what the API returns for a
        tool call cut off by max_tokens: an empty object."""
        return _json_body(body)

    def stream_frames(self, message: Mapping[str, Any]) -> list[str]:
        """SSE frames equivalent to a `message` body, as the API would stream it."""
        usage = message.get("usage")
        start = {k: v for k, v in message.items() if k != "content"}
        start.update(content=[], stop_reason=None, stop_sequence=None)
        if isinstance(usage, dict):
            start["usage"] = {**usage, "output_tokens": min(1, usage.get("output_tokens") or 0)}
        frames = [event_frame({"type": "message_start", "message": start})]
        blocks = message.get("content") or []
        for index, block in enumerate(blocks):
            frames.extend(_block_frames(index, block))
            if index == 0:
                frames.insert(2, event_frame({"type": "ping"}))
        if not blocks:
            frames.append(event_frame({"type": "ping"}))
        delta_usage: dict[str, Any] = {"output_tokens": (usage or {}).get("output_tokens", 0)}
        frames.append(
            event_frame(
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": message.get("stop_reason"),
                        "stop_sequence": message.get("stop_sequence"),
                    },
                    "usage": delta_usage,
                }
            )
        )
        frames.append(event_frame({"type": "message_stop"}))
        return frames

    def models_body(self, model_ids: Sequence[str]) -> JSON:
        """Anthropic's own list shape (what its SDK's ``models.list`` reads)."""
        return {
            "data": [
                {
                    "type": "model",
                    "id": model,
                    "display_name": model,
                    "created_at": "1970-01-01T00:00:00Z",
                }
                for model in model_ids
            ],
            "has_more": False,
            "first_id": model_ids[0] if model_ids else None,
            "last_id": model_ids[-1] if model_ids else None,
        }

    # -- assembly ---------------------------------------------------------------

    def assemble(self, frames: Sequence[str]) -> JSON:
        message: dict[str, Any] = {}
        blocks: dict[int, dict[str, Any]] = {}
        buffers: dict[int, str] = {}
        for name, data in iter_events(frames):
            event = json.loads(data)
            kind = event.get("type", name)
            if kind == "error":
                return event
            if kind == "message_start":
                message = copy.deepcopy(event["message"])
            elif kind == "content_block_start":
                blocks[event["index"]] = copy.deepcopy(event["content_block"])
            elif kind == "content_block_delta":
                _apply_delta(blocks[event["index"]], event["delta"], buffers, event["index"])
            elif kind == "content_block_stop":
                text = buffers.pop(event["index"], "")
                if text:
                    blocks[event["index"]]["input"] = json.loads(text)
            elif kind == "message_delta":
                message.update(event.get("delta") or {})
                usage = event.get("usage") or {}
                message.setdefault("usage", {}).update(
                    {k: v for k, v in usage.items() if v is not None}
                )
            elif kind == "message_stop":
                break
        message["content"] = [blocks[i] for i in sorted(blocks)]
        return message

    def stream_complete(self, frames: Sequence[str]) -> bool:
        return any(kind in ("message_stop", "error") for kind in event_types(frames))

    # -- fallback ---------------------------------------------------------------

    def fallback(self, body: JSON, digest: str) -> JSON:
        return {
            "id": "msg_chaosllm" + digest[:24],
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "") if isinstance(body, dict) else "",
            "content": [
                {
                    "type": "text",
                    "text": f"[chaosllm fallback] No recording matches this request "
                    f"(digest {digest}).",
                }
            ],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }


_ERROR_START = b'{"type": "error"'
"""How every error body chaosllm writes begins (``json.dumps`` of `_envelope`'s)."""


class AnthropicMessagesErrors(Errors):
    """`AnthropicMessages`'s errors: its envelope, its failure classes, its rate-limit headers."""

    codec: AnthropicMessagesCodec

    def _envelope(
        self, status: int, message: str, kind: str | None, code: str | None, param: str | None
    ) -> dict[str, Any]:
        """``{"type": "error", "error": {"type", "message"}}`` (no code, no param; a miss,
        chaosllm's own, also says its ``code``, so that it cannot pass for a wrong model)."""
        type_ = _KIND_TYPES.get(kind or "") or _error_type(status)
        error = {"type": type_, "message": message}
        if kind == ErrorKind.NO_MATCH and code is not None:
            error["code"] = code
        return {"type": "error", "error": error}

    request_id_headers = ("request-id",)
    request_id_form = "anthropic"

    def _stamp_body(self, plan: ResponsePlan, ident: str) -> ResponsePlan:
        """An error body (``{"type": "error", ...}``, whatever the status) says its
        ``request_id`` too, as the API's do (the SDK's ``ErrorResponse.request_id``)."""
        if len(plan.pieces) != 1 or plan.pieces[0].frame:
            return plan
        data = plan.pieces[0].data
        if not data.startswith(_ERROR_START) or b'"request_id"' in data:
            return plan
        try:
            body = json.loads(data)
        except ValueError:
            return plan
        if not isinstance(body, dict) or body.get("type") != "error":
            return plan
        body["request_id"] = ident
        stamped = json.dumps(body, ensure_ascii=False).encode("utf-8")
        return plan.with_(pieces=(Piece(stamped, plan.pieces[0].delay_ms, frame=False),))

    def throttle_headers(self, reset: float, wall: float) -> tuple[tuple[str, str], ...]:
        """The requests left (none) and when the bucket is full again (RFC 3339)."""
        return (
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", rfc3339(wall + reset)),
        )

    def rate_limit_headers(self, state: RateLimitState) -> tuple[tuple[str, str], ...]:
        """``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,
        remaining,reset}``, resets as RFC 3339 times."""
        headers: list[tuple[str, str]] = []
        for name, meter in (
            ("requests", state.requests),
            ("tokens", state.tokens),
            ("input-tokens", state.input_tokens),
            ("output-tokens", state.output_tokens),
        ):
            if meter is not None:
                headers += [
                    (f"anthropic-ratelimit-{name}-limit", str(meter.limit)),
                    (f"anthropic-ratelimit-{name}-remaining", str(meter.remaining)),
                    (f"anthropic-ratelimit-{name}-reset", rfc3339(state.wall + meter.reset)),
                ]
        return tuple(headers)

    def failure_status(self, failure: Failure) -> int:
        """529 for an overload; a spent credit balance is a 400."""
        return _FAILURE_STATUSES.get(failure) or super().failure_status(failure)

    def failure_message(self, failure: Failure, request: JSON) -> str:
        if failure is Failure.CONTEXT_TOO_LONG:
            tokens = CONTEXT_WINDOW + estimated_tokens(request)
            return f"prompt is too long: {tokens} tokens > {CONTEXT_WINDOW} maximum"
        if failure is Failure.QUOTA_EXHAUSTED:
            return (
                "Your credit balance is too low to access the Anthropic API. Please go to "
                "Plans & Billing to upgrade or purchase credits."
            )
        if failure is Failure.KEY_REFUSED:
            return "invalid x-api-key"
        if failure is Failure.NO_SUCH_MODEL:
            return f"model: {self.codec.model_of(request)}"
        return "Overloaded"


class AnthropicMessagesFaults(FaultHooks):
    """`AnthropicMessages`'s fault hooks: how its streams end and its answers break."""

    codec: AnthropicMessagesCodec
    errors: AnthropicMessagesErrors

    arguments_key = "input"
    finishing_events = frozenset({"message_delta", "message_stop", "error"})

    # -- what faults need -------------------------------------------------------

    def stream_error_frame(self, message: str, *, status: int) -> bytes:
        return event_frame(self.errors.error_answer(message, status=status)).encode("utf-8")

    def empty_answer(self, body: JSON) -> JSON:
        empty = copy.deepcopy(body)
        empty["content"] = []
        empty["stop_reason"] = "end_turn"
        empty["stop_sequence"] = None
        usage = empty.get("usage")
        if isinstance(usage, dict):
            usage["output_tokens"] = 0
        return empty

    def tool_calls(self, answer: Any) -> Iterator[dict[str, Any]]:
        for block in answer.get("content") or []:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                yield block

    def last_user_text(self, body: JSON) -> str | None:
        messages = body.get("messages") if isinstance(body, dict) else None
        return facts.last_user_text(messages, _TEXT_BLOCKS)

    def tool_names(self, body: JSON) -> frozenset[str]:
        return facts.offered_tool_names(body)

    def called_tool_names(self, answer: JSON) -> frozenset[str]:
        return facts.called_names(answer, "content", _CALLS)

    def break_tool_arguments(self, body: JSON) -> JSON | None:
        broken = super().break_tool_arguments(body)
        if broken is not None:
            broken["stop_reason"] = "max_tokens"
        return broken

    # -- broken tool arguments on a live stream ----------------------------------

    def break_argument_deltas(self, frame: bytes, cut: ArgumentCuts) -> bytes | None:
        """Each ``input_json_delta``'s ``partial_json`` as ``cut(block index, text)``, and
        once some input is broken the ``message_delta``'s ``stop_reason: max_tokens``, as
        `break_tool_arguments` says; a changed event is written again as one frame."""
        found = one_event(frame)
        if found is None:
            return frame
        name, kind, event = found
        delta = event.get("delta")
        if not isinstance(delta, dict):
            return frame
        if kind == "content_block_delta" and delta.get("type") == "input_json_delta":
            text = delta.get("partial_json")
            if not isinstance(text, str):
                return frame
            new = cut(event.get("index"), text)
            if new == text:
                return frame
            delta["partial_json"] = new
        elif kind == "message_delta" and cut.broken and delta.get("stop_reason") != "max_tokens":
            delta["stop_reason"] = "max_tokens"
        else:
            return frame
        data = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
        return f"event: {name or kind}\ndata: {data}\n\n".encode()

    def filtered_answer(self, answer: JSON) -> JSON | None:
        """``stop_reason: "refusal"``: the text blocks cut (`filtered_text`), no tool use."""
        if not self.codec.is_answer(answer):
            return None
        assert isinstance(answer, dict)
        filtered = copy.deepcopy(answer)
        blocks = filtered_blocks(filtered.get("content"), lambda b: b.get("type") in _CALLS)
        filtered.update(content=blocks, stop_reason="refusal", stop_sequence=None)
        return filtered


class AnthropicMessages(Provider):
    """The `anthropic.messages` provider (``POST /v1/messages``)."""

    parts = Parts(AnthropicMessagesCodec, AnthropicMessagesErrors, AnthropicMessagesFaults)

    name = "anthropic.messages"
    paths = ("/v1/messages",)
    client_header = "anthropic-version"


def _json_body(body: JSON) -> JSON:
    """A message as a JSON body: a broken tool input (a string, see the module doc) is
    what the API returns for a tool call cut off by max_tokens, an empty object."""
    if not isinstance(body, dict) or not any(
        isinstance(b, dict) and isinstance(b.get("input"), str) for b in body.get("content") or []
    ):
        return body
    fixed = copy.deepcopy(body)
    for block in fixed["content"]:
        if isinstance(block, dict) and isinstance(block.get("input"), str):
            block["input"] = {}
    return fixed


def _block_frames(index: int, block: Mapping[str, Any]) -> list[str]:
    kind = block.get("type")
    deltas: list[dict[str, Any]] = []
    start = dict(block)
    if kind == "text":
        start["text"] = ""
        start.pop("citations", None)
        deltas = [{"type": "text_delta", "text": p} for p in text_pieces(block.get("text", ""))]
    elif kind in ("tool_use", "server_tool_use"):
        value = block.get("input")
        text = value if isinstance(value, str) else json.dumps(value) if value else ""
        start["input"] = {}
        deltas = [{"type": "input_json_delta", "partial_json": ""}]
        deltas += [{"type": "input_json_delta", "partial_json": p} for p in _json_pieces(text)]
    elif kind == "thinking":
        start.update(thinking="", signature="")
        deltas = [
            {"type": "thinking_delta", "thinking": p}
            for p in text_pieces(block.get("thinking", ""))
        ]
        if block.get("signature"):
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
    frames = [event_frame({"type": "content_block_start", "index": index, "content_block": start})]
    frames += [
        event_frame({"type": "content_block_delta", "index": index, "delta": d}) for d in deltas
    ]
    frames.append(event_frame({"type": "content_block_stop", "index": index}))
    return frames


def _apply_delta(
    block: dict[str, Any], delta: Mapping[str, Any], buffers: dict[int, str], index: int
) -> None:
    kind = delta.get("type")
    if kind == "text_delta":
        block["text"] = block.get("text", "") + delta.get("text", "")
    elif kind == "input_json_delta":
        buffers[index] = buffers.get(index, "") + delta.get("partial_json", "")
    elif kind == "thinking_delta":
        block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
    elif kind == "signature_delta":
        block["signature"] = delta.get("signature", "")
    elif kind == "citations_delta":
        block.setdefault("citations", []).append(delta.get("citation"))
