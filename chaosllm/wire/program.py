"""A `ResponsePlan` compiled into a wire program: what to write, when, and how it ends.

Theory of operation
-------------------
A plan is data about a response (`chaosllm.model`); a program is the same response as
the steps an executor takes (`chaosllm.wire.executor` awaits them, `chaosllm.wire.player`
runs them from the loop's callbacks). A program is a sequence of segments, each
``(delay in seconds, data, frames, body bytes, carries the head)``: the executor waits
the delay, writes the data and adds the counts to the plan's report. Then the ending:

- `KEEP`: the message is complete; the connection serves the next request when
  `Program.keep` says it can (else it is closed, FIN);
- `FIN`: the connection is closed;
- `RST`: every byte written is flushed to the kernel, then the connection is reset;
- `STALL`: silence for `Program.stall_s` (or until the client leaves), then FIN.

Two kinds of program come out of one plan:

- `Program`, bytes for a socket (`compile_program`): the head (`chaosllm.wire.head`)
  and every piece up to the next delay are one segment, framed as h11 frames them. The
  ``Date`` value is the one thing that changes between two requests: the head's bytes
  before it are `Program.prefix`, spliced in by `Program.first`.
- `AsgiProgram`, ASGI messages (`compile_asgi`): for a plan run under another ASGI
  server, degraded to what standard ASGI can say (see `chaosllm.wire.asgi`).

Compiling is pure and done once: `program_for` and `asgi_program_for` keep what they
compile on the plan itself (`ResponsePlan.compiled`), keyed by the few things that vary
(the kind of request and whether the server wants to close), so a plan the engine keeps
and serves again carries its programs, and the cache lives and dies with it. A plan made
afresh for every request (a session's replay: fresh ids, the same headers) finds its
head in `_head`'s memo, by value, since building a head costs more than the rest.
"""

from __future__ import annotations

import functools
from typing import Final, Generic, TypeVar, cast

from chaosllm.model import Ending, Framing, ResponsePlan
from chaosllm.wire.head import CHUNKED, HTTP10, LENGTH, Head, build_head, http_date

__all__ = [
    "FIN",
    "KEEP",
    "RST",
    "STALL",
    "AsgiPart",
    "AsgiProgram",
    "Program",
    "Steps",
    "asgi_program_for",
    "compile_asgi",
    "compile_program",
    "program_for",
]

KEEP: Final = 0
FIN: Final = 1
RST: Final = 2
STALL: Final = 3

_ENDINGS: Final = {Ending.COMPLETE: KEEP, Ending.CLOSE: FIN, Ending.RESET: RST, Ending.STALL: STALL}
_FRAMING_HEADERS: Final = frozenset({"content-length", "transfer-encoding"})
_ASGI: Final = "asgi"

T = TypeVar("T")

AsgiPart = tuple[bytes, bool] | None
"""One ASGI message of an `AsgiProgram`: None for ``http.response.start``, else
``(body, more_body)`` for ``http.response.body``."""


class Steps(Generic[T]):
    """What both kinds of program are: segments of `T` and an ending."""

    __slots__ = ("ending", "keep", "segments", "stall_s")

    def __init__(
        self,
        segments: tuple[tuple[float, T, int, int, bool], ...],
        ending: int,
        keep: bool,
        stall_s: float,
    ) -> None:
        self.segments = segments
        """(delay in seconds, data, frames, body bytes, carries the head)."""
        self.ending = ending
        """`KEEP`, `FIN`, `RST` or `STALL`."""
        self.keep = keep
        """Whether the connection can serve another request afterwards."""
        self.stall_s = stall_s
        """With `STALL`: the longest silence before the connection is closed."""

    def first(self) -> T:
        """The data of the first segment, as it is written now."""
        return self.segments[0][1]


class Program(Steps[bytes]):
    """A plan as bytes for a socket (see the module docstring)."""

    __slots__ = ("halves", "head_end", "instant", "lines", "prefix")

    def __init__(
        self,
        segments: tuple[tuple[float, bytes, int, int, bool], ...],
        ending: int,
        keep: bool,
        stall_s: float,
        prefix: bytes | None,
        head_end: int = -1,
    ) -> None:
        super().__init__(segments, ending, keep, stall_s)
        self.head_end = head_end
        """Where the head ends in the first segment's data (after its blank line); -1:
        the program writes no head."""
        self.prefix = prefix
        """The head up to its ``Date`` value: the first segment is `prefix`, the date,
        then its data. None: no date to fill in (no head, or the plan's own Date)."""
        self.lines: tuple[bytes, bytes, bytes] | None = None
        """Header lines last in the head (`with_header_lines`): the first segment's data
        before them, the lines, the data after them; None: none added."""
        self.halves: tuple[bytes, bytes] | None = None
        """The first segment's data cut before the blank line that ends the head, on the
        first `with_header_lines` (a program kept for many answers cuts it once)."""
        self.instant = len(segments) == 1 and segments[0][0] <= 0 and ending in (KEEP, FIN)
        """No delay and nothing to wait for: executed at once, without a task."""

    def first(self) -> bytes:
        prefix = self.prefix
        lines = self.lines
        if lines is None:
            if prefix is None:
                return self.segments[0][1]
            return b"".join((prefix, http_date(), self.segments[0][1]))
        if prefix is None:
            return b"".join(lines)
        return b"".join((prefix, http_date(), *lines))

    def with_header_lines(self, lines: bytes) -> Program:
        """This program with header `lines` (``name: value\r\n`` each) last in its head:
        the same segments, the lines spliced in by `first` (the body is not copied)."""
        derived = Program.__new__(Program)
        derived.segments = self.segments
        derived.ending = self.ending
        derived.keep = self.keep
        derived.stall_s = self.stall_s
        derived.prefix = self.prefix
        derived.head_end = self.head_end + len(lines)
        derived.instant = self.instant
        derived.halves = None
        if self.lines is None:
            halves = self.halves
            if halves is None:
                cut = self.head_end - 2  # before the blank line that ends the head
                data = self.segments[0][1]
                self.halves = halves = (data[:cut], data[cut:])
            derived.lines = (halves[0], lines, halves[1])
        else:
            before, added, after = self.lines
            derived.lines = (before, added + lines, after)
        return derived


class AsgiProgram(Steps[AsgiPart]):
    """A plan as ASGI messages (see `chaosllm.wire.asgi`)."""

    __slots__ = ("abort", "degraded", "headers", "status", "waits")

    def __init__(
        self,
        segments: tuple[tuple[float, AsgiPart, int, int, bool], ...],
        ending: int,
        stall_s: float,
        *,
        status: int,
        headers: tuple[tuple[bytes, bytes], ...],
        abort: str | None,
        degraded: tuple[str, str] | None,
        waits: bool,
    ) -> None:
        super().__init__(segments, ending, True, stall_s)
        self.status = status
        self.headers = headers
        self.abort = abort
        """Why the hosting server must abort the connection afterwards, if it must."""
        self.degraded = degraded
        """(kind, explanation) when this is not exactly the plan, else None."""
        self.waits = waits
        """Whether it may wait (and must watch for the client leaving meanwhile)."""


def _cached(plan: ResponsePlan, key: object) -> object | None:
    try:
        cache = plan.compiled
    except AttributeError:  # nothing compiled yet
        return None
    return cache.get(key)


def _keep(plan: ResponsePlan, key: object, program: object) -> None:
    try:
        cache = plan.compiled
    except AttributeError:
        cache = {}
        object.__setattr__(plan, "compiled", cache)  # a cache, not part of the value
    cache[key] = program


def program_for(
    plan: ResponsePlan, *, is_head: bool, http10: bool, keep_alive: bool, close: bool
) -> Program:
    """`compile_program`, once per plan and variant (see the module docstring)."""
    variant = is_head | http10 << 1 | keep_alive << 2 | close << 3
    derived = getattr(plan, "stamped_from", None)
    if derived is not None:  # the base plan's program, compiled once, re-headed
        base, lines = derived
        program = program_for(
            base, is_head=is_head, http10=http10, keep_alive=keep_alive, close=close
        )
        if program.head_end >= 0:
            return program.with_header_lines(lines)
    found = _cached(plan, variant)
    if found is not None:
        return cast(Program, found)
    program = compile_program(
        plan, is_head=is_head, http10=http10, keep_alive=keep_alive, close=close
    )
    _keep(plan, variant, program)
    return program


@functools.lru_cache(maxsize=1024)
def _head(
    status: int,
    headers: tuple[tuple[str, str], ...],
    length: int,
    is_head: bool,
    http10: bool,
    keep_alive: bool,
    close: bool,
) -> Head:
    """The head of a plan with `status`, `headers` and a body of `length` (-1: chunked),
    by value: a plan made afresh for each request (a session's replay, with fresh ids)
    has the headers of the last one, and building a head costs more than the rest of
    its program."""
    encoded = [
        (name.encode("latin-1"), value.encode("latin-1"))
        for name, value in headers
        if name.lower() not in _FRAMING_HEADERS
    ]
    if length >= 0:
        encoded.append((b"content-length", b"%d" % length))
    else:
        encoded.append((b"transfer-encoding", b"chunked"))
    return build_head(
        status, encoded, is_head=is_head, http10=http10, keep_alive=keep_alive, close=close
    )


def compile_program(
    plan: ResponsePlan, *, is_head: bool, http10: bool, keep_alive: bool, close: bool
) -> Program:
    """`plan` as bytes for a request (a HEAD or not, of HTTP/1.0 or 1.1, whose client
    wants keep-alive or not) on a connection the server wants to `close` or not, framed
    as h11 frames it: a body shorter than its Content-Length is never completed, bytes
    beyond it are written raw, and a message that is not completed ends the connection.
    RuntimeError for a head h11 refuses to send."""
    segments: list[tuple[float, bytes, int, int, bool]] = []
    parts: list[bytes] = []
    frames = size = 0
    head = False
    prefix: bytes | None = None
    head_end = -1
    delay = plan.head_delay_ms / 1000
    raw = not plan.send_head
    mode, remaining, keep = HTTP10, 0, False
    if plan.send_head:
        length = plan.declared_length if plan.framing is Framing.LENGTH else -1
        close = close or plan.close_after
        built = _head(plan.status, plan.headers, length, is_head, http10, keep_alive, close)
        if built.after_date is None:
            parts.append(built.before_date)
        else:
            prefix = built.before_date
            parts.append(built.after_date)
        head_end = len(parts[0])
        head = True
        mode, remaining, keep = built.mode, built.length, built.keep_alive
    for piece in plan.pieces:
        if piece.delay_ms > 0:
            segments.append((delay, b"".join(parts), frames, size, head))
            parts = []
            frames = size = 0
            head = False
            delay = piece.delay_ms / 1000
        data = piece.data
        if raw:
            parts.append(data)
        elif data and not is_head:
            if mode == CHUNKED:
                parts += (b"%x\r\n" % len(data), data, b"\r\n")
            elif mode == LENGTH:
                if len(data) > remaining:
                    raw = True  # beyond the declared length: written as it is
                else:
                    remaining -= len(data)
                parts.append(data)
            else:
                parts.append(data)
        size += len(data)
        if piece.frame:
            frames += 1
    ending = _ENDINGS[plan.ending]
    if ending == KEEP:
        if raw or (mode == LENGTH and remaining != 0):
            keep = False  # no head, or a body that is not the declared length
        elif mode == CHUNKED and not is_head:
            parts.append(b"0\r\n\r\n")
    else:
        keep = False
    stall_s = plan.stall_ms / 1000 if ending == STALL else 0.0
    segments.append((delay, b"".join(parts), frames, size, head))
    return Program(tuple(segments), ending, keep, stall_s, prefix, head_end)


# -- ASGI -------------------------------------------------------------------------------


def asgi_program_for(plan: ResponsePlan) -> AsgiProgram:
    """`compile_asgi`, once per plan."""
    found = _cached(plan, _ASGI)
    if found is not None:
        return cast(AsgiProgram, found)
    program = compile_asgi(plan)
    _keep(plan, _ASGI, program)
    return program


def _degradation(plan: ResponsePlan) -> tuple[str, str] | None:
    """(kind, explanation) when the plan cannot be executed exactly under ASGI."""
    if not plan.send_head:
        return (
            "no_head",
            "send_head=False (raw bytes or empty reply) is impossible under ASGI: "
            "aborted before the response started (the server answers 500 instead)",
        )
    if plan.ending is Ending.CLOSE:
        return (
            plan.ending.value,
            "ending CLOSE emulated by raising after the partial body "
            "(the ASGI server decides how the connection ends)",
        )
    if plan.ending is Ending.RESET:
        return (
            plan.ending.value,
            "ending RESET impossible under ASGI: emulated by raising after the partial "
            "body (typically a FIN, not an RST)",
        )
    if plan.ending is Ending.STALL:
        return (
            plan.ending.value,
            "ending STALL emulated by sleeping stall_ms, then raising to abort the connection",
        )
    if plan.framing is Framing.LENGTH and plan.body_length != plan.declared_length:
        return (
            "length",
            "a complete message whose Content-Length differs from its body cannot be "
            "sent under ASGI: the real body length is declared",
        )
    return None


@functools.lru_cache(maxsize=1024)
def _asgi_header(name: str, value: str) -> tuple[bytes, bytes] | None:
    """A plan's header as an ASGI header, None for a framing header (the server frames
    the body): by value, since a plan made afresh for each request (a session's replay)
    has the headers of the last one but its request id."""
    lowered = name.lower()
    if lowered in _FRAMING_HEADERS:
        return None
    return (lowered.encode("latin-1"), value.encode("latin-1"))


def _asgi_headers(plan: ResponsePlan) -> tuple[tuple[bytes, bytes], ...]:
    headers = [encoded for name, value in plan.headers if (encoded := _asgi_header(name, value))]
    if plan.framing is Framing.LENGTH:
        if plan.ending is Ending.COMPLETE:
            headers.append((b"content-length", str(plan.body_length).encode("ascii")))
        elif plan.body_length <= plan.declared_length:
            # The server then sees a short body and drops the connection (uvicorn does).
            headers.append((b"content-length", str(plan.declared_length).encode("ascii")))
    if plan.close_after:
        headers.append((b"connection", b"close"))
    return tuple(headers)


def compile_asgi(plan: ResponsePlan) -> AsgiProgram:
    """`plan` as the ASGI messages that come nearest to it: delays before the messages,
    the pieces as ``http.response.body`` messages (one message for a complete body of
    known length sent at once), and an ending that must break the connection as the
    reason to abort it (`AsgiProgram.abort`). A plan without a head starts no response:
    it waits its head delay (a stall with nothing before it), then aborts."""
    degraded = _degradation(plan)
    head_delay = plan.head_delay_ms / 1000
    waits = (
        head_delay > 0
        or plan.ending is Ending.STALL
        or any(piece.delay_ms > 0 for piece in plan.pieces)
    )
    if not plan.send_head:
        return AsgiProgram(
            (),
            STALL,
            head_delay,
            status=plan.status,
            headers=(),
            abort="send_head=False",
            degraded=degraded,
            waits=waits,
        )
    segments: list[tuple[float, AsgiPart, int, int, bool]] = [(head_delay, None, 0, 0, True)]
    complete = plan.ending is Ending.COMPLETE
    pieces = plan.pieces
    if (
        complete
        and plan.framing is Framing.LENGTH
        and len(pieces) > 1
        and not any(piece.delay_ms > 0 for piece in pieces)
    ):
        # A body of known length, all of it at once: one message (the same bytes).
        body = b"".join([piece.data for piece in pieces])
        frames = sum(1 for piece in pieces if piece.frame)
        segments.append((0.0, (body, False), frames, len(body), False))
    else:
        last = len(pieces) - 1
        for index, piece in enumerate(pieces):
            more = not (complete and index == last)
            data, delay = piece.data, piece.delay_ms / 1000
            segments.append((delay, (data, more), int(piece.frame), len(data), False))
        if complete and not pieces:
            segments.append((0.0, (b"", False), 0, 0, False))
    ending = _ENDINGS[plan.ending]
    return AsgiProgram(
        tuple(segments),
        ending,
        plan.stall_ms / 1000 if ending == STALL else 0.0,
        status=plan.status,
        headers=_asgi_headers(plan),
        abort=None if complete else f"ending {plan.ending.name}",
        degraded=degraded,
        waits=waits,
    )
