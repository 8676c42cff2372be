"""Faults applied to a live stream frame by frame, as its frames arrive.

Theory of operation. In the proxy modes a fault on a streaming answer used to wait for
the whole upstream answer and transform it as a plan (`chaosllm.faults.transform`),
which moved the first token to the end of the answer. The faults whose stream
behaviour is "pass K frames, then end the answer some way" (``truncated_stream``,
``dropped_connection``, ``connection_reset``, ``stall``, ``garbage``, ``error_in_200``,
``overloaded`` with ``after_chunks``) and ``malformed_tool_args`` (which breaks the
tool-call arguments as they pass) have a streaming counterpart here: a small
pure state machine (`LiveFault`) fed one upstream frame at a time. `LiveFault.feed`
says what to write to the client now (`Step.write`) and, once, how the client's answer
ends (`Step.end`: the pieces written last and the `Ending`); `LiveFault.finish` says
it when the upstream's stream ended before that. Fed the frames of a stream, a machine
gives the pieces and the ending `apply_fault` gives the plan of the same frames
(``tests/leaves/test_live_faults_property.py`` checks it with hypothesis for every type). For
``malformed_tool_args`` each protocol says how its frames break
(`FaultHooks.break_argument_deltas`, with one stream's `ArgumentCuts`): where arguments
stream as deltas (Chat Completions and Azure, Anthropic's ``input_json_delta``, the
Responses API's ``function_call_arguments.delta``, Bedrock's ``toolUse.input``) the
first delta of each call is cut and the later ones dropped, a restatement of the whole
(``.done``, a finished item) says the same, and the stop reason is what the buffered
transform gives (Anthropic's and Bedrock's ``max_tokens``); the answers agree except in
the broken arguments' text, invalid JSON in both, as the whole arguments are not known
yet. Where a call comes whole in one frame (Gemini's ``functionCall``, Ollama's
``tool_calls`` line) the live answer is the buffered one exactly: Gemini's call dropped
and its finishing frame ``MALFORMED_FUNCTION_CALL``, Ollama's line its parse error, which
ends the stream. Each catalogue entry names its machine's factory (`FaultType.live`); a
factory returns None when the fault cannot run live on this stream (then the proxy
reads the answer whole, as before).

A machine whose fault applies only to some answers (``malformed_tool_args``: answers
with tool calls) `shows` whether a frame proves the answer is one: the engine takes the
fault from the board only then (`Claimed`), so it is consumed exactly as often as on a
replayed answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from chaosllm.faults.transform import DEFAULT_GARBAGE, _message
from chaosllm.model import JSON, Ending, Piece, ResponsePlan
from chaosllm.providers.base import Failure, Provider, cut_json

if TYPE_CHECKING:
    from chaosllm.faults.spec import FaultSpec

__all__ = [
    "Claimed",
    "Cut",
    "LiveChoice",
    "LiveContext",
    "LiveEnd",
    "LiveFault",
    "Step",
    "run_live",
]


@dataclass(frozen=True, slots=True)
class LiveContext:
    provider: Provider
    request: JSON = None
    """The (bound) request body."""


@dataclass(frozen=True, slots=True)
class LiveEnd:
    """How the client's answer ends: `pieces` written last, then `ending`."""

    pieces: tuple[Piece, ...] = ()
    ending: Ending = Ending.COMPLETE
    stall_ms: float = 0.0
    """With `Ending.STALL`: the longest silence before the socket is closed."""


@dataclass(frozen=True, slots=True)
class Step:
    write: tuple[Piece, ...] = ()
    """What the client gets now (the frame, changed or not, or nothing)."""
    end: LiveEnd | None = None
    """Set once: the client's answer ends here (no more frames are fed)."""


class LiveFault(Protocol):
    """A fault's streaming counterpart: fed the upstream's frames one at a time."""

    def feed(self, frame: bytes) -> Step: ...

    def finish(self) -> LiveEnd:
        """The upstream's stream ended (cleanly) before `Step.end` came."""

    def shows(self, frame: bytes) -> bool:
        """Whether `frame` proves the fault applies to this answer (`Claimed`)."""


LiveFactory = Callable[["FaultSpec", LiveContext], "LiveFault | None"]
"""A catalogue entry's `FaultType.live`: its machine for one stream, or None when it
cannot run live there."""


@dataclass(frozen=True, slots=True)
class LiveChoice:
    """What the engine decided at the head of a live upstream stream
    (`chaosllm.core.engine.Engine.fault_live`)."""

    fault: LiveFault | None = None
    """Apply it to the frames as they arrive."""
    buffered: Callable[[ResponsePlan, JSON], ResponsePlan] | None = None
    """A fault that needs the whole answer may fire: read it whole, then call this."""


def run_live(machine: LiveFault, frames: list[bytes]) -> tuple[tuple[Piece, ...], LiveEnd]:
    """What a machine makes of a whole stream: the pieces the client gets (the end's
    included) and the end. The frames after the end are not fed."""
    out: list[Piece] = []
    for frame in frames:
        step = machine.feed(frame)
        out += step.write
        if step.end is not None:
            return (*out, *step.end.pieces), step.end
    end = machine.finish()
    return (*out, *end.pieces), end


def _finishes(provider: Provider, frame: bytes) -> bool:
    """Whether a frame is one that finishes the answer (finish chunk, usage, terminator),
    as the whole-plan cut counts them (`FaultHooks.answer_frame_count`)."""
    plan = ResponsePlan(status=200, headers=(), pieces=(Piece(frame),))
    return provider.faults.answer_frame_count(plan) == 0


@dataclass(slots=True)
class Cut:
    """K answer frames pass untouched; the next frame (or the stream's end, None) decides
    the end (`at`). A frame that finishes the answer ends it too, as the whole-plan cut
    never keeps one."""

    provider: Provider
    after_chunks: int
    at: Callable[[bytes | None], LiveEnd]
    passed: int = 0

    def feed(self, frame: bytes) -> Step:
        if self.passed < self.after_chunks and not _finishes(self.provider, frame):
            self.passed += 1
            return Step((Piece(frame),))
        return Step((), self.at(frame))

    def finish(self) -> LiveEnd:
        return self.at(None)

    def shows(self, frame: bytes) -> bool:
        return True


def _partial(spec: FaultSpec, frame: bytes | None) -> tuple[Piece, ...]:
    """``after_bytes`` bytes of the frame after the K (never all of it), as `_cut_within`."""
    after_bytes = spec.param("after_bytes")
    if not after_bytes or frame is None:
        return ()
    size = min(after_bytes, len(frame) - 1)
    return (Piece(frame[:size], frame=False),) if size > 0 else ()


def truncated_stream(spec: FaultSpec, ctx: LiveContext) -> LiveFault:
    return Cut(ctx.provider, spec.param("after_chunks"), lambda frame: LiveEnd())


def dropped_connection(spec: FaultSpec, ctx: LiveContext) -> LiveFault:
    return Cut(
        ctx.provider,
        spec.param("after_chunks"),
        lambda frame: LiveEnd(_partial(spec, frame), Ending.CLOSE),
    )


def connection_reset(spec: FaultSpec, ctx: LiveContext) -> LiveFault:
    return Cut(
        ctx.provider,
        spec.param("after_chunks"),
        lambda frame: LiveEnd(_partial(spec, frame), Ending.RESET),
    )


def stall(spec: FaultSpec, ctx: LiveContext) -> LiveFault:
    end = LiveEnd((), Ending.STALL, spec.param("max_ms"))
    return Cut(ctx.provider, spec.param("after_chunks"), lambda frame: end)


def error_in_200(spec: FaultSpec, ctx: LiveContext) -> LiveFault:
    frame = Piece(ctx.provider.faults.stream_error_frame(_message(spec, 200), status=500))
    return Cut(ctx.provider, spec.param("after_chunks"), lambda _: LiveEnd((frame,)))


def garbage(spec: FaultSpec, ctx: LiveContext) -> LiveFault:
    data = spec.param("data")
    noise = data.encode("utf-8") if isinstance(data, str) else DEFAULT_GARBAGE

    def at(frame: bytes | None) -> LiveEnd:
        sent = noise
        if data is None and frame is not None:
            # A checksummed framing's garbage: its next frame, garbled.
            sent = ctx.provider.faults.corrupt_frame(frame) or noise
        return LiveEnd((Piece(sent),), Ending.CLOSE)

    return Cut(ctx.provider, spec.param("after_chunks"), at)


def overloaded(spec: FaultSpec, ctx: LiveContext) -> LiveFault | None:
    """K frames, then the protocol's overload error event (`FaultHooks.failure_frame`);
    without ``after_chunks`` the overload is a status before any frame: not live."""
    after_chunks = spec.param("after_chunks")
    if after_chunks is None:
        return None
    data = ctx.provider.faults.failure_frame(Failure.OVERLOADED, ctx.request, spec.param("message"))
    return Cut(ctx.provider, after_chunks, lambda _: LiveEnd((Piece(data),)))


@dataclass(slots=True)
class _Cuts:
    """One stream's `ArgumentCuts`: each call's arguments cut in their first non-empty
    delta (`cut_json` of it: never valid JSON), its later deltas' text dropped; a
    restatement of a call's whole arguments is what its deltas became."""

    memo: dict[object, Any] = field(default_factory=dict)
    sent: dict[object, str] = field(default_factory=dict)

    @property
    def broken(self) -> bool:
        return bool(self.sent)

    def __call__(self, key: object, text: str) -> str:
        if key in self.sent:
            return ""
        if not text:
            return text
        self.sent[key] = cut_json(text)
        return self.sent[key]

    def whole(self, key: object, text: str) -> str:
        return self.sent[key] if key in self.sent else self(key, text)


@dataclass(slots=True)
class _Look:
    """`ArgumentCuts` that change nothing and note whether a frame carries argument text."""

    memo: dict[object, Any] = field(default_factory=dict)
    found: bool = False

    @property
    def broken(self) -> bool:
        return False

    def __call__(self, key: object, text: str) -> str:
        self.found = self.found or bool(text)
        return text

    def whole(self, key: object, text: str) -> str:
        return self(key, text)


@dataclass(slots=True)
class _BrokenArguments:
    """Every tool call's arguments broken as the protocol's `break_argument_deltas` says
    with one stream's `_Cuts`; every other byte as it came. A frame broken into one that
    finishes the answer ends it there."""

    provider: Provider
    cuts: _Cuts = field(default_factory=_Cuts)

    def feed(self, frame: bytes) -> Step:
        broken = self.provider.faults.break_argument_deltas(frame, self.cuts)
        if broken is None or broken == frame:
            return Step((Piece(frame),))
        if _finishes(self.provider, broken) and not _finishes(self.provider, frame):
            return Step((), LiveEnd((Piece(broken),)))
        return Step((Piece(broken),))

    def finish(self) -> LiveEnd:
        return LiveEnd()

    def shows(self, frame: bytes) -> bool:
        look = _Look()
        broken = self.provider.faults.break_argument_deltas(frame, look)
        return look.found or (broken is not None and broken != frame)


def malformed_tool_args(spec: FaultSpec, ctx: LiveContext) -> LiveFault | None:
    if ctx.provider.faults.break_argument_deltas(b"", _Look()) is None:
        return None  # this protocol's deltas cannot be broken one frame at a time
    return _BrokenArguments(ctx.provider)


@dataclass(slots=True)
class Claimed:
    """A machine whose fault is taken from the board (`claim`, once) only when a frame
    `shows` it applies; until then, and for good when the claim fails, frames pass."""

    machine: LiveFault
    claim: Callable[[], bool]
    decided: bool | None = None

    def feed(self, frame: bytes) -> Step:
        if self.decided is None and self.machine.shows(frame):
            self.decided = self.claim()
        if self.decided:
            return self.machine.feed(frame)
        return Step((Piece(frame),))

    def finish(self) -> LiveEnd:
        return self.machine.finish() if self.decided else LiveEnd()

    def shows(self, frame: bytes) -> bool:
        return self.machine.shows(frame)
