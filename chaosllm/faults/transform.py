"""Each fault as a pure transformation of a response plan.

Every fault type's transform is a function ``(plan, spec, ctx) -> plan`` here;
the catalogue (`chaosllm.faults.catalogue`) names them, so dispatch is a table
lookup, never a chain of name comparisons. `apply_fault(spec, plan, ctx)`
returns the plan the wire must execute, or None when the fault does not apply
to this answer (``fault_applies``: a tool-call fault on an answer without tool
calls): then it is not consumed. What the provider's protocol looks like when
it breaks (its error envelope, its error frame, an empty answer, which frames
finish a stream) comes from the provider, so this module knows no protocol.

"chunks" are SSE frames, never bytes. A cut after K frames never keeps the
frames that finish the answer (finish chunk, usage chunk, terminator): K is
clamped to the number of answer frames.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from chaosllm.model import JSON, Ending, Framing, Piece, ResponsePlan
from chaosllm.providers.base import Provider

if TYPE_CHECKING:
    from chaosllm.faults.spec import FaultSpec

__all__ = ["DEFAULT_GARBAGE", "FaultContext", "apply_fault", "fault_applies"]

DEFAULT_GARBAGE = (
    b"\x00\xff\xfe\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"
    b"\x8b\xad\xf0\x0d<html><body>502 Bad Gateway</body></html>\r\n\x00\x00"
)

_DEFAULT_MESSAGES = {
    503: "The server is overloaded or not ready yet.",
    429: "Rate limit reached for requests. Please try again in 1s.",
    200: "The server had an error while processing your request. Sorry about that!",
}


@dataclass(frozen=True, slots=True)
class FaultContext:
    provider: Provider
    stream: bool
    answer: JSON
    """The answer body the plan was rendered from."""
    render: Callable[[JSON], ResponsePlan]
    """Renders another answer body for the same request (no recorded frames)."""


def fault_applies(spec: FaultSpec, provider: Provider, answer: JSON) -> bool:
    """Whether `spec` can fire on `answer` (a fault that cannot is not consumed)."""
    return spec.entry.applies(provider, answer)


def apply_fault(spec: FaultSpec, plan: ResponsePlan, ctx: FaultContext) -> ResponsePlan | None:
    """The plan after the fault, or None when it does not apply to `ctx.answer`."""
    entry = spec.entry
    if not entry.applies(ctx.provider, ctx.answer):
        return None
    return entry.transform(plan, spec, ctx)


# -- applicability ------------------------------------------------------------------------------


def always(provider: Provider, answer: JSON) -> bool:
    return True


def is_object(provider: Provider, answer: JSON) -> bool:
    return isinstance(answer, dict)


def has_tool_arguments(provider: Provider, answer: JSON) -> bool:
    return isinstance(answer, dict) and provider.break_tool_arguments(answer) is not None


# -- helpers ------------------------------------------------------------------------------------


def _streaming(plan: ResponsePlan, ctx: FaultContext) -> bool:
    return ctx.stream and plan.framing is Framing.CHUNKED


def _message(spec: FaultSpec, status: int) -> str:
    message = spec.param("message")
    if isinstance(message, str):
        return message
    return _DEFAULT_MESSAGES.get(status, f"chaosllm injected an HTTP {status} error.")


def _error_plan(
    spec: FaultSpec, ctx: FaultContext, status: int, retry_after: float | None
) -> ResponsePlan:
    body = ctx.provider.error_answer(_message(spec, status), status=status)
    headers = [("content-type", "application/json"), *ctx.provider.error_headers(status)]
    if retry_after is not None:
        # Retry-After is whole seconds: round up, so a client that honours it never
        # comes back before `retry_after` has passed (round() took 2.5 to "2").
        headers.append(("retry-after", str(math.ceil(retry_after))))
        headers.append(("retry-after-ms", str(int(retry_after * 1000))))
    if status == 429:
        headers += [
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", f"{1.0 if retry_after is None else retry_after:g}s"),
        ]
    data = json.dumps(body, ensure_ascii=False).encode("utf-8")
    return ResponsePlan(status=status, headers=tuple(headers), pieces=(Piece(data, frame=False),))


def _cut(plan: ResponsePlan, ctx: FaultContext, after_chunks: int) -> tuple[Piece, ...]:
    keep = min(after_chunks, ctx.provider.answer_frame_count(plan))
    return plan.pieces[:keep]


def _cut_within(plan: ResponsePlan, ctx: FaultContext, spec: FaultSpec) -> tuple[Piece, ...]:
    """K frames (`_cut`), then ``after_bytes`` bytes of the next one: a cut inside a frame
    (none without ``after_bytes``; never the whole frame)."""
    kept = _cut(plan, ctx, spec.param("after_chunks"))
    after_bytes = spec.param("after_bytes")
    if after_bytes and len(kept) < len(plan.pieces):
        cut = plan.pieces[len(kept)]
        size = min(after_bytes, len(cut.data) - 1)
        if size > 0:
            kept = (*kept, Piece(cut.data[:size], cut.delay_ms, frame=False))
    return kept


def _body_prefix(plan: ResponsePlan, after_bytes: int | None) -> tuple[Piece, ...]:
    body = plan.body()
    size = len(body) // 2 if after_bytes is None else min(after_bytes, max(len(body) - 1, 0))
    return (Piece(body[:size], frame=False),) if size else ()


# -- the transforms, one per fault type ---------------------------------------------------------


def empty_response(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    return ctx.render(ctx.provider.empty_answer(ctx.answer))


def malformed_tool_args(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    broken = ctx.provider.break_tool_arguments(ctx.answer)
    assert broken is not None, "apply_fault checks has_tool_arguments first"
    return ctx.render(broken)


def http_503(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    return _error_plan(spec, ctx, 503, spec.param("retry_after"))


def http_429(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    return _error_plan(spec, ctx, 429, spec.param("retry_after"))


def http_error(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    return _error_plan(spec, ctx, spec.param("status"), spec.param("retry_after"))


def truncated_stream(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    if _streaming(plan, ctx):
        return plan.with_(pieces=_cut(plan, ctx, spec.param("after_chunks")))
    body = plan.body()
    cut = body[: max(1, len(body) // 2)]
    return plan.with_(pieces=(Piece(cut, frame=False),), content_length=None, close_after=True)


def dropped_connection(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    if _streaming(plan, ctx):
        return plan.with_(pieces=_cut_within(plan, ctx, spec), ending=Ending.CLOSE)
    return plan.with_(
        pieces=_body_prefix(plan, spec.param("after_bytes")),
        content_length=plan.declared_length,
        ending=Ending.CLOSE,
    )


def error_in_200(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    message = _message(spec, 200)
    if _streaming(plan, ctx):
        frame = Piece(ctx.provider.stream_error_frame(message, status=500))
        return plan.with_(status=200, pieces=(*_cut(plan, ctx, spec.param("after_chunks")), frame))
    body = json.dumps(ctx.provider.error_answer(message, status=500)).encode("utf-8")
    return plan.with_(status=200, pieces=(Piece(body, frame=False),), content_length=None)


def connection_reset(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    if _streaming(plan, ctx):
        return plan.with_(pieces=_cut_within(plan, ctx, spec), ending=Ending.RESET)
    after_bytes = spec.param("after_bytes")
    if after_bytes == 0:
        return plan.with_(send_head=False, pieces=(), ending=Ending.RESET)
    return plan.with_(
        pieces=_body_prefix(plan, after_bytes),
        content_length=plan.declared_length,
        ending=Ending.RESET,
    )


def empty_reply(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    return plan.with_(send_head=False, pieces=(), ending=Ending.CLOSE)


def latency(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    return plan.with_(head_delay_ms=plan.head_delay_ms + spec.param("delay_ms"))


def slow_stream(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    delay = spec.param("delay_ms")
    if _streaming(plan, ctx):
        return plan.with_(
            pieces=tuple(Piece(p.data, p.delay_ms + delay, p.frame) for p in plan.pieces)
        )
    body, size = plan.body(), spec.param("piece_bytes")
    pieces = tuple(Piece(body[i : i + size], delay, frame=False) for i in range(0, len(body), size))
    return plan.with_(pieces=pieces, content_length=plan.declared_length)


def stall(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    if _streaming(plan, ctx):
        return plan.with_(
            pieces=_cut(plan, ctx, spec.param("after_chunks")),
            ending=Ending.STALL,
            stall_ms=spec.param("max_ms"),
        )
    return plan.with_(
        pieces=(),
        content_length=plan.declared_length,
        ending=Ending.STALL,
        stall_ms=spec.param("max_ms"),
    )


def garbage(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    data = spec.param("data")
    noise = data.encode("utf-8") if isinstance(data, str) else DEFAULT_GARBAGE
    if _streaming(plan, ctx):
        kept = _cut(plan, ctx, spec.param("after_chunks"))
        if data is None and len(kept) < len(plan.pieces):
            # A checksummed framing's garbage: its next frame, garbled (the checksum fails).
            noise = ctx.provider.corrupt_frame(plan.pieces[len(kept)].data) or noise
        return plan.with_(pieces=(*kept, Piece(noise)), ending=Ending.CLOSE)
    return plan.with_(send_head=False, pieces=(Piece(noise, frame=False),), ending=Ending.CLOSE)
