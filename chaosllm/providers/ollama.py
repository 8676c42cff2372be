"""Ollama's native API: ``/api/chat`` and ``/api/generate``, their NDJSON streams, errors
and the auxiliary answers (model list, version, embeddings). Pure.

Theory of operation
-------------------
Two providers share one base: `OllamaChat` (``ollama.chat``, ``POST /api/chat``,
a conversation of ``messages``) and `OllamaGenerate` (``ollama.generate``,
``POST /api/generate``, one ``prompt``). Ollama streams by DEFAULT: a request
without ``stream`` (or with ``stream: true``) gets a stream, ``stream: false``
one JSON object. The digest covers what decides the answer (the model, with
Ollama's implicit ``:latest`` tag dropped, so ``llama3.2`` and
``llama3.2:latest`` are one model; the messages reduced to role, content,
images, tool calls and tool name, or the prompt, suffix, system and context;
tools, format, think) and nothing of transport or sampling (stream, options,
keep_alive).

A stream is NDJSON (``application/x-ndjson``, `chaosllm.providers.ndjson`):
one JSON object per line, each carrying ``model``, ``created_at`` and a
fragment (``message.content`` / ``message.thinking`` for chat, ``response`` /
``thinking`` for generate) with ``done: false``; tool calls come whole in one
line (``message.tool_calls[].function.arguments`` is a JSON object, never a
string); the last line has ``done: true``, ``done_reason`` and the counters
(``total_duration``, ``load_duration``, ``prompt_eval_count``,
``prompt_eval_duration``, ``eval_count``, ``eval_duration``; generate's
``context`` too). The non-stream answer is that last line with the whole
message (or response) in it: `assemble` is the inverse of `stream_frames`.

Errors are ``{"error": "<message>"}`` with the HTTP status (404 for a model
Ollama does not have: ``model "x" not found, try pulling it first``); an
error after a stream began is a line ``{"error": "..."}`` (the ``ollama``
client raises ``ResponseError`` on it, status code -1).

Faults: the frames that finish an answer are the ``done: true`` line and an
error line, so a cut keeps only ``done: false`` lines (a stream that simply
stops: the client's iterator just ends). The arguments of a tool call are an
object that cannot be invalid JSON, and Ollama itself parses the model's tool
call: when that fails it answers ``error parsing tool call: raw='...',
err=unexpected end of JSON input``, as a 500 for a JSON request and as an
error line in a stream. That is ``malformed_tool_args`` here: the tool call's
arguments are cut into their JSON text (a string, inside chaosllm only), and
an answer carrying one is rendered as that parse error.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Final

from chaosllm.errors import InvalidRequest
from chaosllm.model import JSON
from chaosllm.providers import facts, ndjson
from chaosllm.providers.base import Parts, Provider
from chaosllm.providers.codec import Codec, FrameSplitting
from chaosllm.providers.conversation import ConversationChecks, Finding, validate_conversation
from chaosllm.providers.embeddings import FALLBACK_DIMENSIONS, MAX_DIMENSIONS, embed
from chaosllm.providers.errors import Errors
from chaosllm.providers.failures import Failure
from chaosllm.providers.faulthooks import ArgumentCuts, FaultHooks
from chaosllm.providers.text import filtered_text, text_pieces, type_name

__all__ = [
    "CHAT_PATH",
    "EMBEDDINGS_PATH",
    "EMBED_PATH",
    "GENERATE_PATH",
    "OLLAMA_VERSION",
    "SHOW_PATH",
    "TAGS_PATH",
    "VERSION_PATH",
    "OllamaChat",
    "OllamaGenerate",
    "embed_body",
    "embeddings_body",
    "error_envelope",
    "model_name",
    "not_found_message",
    "show_body",
    "tags_body",
    "version_body",
]

CHAT_PATH: Final = "/api/chat"
GENERATE_PATH: Final = "/api/generate"
EMBED_PATH: Final = "/api/embed"
EMBEDDINGS_PATH: Final = "/api/embeddings"
"""The legacy single-prompt embeddings endpoint."""
TAGS_PATH: Final = "/api/tags"
VERSION_PATH: Final = "/api/version"
SHOW_PATH: Final = "/api/show"
OLLAMA_VERSION: Final = "0.12.6"
"""The Ollama version `version_body` reports."""

_LATEST: Final = ":latest"
_COUNTERS: Final = (
    "total_duration",
    "load_duration",
    "prompt_eval_count",
    "prompt_eval_duration",
    "eval_count",
    "eval_duration",
)
_CHAT_MESSAGE_KEYS: Final = frozenset({"role", "content", "images", "tool_calls", "tool_name"})
_PARSE_FAILURE: Final = "unexpected end of JSON input"
_FAILURE_MESSAGES: Final[Mapping[Failure, str]] = {
    Failure.CONTEXT_TOO_LONG: "the input length exceeds the context length",
    Failure.QUOTA_EXHAUSTED: "you have reached your usage limit, upgrade for higher limits: "
    "https://ollama.com/upgrade",
    Failure.KEY_REFUSED: "unauthorized",
    Failure.OVERLOADED: "Server overloaded, please retry shortly",
}
"""Ollama's words for the failure classes (a model it does not have: `not_found_message`).
A local Ollama truncates a prompt longer than its context silently; chaosllm answers the
400 Ollama gives when told not to truncate. The quota, key and overload errors are
Ollama Cloud's (a local server has none of them)."""


def model_name(model: Any) -> Any:
    """A model as Ollama resolves it: ``name`` and ``name:latest`` are one model."""
    if isinstance(model, str) and model.endswith(_LATEST):
        return model[: -len(_LATEST)]
    return model


def not_found_message(model: str) -> str:
    """Ollama's 404 for a model it does not have."""
    return f'model "{model}" not found, try pulling it first'


def error_envelope(message: str) -> dict[str, Any]:
    """Ollama's error body (every status)."""
    return {"error": message}


# -- validation: the errors Ollama's Go server answers with ------------------------------------


def _go_type(value: object) -> str:
    """How Go's JSON decoder names a value's type (``string``, ``number``, ``bool``...)."""
    name = type_name(value).rsplit(" ", 1)[-1]
    return "bool" if name == "boolean" else name


def _unmarshal(value: object, where: str, want: str) -> InvalidRequest:
    return InvalidRequest(
        f"json: cannot unmarshal {_go_type(value)} into Go struct field {where} of type {want}",
        param=where.rsplit(".", 1)[-1],
        code="invalid_type",
    )


_FIELD_TYPES: Final[tuple[tuple[str, type | tuple[type, ...], str], ...]] = (
    ("stream", bool, "bool"),
    ("options", dict, "map[string]interface {}"),
    ("tools", list, "api.Tools"),
    ("think", (bool, str), "api.ThinkValue"),
)


def _request_object(body: JSON, struct: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequest(
            f"json: cannot unmarshal {_go_type(body)} into Go value of type api.{struct}",
            param="body",
            code="invalid_type",
        )
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _unmarshal(model, f"{struct}.model", "string")
    if not model:
        raise InvalidRequest("model is required", param="model", code="missing_required_parameter")
    for key, types, want in _FIELD_TYPES:
        value = body.get(key)
        if value is not None and not isinstance(value, types):
            raise _unmarshal(value, f"{struct}.{key}", want)
    return body


def _expect_string(value: object, where: str) -> None:
    if value is not None and not isinstance(value, str):
        raise _unmarshal(value, where, "string")


# -- the conversation (the request validator) --------------------------------------------------


def _as_chat(messages: list[Any]) -> list[Any]:
    """Ollama messages as Chat Completions messages, so that the Chat validator checks them:
    a tool call without an id gets one (``<name>#<message>.<call>``), a tool message
    without ``tool_call_id`` answers the pending call of its ``tool_name`` (else the next
    pending one)."""
    chat: list[Any] = []
    pending: list[tuple[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            chat.append(message)
            continue
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                name = message.get("tool_name")
                found = next((p for p in pending if p[1] == name), pending[0] if pending else None)
                call_id = found[0] if found is not None else f"(none)#{i}"
            pending = [p for p in pending if p[0] != call_id]
            chat.append({**message, "tool_call_id": call_id})
            continue
        pending = []
        calls = message.get("tool_calls")
        if role == "assistant" and isinstance(calls, list) and calls:
            converted = []
            for j, raw in enumerate(calls):
                call: dict[str, Any] = raw if isinstance(raw, dict) else {}
                function = call.get("function")
                name = function.get("name") if isinstance(function, dict) else None
                given = call.get("id")
                new_id = given if isinstance(given, str) else f"{name}#{i}.{j}"
                converted.append({**call, "id": new_id})
                pending.append((new_id, name))
            chat.append({**message, "tool_calls": converted})
        else:
            chat.append(message)
    return chat


def _chat_findings(body: JSON, *, expects_system: bool = False) -> list[Finding]:
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return []
    return validate_conversation({"messages": _as_chat(messages)}, expects_system=expects_system)


def _chat_has_system(body: JSON) -> bool:
    messages = body.get("messages") if isinstance(body, dict) else None
    return isinstance(messages, list) and any(
        isinstance(m, dict) and m.get("role") == "system" for m in messages
    )


def _generate_has_system(body: JSON) -> bool:
    return isinstance(body, dict) and bool(body.get("system"))


def _generate_findings(body: JSON, *, expects_system: bool = False) -> list[Finding]:
    if not isinstance(body, dict) or not expects_system or _generate_has_system(body):
        return []
    messages = [{"role": "user", "content": body.get("prompt") or ""}]
    return [
        replace(finding, param="system")
        for finding in validate_conversation({"messages": messages}, expects_system=True)
    ]


OLLAMA_CHAT_CHECKS: Final = ConversationChecks(_chat_findings, _chat_has_system)
OLLAMA_GENERATE_CHECKS: Final = ConversationChecks(_generate_findings, _generate_has_system)


# -- the shared base ----------------------------------------------------------------------------


def _is_done(line: Mapping[str, Any]) -> bool:
    return line.get("done") is True or "error" in line


class OllamaCodec(Codec):
    """Ollama's codec (chat and generate): its requests' canonical form, its answers' framing."""

    text_key: str = "response"
    """Where an answer's text is (generate: ``response``; chat: inside ``message``)."""

    # -- requests ---------------------------------------------------------------

    def wants_stream(self, body: JSON) -> bool:
        """Ollama streams unless the request says ``stream: false``."""
        return isinstance(body, dict) and body.get("stream") is not False

    def model_of(self, body: JSON) -> Any:
        return body.get("model") if isinstance(body, dict) else None

    # -- stream framing: NDJSON -------------------------------------------------

    def stream_headers(self, options: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
        return ndjson.NDJSON_HEADERS

    def is_stream(self, content_type: str) -> bool:
        return content_type.lower().startswith(ndjson.NDJSON_TYPE)

    def frame_splitter(self, start: float, *, keep: bool = True) -> FrameSplitting:
        return ndjson.LineSplitter(start, keep=keep)

    # -- answers ----------------------------------------------------------------

    def is_answer(self, body: JSON) -> bool:
        return isinstance(body, dict) and "done" in body and "error" not in body

    def _json_answer(self, body: JSON) -> JSON:
        """An answer whose tool call cannot be parsed is Ollama's parse error."""
        failure = _parse_failure(body)
        return body if failure is None else error_envelope(failure)

    def _json_status(self, body: JSON, status: int) -> int:
        """A 500 for an answer whose tool call cannot be parsed, as Ollama answers it."""
        return 500 if status < 400 and _parse_failure(body) is not None else status

    def stream_frames(self, answer: Mapping[str, Any]) -> list[str]:
        """NDJSON lines equivalent to an answer, as Ollama streams it."""
        base = {k: answer[k] for k in ("model", "created_at") if k in answer}
        lines = [ndjson.line({**base, **piece, "done": False}) for piece in self._pieces(answer)]
        failure = _parse_failure(answer)
        if failure is not None:
            lines.append(ndjson.line(error_envelope(failure)))
            return lines
        lines.append(ndjson.line(self._final(answer)))
        return lines

    def _pieces(self, answer: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        """The fragments of a stream before its final line (without model, created_at and
        done), the tool calls excepted when they cannot be parsed."""
        thinking = answer.get("thinking")
        if isinstance(thinking, str) and thinking:
            for piece in text_pieces(thinking):
                yield {"response": "", "thinking": piece}
        text = answer.get("response")
        if isinstance(text, str) and text:
            for piece in text_pieces(text):
                yield {"response": piece}

    def _final(self, answer: Mapping[str, Any]) -> dict[str, Any]:
        """The last line of a stream: the answer with its text emptied."""
        final = dict(answer)
        final["response"] = ""
        final.pop("thinking", None)
        final["done"] = True
        return final

    def assemble(self, frames: Sequence[str]) -> JSON:
        answer: dict[str, Any] = {}
        texts: dict[str, list[str]] = {"response": [], "thinking": []}
        for line in ndjson.iter_objects(frames):
            if "error" in line:
                return line
            for key, parts in texts.items():
                if isinstance(line.get(key), str):
                    parts.append(line[key])
            if line.get("done") is True:
                answer = {k: v for k, v in line.items()}
                break
            if not answer:
                answer = {k: line[k] for k in ("model", "created_at") if k in line}
        answer["response"] = "".join(texts["response"])
        if any(texts["thinking"]):
            answer["thinking"] = "".join(texts["thinking"])
        return answer

    def stream_complete(self, frames: Sequence[str]) -> bool:
        return any(_is_done(line) for line in ndjson.iter_objects(frames))

    def fallback(self, body: JSON, digest: str) -> JSON:
        model = body.get("model", "") if isinstance(body, dict) else ""
        return {
            "model": model,
            "created_at": "1970-01-01T00:00:00Z",
            "response": f"[chaosllm fallback] No recording matches this request (digest {digest}).",
            "done": True,
            "done_reason": "stop",
            **dict.fromkeys(_COUNTERS, 0),
        }


class OllamaErrors(Errors):
    """Ollama's errors: its envelope, its failure classes, its rate-limit headers."""

    codec: OllamaCodec

    def _envelope(
        self, status: int, message: str, kind: str | None, code: str | None, param: str | None
    ) -> dict[str, Any]:
        """``{"error": "<message>"}``, whatever the status and kind."""
        return error_envelope(message)

    # -- the named failure classes ----------------------------------------------

    def failure_message(self, failure: Failure, request: JSON) -> str:
        if failure is Failure.NO_SUCH_MODEL:
            return not_found_message(str(self.codec.model_of(request)))
        return _FAILURE_MESSAGES[failure]


class OllamaFaults(FaultHooks):
    """Ollama's fault hooks (chat and generate): how its streams end and its answers break."""

    codec: OllamaCodec
    errors: OllamaErrors

    # -- what faults need -------------------------------------------------------

    def frame_finishes(self, frame: str) -> bool:
        """The ``done: true`` line, or an error line."""
        return any(_is_done(line) for line in ndjson.iter_objects((frame,)))

    def stream_error_frame(self, message: str, *, status: int) -> bytes:
        return ndjson.line(error_envelope(message)).encode("utf-8")

    def empty_answer(self, body: JSON) -> JSON:
        empty = copy.deepcopy(body)
        empty["response"] = ""
        empty.pop("thinking", None)
        empty["done_reason"] = "stop"
        empty["eval_count"] = 0
        return empty

    def tool_calls(self, answer: Any) -> Iterator[dict[str, Any]]:
        return iter(())

    def break_argument_deltas(self, frame: bytes, cut: ArgumentCuts) -> bytes | None:
        """Tool calls come whole in one line: a line carrying some is the parse error
        `break_tool_arguments` makes of them (an error line, which finishes the answer),
        as the buffered answer streams it; any other line as it is."""
        lines = list(ndjson.iter_objects([frame.decode("utf-8", "replace")])) if frame else []
        if len(lines) != 1:
            return frame
        message = lines[0].get("message")
        if not isinstance(message, dict) or not message.get("tool_calls"):
            return frame
        broken = self.break_tool_arguments({"message": message})
        failure = _parse_failure(broken)
        return frame if failure is None else ndjson.line(error_envelope(failure)).encode()

    def last_user_text(self, body: JSON) -> str | None:
        """The prompt (generate)."""
        prompt = body.get("prompt") if isinstance(body, dict) else None
        return prompt if isinstance(prompt, str) else None

    def filtered_answer(self, answer: JSON) -> JSON | None:
        """Ollama has no content filter: chaosllm cuts the text (`filtered_text`), drops the
        tool calls and ends with ``done_reason: "stop"`` (what a model that stops itself
        answers)."""
        if not self.codec.is_answer(answer):
            return None
        assert isinstance(answer, dict)
        filtered = copy.deepcopy(answer)
        holder = filtered.get("message") if self.codec.text_key == "content" else filtered
        if isinstance(holder, dict):
            text = holder.get(self.codec.text_key)
            holder[self.codec.text_key] = filtered_text(text) if isinstance(text, str) else ""
            holder.pop("tool_calls", None)
        filtered["done_reason"] = "stop"
        return filtered


def _parse_failure(answer: JSON) -> str | None:
    """Ollama's message for an answer whose tool call cannot be parsed (arguments cut into
    a string by ``malformed_tool_args``), None for any other answer."""
    message = answer.get("message") if isinstance(answer, dict) else None
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if isinstance(arguments, str):
            return f"error parsing tool call: raw='{arguments}', err={_PARSE_FAILURE}"
    return None


# -- /api/generate ------------------------------------------------------------------------------


class OllamaGenerateCodec(OllamaCodec):
    """`OllamaGenerate`'s codec: its requests' canonical form, its answers' framing."""

    turn_key = "prompt"
    conversation = OLLAMA_GENERATE_CHECKS

    def validate(self, body: JSON) -> None:
        body = _request_object(body, "GenerateRequest")
        for key in ("prompt", "suffix", "system", "template"):
            _expect_string(body.get(key), f"GenerateRequest.{key}")
        context = body.get("context")
        if context is not None and not isinstance(context, list):
            raise _unmarshal(context, "GenerateRequest.context", "[]int")

    def written(self, body: JSON) -> JSON:
        return {
            "model": model_name(body.get("model")),
            "prompt": body.get("prompt") or "",
            "suffix": body.get("suffix"),
            "system": body.get("system"),
            "template": body.get("template"),
            "context": body.get("context"),
            "images": body.get("images"),
            "raw": body.get("raw"),
            "format": body.get("format"),
            "think": body.get("think"),
        }


class OllamaGenerate(Provider):
    """The `ollama.generate` provider (``POST /api/generate``)."""

    parts = Parts(OllamaGenerateCodec, OllamaErrors, OllamaFaults)

    name = "ollama.generate"
    paths = (GENERATE_PATH,)


# -- /api/chat ----------------------------------------------------------------------------------


class OllamaChatCodec(OllamaCodec):
    """`OllamaChat`'s codec: its requests' canonical form, its answers' framing."""

    conversation = OLLAMA_CHAT_CHECKS
    text_key = "content"

    def validate(self, body: JSON) -> None:
        body = _request_object(body, "ChatRequest")
        messages = body.get("messages")
        if messages is not None and not isinstance(messages, list):
            raise _unmarshal(messages, "ChatRequest.messages", "[]api.Message")
        for i, message in enumerate(messages or []):
            if not isinstance(message, dict):
                raise _unmarshal(message, "ChatRequest.messages", "api.Message")
            _expect_string(message.get("role"), f"Message.messages.{i}.role")
            _expect_string(message.get("content"), f"Message.messages.{i}.content")
            if not message.get("role"):
                raise InvalidRequest(
                    f"messages[{i}]: role is required", param="role", code="invalid_value"
                )
            calls = message.get("tool_calls")
            if calls is not None and not isinstance(calls, list):
                raise _unmarshal(calls, f"Message.messages.{i}.tool_calls", "[]api.ToolCall")
            for call in calls or []:
                function = call.get("function") if isinstance(call, dict) else None
                arguments = function.get("arguments") if isinstance(function, dict) else None
                if arguments is not None and not isinstance(arguments, dict):
                    raise _unmarshal(
                        arguments,
                        "ToolCallFunction.messages.tool_calls.function.arguments",
                        "api.ToolCallFunctionArguments",
                    )

    def written(self, body: JSON) -> JSON:
        return {
            "model": model_name(body.get("model")),
            "messages": [
                {k: v for k, v in m.items() if k in _CHAT_MESSAGE_KEYS}
                if isinstance(m, dict)
                else m
                for m in body.get("messages") or []
            ],
            "tools": body.get("tools") or None,
            "format": body.get("format"),
            "think": body.get("think"),
        }

    def _pieces(self, answer: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        message = answer.get("message") or {}
        role = message.get("role", "assistant")
        thinking = message.get("thinking")
        if isinstance(thinking, str) and thinking:
            for piece in text_pieces(thinking):
                yield {"message": {"role": role, "content": "", "thinking": piece}}
        content = message.get("content")
        if isinstance(content, str) and content:
            for piece in text_pieces(content):
                yield {"message": {"role": role, "content": piece}}
        calls = message.get("tool_calls")
        if calls and _parse_failure(answer) is None:
            yield {"message": {"role": role, "content": "", "tool_calls": calls}}

    def _final(self, answer: Mapping[str, Any]) -> dict[str, Any]:
        final = dict(answer)
        message = answer.get("message") or {}
        final["message"] = {"role": message.get("role", "assistant"), "content": ""}
        final["done"] = True
        return final

    def assemble(self, frames: Sequence[str]) -> JSON:
        answer: dict[str, Any] = {}
        role = "assistant"
        content: list[str] = []
        thinking: list[str] = []
        calls: list[Any] = []
        for line in ndjson.iter_objects(frames):
            if "error" in line:
                return line
            message = line.get("message")
            if isinstance(message, dict):
                role = message.get("role") or role
                if isinstance(message.get("content"), str):
                    content.append(message["content"])
                if isinstance(message.get("thinking"), str):
                    thinking.append(message["thinking"])
                calls.extend(message.get("tool_calls") or [])
            if line.get("done") is True:
                answer = dict(line)
                break
            if not answer:
                answer = {k: line[k] for k in ("model", "created_at") if k in line}
        assembled: dict[str, Any] = {"role": role, "content": "".join(content)}
        if any(thinking):
            assembled["thinking"] = "".join(thinking)
        if calls:
            assembled["tool_calls"] = calls
        answer["message"] = assembled
        return answer

    def fallback(self, body: JSON, digest: str) -> JSON:
        answer = dict(super().fallback(body, digest))
        text = answer.pop("response")
        done = {k: answer.pop(k) for k in ("done", "done_reason")}
        return {**answer, "message": {"role": "assistant", "content": text}, **done}


class OllamaChatFaults(OllamaFaults):
    """`OllamaChat`'s fault hooks: how its streams end and its answers break."""

    codec: OllamaChatCodec
    errors: OllamaErrors

    def empty_answer(self, body: JSON) -> JSON:
        empty = copy.deepcopy(body)
        message = empty.get("message")
        empty["message"] = {
            "role": message.get("role", "assistant") if isinstance(message, dict) else "assistant",
            "content": "",
        }
        empty["done_reason"] = "stop"
        empty["eval_count"] = 0
        return empty

    def tool_calls(self, answer: Any) -> Iterator[dict[str, Any]]:
        message = answer.get("message") if isinstance(answer, dict) else None
        for call in (message.get("tool_calls") if isinstance(message, dict) else None) or []:
            if isinstance(call, dict):
                yield call.setdefault("function", {})

    def last_user_text(self, body: JSON) -> str | None:
        messages = body.get("messages") if isinstance(body, dict) else None
        return facts.last_user_text(messages, frozenset())

    def tool_names(self, body: JSON) -> frozenset[str]:
        return facts.offered_tool_names(body)


class OllamaChat(Provider):
    """The `ollama.chat` provider (``POST /api/chat``)."""

    parts = Parts(OllamaChatCodec, OllamaErrors, OllamaChatFaults)

    name = "ollama.chat"
    paths = (CHAT_PATH,)


# -- the auxiliary endpoints --------------------------------------------------------------------


def tags_body(models: Sequence[str]) -> dict[str, Any]:
    """``GET /api/tags``: the models, as Ollama lists what it has pulled (each name with
    its tag, ``:latest`` when it has none)."""
    listed = []
    for model in sorted({model_name(m) for m in models}):
        name = model if ":" in model else model + _LATEST
        listed.append(
            {
                "name": name,
                "model": name,
                "modified_at": "1970-01-01T00:00:00Z",
                "size": 0,
                "digest": _sha(name),
                "details": _details(),
            }
        )
    return {"models": listed}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _details() -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": "gguf",
        "family": "chaosllm",
        "families": ["chaosllm"],
        "parameter_size": "",
        "quantization_level": "",
    }


def version_body() -> dict[str, Any]:
    """``GET /api/version``."""
    return {"version": OLLAMA_VERSION}


def show_body(body: JSON, models: Sequence[str]) -> dict[str, Any]:
    """``POST /api/show`` for a model the recordings have; `InvalidRequest` (with a
    ``code`` of ``not_found`` for an unknown model, Ollama's 404) otherwise."""
    if not isinstance(body, dict):
        raise InvalidRequest("json: cannot unmarshal array into Go value of type api.ShowRequest")
    model = body.get("model") or body.get("name")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model is required", param="model")
    if model_name(model) not in {model_name(m) for m in models}:
        raise InvalidRequest(not_found_message(model), param="model", code="not_found")
    return {
        "modelfile": f"FROM {model}\n",
        "parameters": "",
        "template": "{{ .Prompt }}",
        "details": _details(),
        "model_info": {},
        "capabilities": ["completion", "tools"],
        "modified_at": "1970-01-01T00:00:00Z",
    }


def _embed_request(body: JSON) -> tuple[str, int, dict[str, Any]]:
    if not isinstance(body, dict):
        raise InvalidRequest(
            f"json: cannot unmarshal {_go_type(body)} into Go value of type api.EmbedRequest"
        )
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model is required", param="model")
    dimensions = body.get("dimensions")
    if dimensions is None:
        dimensions = FALLBACK_DIMENSIONS
    if (
        not isinstance(dimensions, int)
        or isinstance(dimensions, bool)
        or not 1 <= dimensions <= MAX_DIMENSIONS
    ):
        raise InvalidRequest(f"invalid dimensions: {dimensions!r}", param="dimensions")
    return model, dimensions, body


def embed_body(body: JSON) -> dict[str, Any]:
    """``POST /api/embed``: a deterministic unit vector per input (`embeddings.embed`)."""
    model, dimensions, request = _embed_request(body)
    raw = request.get("input")
    if isinstance(raw, str):
        texts = [raw]
    elif isinstance(raw, list) and all(isinstance(t, str) for t in raw):
        texts = list(raw)
    else:
        raise InvalidRequest("invalid input type", param="input")
    tokens = sum(max(1, len(t.split())) for t in texts)
    return {
        "model": model,
        "embeddings": [embed(model_name(model), t, dimensions) for t in texts],
        "total_duration": 0,
        "load_duration": 0,
        "prompt_eval_count": tokens,
    }


def embeddings_body(body: JSON) -> dict[str, Any]:
    """``POST /api/embeddings`` (legacy): one vector for ``prompt``."""
    model, dimensions, request = _embed_request(body)
    prompt = request.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise _unmarshal(prompt, "EmbeddingRequest.prompt", "string")
    return {"embedding": embed(model_name(model), prompt or "", dimensions) if prompt else []}
