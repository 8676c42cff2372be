"""OpenAI Chat Completions: canonical requests, plans, error envelopes, stream assembly.

Theory of operation
-------------------
The digest covers what decides the answer (model, messages reduced to
role/content/name/tool_call_id/tool_calls, tools, tool_choice,
response_format) and nothing of transport or sampling, so a streamed and a
non-streamed request hit the same recording.

A recording made from a stream keeps its exact frames: a stream request
replays them verbatim (their bytes, their recorded gaps scaled by `timing`),
except for the usage chunk, which the API sends if and only if
``stream_options.include_usage`` asks for it: a recorded one is dropped when
the request does not ask, and one is rendered from the answer's usage (before
``[DONE]``) when it asks and the recording has none. Otherwise frames are
rendered from the assembled body the way the API streams them: a role delta,
reasoning deltas, content (or refusal) deltas of a few words each, tool calls
(one delta with index, id, type and name, then argument fragments), the finish
chunk, the usage chunk when ``stream_options.include_usage`` is set, and
``data: [DONE]``. A non-stream request gets the assembled body as JSON,
whichever way it was recorded.

A stream recorded without ``include_usage`` has no usage: what is served from it
(a JSON answer, a usage chunk) gets an estimate (about four characters a token,
of the recorded request's messages and of the answer), and its messages the
``refusal: null`` every real answer has; the journal says ``estimated:
["usage"]``.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar

from chaosllm.model import JSON, RecordedChunk, RecordedResponse
from chaosllm.providers import facts
from chaosllm.providers.base import Parts, Provider
from chaosllm.providers.codec import Codec
from chaosllm.providers.conversation import CHAT_CHECKS
from chaosllm.providers.equivalence import function_defaults, text_contents
from chaosllm.providers.failures import Failure
from chaosllm.providers.faulthooks import FaultHooks
from chaosllm.providers.openai_common import (
    CONTENT_FILTER,
    OpenAIErrors,
    argument_pieces,
    expect,
    expect_object,
    expect_role,
    expect_type,
    expect_typed_fields,
    missing,
    require_object_with_model,
    typed_fields,
)
from chaosllm.providers.sse import DONE, DONE_FRAME, data_frame, iter_data
from chaosllm.providers.text import canonical_json, filtered_text, text_pieces

__all__ = [
    "CANONICAL_MESSAGE_KEYS",
    "DONE_FRAME",
    "OpenAIChat",
    "data_chunks",
    "iter_frame_payloads",
    "sse_frame",
]

CANONICAL_MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_call_id", "tool_calls"})
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
REASONING_KEYS = ("reasoning_content", "reasoning")

_TYPED_FIELDS = typed_fields(
    stream=bool, tools=list, stream_options=dict, response_format=dict, n=int
)

_FUNCTION_DEFAULTS: Mapping[str, JSON] = MappingProxyType({"strict": False})
"""A function tool's members at their documented default (``strict``: "Defaults to false")."""

_WITH_USAGE: tuple[str, Mapping[str, Any]] = (
    "sse+usage",
    MappingProxyType({"include_usage": True}),
)
_WITHOUT_USAGE: tuple[str, Mapping[str, Any]] = ("sse", MappingProxyType({"include_usage": False}))

_USAGE = ("usage",)
_CHUNK_BASE = ("id", "object", "created", "model", "service_tier", "system_fingerprint")

sse_frame = data_frame
"""One ``data:`` frame (`chaosllm.providers.sse.data_frame`)."""
iter_frame_payloads = iter_data
"""The data of each event in some frames (`chaosllm.providers.sse.iter_data`)."""


_TEXT_PARTS = frozenset({"text"})
"""The content parts holding text a user wrote (``match.contains`` reads them)."""


def _asks_usage(body: JSON) -> bool:
    options = body.get("stream_options") if isinstance(body, dict) else None
    return isinstance(options, dict) and options.get("include_usage") is True


def _is_done(frame: str) -> bool:
    return any(data.strip() == DONE for data in iter_data([frame]))


def _tokens(characters: int) -> int:
    """About four characters a token (the rule of thumb of OpenAI's tokenizer docs)."""
    return math.ceil(characters / 4)


def _data_chunks(frames: Sequence[str]) -> Iterator[dict[str, Any] | None]:
    """The JSON object of each data line of `frames`, None for ``[DONE]``; lines that are
    not a JSON object are passed over."""
    for data in iter_data(frames):
        if data.strip() == DONE:
            yield None
            continue
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            continue
        if isinstance(chunk, dict):
            yield chunk


data_chunks = _data_chunks
"""The JSON object of each data line of some frames, None for ``[DONE]`` (shared with the
protocols built on Chat Completions)."""


_SAFE_FILTERS = {
    name: {"filtered": False, "severity": "safe"}
    for name in ("hate", "self_harm", "sexual", "violence")
}
"""Azure's filter results of text that passed every filter."""


def _answer_base(answer: Mapping[str, Any]) -> dict[str, Any]:
    """The fields every chunk of a stream of `answer` starts with."""
    base = {k: answer[k] for k in _CHUNK_BASE if k in answer}
    base["object"] = "chat.completion.chunk"
    return base


def _usage_chunk(frame: str, *, base: bool = False) -> dict[str, Any] | None:
    """The usage chunk a frame is (``choices: []`` and a usage), else None; with `base`,
    the fields every chunk of a frame starts with (id, object, created, model...)."""
    for chunk in _data_chunks([frame]):
        if chunk is None:
            continue
        if base:
            if not chunk.get("object"):
                continue  # Azure's prompt-filter chunk: no id, object or model of its own
            return {k: chunk[k] for k in _CHUNK_BASE if k in chunk}
        if chunk.get("choices") == [] and chunk.get("usage") is not None:
            return chunk
    return None


def _with_refusal(answer: dict[str, Any]) -> dict[str, Any]:
    """`answer` with ``refusal: null`` on each message lacking one (the API's messages
    always carry it); `answer` itself when none lacks it."""
    choices = answer.get("choices")
    messages = [c.get("message") for c in choices or () if isinstance(c, dict)]
    if all(not isinstance(m, dict) or "refusal" in m for m in messages):
        return answer
    served = copy.deepcopy(answer)
    for choice in served["choices"]:
        if isinstance(choice, dict) and isinstance(choice.get("message"), dict):
            choice["message"].setdefault("refusal", None)
    return served


def _no_text_beside_calls(message: JSON) -> JSON:
    """An assistant message with tool calls and an empty (or no) content, with ``content:
    null``: the content is "required unless tool_calls ... is specified"."""
    if (
        isinstance(message, dict)
        and message.get("role") == "assistant"
        and message.get("tool_calls")
        and message.get("content", None) in ("", [], None)
    ):
        return {**message, "content": None}
    return message


class OpenAIChatCodec(Codec):
    """`OpenAIChat`'s codec: its requests' canonical form, its answers' framing."""

    conversation = CHAT_CHECKS
    minted_prefixes = ("chatcmpl-", "call_")

    # -- requests ---------------------------------------------------------------

    def validate(self, body: JSON) -> None:
        body = require_object_with_model(body, "messages")
        messages = body["messages"]
        expect_type(messages, (list,), "messages", "an array")
        expect(
            len(messages) > 0,
            "Invalid 'messages': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.",
            "messages",
            "empty_array",
        )
        for i, value in enumerate(messages):
            message = expect_object(value, f"messages[{i}]")
            role = expect_role(message, ROLES, f"messages[{i}]")
            if message.get("content") is not None:
                expect_type(
                    message["content"],
                    (str, list),
                    f"messages[{i}].content",
                    "one of a string or array of objects",
                )
            if role == "tool" and not isinstance(message.get("tool_call_id"), str):
                raise missing(f"messages[{i}].tool_call_id")
        expect_typed_fields(body, _TYPED_FIELDS)

    def written(self, body: JSON) -> JSON:
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

    def equivalent(self, written: Any, *, defaults: bool = True) -> Any:
        """A message's content as one text part is its string; ``tool_choice`` at its
        default (``auto`` with tools, ``none`` without) is no tool_choice; a function's
        ``strict: false`` (the default) is no ``strict``; an assistant message with tool
        calls and no text (``""``, ``[]`` or no content) has ``content: null``."""
        messages = text_contents(written["messages"])
        choice = written["tool_choice"]
        if choice == ("auto" if written["tools"] else "none"):
            choice = None
        tools = written["tools"]
        if defaults:
            tools = function_defaults(tools, _FUNCTION_DEFAULTS)
            messages = [_no_text_beside_calls(m) for m in messages]
        return {**written, "messages": messages, "tools": tools, "tool_choice": choice}

    def earlier_forms(self, written: Any) -> Sequence[Any]:
        """Before a function's ``strict: false`` was its default, and an empty content
        beside tool calls null."""
        return (self.equivalent(written, defaults=False),)

    def stream_variant(self, body: JSON) -> tuple[str, Mapping[str, Any]]:
        """With ``stream_options.include_usage`` the stream ends with the usage chunk."""
        return _WITH_USAGE if _asks_usage(body) else _WITHOUT_USAGE

    def _recorded_frames(
        self, response: RecordedResponse, options: Mapping[str, Any], request: JSON
    ) -> Sequence[RecordedChunk]:
        """The recorded frames, with the usage chunk if and only if it is asked for: a
        recorded one is dropped when not, one rendered from the answer's usage is added
        before ``[DONE]`` when asked and none was recorded."""
        chunks = response.chunks
        assert chunks is not None
        at = next((i for i, c in enumerate(chunks) if _usage_chunk(c.data) is not None), None)
        wanted = bool(options.get("include_usage"))
        if wanted == (at is not None):
            return chunks
        if at is not None:
            return chunks[:at] + chunks[at + 1 :]
        first = next((b for c in chunks if (b := _usage_chunk(c.data, base=True))), None)
        answer = self.served_answer(response.body, request)
        payload = {**(first or {}), "choices": [], "usage": answer.get("usage")}
        end = next((i for i, c in enumerate(chunks) if _is_done(c.data)), len(chunks))
        return (*chunks[:end], RecordedChunk(data_frame(payload)), *chunks[end:])

    def served_answer(self, answer: JSON, request: JSON) -> JSON:
        """An answer without usage (a stream recorded without ``include_usage``) gets an
        estimated one, and its messages the ``refusal: null`` every real answer has."""
        if not isinstance(answer, dict) or "choices" not in answer:
            return answer
        if answer.get("usage") is not None:
            return _with_refusal(answer)
        served = copy.deepcopy(answer)
        written = 0
        for choice in served.get("choices") or []:
            message = choice.get("message") if isinstance(choice, dict) else None
            if not isinstance(message, dict):
                continue
            message.setdefault("refusal", None)
            for key in ("content", "refusal", *REASONING_KEYS):
                if isinstance(message.get(key), str):
                    written += len(message[key])
            for call in message.get("tool_calls") or []:
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict):
                    written += len(str(function.get("name") or ""))
                    written += len(str(function.get("arguments") or ""))
        messages = request.get("messages") if isinstance(request, dict) else None
        prompt = _tokens(len(canonical_json(messages))) if messages else 0
        completion = _tokens(written)
        served["usage"] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        return served

    def estimated(self, response: RecordedResponse, body: JSON) -> tuple[str, ...]:
        answer = response.body
        if (
            response.status >= 400
            or not isinstance(answer, dict)
            or answer.get("usage") is not None
            or "choices" not in answer
        ):
            return ()
        if self.wants_stream(body) and not _asks_usage(body):
            return ()
        return _USAGE

    # -- responses --------------------------------------------------------------

    def is_answer(self, body: JSON) -> bool:
        return isinstance(body, dict) and "choices" in body

    def stream_frames(
        self, completion: Mapping[str, Any], *, include_usage: bool = False
    ) -> list[str]:
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
            return data_frame(payload)

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
            frames.append(data_frame(payload))
        frames.append(DONE_FRAME)
        return frames

    # -- assembly ---------------------------------------------------------------

    def assemble(self, frames: Sequence[str]) -> JSON:
        completion: dict[str, Any] = {}
        choices: dict[int, dict[str, Any]] = {}
        for data in iter_data(frames):
            if data.strip() == DONE:
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
        for data in iter_data(frames):
            last = data
        if last is None:
            return False
        if last.strip() == DONE:
            return True
        try:
            chunk = json.loads(last)
        except json.JSONDecodeError:
            return False
        # The API ends a stream that fails with an error event (and no [DONE]).
        return isinstance(chunk, dict) and "error" in chunk and "choices" not in chunk

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


class OpenAIChatFaults(FaultHooks):
    """`OpenAIChat`'s fault hooks: how its streams end and its answers break."""

    codec: OpenAIChatCodec
    errors: OpenAIErrors

    gateway_compatible = True

    # -- what the wire quirks need ----------------------------------------------

    def usage_frame(self, answer: JSON) -> bytes | None:
        """The usage chunk (``choices: []``) of a stream of `answer` (its usage, estimated
        when it has none)."""
        if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list):
            return None
        served = self.codec.served_answer(answer, None)
        payload = {**_answer_base(answer), "choices": [], "usage": served.get("usage")}
        return data_frame(payload).encode("utf-8")

    def carries_usage(self, frame: bytes) -> bool:
        return _usage_chunk(frame.decode("utf-8", "replace")) is not None

    def filter_frames(self, answer: JSON) -> tuple[bytes, bytes] | None:
        """Azure's: first the prompt's filter results (``choices: []``, empty id and model),
        last each choice's asynchronous filter results and offsets, as Azure sends them
        around a stream (the answer's own results, else all "safe"); with an empty delta,
        which Azure leaves out (the openai SDK then gives ``delta=None``), so that the
        stream stays valid Chat Completions."""
        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not isinstance(choices, list):
            return None
        empty = {"created": 0, "id": "", "model": "", "object": ""}
        prompt = answer.get("prompt_filter_results") or [
            {"prompt_index": 0, "content_filter_results": _SAFE_FILTERS}
        ]
        trailing = []
        for i, choice in enumerate(choices):
            choice = choice if isinstance(choice, dict) else {}
            content = (choice.get("message") or {}).get("content")
            size = len(content) if isinstance(content, str) else 0
            results = choice.get("content_filter_results") or _SAFE_FILTERS
            trailing.append(
                {
                    "content_filter_offsets": {
                        "check_offset": 0,
                        "start_offset": 0,
                        "end_offset": size,
                    },
                    "content_filter_results": results,
                    "delta": {},
                    "finish_reason": None,
                    "index": choice.get("index", i),
                }
            )
        first = data_frame({"choices": [], **empty, "prompt_filter_results": prompt})
        last = data_frame({"choices": trailing, **empty})
        return first.encode("utf-8"), last.encode("utf-8")

    def restated_arguments(self, answer: JSON) -> dict[int, dict[int, str]] | None:
        found: dict[int, dict[int, str]] = {}
        choices = answer.get("choices") if isinstance(answer, dict) else None
        for i, choice in enumerate(choices if isinstance(choices, list) else ()):
            message = choice.get("message") if isinstance(choice, dict) else None
            calls = message.get("tool_calls") if isinstance(message, dict) else None
            for k, call in enumerate(calls if isinstance(calls, list) else ()):
                function = call.get("function") if isinstance(call, dict) else None
                arguments = function.get("arguments") if isinstance(function, dict) else None
                if isinstance(arguments, str) and arguments:
                    found.setdefault(choice.get("index", i), {})[call.get("index", k)] = arguments
        return found or None

    def restate_arguments(self, frame: bytes, arguments: Mapping[int, Mapping[int, str]]) -> bytes:
        """The finish chunk of a choice with tool calls, its delta carrying every call's
        complete arguments again (``{"index": k, "function": {"arguments": ...}}``)."""
        chunks = list(_data_chunks([frame.decode("utf-8", "replace")]))
        if len(chunks) != 1 or chunks[0] is None:
            return frame
        chunk, changed = chunks[0], False
        for choice in chunk.get("choices") or []:
            calls = arguments.get(choice.get("index", 0)) if isinstance(choice, dict) else None
            if calls and choice.get("finish_reason"):
                delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
                delta["tool_calls"] = [
                    {"index": k, "function": {"arguments": calls[k]}} for k in sorted(calls)
                ]
                choice["delta"], changed = delta, True
        return data_frame(chunk).encode("utf-8") if changed else frame

    # -- what faults need -------------------------------------------------------

    def break_argument_deltas(
        self, frame: bytes, cut: Callable[[object, str], str]
    ) -> bytes | None:
        """A chunk's ``delta.tool_calls[].function.arguments``, each replaced by
        ``cut((choice index, call index), text)``; a changed chunk is written again as one
        ``data:`` frame."""
        if not frame:
            return frame
        chunks = list(_data_chunks([frame.decode("utf-8", "replace")]))
        if len(chunks) != 1 or chunks[0] is None:
            return frame
        chunk, changed = chunks[0], False
        for i, choice in enumerate(chunk.get("choices") or ()):
            delta = choice.get("delta") if isinstance(choice, dict) else None
            calls = delta.get("tool_calls") if isinstance(delta, dict) else None
            for k, call in enumerate(calls if isinstance(calls, list) else ()):
                function = call.get("function") if isinstance(call, dict) else None
                text = function.get("arguments") if isinstance(function, dict) else None
                if isinstance(text, str):
                    assert isinstance(function, dict)
                    new = cut((choice.get("index", i), call.get("index", k)), text)
                    if new != text:
                        function["arguments"], changed = new, True
        return data_frame(chunk).encode("utf-8") if changed else frame

    def frame_finishes(self, frame: str) -> bool:
        """A finish chunk, the usage chunk, [DONE] or an error."""
        for chunk in _data_chunks((frame,)):
            if chunk is None:
                return True
            choices = chunk.get("choices")
            if "error" in chunk or choices == []:
                return True
            if isinstance(choices, list) and any(
                isinstance(c, dict) and c.get("finish_reason") for c in choices
            ):
                return True
        return False

    def stream_error_frame(self, message: str, *, status: int) -> bytes:
        return data_frame(self.errors.error_answer(message, status=status)).encode("utf-8")

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

    def tool_calls(self, answer: Any) -> Iterator[dict[str, Any]]:
        for choice in answer.get("choices") or []:
            for call in (choice.get("message") or {}).get("tool_calls") or []:
                yield call.setdefault("function", {})

    def filtered_answer(self, answer: JSON) -> JSON | None:
        """Each choice's content cut (`filtered_text`; null if it had none), no tool calls,
        ``finish_reason: "content_filter"``."""
        if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list):
            return None
        filtered = copy.deepcopy(answer)
        for choice in filtered["choices"]:
            if not isinstance(choice, dict):
                continue
            message = choice.setdefault("message", {})
            for key in ("tool_calls", "function_call"):
                message.pop(key, None)
            content = message.get("content")
            message["content"] = filtered_text(content) if isinstance(content, str) else None
            choice["finish_reason"] = CONTENT_FILTER
        return filtered

    def failure_frame(self, failure: Failure, request: JSON, message: str | None = None) -> bytes:
        """``data: {"error": ...}`` with the class's type and code."""
        return data_frame(self.errors.failure(failure, request, message).body).encode("utf-8")

    def last_user_text(self, body: JSON) -> str | None:
        messages = body.get("messages") if isinstance(body, dict) else None
        return facts.last_user_text(messages, _TEXT_PARTS)

    def tool_names(self, body: JSON) -> frozenset[str]:
        if not isinstance(body, dict):
            return frozenset()
        return facts.tool_names(body.get("tools"), body.get("functions"))

    def called_tool_names(self, answer: JSON) -> frozenset[str]:
        choices = answer.get("choices") if isinstance(answer, dict) else None
        calls: list[Any] = []
        for choice in choices if isinstance(choices, list) else ():
            message = choice.get("message") if isinstance(choice, dict) else None
            if not isinstance(message, dict):
                continue
            listed = message.get("tool_calls")
            for call in listed if isinstance(listed, list) else ():
                if isinstance(call, dict):
                    calls.append(call.get("function"))
            calls.append(message.get("function_call"))  # the legacy single call
        return facts.names_of(calls)


class OpenAIChat(Provider):
    """The `openai.chat` provider (``POST /v1/chat/completions``)."""

    parts = Parts(OpenAIChatCodec, OpenAIErrors, OpenAIChatFaults)

    name = "openai.chat"
    paths: ClassVar[tuple[str, ...]] = ("/v1/chat/completions", "/chat/completions")


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
