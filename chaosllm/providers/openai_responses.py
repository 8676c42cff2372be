"""OpenAI Responses API (``POST /v1/responses``): requests, plans, errors, stream assembly.

Theory of operation
-------------------
The digest covers what decides the answer (model, instructions, input, tools,
tool_choice, text.format, and the server-side conversation it continues:
``previous_response_id``, ``conversation``, when set) and nothing of transport,
sampling or storage (stream, temperature, max_output_tokens, store, metadata),
so a streamed and a non-streamed request hit the same recording. The ids of a
server-side conversation are replay-stable (the recorded answers minted them),
so two conversations asking the same follow-up get their own answers.

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
from typing import Any, ClassVar

from chaosllm.model import JSON, ResponsePlan
from chaosllm.providers import facts
from chaosllm.providers.base import Parts, Provider
from chaosllm.providers.codec import Codec
from chaosllm.providers.conversation import RESPONSES_CHECKS
from chaosllm.providers.equivalence import one_text
from chaosllm.providers.failures import Failure
from chaosllm.providers.faulthooks import ArgumentCuts, FaultHooks
from chaosllm.providers.openai_common import (
    CONTENT_FILTER,
    OpenAIErrors,
    argument_pieces,
    expect_object,
    expect_role,
    expect_type,
    expect_typed_fields,
    missing,
    openai_envelope,
    openai_error_type,
    require_object_with_model,
    typed_fields,
)
from chaosllm.providers.sse import event_frame, event_types, iter_events, one_event
from chaosllm.providers.text import canonical_json, filtered_text, text_pieces

__all__ = ["OpenAIResponses", "iter_events", "sse_event"]

_THREAD_KEYS = ("previous_response_id", "conversation")
_NO_THREAD = ("null", "null")
_TEXT_PARTS = frozenset({"input_text", "text"})
"""The content parts holding text a user wrote (``match.contains`` reads them)."""
_CALLS = frozenset({"function_call", "custom_tool_call"})
"""The output items that call a tool by name (``match.tool`` reads them)."""

TERMINAL_EVENTS = frozenset(
    {"response.completed", "response.failed", "response.incomplete", "error"}
)
INPUT_ROLES = frozenset({"user", "assistant", "system", "developer"})

_TYPED_FIELDS = typed_fields(
    stream=bool,
    instructions=str,
    tools=list,
    text=dict,
    reasoning=dict,
    metadata=dict,
    max_output_tokens=int,
    store=bool,
)

sse_event = event_frame
"""One Responses stream frame: ``event: <type>`` and its JSON data (`sse.event_frame`)."""


def _easy_message(item: JSON) -> JSON:
    """An input message in its shortest form (see `OpenAIResponsesCodec.equivalent`)."""
    if not (isinstance(item, dict) and "role" in item and item.get("type", "message") == "message"):
        return item
    easy = {k: v for k, v in item.items() if k != "type"}
    if "content" in easy:
        easy["content"] = one_text(easy["content"], ("input_text", "output_text"))
    return easy


def _referenced(item: JSON) -> JSON:
    """An item passed back with the id the API gave it, as the ``item_reference`` to that
    id (see `OpenAIResponsesCodec.equivalent`); any other item as it is."""
    if isinstance(item, dict) and isinstance(item.get("id"), str):
        return {"type": "item_reference", "id": item["id"]}
    return item


def _is_user_text(item: JSON) -> bool:
    return (
        isinstance(item, dict)
        and set(item) == {"role", "content"}
        and item["role"] == "user"
        and isinstance(item["content"], str)
    )


def _strip_status(item: JSON) -> JSON:
    if isinstance(item, dict):
        return {k: v for k, v in item.items() if k != "status"}
    return item


class OpenAIResponsesCodec(Codec):
    """`OpenAIResponses`'s codec: its requests' canonical form, its answers' framing."""

    conversation = RESPONSES_CHECKS
    turn_key = "input"
    minted_prefixes = ("resp_", "msg_", "fc_", "call_", "rs_")

    # -- requests ---------------------------------------------------------------

    def validate(self, body: JSON) -> None:
        body = require_object_with_model(body, "input")
        items = body["input"]
        expect_type(items, (str, list), "input", "one of a string or array of input items")
        for i, value in enumerate(items if isinstance(items, list) else []):
            where = f"input[{i}]"
            item = expect_object(value, where)
            kind = item.get("type", "message")
            if kind == "message":
                expect_role(item, INPUT_ROLES, where)
                expect_type(
                    item.get("content"),
                    (str, list),
                    f"{where}.content",
                    "one of a string or array of input content",
                )
            elif kind == "function_call_output":
                for key in ("call_id", "output"):
                    if key not in item:
                        raise missing(f"{where}.{key}")
            elif kind == "function_call":
                for key in ("call_id", "name", "arguments"):
                    if not isinstance(item.get(key), str):
                        raise missing(f"{where}.{key}")
        expect_typed_fields(body, _TYPED_FIELDS)
        for i, tool in enumerate(body.get("tools") or []):
            if not (isinstance(tool, dict) and isinstance(tool.get("type"), str)):
                raise missing(f"tools[{i}].type")
            if tool.get("type") == "function" and not isinstance(tool.get("name"), str):
                raise missing(f"tools[{i}].name")

    def written(self, body: JSON) -> JSON:
        items = body.get("input")
        text = body.get("text")
        canonical = {
            "model": body.get("model"),
            "instructions": body.get("instructions"),
            # An output item passed back as input keeps its content, not its status.
            "input": [_strip_status(i) for i in items] if isinstance(items, list) else items,
            "tools": body.get("tools"),
            "tool_choice": body.get("tool_choice"),
            "text_format": text.get("format") if isinstance(text, dict) else None,
        }
        # Only when set: the digests of requests without them stay what they were.
        for key in _THREAD_KEYS:
            if body.get(key) is not None:
                canonical[key] = body[key]
        return canonical

    def equivalent(self, written: Any, *, references: bool = True) -> Any:
        """An input message is the same with or without ``type: "message"``, its content
        as one ``input_text`` (``output_text``) part is its string, and an input of one
        user message with a string is that string; an item passed back with its ``id``
        is the ``item_reference`` to that id (the API resolves a reference to the item
        it names); ``tool_choice: "auto"`` is the default."""
        items = written["input"]
        if isinstance(items, list):
            items = [_easy_message(item) for item in items]
            if references:
                items = [_referenced(item) for item in items]
            if len(items) == 1 and _is_user_text(items[0]):
                items = items[0]["content"]
        choice = None if written["tool_choice"] == "auto" else written["tool_choice"]
        return {**written, "input": items, "tool_choice": choice}

    def earlier_forms(self, written: Any) -> Sequence[Any]:
        """Before an item passed back with its id was its reference."""
        return (self.equivalent(written, references=False),)

    def thread(self, body: JSON) -> Any:
        """``previous_response_id`` and ``conversation`` (None when neither is set)."""
        if not isinstance(body, dict):
            return None
        thread = tuple(canonical_json(body.get(key)) for key in _THREAD_KEYS)
        return None if thread == _NO_THREAD else thread

    # -- responses --------------------------------------------------------------

    def is_answer(self, body: JSON) -> bool:
        return isinstance(body, dict) and body.get("object") == "response"

    def stream_frames(self, response: Mapping[str, Any]) -> list[str]:
        """SSE frames equivalent to a `response` object, as the API would stream it."""
        frames: list[str] = []

        def emit(type_: str, **fields: Any) -> None:
            frames.append(event_frame({"type": type_, "sequence_number": len(frames), **fields}))

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
            emit(
                "response.function_call_arguments.done",
                **at,
                name=item.get("name"),
                arguments=arguments,
            )
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
                return openai_envelope(
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
        last = None
        for last in event_types(frames):  # noqa: B007 (the last event is what counts)
            pass
        return last in TERMINAL_EVENTS

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


class OpenAIResponsesErrors(OpenAIErrors):
    """`OpenAIResponses`'s errors: its envelope, its failure classes, its rate-limit headers."""

    codec: OpenAIResponsesCodec

    def failure_message(self, failure: Failure, request: JSON) -> str:
        if failure is Failure.CONTEXT_TOO_LONG:
            return (
                "Your input exceeds the context window of this model. Please adjust your "
                "input and try again."
            )
        return super().failure_message(failure, request)


class OpenAIResponsesFaults(FaultHooks):
    """`OpenAIResponses`'s fault hooks: how its streams end and its answers break."""

    codec: OpenAIResponsesCodec
    errors: OpenAIResponsesErrors

    finishing_events = TERMINAL_EVENTS

    def frame_tokens(self, data: bytes) -> int:
        """Only the ``*.delta`` events carry new text (``*.done`` and ``response.*``
        events restate what came before), at least 1."""
        tokens = 0
        for _, payload in iter_events([data.decode("utf-8", "replace")]):
            try:
                event = json.loads(payload)
            except ValueError:
                continue
            if isinstance(event, dict) and str(event.get("type", "")).endswith(".delta"):
                tokens += self.text_tokens({"delta": event.get("delta")})
        return max(1, tokens)

    # -- what faults need -------------------------------------------------------

    def stream_error_frame(self, message: str, *, status: int) -> bytes:
        _, code = openai_error_type(status)
        code = "rate_limit_exceeded" if status == 429 else code or "server_error"
        # `framed_error` continues the stream's sequence_number.
        return event_frame(
            {"type": "error", "code": code, "message": message, "param": None, "sequence_number": 0}
        ).encode("utf-8")

    def framed_error(self, frame: bytes, plan: ResponsePlan, kept: int) -> bytes:
        """The ``error`` event numbered after the events it follows: its
        ``sequence_number`` one past the highest of the first `kept` pieces (every
        event of a stream carries the next number)."""
        found = one_event(frame)
        if found is None:
            return frame
        numbers = []
        for piece in plan.pieces[:kept]:
            for _, data in iter_events([piece.data.decode("utf-8", "replace")]):
                try:
                    number = json.loads(data).get("sequence_number")
                except (ValueError, AttributeError):
                    continue
                if isinstance(number, int):
                    numbers.append(number)
        event = found[2]
        event["sequence_number"] = max(numbers) + 1 if numbers else kept
        return event_frame(event).encode("utf-8")

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

    def tool_calls(self, answer: Any) -> Iterator[dict[str, Any]]:
        for item in answer.get("output") or []:
            if isinstance(item, dict) and item.get("type") == "function_call":
                yield item

    def break_argument_deltas(self, frame: bytes, cut: ArgumentCuts) -> bytes | None:
        """Each ``function_call_arguments.delta`` as ``cut(output index, delta)``; the whole
        arguments a frame restates (``function_call_arguments.done``, a function call item
        added or done, the terminal response's output) as ``cut.whole``: the client's
        answer is the one its deltas make. A changed event is written again as one frame."""
        found = one_event(frame)
        if found is None:
            return frame
        name, kind, event = found
        at = event.get("output_index")
        changed = False

        def put(holder: dict[str, Any], field: str, key: object, whole: bool) -> None:
            nonlocal changed
            text = holder.get(field)
            if isinstance(text, str):
                new = cut.whole(key, text) if whole else cut(key, text)
                if new != text:
                    holder[field], changed = new, True

        def item(value: Any, key: object, whole: bool) -> None:
            if isinstance(value, dict) and value.get("type") == "function_call":
                put(value, "arguments", key, whole)

        if kind == "response.function_call_arguments.delta":
            put(event, "delta", at, False)
        elif kind == "response.function_call_arguments.done":
            put(event, "arguments", at, True)
        elif kind in ("response.output_item.added", "response.output_item.done"):
            item(event.get("item"), at, kind.endswith(".done"))
        elif kind in ("response.completed", "response.failed", "response.incomplete"):
            response = event.get("response")
            output = response.get("output") if isinstance(response, dict) else None
            for index, value in enumerate(output if isinstance(output, list) else ()):
                item(value, index, True)
        if not changed:
            return frame
        payload = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
        return f"event: {name or kind}\ndata: {payload}\n\n".encode()

    def failure_frame(self, failure: Failure, request: JSON, message: str | None = None) -> bytes:
        """An ``error`` event with the class's code."""
        error = self.errors.failure(failure, request, message).body
        details = error.get("error") if isinstance(error, dict) else None
        fields = details if isinstance(details, dict) else {}
        return event_frame(
            {
                "type": "error",
                "code": fields.get("code"),
                "message": fields.get("message"),
                "param": fields.get("param"),
                "sequence_number": 0,
            }
        ).encode("utf-8")

    def filtered_answer(self, answer: JSON) -> JSON | None:
        """``status: "incomplete"``, ``incomplete_details.reason: "content_filter"``, each
        message's text cut (`filtered_text`), no function calls."""
        if not isinstance(answer, dict) or not isinstance(answer.get("output"), list):
            return None
        filtered = copy.deepcopy(answer)
        output = []
        for item in filtered["output"]:
            if not isinstance(item, dict) or item.get("type") in _CALLS:
                continue
            if item.get("type") == "message":
                item["status"] = "incomplete"
                for part in item.get("content") or []:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        part["text"] = filtered_text(part["text"])
            output.append(item)
        filtered.update(
            output=output, status="incomplete", incomplete_details={"reason": CONTENT_FILTER}
        )
        return filtered

    def last_user_text(self, body: JSON) -> str | None:
        items = body.get("input") if isinstance(body, dict) else None
        if isinstance(items, str):
            return items  # a bare prompt
        return facts.last_user_text(items, _TEXT_PARTS)

    def tool_names(self, body: JSON) -> frozenset[str]:
        return facts.offered_tool_names(body)

    def called_tool_names(self, answer: JSON) -> frozenset[str]:
        return facts.called_names(answer, "output", _CALLS)


class OpenAIResponses(Provider):
    """The `openai.responses` provider (``POST /v1/responses``)."""

    parts = Parts(OpenAIResponsesCodec, OpenAIResponsesErrors, OpenAIResponsesFaults)

    name = "openai.responses"
    paths: ClassVar[tuple[str, ...]] = ("/v1/responses", "/responses")
