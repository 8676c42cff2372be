"""Bedrock Runtime Converse: canonical requests, answers, AWS errors, the event stream.

Theory of operation
-------------------
``POST /model/{modelId}/converse`` answers JSON, ``/converse-stream`` AWS's binary event
stream (`chaosllm.providers.eventstream`). botocore percent-encodes the model id in the
path (``anthropic.claude-3-haiku-20240307-v1%3A0``; an ARN's slashes as ``%2F``); the
servers decode the path before routing, so the id may hold ``:`` and ``/`` (the templates
match it with ``{modelId:path}``). `bind` folds the model id and whether the path
streams into the request (``modelId``, ``stream``): what is keyed, matched and recorded.

The digest covers ``modelId``, ``system``, ``messages`` and ``toolConfig``; inference
settings and the transport (``stream``) are left out, so a streamed and a JSON request
hit the same recording.

An answer is ``{"output": {"message": {"role", "content": [...]}}, "stopReason",
"usage", "metrics"}``. A stream is a message per event: ``messageStart`` (the role), per
content block an optional ``contentBlockStart`` (a ``toolUse`` block's id and name),
``contentBlockDelta`` (``text``, ``toolUse.input`` as fragments of a JSON *string*,
``reasoningContent`` text then signature) and ``contentBlockStop``; then ``messageStop``
(the stop reason) and ``metadata`` (usage, metrics), which finish the answer. A stream
that fails ends with an ``exception`` message (``:exception-type``
``modelStreamErrorException``, ``throttlingException``...).

Errors: a JSON body ``{"message"}`` and the header ``x-amzn-ErrorType:
<Name>:http://internal.amazon.com/coral/com.amazon.bedrock/`` (botocore reads the code
from it), with the status of that exception in the service model.

Faults: ``malformed_tool_args`` cuts each tool call's input into invalid JSON text, which
a stream carries in its ``toolUse.input`` deltas; a JSON body carries what the API answers
for a tool call cut off by the token limit (an empty ``input`` object, ``stopReason:
max_tokens``). ``garbage`` mid-stream, without ``data``, sends the next message with a
wrong message CRC (`corrupt_frame`), which botocore refuses with ``ChecksumMismatch``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar, Final
from urllib.parse import quote

from chaosllm.errors import EventStreamError, InvalidRequest
from chaosllm.model import JSON, ResponsePlan
from chaosllm.providers import eventstream as es
from chaosllm.providers import facts
from chaosllm.providers.base import Parts, Provider
from chaosllm.providers.codec import Codec
from chaosllm.providers.conversation import (
    ConversationChecks,
    Finding,
    anthropic_has_system_prompt,
    validate_anthropic_conversation,
)
from chaosllm.providers.errors import Errors
from chaosllm.providers.failures import ErrorKind, Failure
from chaosllm.providers.faulthooks import ArgumentCuts, FaultHooks
from chaosllm.providers.text import filtered_blocks, text_pieces

__all__ = ["BEDROCK_CHECKS", "ERROR_TYPE_SUFFIX", "BedrockConverse", "error_type"]

ERROR_TYPE_SUFFIX: Final = ":http://internal.amazon.com/coral/com.amazon.bedrock/"
"""What follows the exception name in ``x-amzn-ErrorType``."""

_STATUS_TYPES: Final[Mapping[int, str]] = {
    400: "ValidationException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ModelTimeoutException",
    424: "ModelErrorException",
    429: "ThrottlingException",
    500: "InternalServerException",
    503: "ServiceUnavailableException",
}
_KIND_TYPES: Final[Mapping[str, str]] = {
    ErrorKind.INVALID_REQUEST: "ValidationException",
    ErrorKind.NOT_FOUND: "ResourceNotFoundException",
    ErrorKind.NO_MATCH: "ResourceNotFoundException",
    ErrorKind.SERVER_ERROR: "InternalServerException",
}
_STREAM_EXCEPTIONS: Final[Mapping[int, str]] = {
    400: "validationException",
    429: "throttlingException",
    503: "serviceUnavailableException",
}
"""The ``:exception-type`` of a mid-stream error by status (any other:
``modelStreamErrorException``, the stream's own failure)."""
_ROLES: Final = ("user", "assistant")
_FAILURE_MESSAGES: Final[Mapping[Failure, str]] = {
    Failure.CONTEXT_TOO_LONG: "Input is too long for requested model.",
    Failure.QUOTA_EXHAUSTED: "Too many tokens per day, please wait before trying again.",
    Failure.KEY_REFUSED: "The security token included in the request is invalid.",
    Failure.NO_SUCH_MODEL: "Could not resolve the foundation model from the provided model "
    "identifier.",
    Failure.OVERLOADED: "Bedrock is unable to process your request.",
}
"""AWS's words for the failure classes (a spent daily token quota is Converse's
``ThrottlingException``, the 429 its service model lists)."""
_KEY_REFUSED_TYPE: Final = (
    "UnrecognizedClientException:http://internal.amazon.com/coral/com.amazon.coral.service/"
)
"""``x-amzn-ErrorType`` of credentials AWS does not know (a 403 of AWS's front door, not
of Bedrock's service model)."""
_FINISHING: Final = frozenset({"messageStop", "metadata"})


def error_type(status: int) -> str:
    """The Bedrock exception a real API answers with for an HTTP status."""
    if status in _STATUS_TYPES:
        return _STATUS_TYPES[status]
    return "InternalServerException" if status >= 500 else "ValidationException"


def _fail(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(f"1 validation error detected: {message}", param=param)


def _json_fragments(text: str) -> list[str]:
    """``toolUse.input`` fragments as Bedrock streams them: a few characters at a time."""
    return [text[i : i + 12] for i in range(0, len(text), 12)]


def _compact(payload: JSON) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _event(event_type: str, payload: JSON) -> str:
    """An event message's text (what `encode_frame` turns into bytes), as Bedrock heads
    one: ``:event-type``, ``:content-type``, ``:message-type``."""
    return (
        f":event-type: {event_type}\n:content-type: application/json\n"
        f":message-type: event\n\n" + _compact(payload).decode("utf-8")
    )


# -- the conversation, as Anthropic's checks read it ------------------------------------


def _as_anthropic(body: JSON) -> JSON:
    """A Converse request's conversation in Anthropic's block shapes (``toolUse`` ->
    ``tool_use``, ``toolResult`` -> ``tool_result``), which the same checks apply to."""
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return {}
    messages = []
    for message in body["messages"]:
        if not isinstance(message, dict):
            messages.append(message)
            continue
        blocks = []
        for block in message.get("content") or []:
            if not isinstance(block, dict):
                continue
            if isinstance(block.get("toolUse"), dict):
                blocks.append({"type": "tool_use", "id": block["toolUse"].get("toolUseId")})
            elif isinstance(block.get("toolResult"), dict):
                use_id = block["toolResult"].get("toolUseId")
                blocks.append({"type": "tool_result", "tool_use_id": use_id})
            elif isinstance(block.get("text"), str):
                blocks.append({"type": "text", "text": block["text"]})
        messages.append({"role": message.get("role"), "content": blocks})
    system = body.get("system")
    texts = [b.get("text", "") for b in system or [] if isinstance(b, dict)]
    return {"messages": messages, "system": "\n".join(t for t in texts if isinstance(t, str))}


def _findings(body: JSON, *, expects_system: bool = False) -> list[Finding]:
    return validate_anthropic_conversation(_as_anthropic(body), expects_system=expects_system)


def _has_system(body: JSON) -> bool:
    return anthropic_has_system_prompt(_as_anthropic(body))


BEDROCK_CHECKS = ConversationChecks(_findings, _has_system)
"""Anthropic's checks over a Converse conversation (the same rules: each ``toolUse``
answered by a ``toolResult`` in the next message, and only those)."""


class BedrockConverseCodec(Codec):
    """`BedrockConverse`'s codec: its requests' canonical form, its answers' framing."""

    conversation = BEDROCK_CHECKS

    def model_of(self, body: JSON) -> Any:
        return body.get("modelId") if isinstance(body, dict) else None

    def validate(self, body: JSON) -> None:
        if not isinstance(body, dict):
            raise _fail("the request body must be a JSON object", "body")
        if not isinstance(body.get("modelId"), str) or not body["modelId"]:
            raise _fail("Value null at 'modelId' failed to satisfy constraint", "modelId")
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise _fail(
                "Value null at 'messages' failed to satisfy constraint: Member must not be null",
                "messages",
            )
        for i, message in enumerate(messages):
            where = f"messages.{i + 1}"
            if not isinstance(message, dict):
                raise _fail(f"Value at '{where}' failed to satisfy constraint", where)
            if message.get("role") not in _ROLES:
                raise _fail(
                    f"Value at '{where}.member.role' failed to satisfy constraint: Member "
                    f"must satisfy enum value set: [user, assistant]",
                    f"{where}.role",
                )
            content = message.get("content")
            if not isinstance(content, list):
                raise _fail(
                    f"Value null at '{where}.member.content' failed to satisfy constraint: "
                    f"Member must not be null",
                    f"{where}.content",
                )
            for j, block in enumerate(content):
                if not isinstance(block, dict) or len(block) != 1:
                    raise _fail(
                        f"Value at '{where}.member.content.{j + 1}' failed to satisfy "
                        f"constraint: a content block has exactly one member",
                        f"{where}.content.{j + 1}",
                    )
        system = body.get("system")
        if system is not None and not isinstance(system, list):
            raise _fail("Value at 'system' failed to satisfy constraint", "system")
        for key in ("inferenceConfig", "toolConfig", "additionalModelRequestFields"):
            if key in body and not isinstance(body[key], dict):
                raise _fail(f"Value at '{key}' failed to satisfy constraint", key)

    def written(self, body: JSON) -> JSON:
        return {
            "modelId": body.get("modelId"),
            "system": body.get("system"),
            "messages": body.get("messages", []),
            "toolConfig": body.get("toolConfig"),
        }

    # -- stream framing: AWS's event stream ---------------------------------------

    def stream_headers(self, options: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
        return (("content-type", es.CONTENT_TYPE),)

    def encode_frame(self, text: str) -> bytes:
        message = es.text_message(text)
        return es.encode_message(message.headers, message.payload)

    def frame_text(self, data: bytes) -> str:
        message, size = es.decode_message(data)
        if size != len(data):
            raise EventStreamError(f"{len(data) - size} bytes after the message")
        return es.message_text(message)

    def is_stream(self, content_type: str) -> bool:
        return content_type.lower().startswith(es.CONTENT_TYPE)

    def frame_splitter(self, start: float, *, keep: bool = True) -> es.MessageSplitter:
        return es.MessageSplitter(start, keep=keep)

    # -- responses --------------------------------------------------------------

    def is_answer(self, body: JSON) -> bool:
        return isinstance(body, dict) and isinstance(body.get("output"), dict)

    def _json_answer(self, body: JSON) -> JSON:
        """A broken tool input (a string, see the module doc) is answered as the API
        answers a tool call cut off by the token limit: an empty object."""
        if not any(isinstance(c.get("input"), str) for c in _tool_uses(body)):
            return body
        fixed = copy.deepcopy(body)
        for call in _tool_uses(fixed):
            if isinstance(call.get("input"), str):
                call["input"] = {}
        return fixed

    def stream_frames(self, answer: Mapping[str, Any]) -> list[str]:
        message = (answer.get("output") or {}).get("message") or {}
        frames = [_event("messageStart", {"role": message.get("role", "assistant")})]
        for index, block in enumerate(message.get("content") or []):
            if isinstance(block, dict):
                frames += _block_frames(index, block)
        stop: dict[str, Any] = {"stopReason": answer.get("stopReason", "end_turn")}
        if answer.get("additionalModelResponseFields") is not None:
            stop["additionalModelResponseFields"] = answer["additionalModelResponseFields"]
        frames.append(_event("messageStop", stop))
        metadata = {
            "usage": answer.get("usage") or {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0},
            "metrics": answer.get("metrics") or {"latencyMs": 0},
        }
        frames.append(_event("metadata", metadata))
        return frames

    # -- assembly ---------------------------------------------------------------

    def assemble(self, frames: Sequence[str]) -> JSON:
        role = "assistant"
        blocks: dict[int, dict[str, Any]] = {}
        inputs: dict[int, str] = {}
        answer: dict[str, Any] = {}
        for message in es.iter_messages(frames):
            payload = json.loads(message.payload or b"{}")
            if message.message_type != "event":
                return payload if isinstance(payload, dict) else {"message": str(payload)}
            kind = message.kind
            if kind == "messageStart":
                role = payload.get("role", role)
            elif kind == "contentBlockStart":
                start = payload.get("start") or {}
                index = payload["contentBlockIndex"]
                if isinstance(start.get("toolUse"), dict):
                    blocks[index] = {"toolUse": {**start["toolUse"]}}
                    inputs[index] = ""
            elif kind == "contentBlockDelta":
                index = payload["contentBlockIndex"]
                _apply_delta(
                    blocks.setdefault(index, {}), payload.get("delta") or {}, inputs, index
                )
            elif kind == "contentBlockStop":
                index = payload["contentBlockIndex"]
                if index in inputs:
                    text = inputs.pop(index)
                    blocks[index]["toolUse"]["input"] = json.loads(text) if text else {}
            elif kind == "messageStop":
                answer["stopReason"] = payload.get("stopReason")
                if "additionalModelResponseFields" in payload:
                    extra = payload["additionalModelResponseFields"]
                    answer["additionalModelResponseFields"] = extra
            elif kind == "metadata":
                answer.update({k: v for k, v in payload.items() if k != "p"})
        content = [blocks[i] for i in sorted(blocks)]
        return {"output": {"message": {"role": role, "content": content}}, **answer}

    def stream_complete(self, frames: Sequence[str]) -> bool:
        for text in frames:
            try:
                message = es.text_message(text)
            except EventStreamError:
                continue
            if message.message_type != "event" or message.kind == "metadata":
                return True
        return False

    # -- fallback ---------------------------------------------------------------

    def fallback(self, body: JSON, digest: str) -> JSON:
        text = f"[chaosllm fallback] No recording matches this request (digest {digest})."
        return {
            "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
            "stopReason": "end_turn",
            "usage": {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0},
            "metrics": {"latencyMs": 0},
        }


class BedrockConverseErrors(Errors):
    """`BedrockConverse`'s errors: its envelope, its failure classes, its rate-limit headers."""

    codec: BedrockConverseCodec

    request_id_headers = ("x-amzn-RequestId",)

    def error_headers(self, status: int) -> tuple[tuple[str, str], ...]:
        return (("x-amzn-errortype", error_type(status) + ERROR_TYPE_SUFFIX),)

    def _envelope(
        self, status: int, message: str, kind: str | None, code: str | None, param: str | None
    ) -> dict[str, Any]:
        """``{"message"}``: the exception's name travels in ``x-amzn-ErrorType``."""
        return {"message": message}

    def error_answer(self, message: str, *, status: int, code: str | None = None) -> JSON:
        return {"message": message}

    # -- the named failure classes ----------------------------------------------

    def failure_status(self, failure: Failure) -> int:
        """Credentials AWS does not know are a 403."""
        return 403 if failure is Failure.KEY_REFUSED else super().failure_status(failure)

    def failure_message(self, failure: Failure, request: JSON) -> str:
        return _FAILURE_MESSAGES[failure]

    def _failure_headers(self, failure: Failure, status: int) -> tuple[tuple[str, str], ...]:
        if failure is Failure.KEY_REFUSED:
            return (("x-amzn-errortype", _KEY_REFUSED_TYPE),)
        return super()._failure_headers(failure, status)


class BedrockConverseFaults(FaultHooks):
    """`BedrockConverse`'s fault hooks: how its streams end and its answers break."""

    codec: BedrockConverseCodec
    errors: BedrockConverseErrors

    arguments_key = "input"
    finishing_events = _FINISHING

    def corrupt_frame(self, frame: bytes) -> bytes | None:
        """The message with a wrong message CRC (a decoder's checksum error)."""
        return es.corrupt(frame)

    # -- what faults need -------------------------------------------------------

    def frame_finishes(self, frame: str) -> bool:
        try:
            message = es.text_message(frame)
        except EventStreamError:
            return False
        return message.message_type != "event" or message.kind in _FINISHING

    def answer_frame_count(self, plan: ResponsePlan) -> int:
        for i, piece in enumerate(plan.pieces):
            try:
                message, _ = es.decode_message(piece.data)
            except EventStreamError:
                continue
            if message.message_type != "event" or message.kind in _FINISHING:
                return i
        return len(plan.pieces)

    def stream_error_frame(self, message: str, *, status: int) -> bytes:
        name = _STREAM_EXCEPTIONS.get(status, "modelStreamErrorException")
        payload: dict[str, Any] = {"message": message}
        if name == "modelStreamErrorException":
            payload.update(originalStatusCode=status, originalMessage=message)
        return es.event_message(name, _compact(payload), message_type="exception")

    def empty_answer(self, body: JSON) -> JSON:
        empty = copy.deepcopy(body)
        message = empty.setdefault("output", {}).setdefault("message", {"role": "assistant"})
        message["content"] = []
        empty["stopReason"] = "end_turn"
        usage = empty.get("usage")
        if isinstance(usage, dict):
            usage["outputTokens"] = 0
            usage["totalTokens"] = usage.get("inputTokens", 0)
        return empty

    def tool_calls(self, answer: Any) -> Iterator[dict[str, Any]]:
        return _tool_uses(answer)

    def break_tool_arguments(self, body: JSON) -> JSON | None:
        """The cut inputs, and the stop reason of an answer cut off by the token limit."""
        broken = super().break_tool_arguments(body)
        return None if broken is None else {**broken, "stopReason": "max_tokens"}

    def break_argument_deltas(self, frame: bytes, cut: ArgumentCuts) -> bytes | None:
        """Each ``contentBlockDelta``'s ``toolUse.input`` fragment as ``cut(block index,
        text)``, and once some input is broken the ``messageStop``'s ``stopReason:
        max_tokens``, as `break_tool_arguments` says; a changed message is encoded again
        with its own headers (both CRCs computed anew)."""
        if not frame:
            return frame
        try:
            message, size = es.decode_message(frame)
            payload = json.loads(message.payload or b"{}")
        except (EventStreamError, ValueError):
            return frame
        if size != len(frame) or message.message_type != "event" or not isinstance(payload, dict):
            return frame
        if message.kind == "contentBlockDelta":
            delta = payload.get("delta")
            use = delta.get("toolUse") if isinstance(delta, dict) else None
            text = use.get("input") if isinstance(use, dict) else None
            if not isinstance(text, str):
                return frame
            assert isinstance(use, dict)
            new = cut(payload.get("contentBlockIndex"), text)
            if new == text:
                return frame
            use["input"] = new
        elif (
            message.kind == "messageStop"
            and cut.broken
            and payload.get("stopReason") != "max_tokens"
        ):
            payload["stopReason"] = "max_tokens"
        else:
            return frame
        return es.encode_message(message.headers, _compact(payload))

    # -- what fault matching reads (``match.contains``, ``match.tool``) ---------------

    def last_user_text(self, body: JSON) -> str | None:
        """The ``text`` blocks of the last user message that has any."""
        messages = body.get("messages") if isinstance(body, dict) else None
        for message in reversed(messages if isinstance(messages, list) else []):
            if not isinstance(message, dict) or message.get("role") != "user":
                continue
            content = message.get("content")
            texts = [
                block["text"]
                for block in (content if isinstance(content, list) else ())
                if isinstance(block, dict) and isinstance(block.get("text"), str)
            ]
            if texts:
                return "\n".join(texts)
        return None

    def tool_names(self, body: JSON) -> frozenset[str]:
        """The ``toolSpec`` names of ``toolConfig.tools``."""
        config = body.get("toolConfig") if isinstance(body, dict) else None
        tools = config.get("tools") if isinstance(config, dict) else None
        return facts.tool_names(
            [t.get("toolSpec") for t in tools if isinstance(t, dict)]
            if isinstance(tools, list)
            else None
        )

    def filtered_answer(self, answer: JSON) -> JSON | None:
        """``stopReason: "content_filtered"``: the text blocks cut (`filtered_text`), no
        tool use."""
        if not self.codec.is_answer(answer):
            return None
        filtered = copy.deepcopy(answer)
        assert isinstance(filtered, dict)
        message = filtered["output"].get("message")
        if isinstance(message, dict):
            message["content"] = filtered_blocks(message.get("content"), lambda b: "toolUse" in b)
        filtered["stopReason"] = "content_filtered"
        return filtered


class BedrockConverse(Provider):
    """The `bedrock.converse` provider (``POST /model/{modelId}/converse[-stream]``)."""

    parts = Parts(BedrockConverseCodec, BedrockConverseErrors, BedrockConverseFaults)

    name = "bedrock.converse"
    path_templates: ClassVar[tuple[str, ...]] = (
        "/model/{modelId:path}/converse",
        "/model/{modelId:path}/converse-stream",
    )

    # -- routes -----------------------------------------------------------------

    def path_params(self, path: str) -> dict[str, str] | None:
        """The model id, and ``stream`` (``"true"`` on ``/converse-stream``)."""
        params = super().path_params(path)
        if params is not None:
            params["stream"] = "true" if path.endswith("/converse-stream") else "false"
        return params

    def upstream_path(self, path: str) -> str:
        """The path as botocore sends it: the model id percent-encoded whole (its ``:``
        and ``/`` too), which AWS's SigV4 signature covers."""
        params = self.path_params(path)
        if params is None:
            return path
        operation = "converse-stream" if params["stream"] == "true" else "converse"
        return f"/model/{quote(params['modelId'], safe='-_.~')}/{operation}"

    def bind(self, body: JSON, params: Mapping[str, str], query: str) -> JSON:
        if not isinstance(body, dict):
            raise _fail("the request body must be a JSON object", "body")
        model = params.get("modelId")
        if not model:
            raise _fail("Value at 'modelId' failed to satisfy constraint", "modelId")
        return {**body, "modelId": model, "stream": params.get("stream") == "true"}


def _tool_uses(answer: Any) -> Iterator[dict[str, Any]]:
    """The ``toolUse`` objects of an answer's content blocks (mutable)."""
    if not isinstance(answer, dict):
        return
    message = (answer.get("output") or {}).get("message") or {}
    for block in message.get("content") or []:
        if isinstance(block, dict) and isinstance(block.get("toolUse"), dict):
            yield block["toolUse"]


def _block_frames(index: int, block: Mapping[str, Any]) -> list[str]:
    """The events of one content block: start (tool use only), deltas, stop."""
    frames: list[str] = []
    deltas: list[dict[str, Any]] = []
    if isinstance(block.get("text"), str):
        deltas = [{"text": piece} for piece in text_pieces(block["text"])]
    elif isinstance(block.get("toolUse"), dict):
        use = block["toolUse"]
        start = {k: v for k, v in use.items() if k != "input"}
        frames.append(
            _event("contentBlockStart", {"start": {"toolUse": start}, "contentBlockIndex": index})
        )
        value = use.get("input")
        text = value if isinstance(value, str) else json.dumps(value) if value else ""
        deltas = [{"toolUse": {"input": p}} for p in _json_fragments(text)]
    elif isinstance(block.get("reasoningContent"), dict):
        reasoning = block["reasoningContent"].get("reasoningText") or {}
        deltas = [{"reasoningContent": {"text": p}} for p in text_pieces(reasoning.get("text", ""))]
        if reasoning.get("signature"):
            deltas.append({"reasoningContent": {"signature": reasoning["signature"]}})
    frames += [
        _event("contentBlockDelta", {"delta": d, "contentBlockIndex": index}) for d in deltas
    ]
    frames.append(_event("contentBlockStop", {"contentBlockIndex": index}))
    return frames


def _apply_delta(
    block: dict[str, Any], delta: Mapping[str, Any], inputs: dict[int, str], index: int
) -> None:
    if "text" in delta:
        block["text"] = block.get("text", "") + delta["text"]
    elif isinstance(delta.get("toolUse"), dict):
        inputs[index] = inputs.get(index, "") + delta["toolUse"].get("input", "")
    elif isinstance(delta.get("reasoningContent"), dict):
        reasoning = block.setdefault("reasoningContent", {}).setdefault("reasoningText", {})
        part = delta["reasoningContent"]
        if "text" in part:
            reasoning["text"] = reasoning.get("text", "") + part["text"]
        if "signature" in part:
            reasoning["signature"] = part["signature"]
