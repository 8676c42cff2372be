"""A protocol's fault hooks: how its answers and streams break, natively. Pure.

The fault-hooks part of a provider (`chaosllm.providers.base.Provider`) is what
`chaosllm.faults` asks of a protocol, and only `chaosllm.faults` calls it:

- how a stream ends: which frames finish the answer (`finishing_events`,
  `frame_finishes`, `answer_frame_count`), its error frame (`stream_error_frame`, in
  the stream's own framing `framed_error`; a failure class mid-stream
  `failure_frame`), a garbled frame of a checksummed framing (`corrupt_frame`);
- how an answer breaks: an empty answer (`empty_answer`), its tool calls
  (`tool_calls`, `arguments_key`) cut into invalid JSON whole
  (`break_tool_arguments`) or frame by frame on a live stream
  (`break_argument_deltas`), the content filter's cut (`filtered_answer`);
- what the pace and the wire quirks read: tokens (`text_tokens`, `frame_tokens`),
  whether a stream is SSE (`streams_sse`), the usage-only and content-filter frames
  and restated arguments some gateways send;
- what fault matching reads (``match.contains``, ``match.tool``): `last_user_text`,
  `tool_names`, `called_tool_names`.

A protocol writes `stream_error_frame`, `empty_answer` and `tool_calls`; the rest has
defaults (None: the protocol has no such thing).
"""

from __future__ import annotations

import abc
import copy
import json
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, Protocol

from chaosllm.model import JSON, ResponsePlan
from chaosllm.providers import facts, sse
from chaosllm.providers.codec import Codec
from chaosllm.providers.errors import Errors
from chaosllm.providers.failures import Failure
from chaosllm.providers.text import cut_json, text_length

__all__ = ["ArgumentCuts", "FaultHooks"]


class ArgumentCuts(Protocol):
    """What `FaultHooks.break_argument_deltas` breaks one live stream's tool-call arguments
    with (``malformed_tool_args`` on a live stream: `chaosllm.faults.live` holds one per
    stream). `key` names a call: the same for every frame of that call."""

    memo: dict[object, Any]
    """The protocol's own memory across one stream's frames (Gemini: what a candidate's
    finishing frame says of the call it dropped)."""

    @property
    def broken(self) -> bool:
        """Whether some call's arguments were broken so far in this stream."""

    def __call__(self, key: object, text: str) -> str:
        """An argument delta's text, as the fault leaves it."""

    def whole(self, key: object, text: str) -> str:
        """The whole arguments a frame restates (a ``.done`` event, a finished item), as
        the call's deltas left them."""


class FaultHooks(abc.ABC):
    """A protocol's fault hooks (see the module's docstring), over its `codec` and its
    `errors`."""

    def __init__(self, codec: Codec, errors: Errors) -> None:
        self.codec = codec
        self.errors = errors

    gateway_compatible: ClassVar[bool] = False
    """Whether the OpenAI-compatible gateways speak this protocol (Chat Completions): their
    faults (`chaosllm.faults.gateway`) apply to it."""

    finishing_events: ClassVar[frozenset[str]] = frozenset()
    """Stream event types that finish an answer (see `answer_frame_count`)."""

    def corrupt_frame(self, frame: bytes) -> bytes | None:
        """A stream frame as a checksummed framing garbles it (AWS's event stream: the
        message with a wrong CRC), what ``garbage`` sends mid-stream without ``data``;
        None (the default): the framing has no checksum, the noise is sent instead."""
        return None

    # -- stored responses (`chaosllm.providers.openai_stored`) ----------------------

    stores_responses: ClassVar[bool] = False
    """Whether its requests are operations on stored responses (their faults apply)."""

    def stored_operation(self, request: JSON) -> str | None:
        """The operation on a stored response a (bound) request is (``poll``, ``resume``,
        ``cancel``); None (the default): a request for a new answer."""
        return None

    def stored_failure(self, answer: JSON, status: str) -> JSON:
        """A stored response `answer` as it ends when it fails meanwhile (`status`:
        ``failed`` or ``incomplete``); itself by default."""
        return answer

    def stored_failure_frame(self, answer: JSON, request: JSON) -> bytes:
        """The frame a resumed stream of a failed response ends with (none by default)."""
        return b""

    # -- what the pace and the wire quirks need (legal but unusual streams) -----------

    def streams_sse(self, body: JSON) -> bool:
        """Whether a stream answering request `body` is Server-Sent Events (what the SSE
        quirks apply to): its content type says so (not Gemini's JSON array without
        ``alt=sse``, Ollama's NDJSON or Bedrock's event stream)."""
        return any(
            key.lower() == "content-type" and value.lower().startswith("text/event-stream")
            for key, value in self.codec.stream_headers(self.codec.stream_variant(body)[1])
        )

    def text_tokens(self, value: JSON) -> int:
        """Estimated tokens of the text an answer (or a frame's payload) carries, what a
        pace paces: its text's characters / 4, rounded up; by default the strings under
        `TEXT_KEYS` anywhere in it."""
        return -(-text_length(value) // 4)

    def frame_tokens(self, data: bytes) -> int:
        """Estimated tokens of a stream frame (`text_tokens` of its payloads), at least 1."""
        try:
            text = self.codec.frame_text(data)
        except ValueError:
            return 1
        payloads = list(sse.iter_data([text])) or text.splitlines()
        tokens = 0
        for payload in payloads:
            try:
                tokens += self.text_tokens(json.loads(payload))
            except ValueError:
                continue
        return max(1, tokens)

    def usage_frame(self, answer: JSON) -> bytes | None:
        """A frame carrying only the usage of a stream of `answer` (Chat Completions'
        ``choices: []`` chunk, which some gateways send even when it is not asked for);
        None (the default): the protocol has no such frame."""
        return None

    def carries_usage(self, frame: bytes) -> bool:
        """Whether a stream frame is the usage-only frame of `usage_frame`."""
        return False

    def filter_frames(self, answer: JSON) -> tuple[bytes, bytes] | None:
        """Azure's content-filter frames around a stream of `answer`: the prompt's results
        first (``choices: []``), the choices' asynchronous filter results last;
        None (the default): the protocol has none."""
        return None

    def restated_arguments(self, answer: JSON) -> dict[int, dict[int, str]] | None:
        """Per choice, per tool-call index, the complete arguments of the answer's tool
        calls, for a protocol some gateways restate them for on the finish frame (Chat
        Completions); None (the default): not this protocol, or no tool calls."""
        return None

    def restate_arguments(self, frame: bytes, arguments: Mapping[int, Mapping[int, str]]) -> bytes:
        """`frame` with the complete `arguments` (`restated_arguments`) restated for the
        same tool-call indexes when it finishes a choice that has them; itself otherwise."""
        return frame

    # -- what faults need: each provider says how its own protocol breaks -------------

    def frame_finishes(self, frame: str) -> bool:
        """Whether a frame finishes the answer (one of `finishing_events`)."""
        return any(kind in self.finishing_events for kind in sse.event_types((frame,)))

    def answer_frame_count(self, plan: ResponsePlan) -> int:
        """How many leading frames of a stream plan carry the answer, before the frames
        that finish it (finish chunk, usage chunk, terminator)."""
        for i, piece in enumerate(plan.pieces):
            if self.frame_finishes(piece.data.decode("utf-8", "replace")):
                return i
        return len(plan.pieces)

    @abc.abstractmethod
    def stream_error_frame(self, message: str, *, status: int) -> bytes:
        """An error event inside a stream, in the provider's own format."""

    def framed_error(self, frame: bytes, plan: ResponsePlan, kept: int) -> bytes:
        """An error event (`stream_error_frame`, `failure_frame`: in the protocol's first
        stream framing) as the piece after the first `kept` pieces of the stream `plan`, in
        that stream's own framing (Gemini's JSON array: an element, the array closed); the
        frame itself by default."""
        return frame

    @abc.abstractmethod
    def empty_answer(self, body: JSON) -> JSON:
        """A well-formed answer body with no content and no tool calls."""

    arguments_key: ClassVar[str] = "arguments"
    """The key of a tool call's arguments (in what `tool_calls` yields)."""

    @abc.abstractmethod
    def tool_calls(self, answer: Any) -> Iterator[dict[str, Any]]:
        """The objects of an answer body holding its tool calls' arguments (mutable)."""

    def break_tool_arguments(self, body: JSON) -> JSON | None:
        """The answer with every tool call's arguments cut into invalid JSON (arguments that
        are a JSON value are cut as their text); None when the answer has no tool calls."""
        broken = copy.deepcopy(body)
        calls = list(self.tool_calls(broken))
        for call in calls:
            value = call.get(self.arguments_key)
            text = value if isinstance(value, str) else json.dumps(value) if value else ""
            call[self.arguments_key] = cut_json(text)
        return broken if calls else None

    def break_argument_deltas(self, frame: bytes, cut: ArgumentCuts) -> bytes | None:
        """A stream frame with the text of each tool-call argument delta it carries replaced
        by ``cut(key, text)`` (`key` names the call: the same for every delta of one call)
        and each restatement of a call's whole arguments by ``cut.whole(key, text)``, what
        ``malformed_tool_args`` does to a live stream (`chaosllm.faults.live`), so that the
        client's answer is the one `break_tool_arguments` gives (a protocol whose calls
        come whole breaks them as that does); the frame itself when nothing changed. A
        frame broken into one that finishes the answer (Ollama's parse error) ends the
        client's answer there. None (the default): this protocol's argument deltas cannot
        be broken one frame at a time (the answer is then read whole)."""
        return None

    def failure_frame(self, failure: Failure, request: JSON, message: str | None = None) -> bytes:
        """A failure class inside a stream that already began (an overload mid-answer):
        `stream_error_frame` of its status by default."""
        text = message if message is not None else self.errors.failure_message(failure, request)
        return self.stream_error_frame(text, status=self.errors.failure_status(failure))

    def filtered_answer(self, answer: JSON) -> JSON | None:
        """The answer as the protocol's content filter cuts it: the text before the filter
        stopped it (`filtered_text`), no tool calls, the finish reason saying why. None
        (the default): the answer is not one this protocol can filter."""
        return None

    # -- what fault matching reads (``match.contains``, ``match.tool``) -----------------

    def last_user_text(self, body: JSON) -> str | None:
        """The text of the request's last user message that holds text (its text parts
        joined by newlines), or None: what ``match.contains`` searches. Never raises (a
        proxied body may hold anything). None by default."""
        return None

    def tool_names(self, body: JSON) -> frozenset[str]:
        """The names of the tools the request offers (``match.tool``); none by default."""
        return frozenset()

    def called_tool_names(self, answer: JSON) -> frozenset[str]:
        """The names of the tools an answer calls (``match.tool``), read without changing
        it: by default the ``name`` of each object `tool_calls` yields (a copy's)."""
        if not isinstance(answer, dict):
            return frozenset()
        try:
            return facts.names_of(self.tool_calls(copy.deepcopy(answer)))
        except (AttributeError, TypeError, KeyError):
            return frozenset()

    def server_name(self, body: JSON) -> str | None:
        """The named server a request addresses (``match.server``: an MCP server's name);
        None (the default): a model request."""
        return None
