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
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from chaosllm.config import Pace
from chaosllm.model import JSON, Ending, Framing, Piece, ResponsePlan
from chaosllm.providers.base import Failure, Provider
from chaosllm.providers.ratelimits import openai_duration

if TYPE_CHECKING:
    from chaosllm.faults.spec import FaultSpec

__all__ = ["DEFAULT_GARBAGE", "FaultContext", "apply_fault", "fault_applies", "paced"]

DEFAULT_GARBAGE = (
    b"\x00\xff\xfe\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"
    b"\x8b\xad\xf0\x0d<html><body>502 Bad Gateway</body></html>\r\n\x00\x00"
)

_DEFAULT_MESSAGES = {
    503: "The server is overloaded or not ready yet.",
    429: "Rate limit reached for requests. Please try again in {wait}.",
    200: "The server had an error while processing your request. Sorry about that!",
}
_DEFAULT_WAIT = 1.0
"""The wait a 429 without ``retry_after`` tells of (its body and its reset headers)."""


@dataclass(frozen=True, slots=True)
class FaultContext:
    provider: Provider
    stream: bool
    answer: JSON
    """The answer body the plan was rendered from."""
    render: Callable[[JSON], ResponsePlan]
    """Renders another answer body for the same request (no recorded frames)."""
    request: JSON = None
    """The (bound) request body, when known: what `FaultType.on_request` reads."""
    draw_key: str = ""
    """Seeds the random draws of a transform (a pace's jitter): the server seed and the
    request's place in its session, so ``--seed`` repeats them exactly."""
    wall: float = 0.0
    """The time of the request (seconds since the epoch, the engine's clock): what an
    absolute reset (Anthropic's ``anthropic-ratelimit-*-reset``) is counted from."""


def fault_applies(
    spec: FaultSpec,
    provider: Provider,
    answer: JSON,
    *,
    request: JSON = None,
    stream: bool | None = None,
) -> bool:
    """Whether `spec` can fire on `answer` (a fault that cannot is not consumed); given
    `stream` (and the `request` body), also whether it can fire on that request
    (`FaultType.on_request`: the SSE quirks fire on SSE streams only)."""
    entry = spec.entry
    if stream is not None and not entry.on_request(provider, request, stream):
        return False
    return entry.applies(provider, answer)


def apply_fault(spec: FaultSpec, plan: ResponsePlan, ctx: FaultContext) -> ResponsePlan | None:
    """The plan after the fault, or None when it does not apply to `ctx.answer` (or, the
    request known, to `ctx.request`)."""
    entry = spec.entry
    if ctx.request is not None and not entry.on_request(ctx.provider, ctx.request, ctx.stream):
        return None
    if not entry.applies(ctx.provider, ctx.answer):
        return None
    return entry.transform(plan, spec, ctx)


# -- applicability ------------------------------------------------------------------------------


def always(provider: Provider, answer: JSON) -> bool:
    return True


def is_object(provider: Provider, answer: JSON) -> bool:
    return isinstance(answer, dict)


def has_tool_arguments(provider: Provider, answer: JSON) -> bool:
    return isinstance(answer, dict) and provider.faults.break_tool_arguments(answer) is not None


def can_filter(provider: Provider, answer: JSON) -> bool:
    """An answer the protocol's content filter can cut (`FaultHooks.filtered_answer`)."""
    return isinstance(answer, dict) and provider.faults.filtered_answer(answer) is not None


def any_request(provider: Provider, request: JSON, stream: bool) -> bool:
    return True


def sse_stream(provider: Provider, request: JSON, stream: bool) -> bool:
    """A streaming request answered with Server-Sent Events (`FaultHooks.streams_sse`)."""
    return stream and provider.faults.streams_sse(request)


def has_non_ascii(provider: Provider, answer: JSON) -> bool:
    """An answer with a character beyond ASCII somewhere (what ``split_utf8`` splits)."""
    return _non_ascii(answer)


def has_usage_frame(provider: Provider, answer: JSON) -> bool:
    return provider.faults.usage_frame(answer) is not None


def has_filter_frames(provider: Provider, answer: JSON) -> bool:
    return provider.faults.filter_frames(answer) is not None


def restates_arguments(provider: Provider, answer: JSON) -> bool:
    return provider.faults.restated_arguments(answer) is not None


def _non_ascii(value: JSON) -> bool:
    if isinstance(value, str):
        return not value.isascii()
    if isinstance(value, dict):
        return any(_non_ascii(k) or _non_ascii(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_non_ascii(v) for v in value)
    return False


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
    errors = ctx.provider.errors
    headers = [("content-type", "application/json"), *ctx.provider.error_headers(status)]
    if retry_after is not None:
        # Retry-After is whole seconds: round up, so a client that honours it never
        # comes back before `retry_after` has passed (round() took 2.5 to "2").
        headers.append(("retry-after", str(math.ceil(retry_after))))
        headers.append(("retry-after-ms", str(int(retry_after * 1000))))
    if status == 429:
        # The body, the wait and the provider's own rate-limit headers tell one wait.
        wait = _DEFAULT_WAIT if retry_after is None else retry_after
        given = spec.param("message")
        message = (
            given
            if isinstance(given, str)
            else _DEFAULT_MESSAGES[429].format(wait=openai_duration(wait))
        )
        body = errors.throttled_answer(message, retry_after=wait)
        headers += errors.throttle_headers(wait, ctx.wall)
    else:
        body = errors.error_answer(_message(spec, status), status=status)
    data = json.dumps(body, ensure_ascii=False).encode("utf-8")
    return ResponsePlan(status=status, headers=tuple(headers), pieces=(Piece(data, frame=False),))


def _cut(plan: ResponsePlan, ctx: FaultContext, after_chunks: int) -> tuple[Piece, ...]:
    keep = min(after_chunks, ctx.provider.faults.answer_frame_count(plan))
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
    return ctx.render(ctx.provider.faults.empty_answer(ctx.answer))


def malformed_tool_args(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    broken = ctx.provider.faults.break_tool_arguments(ctx.answer)
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
        kept = _cut(plan, ctx, spec.param("after_chunks"))
        data = ctx.provider.faults.stream_error_frame(message, status=500)
        frame = Piece(ctx.provider.faults.framed_error(data, plan, len(kept)))
        return plan.with_(status=200, pieces=(*kept, frame))
    body = json.dumps(ctx.provider.errors.error_answer(message, status=500)).encode("utf-8")
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
            noise = ctx.provider.faults.corrupt_frame(plan.pieces[len(kept)].data) or noise
        return plan.with_(pieces=(*kept, Piece(noise)), ending=Ending.CLOSE)
    return plan.with_(send_head=False, pieces=(Piece(noise, frame=False),), ending=Ending.CLOSE)


# -- the named failure classes (`Failure`: each protocol words them, `Errors.failure`) ----


def _failure_plan(
    spec: FaultSpec, ctx: FaultContext, failure: Failure, retry_after: float | None = None
) -> ResponsePlan:
    reply = ctx.provider.errors.failure(failure, ctx.request, spec.param("message"))
    headers = [("content-type", "application/json"), *reply.headers]
    if retry_after is not None:
        headers.append(("retry-after", str(math.ceil(retry_after))))
        headers.append(("retry-after-ms", str(int(retry_after * 1000))))
    data = json.dumps(reply.body, ensure_ascii=False).encode("utf-8")
    return ResponsePlan(
        status=reply.status, headers=tuple(headers), pieces=(Piece(data, frame=False),)
    )


def context_length_exceeded(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    return _failure_plan(spec, ctx, Failure.CONTEXT_TOO_LONG)


def insufficient_quota(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    return _failure_plan(spec, ctx, Failure.QUOTA_EXHAUSTED)


def invalid_api_key(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    return _failure_plan(spec, ctx, Failure.KEY_REFUSED)


def model_not_found(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    return _failure_plan(spec, ctx, Failure.NO_SUCH_MODEL)


def overloaded(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    """The overload status; with ``after_chunks`` on a stream, K frames and then the
    protocol's error event (Anthropic's ``overloaded_error``) instead of the rest."""
    after_chunks = spec.param("after_chunks")
    if after_chunks is not None and _streaming(plan, ctx):
        kept = _cut(plan, ctx, after_chunks)
        data = ctx.provider.faults.failure_frame(
            Failure.OVERLOADED, ctx.request, spec.param("message")
        )
        frame = Piece(ctx.provider.faults.framed_error(data, plan, len(kept)))
        return plan.with_(pieces=(*kept, frame))
    return _failure_plan(spec, ctx, Failure.OVERLOADED, spec.param("retry_after"))


def content_filter(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    filtered = ctx.provider.faults.filtered_answer(ctx.answer)
    assert filtered is not None, "apply_fault checks can_filter first"
    return ctx.render(filtered)


# -- the pace (``--timing ttft=...,tps=...``, and the fault that paces one answer) ---------


def paced(plan: ResponsePlan, pace: Pace, provider: Provider, draw_key: str) -> ResponsePlan:
    """`plan` at `pace`: a stream's first piece after the ttft, each later frame after its
    tokens (`FaultHooks.frame_tokens`) at ``tps`` (pieces that are no frame: none), a JSON
    answer's head after the ttft and its whole text's tokens; every gap scaled by a factor
    drawn from [1 - jitter, 1 + jitter] by ``Random(draw_key)``, so the same key gives the
    same gaps. The rendered gaps are replaced; ``head_delay_ms`` and a fault's are kept."""
    rng = random.Random(draw_key)
    jitter = pace.jitter

    def scaled(ms: float) -> float:
        return ms * (1.0 + jitter * (2.0 * rng.random() - 1.0)) if jitter and ms else ms

    per_token = 1000.0 / pace.tps if pace.tps else 0.0
    if plan.framing is not Framing.CHUNKED:
        if not plan.send_head or plan.status >= 400:
            return plan
        answer_ms = 0.0
        if per_token:
            try:
                answer_ms = provider.faults.text_tokens(json.loads(plan.body())) * per_token
            except ValueError:
                answer_ms = 0.0
        return plan.with_(head_delay_ms=plan.head_delay_ms + scaled(pace.ttft_ms + answer_ms))
    pieces = []
    for i, piece in enumerate(plan.pieces):
        if i == 0:
            gap = pace.ttft_ms
        else:
            gap = provider.faults.frame_tokens(piece.data) * per_token if piece.frame else 0.0
        pieces.append(Piece(piece.data, scaled(gap), piece.frame))
    return plan.with_(pieces=tuple(pieces))


def pace(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    tps = spec.param("tps")
    chosen = Pace(ttft_ms=spec.param("ttft_ms"), tps=tps or None, jitter=spec.param("jitter"))
    return paced(plan, chosen, ctx.provider, ctx.draw_key)


# -- legal-but-nasty wire quirks (each leaves a valid stream) ----------------------------------


def _stream_pieces(plan: ResponsePlan, ctx: FaultContext) -> tuple[Piece, ...] | None:
    return plan.pieces if _streaming(plan, ctx) else None


def keepalive_comments(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    pieces = _stream_pieces(plan, ctx)
    if not pieces:
        return plan
    comment = (spec.param("comment") or "PROCESSING").replace("\r", " ").replace("\n", " ")
    line = (": " + comment + "\n\n").encode("utf-8")
    every, out = spec.param("every_frames"), []
    for i, piece in enumerate(pieces):
        out.append(piece)
        if (i + 1) % every == 0 and i + 1 < len(pieces):
            out.append(Piece(line, frame=False))
    return plan.with_(pieces=tuple(out))


def _rewrite_frames(
    plan: ResponsePlan, ctx: FaultContext, pattern: re.Pattern[bytes], replacement: bytes
) -> ResponsePlan:
    """A stream's pieces with each match of `pattern` replaced (their gaps kept)."""
    pieces = _stream_pieces(plan, ctx)
    if not pieces:
        return plan
    return plan.with_(
        pieces=tuple(Piece(pattern.sub(replacement, p.data), p.delay_ms, p.frame) for p in pieces)
    )


_LINE_END = re.compile(rb"\r\n|\r|\n")


def crlf_frames(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    return _rewrite_frames(plan, ctx, _LINE_END, b"\r\n")


_DATA_SPACE = re.compile(rb"(?m)^data: ")


def data_no_space(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    return _rewrite_frames(plan, ctx, _DATA_SPACE, b"data:")


_ESCAPE = re.compile(rb"\\u([0-9a-fA-F]{4})")


def _multibyte(data: bytes) -> tuple[bytes, int] | None:
    """`data` (a frame) with a multi-byte UTF-8 character in it, and the offset of its
    first byte: the first one the frame has, else its first ``\\uXXXX`` escape of a
    character beyond ASCII (no surrogate) written out as UTF-8, the same JSON."""
    for i, byte in enumerate(data):
        if byte >= 0xC0:
            return data, i
    for found in _ESCAPE.finditer(data):
        code = int(found.group(1), 16)
        if code >= 0x80 and not 0xD800 <= code <= 0xDFFF:
            start = found.start()
            # an escaped backslash before it makes it no escape
            backslashes = len(data[:start]) - len(data[:start].rstrip(b"\\"))
            if backslashes % 2 == 0:
                char = chr(code).encode("utf-8")
                return data[:start] + char + data[found.end() :], start
    return None


def split_utf8(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    pieces = _stream_pieces(plan, ctx)
    if not pieces:
        return plan
    for at, piece in enumerate(pieces):
        found = _multibyte(piece.data) if piece.frame else None
        if found is None:
            continue
        data, start = found
        cut = start + 1  # after the lead byte: both halves are invalid UTF-8 alone
        first = Piece(data[:cut], piece.delay_ms, piece.frame)
        second = Piece(data[cut:], spec.param("gap_ms"), frame=False)
        return plan.with_(pieces=(*pieces[:at], first, second, *pieces[at + 1 :]))
    return plan


def _before_the_end(pieces: tuple[Piece, ...], extra: Piece) -> tuple[Piece, ...]:
    """`extra` before the stream's last piece (its terminator), or last when it has one
    piece or none."""
    if len(pieces) < 2:
        return (*pieces, extra)
    return (*pieces[:-1], extra, pieces[-1])


def usage_only_frame(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    pieces = _stream_pieces(plan, ctx)
    frame = ctx.provider.faults.usage_frame(ctx.answer)
    if (
        not pieces
        or frame is None
        or any(ctx.provider.faults.carries_usage(p.data) for p in pieces)
    ):
        return plan  # asked for: the usage frame is there already
    return plan.with_(pieces=_before_the_end(pieces, Piece(frame)))


def filter_frames(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    pieces = _stream_pieces(plan, ctx)
    frames = ctx.provider.faults.filter_frames(ctx.answer)
    if not pieces or frames is None:
        return plan
    first, last = frames
    return plan.with_(pieces=(Piece(first), *_before_the_end(pieces, Piece(last))))


def restated_tool_args(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    pieces = _stream_pieces(plan, ctx)
    arguments = ctx.provider.faults.restated_arguments(ctx.answer)
    if not pieces or arguments is None:
        return plan
    restate = ctx.provider.faults.restate_arguments
    out = tuple(Piece(restate(p.data, arguments), p.delay_ms) if p.frame else p for p in pieces)
    return plan.with_(pieces=out)
