"""Each fault as a pure transformation of a response plan.

`apply_fault(spec, plan, ctx)` returns the plan the wire must execute, or
None when the fault does not apply to this answer (``malformed_tool_args`` on
an answer without tool calls): then it is not consumed. What the provider's
protocol looks like when it breaks (its error envelope, its error frame, an
empty answer, which frames finish a stream) comes from the provider, so this
module knows no protocol.

"chunks" are SSE frames, never bytes. A cut after K frames never keeps the
frames that finish the answer (finish chunk, usage chunk, terminator): K is
clamped to the number of answer frames.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass

from chaosllm.faults.spec import FaultSpec
from chaosllm.model import JSON, Ending, Framing, Piece, ResponsePlan
from chaosllm.providers.base import Provider

__all__ = ["DEFAULT_GARBAGE", "FaultContext", "apply_fault"]

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


def _message(spec: FaultSpec, status: int) -> str:
    message = spec.param("message")
    if isinstance(message, str):
        return message
    return _DEFAULT_MESSAGES.get(status, f"chaosllm injected an HTTP {status} error.")


def _error_plan(
    spec: FaultSpec, plan: ResponsePlan, ctx: FaultContext, status: int, retry_after: float | None
) -> ResponsePlan:
    body = ctx.provider.error_answer(_message(spec, status), status=status)
    headers: list[tuple[str, str]] = [("content-type", "application/json")]
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


def _body_prefix(plan: ResponsePlan, after_bytes: int | None) -> tuple[Piece, ...]:
    body = plan.body()
    size = len(body) // 2 if after_bytes is None else min(after_bytes, max(len(body) - 1, 0))
    return (Piece(body[:size], frame=False),) if size else ()


def apply_fault(spec: FaultSpec, plan: ResponsePlan, ctx: FaultContext) -> ResponsePlan | None:
    kind = spec.type
    stream = ctx.stream and plan.framing is Framing.CHUNKED

    if kind == "empty_response":
        return ctx.render(ctx.provider.empty_answer(ctx.answer))

    if kind == "malformed_tool_args":
        broken = ctx.provider.break_tool_arguments(ctx.answer)
        return None if broken is None else ctx.render(broken)

    if kind == "http_503":
        return _error_plan(spec, plan, ctx, 503, spec.param("retry_after"))
    if kind == "http_429":
        return _error_plan(spec, plan, ctx, 429, spec.param("retry_after"))
    if kind == "http_error":
        return _error_plan(spec, plan, ctx, spec.param("status"), spec.param("retry_after"))

    if kind == "truncated_stream":
        if stream:
            return plan.with_(pieces=_cut(plan, ctx, spec.param("after_chunks")))
        body = plan.body()
        cut = body[: max(1, len(body) // 2)]
        return plan.with_(pieces=(Piece(cut, frame=False),), content_length=None, close_after=True)

    if kind == "dropped_connection":
        if stream:
            return plan.with_(
                pieces=_cut(plan, ctx, spec.param("after_chunks")), ending=Ending.CLOSE
            )
        return plan.with_(
            pieces=_body_prefix(plan, spec.param("after_bytes")),
            content_length=plan.declared_length,
            ending=Ending.CLOSE,
        )

    if kind == "error_in_200":
        message = _message(spec, 200)
        if stream:
            frame = Piece(ctx.provider.stream_error_frame(message, status=500))
            return plan.with_(
                status=200, pieces=(*_cut(plan, ctx, spec.param("after_chunks")), frame)
            )
        body = json.dumps(ctx.provider.error_answer(message, status=500)).encode("utf-8")
        return plan.with_(status=200, pieces=(Piece(body, frame=False),), content_length=None)

    if kind == "connection_reset":
        if stream:
            return plan.with_(
                pieces=_cut(plan, ctx, spec.param("after_chunks")), ending=Ending.RESET
            )
        after_bytes = spec.param("after_bytes")
        if after_bytes == 0:
            return plan.with_(send_head=False, pieces=(), ending=Ending.RESET)
        return plan.with_(
            pieces=_body_prefix(plan, after_bytes),
            content_length=plan.declared_length,
            ending=Ending.RESET,
        )

    if kind == "empty_reply":
        return plan.with_(send_head=False, pieces=(), ending=Ending.CLOSE)

    if kind == "latency":
        return plan.with_(head_delay_ms=plan.head_delay_ms + spec.param("delay_ms"))

    if kind == "slow_stream":
        delay = spec.param("delay_ms")
        if stream:
            return plan.with_(
                pieces=tuple(Piece(p.data, p.delay_ms + delay, p.frame) for p in plan.pieces)
            )
        body, size = plan.body(), spec.param("piece_bytes")
        pieces = tuple(
            Piece(body[i : i + size], delay, frame=False) for i in range(0, len(body), size)
        )
        return plan.with_(pieces=pieces, content_length=plan.declared_length)

    if kind == "stall":
        if stream:
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

    if kind == "garbage":
        data = spec.param("data")
        garbage = data.encode("utf-8") if isinstance(data, str) else DEFAULT_GARBAGE
        if stream:
            return plan.with_(
                pieces=(*_cut(plan, ctx, spec.param("after_chunks")), Piece(garbage)),
                ending=Ending.CLOSE,
            )
        return plan.with_(
            send_head=False, pieces=(Piece(garbage, frame=False),), ending=Ending.CLOSE
        )

    raise AssertionError(f"fault type {kind!r} has no transformation")  # pragma: no cover
