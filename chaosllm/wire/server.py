"""chaosllm's own HTTP/1.1 server: asyncio protocols and httptools (llhttp).

Theory of operation
-------------------
`WireServer.serve` runs the ASGI lifespan (when the app supports it), binds the
listening sockets (`chaosllm.wire.common.bind_sockets`: ``::`` is dual-stack) and hands
them to the event loop's own server (`loop.create_server`; uvloop's when the loop is
uvloop). Every accepted connection is one `_Conn`, an `asyncio.Protocol` that feeds
what it reads to an `httptools.HttpRequestParser` (llhttp, Node.js's parser). There is
no task per connection, and none per request unless the request needs one:

1. The parser's callbacks build the request: the head (at most `MAX_HEAD` bytes: 431;
   an HTTP version other than 1.0 and 1.1: 505; Content-Length together with
   Transfer-Encoding, RFC 9112 section 6.1: 400 and the connection closed; any other
   malformed HTTP: 400), then the whole body (over `max_body_bytes`, declared or
   counted as it arrives: 413, then a lingering close). Complete requests queue in
   arrival order (pipelining); reading pauses while more than `MAX_STASH` bytes are
   queued behind a response in flight, or while the client does not read.
2. The first queued request is answered when no other is in flight: the fast path
   (`direct`) first, which may return a plan for it; else the ASGI app, in a task, with
   a `_Cycle`'s ``receive``/``send``. A plan with no delay and an ending that needs no
   waiting (the usual replay) is executed there and then, with no task; any other
   plan of the fast path runs from the loop's callbacks (`_Player`), its delays on one
   timer heap for the whole server (`_Pacer`: one loop timer, every stream then due
   written in one pass, no timer handle, future or task a frame), until it must wait
   for something else (a full buffer, an RST's flush, a stall): a task runs the rest.
   The app's plans run in its task.
3. The connection is kept alive unless either side asked to close, the response was
   not completed, or the server is shutting down; the next queued request follows.

Timers, one per connection at most and only while no response is in flight: the first
request's head must arrive within `header_timeout_s` of the accept and a later one
within `header_timeout_s` of its first byte (408 for a partial head, a plain close for
no byte at all); an idle keep-alive connection is closed after `keepalive_timeout_s`;
a body that pauses for `header_timeout_s`, or arrives slower than `body_min_rate` bytes
a second once `body_timeout_s` has passed, gets 408.

Plans (the ``chaosllm.plan`` message of `chaosllm.wire.asgi.send_plan`, or the fast
path's) are compiled into segments: the head and every piece up to the next delay are
one write. Heads and chunks follow h11's rules byte for byte (header order, ``Date``,
``Transfer-Encoding: chunked`` for HTTP/1.1 and close-delimited bodies for HTTP/1.0,
``Connection: close``), so the two servers put the same bytes on the wire: a body
shorter than its Content-Length is never completed, bytes beyond it are written raw,
and a message that is not completed ends the connection. Endings: FIN (``CLOSE``), RST
with SO_LINGER 0 once every byte written reached the kernel (``RESET``), silence until
`stall_ms` or the client leaves (``STALL``), raw bytes without a head, an empty reply.
Writes respect flow control: a segment waits while the transport's buffer is full.

The client is noticed leaving at once (the protocol reads all the time): EOF or a lost
connection ends a plan's delay, answers the app's second ``receive()`` with
``http.disconnect``, and turns the rest of the response into no-ops.

Connections are limited to `max_connections` (lowered, with a warning, when the
open-file limit cannot be raised far enough): when full, the oldest idle connection
(waiting for a request with nothing of it received) is closed for a new one; with none
idle, up to `RESERVE` more are accepted and served only on the control plane and
``/health`` (503 elsewhere), so a full server can still be inspected and disarmed.

Shutdown (`request_shutdown`, thread-safe) stops accepting, closes the connections that
are waiting for a request, lets in-flight requests (and a body being read) finish for
`graceful_timeout_s`, then cancels them; every socket is closed on the way.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import re
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Final, cast

import anyio
import anyio.abc
import anyio.from_thread
import httptools

from chaosllm.core.report import Outcome, PlanReport
from chaosllm.errors import ServerError
from chaosllm.model import Ending, Framing, ResponsePlan
from chaosllm.wire.asgi import PLAN_EXTENSION, PlanAborted, Scope
from chaosllm.wire.common import (
    ASGI_VERSION,
    BOTH_FRAMINGS,
    LINGER_S,
    MAX_HEAD,
    MAX_STASH,
    PHRASES,
    RESERVE,
    Cycle,
    Direct,
    ErrorBody,
    ServerCore,
    address,
    backend_options,
    bind_sockets,
    body_deadline,
    connection_cap,
    error_body,
    error_response,
    http_date,
    is_control,
    path_of,
    version_refusal,
)

__all__ = ["Direct", "ErrorBody", "WireServer"]

logger = logging.getLogger("chaosllm.wire")

_RST_LINGER: Final = struct.pack("ii", 1, 0)
_BACKLOG: Final = 2048
_CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"
_STOP: Final = "chaosllm refused the request"

# Parser states: waiting for a message (nothing of it received), in its head, in its body.
_IDLE: Final = 0
_HEAD: Final = 1
_BODY: Final = 2

# Body framings of a response (h11's writers): Content-Length, chunked, close-delimited.
_LENGTH: Final = 0
_CHUNKED: Final = 1
_HTTP10: Final = 2

# Ending of a compiled plan.
_KEEP: Final = 0
_FIN: Final = 1
_RST: Final = 2
_STALL: Final = 3

_FIELD_NAME: Final = re.compile(rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")
_FIELD_VALUE: Final = re.compile(rb"(?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*)?")
_HEAD_CACHE_SIZE: Final = 512


class _Gone(Exception):
    """The client went away (or the socket is closed): stop writing."""


class _Request:
    """A complete request (or one whose body is still arriving)."""

    __slots__ = (
        "body",
        "headers",
        "http_version",
        "is_head",
        "keep_alive",
        "method",
        "path",
        "query",
        "raw_path",
        "size",
        "want_continue",
    )

    def __init__(
        self,
        method: bytes,
        target: bytes,
        http_version: str,
        headers: list[tuple[bytes, bytes]],
        keep_alive: bool,
    ) -> None:
        self.method = method
        self.raw_path, self.query, self.path = path_of(target)
        self.http_version = http_version
        self.headers = headers
        self.keep_alive = keep_alive
        self.is_head = method == b"HEAD"
        self.body = b""
        self.size = 0
        self.want_continue = False


class _Refusal:
    """An answer the server gives on its own, in the request order, then closes."""

    __slots__ = ("code", "linger", "message", "path", "size", "status", "type_")

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        *,
        type_: str = "invalid_request_error",
        path: str | None = None,
        linger: bool = False,
    ) -> None:
        self.status = status
        self.message = message
        self.code = code
        self.type_ = type_
        self.path = path
        self.linger = linger
        self.size = 0


class _Head:
    """A response head as h11 would write it, and how the body that follows is framed."""

    __slots__ = ("after_date", "before_date", "keep_alive", "length", "mode")

    def __init__(
        self, before_date: bytes, after_date: bytes | None, mode: int, length: int, keep: bool
    ) -> None:
        self.before_date = before_date
        self.after_date = after_date
        """None: the headers had their own Date."""
        self.mode = mode
        self.length = length
        self.keep_alive = keep

    def render(self) -> bytes:
        if self.after_date is None:
            return self.before_date
        return self.before_date + http_date() + self.after_date


def _tokens(value: bytes) -> list[bytes]:
    """The comma-separated tokens of a header value, in lower case."""
    return [token.strip(b" \t") for token in value.lower().split(b",")]


def _comma_tokens(items: Sequence[tuple[bytes, bytes, bytes]], name: bytes) -> list[bytes]:
    tokens: list[bytes] = []
    for _, key, value in items:
        if key == name:
            for token in value.split(b","):
                token = token.strip(b" \t").lower()
                if token:
                    tokens.append(token)
    return tokens


def _build_head(
    status: int,
    headers: Sequence[tuple[bytes, bytes]],
    *,
    is_head: bool,
    http10: bool,
    keep_alive: bool,
    close: bool,
) -> _Head:
    """h11's `_clean_up_response_headers_for_sending` and body framing, for `headers` as
    the app (or plan) gives them; `close` adds ``connection: close`` (the server's own
    wish), `keep_alive` is the client's. RuntimeError for what h11 refuses to send."""
    if not 200 <= status < 1000:
        raise RuntimeError(f"response status {status} is not in the range [200, 1000)")
    items: list[tuple[bytes, bytes, bytes]] = []
    has_date = False
    for raw, value in headers:
        if _FIELD_NAME.fullmatch(raw) is None:
            raise RuntimeError(f"illegal response header name {raw!r}")
        if _FIELD_VALUE.fullmatch(value) is None:
            raise RuntimeError(f"illegal response header value {value!r}")
        name = raw.lower()
        if name == b"date":
            has_date = True
        elif name == b"content-length":
            if not value.isdigit():
                raise RuntimeError(f"bad Content-Length {value!r}")
        elif name == b"transfer-encoding" and value.lower() != b"chunked":
            raise RuntimeError("only Transfer-Encoding: chunked is supported")
        items.append((raw, name, value))
    if not has_date:
        items.append((b"date", b"date", b""))  # its value is filled in when rendered
    if close:
        items.append((b"connection", b"connection", b"close"))
    # Framing as for a GET (a HEAD's headers are a GET's): T-E beats C-L.
    has_te = any(key == b"transfer-encoding" for _, key, _ in items)
    lengths = [value for _, key, value in items if key == b"content-length"]
    need_close = False
    if status not in (204, 304) and (has_te or not lengths):
        items = [i for i in items if i[1] != b"content-length" and i[1] != b"transfer-encoding"]
        if http10:
            need_close = not is_head
        else:
            items.append((b"Transfer-Encoding", b"transfer-encoding", b"chunked"))
    if not keep_alive or need_close:
        tokens = set(_comma_tokens(items, b"connection"))
        tokens.discard(b"keep-alive")
        tokens.add(b"close")
        items = [i for i in items if i[1] != b"connection"]
        items += [(b"Connection", b"connection", token) for token in sorted(tokens)]
    keep = keep_alive and not need_close and b"close" not in _comma_tokens(items, b"connection")
    # The writer, for the real method.
    if is_head or status in (204, 304):
        mode, length = _LENGTH, 0
    elif any(key == b"transfer-encoding" for _, key, _ in items):
        mode, length = _CHUNKED, 0
    else:
        lengths = [value for _, key, value in items if key == b"content-length"]
        if lengths:
            if len(set(lengths)) != 1:
                raise RuntimeError("conflicting Content-Length headers")
            mode, length = _LENGTH, int(lengths[0])
        else:
            mode, length = _HTTP10, 0
            keep = False
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, PHRASES.get(status, b""))]
    ordered = [i for i in items if i[1] == b"host"] + [i for i in items if i[1] != b"host"]
    before: bytes | None = None
    for raw, name, value in ordered:
        if name == b"date" and not has_date and before is None:
            lines.append(b"%s: " % raw)
            before = b"".join(lines)
            lines = [b"\r\n"]
        else:
            lines.append(b"%s: %s\r\n" % (raw, value))
    lines.append(b"\r\n")
    if before is None:
        return _Head(b"".join(lines), None, mode, length, keep)
    return _Head(before, b"".join(lines), mode, length, keep)


class _Program:
    """A plan compiled for one request: segments of bytes to write, each after a delay,
    with the report counts they carry, and how the connection ends."""

    __slots__ = ("ending", "instant", "keep", "segments", "stall_s")

    def __init__(
        self,
        segments: list[tuple[float, bytes, int, int, bool]],
        ending: int,
        keep: bool,
        stall_s: float,
    ) -> None:
        self.segments = segments
        """(delay in seconds, bytes, frames, body bytes, carries the head)."""
        self.ending = ending
        self.keep = keep
        """Whether the connection can serve another request afterwards."""
        self.stall_s = stall_s
        self.instant = len(segments) == 1 and segments[0][0] <= 0 and ending in (_KEEP, _FIN)
        """No delay and nothing to wait for: executed without a task."""


class _Sleep:
    """A timer that resolves `future` no earlier than `seconds` from now, by the monotonic
    clock (a loop's timers may fire a little early)."""

    __slots__ = ("deadline", "future", "handle", "loop")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[None], seconds: float
    ) -> None:
        self.loop = loop
        self.future = future
        self.deadline = time.monotonic() + seconds
        self.handle = loop.call_later(seconds, self.fire)

    def fire(self) -> None:
        left = self.deadline - time.monotonic()
        if left > 0:
            self.handle = self.loop.call_later(left, self.fire)
        elif not self.future.done():
            self.future.set_result(None)

    def cancel(self) -> None:
        self.handle.cancel()


class _Pacer:
    """The timers of every paced answer of the fast path (`_Player`), on one loop timer.

    Deadlines are kept in a heap, by the monotonic clock; one loop timer is armed for the
    earliest, and when it fires every player then due runs, in deadline order, in one
    pass (one that falls due while the pass runs too, but none twice: the loop reads its
    sockets between two frames of a stream): 500 streams paced 50 ms apart cost no timer
    handle, future or task wake-up a frame, and streams due in the same tick are written
    back to back. No player runs before its deadline (a loop's timers may fire a little
    early: it looks again)."""

    __slots__ = ("armed_at", "handle", "heap", "loop", "seq")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.heap: list[tuple[float, int, _Player]] = []
        self.seq = 0
        self.handle: asyncio.TimerHandle | asyncio.Handle | None = None
        self.armed_at = float("inf")

    def add(self, deadline: float, player: _Player) -> int:
        """Run `player.due()` at `deadline`; the entry's number (`player.entry`)."""
        self.seq += 1
        heapq.heappush(self.heap, (deadline, self.seq, player))
        if deadline < self.armed_at:
            self._arm(deadline)
        return self.seq

    def _arm(self, deadline: float) -> None:
        if self.handle is not None:
            self.handle.cancel()
        self.armed_at = deadline
        self.handle = self.loop.call_later(deadline - time.monotonic(), self._fire)

    def _fire(self) -> None:
        self.handle = None
        self.armed_at = float("-inf")  # what the pass adds is armed once, after it
        heap = self.heap
        pop = heapq.heappop
        now = time.monotonic
        last = self.seq
        later: list[tuple[float, int, _Player]] = []
        try:
            while heap and heap[0][0] <= now():
                entry = pop(heap)
                _, seq, player = entry
                if seq > last:  # added by this pass: the next one
                    later.append(entry)
                elif player.entry == seq:  # else cancelled: the client left, or shutdown
                    player.entry = 0
                    try:
                        player.due()
                    except Exception:
                        logger.exception("Exception in the fast path")
        finally:
            for entry in later:
                heapq.heappush(heap, entry)
            self.armed_at = float("inf")
            if heap:
                self._arm(heap[0][0])

    def clear(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        self.armed_at = float("inf")
        self.heap.clear()


class _Player:
    """A compiled program of the fast path executed from the loop's callbacks, without a
    task: as `_Conn.execute` does, segment by segment, each delay on the server's
    `_Pacer`, ended early when the client leaves (a future among the connection's
    ``waiters``, woken on EOF or a lost connection, as `_Conn.pause` is). What waits for
    anything else (the transport's buffer to drain below its high-water mark, an RST's
    flush, a stall) is handed with the rest of the program to a task that runs `execute`
    from there."""

    __slots__ = ("conn", "entry", "index", "paused", "program", "report", "watch")

    def __init__(self, conn: _Conn, program: _Program, report: PlanReport) -> None:
        self.conn = conn
        self.program = program
        self.report = report
        self.index = 0
        """The next segment to write."""
        self.paused = False
        """The delay before segment `index` has been waited (or cut short)."""
        self.entry = 0
        """The pacer's entry this player waits on; 0: none."""
        self.watch: asyncio.Future[None] | None = None

    def start(self) -> None:
        conn = self.conn
        if conn.player is not self:  # ended before its first turn (shutdown)
            return
        if conn.closed or conn.gone:
            self._gone()
        else:
            self._run()

    def due(self) -> None:
        self.paused = True
        self._run()

    def _woken(self, _: asyncio.Future[None]) -> None:
        if self.entry:  # waiting: the client left (EOF or the connection lost)
            self.entry = 0
            self.paused = True
            self._run()

    def _run(self) -> None:
        conn = self.conn
        program = self.program
        segments = program.segments
        report = self.report
        try:
            while self.index < len(segments):
                delay, data, frames, size, head = segments[self.index]
                if delay > 0:
                    if not self.paused and not (conn.eof or conn.closed):
                        self._wait(delay)
                        return
                    self.paused = False
                    if conn.eof or conn.closed:
                        conn.gone = True
                        self._gone()
                        return
                if conn.closed or conn.gone:
                    self._gone()
                    return
                if data:
                    assert conn.transport is not None
                    conn.transport.write(data)
                if head:
                    report.head_sent = True
                report.frames_sent += frames
                report.bytes_sent += size
                self.index += 1
                if conn.write_paused:
                    self._hand_over()
                    return
            ending = program.ending
            if ending == _KEEP:
                if not program.keep:
                    conn.close()
            elif ending == _FIN:
                conn.close()
            else:
                self._hand_over()
                return
        except Exception:
            report.outcome = Outcome.ERROR
            logger.exception("Exception in the fast path")
            conn.must_close = True
            self._end(False)
            return
        report.outcome = Outcome.COMPLETE
        self._end(program.keep)

    def _wait(self, delay: float) -> None:
        conn = self.conn
        if self.watch is None:
            self.watch = watch = conn.loop.create_future()
            watch.add_done_callback(self._woken)
            conn.waiters.append(watch)
        self.entry = conn.server._pacer_of(conn.loop).add(time.monotonic() + delay, self)

    def _gone(self) -> None:
        self.report.outcome = Outcome.CLIENT_GONE
        self.conn.must_close = True
        self._end(False)

    def _unwatch(self) -> None:
        self.entry = 0
        watch = self.watch
        if watch is not None:
            self.watch = None
            watch.remove_done_callback(self._woken)
            with contextlib.suppress(ValueError):
                self.conn.waiters.remove(watch)

    def _hand_over(self) -> None:
        """The rest of the program, from segment `index`, in a task."""
        self._unwatch()
        conn = self.conn
        conn.player = None
        conn.task = conn.loop.create_task(
            conn._run_plan_task(self.program, self.report, self.index)
        )

    def _end(self, keep: bool) -> None:
        self._unwatch()
        self.conn._cycle_done(keep)

    def cancel(self) -> None:
        """Shutdown's grace has run out: end as a cancelled task does."""
        self.report.outcome = Outcome.ERROR
        self._end(False)


class WireServer(ServerCore):
    """An HTTP/1.1 server hosting an ASGI app, able to execute `ResponsePlan`s exactly.

    Usage (in an anyio task group, on the asyncio backend)::

        server = WireServer(app, port=0)
        host, port = await tg.start(server.serve)
        ...
        server.request_shutdown()   # or: await server.shutdown()

    From synchronous code (tests, the CLI)::

        with WireServer(app).run_in_thread() as (host, port):
            ...

    `direct`, when given, is asked first for every request (see `Direct`): a plan it
    returns is executed as the ``chaosllm.plan`` message would be, without the app.
    """

    def _init_state(self) -> None:
        self._conns: set[_Conn] = set()
        self._idle: dict[_Conn, None] = {}
        """Connections waiting for a request with nothing of it received, oldest first."""
        self._cap = self.max_connections
        self._full_warned = False
        self._heads: dict[tuple[Any, ...], _Head] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pacer: _Pacer | None = None

    def _pacer_of(self, loop: asyncio.AbstractEventLoop) -> _Pacer:
        pacer = self._pacer
        if pacer is None or pacer.loop is not loop:
            pacer = self._pacer = _Pacer(loop)
        return pacer

    def thread_options(self, backend: str) -> dict[str, Any] | None:
        """uvloop for asyncio where it is installed (`backend_options`)."""
        return backend_options(backend)

    # -- lifecycle ----------------------------------------------------------------------

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[tuple[str, int]] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until `request_shutdown`; ``task_status.started((host, port))`` once bound.

        Raises `ServerError` when the app's lifespan startup fails, the address cannot be
        bound, or the event loop is not asyncio's (`H11WireServer` runs on any).
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise ServerError(
                "WireServer runs on asyncio (or uvloop); use chaosllm.wire.H11WireServer "
                "on another event loop"
            ) from None
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._stop = anyio.Event()
        self._stopped = anyio.Event()
        failure: str | None = None
        try:
            if self.shutting_down:
                self._stop.set()
            failure = await self._serve_app(task_status)
        finally:
            self._loop = None
            self._stopped.set()
        if failure is not None:
            raise ServerError(failure)

    def request_shutdown(self) -> None:
        """Ask `serve` to stop; callable from any thread.

        From the event loop's thread it returns at once; from another thread it
        returns once the loop has taken the request.
        """
        loop = self._loop
        if loop is not None and threading.get_ident() != self._loop_thread:
            taken = threading.Event()

            def take() -> None:
                try:
                    self._shutdown_in_loop()
                finally:
                    taken.set()

            try:
                loop.call_soon_threadsafe(take)
            except RuntimeError:  # the loop is closed: nothing left to stop
                return
            while not taken.wait(0.05):
                if self._loop is None or loop.is_closed():
                    return
            return
        self._shutdown_in_loop()

    def _shutdown_in_loop(self) -> None:
        self.shutting_down = True
        if self._stop is not None:
            self._stop.set()
        for conn in list(self._conns):
            conn.shutdown()

    async def _serve_sockets(self, task_status: anyio.abc.TaskStatus[tuple[str, int]]) -> None:
        assert self._stop is not None and self._loop is not None
        loop = self._loop
        self._cap = connection_cap(self.max_connections)
        sockets = bind_sockets(self.host, self.port, _BACKLOG)
        servers: list[asyncio.AbstractServer] = []
        try:
            for sock in sockets:
                servers.append(
                    await loop.create_server(lambda: _Conn(self), sock=sock, backlog=_BACKLOG)
                )
            bound = address(sockets[0].getsockname())
            assert bound is not None
            self.bound = bound
            task_status.started(bound)
            await self._stop.wait()
        finally:
            with anyio.CancelScope(shield=True):
                for server in servers:
                    server.close()
                for sock in sockets[len(servers) :]:
                    sock.close()
                await self._close_connections()

    async def _close_connections(self) -> None:
        """Shut down every connection: idle ones now, in-flight ones within
        `graceful_timeout_s`, then cancelled."""
        self._shutdown_in_loop()
        if self._conns:
            self._drained = anyio.Event()
            with anyio.move_on_after(self.graceful_timeout_s):
                await self._drained.wait()
        tasks = [conn.task for conn in self._conns if conn.task is not None]
        for task in tasks:
            task.cancel()
        for conn in list(self._conns):
            if conn.player is not None:
                conn.player.cancel()
        for conn in list(self._conns):
            conn.close()
        if self._pacer is not None:
            self._pacer.clear()
        if tasks:
            with anyio.move_on_after(self.graceful_timeout_s):
                await asyncio.wait(tasks)

    # -- connections --------------------------------------------------------------------

    def _admit(self, conn: _Conn) -> None:
        """Count a new connection in; make room by closing the oldest idle ones."""
        conns, idle = self._conns, self._idle
        while len(conns) >= self._cap and idle:
            next(iter(idle)).close()
            self._warn_full("closing the oldest idle connections")
        conns.add(conn)
        if len(conns) > self._cap:
            if len(conns) > self._cap + RESERVE:
                self._warn_full("refusing new connections")
                conn.close()
            else:
                self._warn_full("serving new connections on the control plane only")
                conn.over_cap = True

    def _warn_full(self, doing: str) -> None:
        if not self._full_warned:
            self._full_warned = True
            logger.warning(
                "the server has reached its connection limit (%d, --max-connections): %s",
                self._cap,
                doing,
            )

    def _forget(self, conn: _Conn) -> None:
        self._idle.pop(conn, None)
        self._conns.discard(conn)
        if self._drained is not None and not self._conns:
            self._drained.set()

    def _plan_head(self, plan: ResponsePlan, req: _Request, close: bool, length: int) -> _Head:
        """The head of `plan` for `req`, built once per status, headers, length and kind of
        request (a replay serves the same few again and again)."""
        variant = req.is_head | (req.http_version != "1.1") << 1 | req.keep_alive << 2 | close << 3
        length_or_chunked = length if plan.framing is Framing.LENGTH else -1
        key = (plan.status, plan.headers, length_or_chunked, variant)
        cached = self._heads.get(key)
        if cached is not None:
            return cached
        headers = [
            (name.encode("latin-1"), value.encode("latin-1"))
            for name, value in plan.headers
            if name.lower() not in ("content-length", "transfer-encoding")
        ]
        if plan.framing is Framing.LENGTH:
            headers.append((b"content-length", b"%d" % length))
        else:
            headers.append((b"transfer-encoding", b"chunked"))
        head = _build_head(
            plan.status,
            headers,
            is_head=req.is_head,
            http10=req.http_version != "1.1",
            keep_alive=req.keep_alive,
            close=close,
        )
        if len(self._heads) >= _HEAD_CACHE_SIZE:
            del self._heads[next(iter(self._heads))]
        self._heads[key] = head
        return head


class _Conn(asyncio.Protocol):
    """One accepted socket: the parser's callbacks, the request queue, the plan executor
    and the socket primitives."""

    def __init__(self, server: WireServer) -> None:
        self.server = server
        loop = server._loop
        assert loop is not None
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.client: tuple[str, int] | None = None
        self.local: tuple[str, int] | None = None
        # the request being parsed
        self.pstate = _IDLE
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_size = 0
        self.head_bytes = 0
        self.req: _Request | None = None
        self.parts: list[bytes] = []
        self.body_size = 0
        # answering
        self.queue: deque[_Request | _Refusal] = deque()
        self.queued = 0
        self.busy = False
        self.task: asyncio.Task[None] | None = None
        self.player: _Player | None = None
        self.served = 0
        self.finish_one = False
        self.over_cap = False
        self.must_close = False
        self.discarding = False
        # the socket
        self.closed = False
        self.eof = False
        self.gone = False
        self.write_paused = False
        self.read_paused = False
        self.waiters: list[asyncio.Future[None]] = []
        self.drain_waiters: list[asyncio.Future[None]] = []
        # timers
        now = loop.time()
        self.accepted = now
        self.ready_since = now
        self.head_since = now
        self.body_since = now
        self.last_data = now
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = transport = cast(asyncio.Transport, transport)
        with contextlib.suppress(OSError, AttributeError, TypeError):
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.client = address(transport.get_extra_info("peername"))
        self.local = address(transport.get_extra_info("sockname"))
        server = self.server
        if server.shutting_down:
            self.closed = True
            transport.close()
            return
        server._admit(self)
        if not self.closed:
            self._wait_next()

    def data_received(self, data: bytes) -> None:
        if self.discarding or self.closed:
            return
        pstate = self.pstate
        if pstate == _BODY:
            self.last_data = self.loop.time()
        else:
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # The request asked to switch protocols: it is answered as a plain request and
            # the connection closed after it (on_headers_complete saw to both).
            self.discarding = True
        except httptools.HttpParserError as exc:
            self._parse_error(exc)
        if not self.discarding and self.pstate != _BODY and self.head_bytes > MAX_HEAD:
            self._refuse(
                431, f"Request head too large: the limit is {MAX_HEAD} bytes", "bad_request"
            )
        if not self.busy:
            self._pump()
        elif self.queued + self.body_size > MAX_STASH and not self.read_paused:
            self._pause_reading()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake(self.waiters)
        if self.discarding and not self.queue and not self.busy:
            self.close()
        elif not self.busy:
            self._pump()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed:
            self.closed = True
            self._cleanup()
        # The parser holds this protocol's callbacks: without this reference cycle the
        # connection is freed here, by reference counting, instead of being left for the
        # garbage collector (about 20 tracked objects a connection, whose full collections
        # then pause every stream in flight). Nothing reads from a lost connection.
        del self.parser

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake(self.drain_waiters)
        if not self.busy and not self.closed:
            self._pump()

    # -- httptools callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.pstate = _HEAD
        self.url = b""
        self.headers = []
        self.head_size = 0
        self.head_since = self.loop.time()

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.head_size += len(url)
        if self.head_size > MAX_HEAD:
            self._stop_parsing(
                431, f"Request head too large: the limit is {MAX_HEAD} bytes", "bad_request"
            )

    def on_header(self, name: bytes, value: bytes) -> None:
        if value[-1:] in (b" ", b"\t"):
            value = value.rstrip(b" \t")
        self.headers.append((name.lower(), value))
        self.head_size += len(name) + len(value) + 4
        if self.head_size > MAX_HEAD:
            self._stop_parsing(
                431, f"Request head too large: the limit is {MAX_HEAD} bytes", "bad_request"
            )

    def on_headers_complete(self) -> None:
        parser = self.parser
        server = self.server
        self.pstate = _BODY
        self.head_bytes = 0
        version = parser.get_http_version()
        path = path_of(self.url)[2]
        refusal = version_refusal(version)
        if refusal is not None:
            self._stop_parsing(505, refusal, "http_version_not_supported", path=path)
        length: bytes | None = None
        chunked = False
        hosts = 0
        close = False
        expect = False
        for name, value in self.headers:
            if name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                if chunked or value.lower() != b"chunked":
                    self._stop_parsing(
                        501,
                        "Only Transfer-Encoding: chunked is supported",
                        "bad_request",
                        path=path,
                    )
                chunked = True
            elif name == b"host":
                hosts += 1
            elif name == b"connection":
                close = close or b"close" in _tokens(value)
            elif name == b"expect":
                expect = expect or b"100-continue" in _tokens(value)
        if chunked and length is not None:
            self._stop_parsing(400, BOTH_FRAMINGS, "bad_request", path=path)
        if version == "1.1" and hosts != 1:
            problem = "Missing mandatory Host: header" if not hosts else "Found multiple Host:"
            self._stop_parsing(400, f"Malformed HTTP request: {problem}", "bad_request")
        limit = server.max_body_bytes
        declared = int(length) if length is not None else 0
        if declared > limit:
            self._stop_parsing(
                413,
                f"Request body too large: the limit is {limit} bytes",
                "request_too_large",
                path=path,
                linger=True,
            )
        method = parser.get_method()
        req = _Request(method, self.url, version, self.headers, version == "1.1" and not close)
        if parser.should_upgrade():
            if declared or chunked:
                self._stop_parsing(
                    400, "Upgrade requests with a body are not supported", "bad_request", path=path
                )
            req.keep_alive = False  # served as a plain request; the connection then closes
        self.req = req
        self.parts = []
        self.body_size = 0
        self.body_since = self.last_data = self.loop.time()
        if expect and version == "1.1":
            if self.busy or self.queue:
                req.want_continue = True
            else:
                self._write_quietly(_CONTINUE)

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)
        self.body_size += len(body)
        if self.body_size > self.server.max_body_bytes:
            req = self.req
            self._stop_parsing(
                413,
                f"Request body too large: the limit is {self.server.max_body_bytes} bytes",
                "request_too_large",
                path=req.path if req is not None else None,
                linger=True,
            )

    def on_message_complete(self) -> None:
        req = self.req
        if req is None:  # pragma: no cover - llhttp completes only headed messages
            return
        self.req = None
        parts = self.parts
        req.body = parts[0] if len(parts) == 1 else b"".join(parts)
        self.parts = []
        req.size = self.body_size + self.head_size + 64
        self.body_size = 0
        self.url = b""
        self.pstate = _IDLE
        self.queue.append(req)
        self.queued += req.size

    # -- refusals -----------------------------------------------------------------------

    def _refuse(
        self,
        status: int,
        message: str,
        code: str,
        *,
        type_: str = "invalid_request_error",
        path: str | None = None,
        linger: bool = False,
    ) -> None:
        """Answer `status` in turn (after the requests before it), then close; nothing
        more is read meanwhile."""
        self.discarding = True
        self.queue.append(_Refusal(status, message, code, type_=type_, path=path, linger=linger))

    def _stop_parsing(
        self,
        status: int,
        message: str,
        code: str,
        *,
        path: str | None = None,
        linger: bool = False,
    ) -> None:
        self._refuse(status, message, code, path=path, linger=linger)
        raise httptools.HttpParserError(_STOP)

    def _parse_error(self, exc: httptools.HttpParserError) -> None:
        if self.discarding:
            return  # a refusal of ours is already queued
        cause = exc.__context__
        if isinstance(exc, httptools.HttpParserCallbackError) and cause is not None:
            logger.error("request parsing failed", exc_info=cause)
            self._refuse(500, "Internal server error", "internal_error", type_="server_error")
            return
        reason = str(exc)
        path = path_of(self.url)[2] if self.url else None
        if "HTTP version" in reason:
            message = "Unsupported HTTP version: chaosllm speaks HTTP/1.1 and HTTP/1.0"
            self._refuse(505, message, "http_version_not_supported", path=path)
        elif "can't be present with" in reason:  # Content-Length with Transfer-Encoding
            self._refuse(400, BOTH_FRAMINGS, "bad_request", path=path)
        else:
            self._refuse(400, f"Malformed HTTP request: {reason}", "bad_request")

    # -- the queue ----------------------------------------------------------------------

    def _pump(self) -> None:
        """Answer queued requests in order while none is in flight; then wait for more."""
        server = self.server
        queue = self.queue
        while not self.busy:
            if self.closed:
                return
            if not queue:
                break
            if server.shutting_down:
                if not self.finish_one:
                    self.close()
                    return
                self.finish_one = False
            if self.write_paused:
                self._pause_reading()
                return
            item = queue.popleft()
            self.queued -= item.size
            if type(item) is _Refusal:
                self._answer_refusal(item)
                return
            assert type(item) is _Request
            self._start(item)
            if not self.busy:
                self.ready_since = self.loop.time()
        if self.busy or self.closed:
            return
        self._wait_next()

    def _wait_next(self) -> None:
        """Nothing in flight and nothing queued: close, or arm the timer for what comes."""
        server = self.server
        if server.shutting_down and not (self.finish_one and self.pstate == _BODY):
            self.close()
            return
        if self.eof:
            if self.pstate == _IDLE or self.discarding:
                self.close()
            else:
                self._answer_refusal(
                    _Refusal(
                        400,
                        "Malformed HTTP request: the connection ended inside the request",
                        "bad_request",
                    )
                )
            return
        if self.read_paused and not self.write_paused:
            self.read_paused = False
            assert self.transport is not None
            self.transport.resume_reading()
        req = self.req
        if req is not None and req.want_continue:
            req.want_continue = False
            self._write_quietly(_CONTINUE)
        if self.pstate == _IDLE and not self.discarding:
            server._idle[self] = None
        else:
            server._idle.pop(self, None)
        self._arm(self._deadline())

    def _deadline(self) -> float:
        server = self.server
        pstate = self.pstate
        if pstate == _IDLE:
            if self.served == 0:
                return self.accepted + server.header_timeout_s
            return self.ready_since + server.keepalive_timeout_s
        if pstate == _HEAD:
            if self.served == 0:
                return self.accepted + server.header_timeout_s
            return max(self.head_since, self.ready_since) + server.header_timeout_s
        since = max(self.last_data, self.ready_since)
        rate = body_deadline(
            max(self.body_since, self.ready_since),
            self.body_size,
            server.body_timeout_s,
            server.body_min_rate,
        )
        return min(since + server.header_timeout_s, rate)

    def _arm(self, deadline: float) -> None:
        timer = self.timer
        if timer is not None:
            if self.timer_at <= deadline:
                return  # it fires first and looks again
            timer.cancel()
        self.timer_at = deadline
        self.timer = self.loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        if self.busy or self.closed or self.discarding or self.queue:
            return
        now = self.loop.time()
        deadline = self._deadline()
        if now < deadline:
            self._arm(deadline)
            return
        pstate = self.pstate
        if pstate == _IDLE or self.server.shutting_down:
            self.close()
        elif pstate == _HEAD:
            self._answer_refusal(_Refusal(408, "Timed out reading the request head", "timeout"))
        else:
            req = self.req
            self._answer_refusal(
                _Refusal(
                    408,
                    "Timed out reading the request body",
                    "timeout",
                    path=req.path if req is not None else None,
                )
            )

    def shutdown(self) -> None:
        """The server is stopping: close if waiting for a request; finish a request whose
        body is arriving; an in-flight one closes the connection when done."""
        if self.closed or self.busy:
            return
        if self.pstate == _BODY and not self.discarding:
            self.finish_one = True
            return
        self.close()

    def _pause_reading(self) -> None:
        if not self.read_paused and not self.closed:
            self.read_paused = True
            assert self.transport is not None
            self.transport.pause_reading()

    # -- answering one request ----------------------------------------------------------

    def _start(self, req: _Request) -> None:
        server = self.server
        self.served += 1
        self.server._idle.pop(self, None)
        # The read timer stays armed: it does nothing while a response is in flight, and
        # keeping it spares a timer per request under keep-alive load.
        if req.want_continue:
            req.want_continue = False
            self._write_quietly(_CONTINUE)
        if self.over_cap:
            self.must_close = True
            if not is_control(req.path):
                self._answer_refusal(
                    _Refusal(
                        503,
                        f"The server is at its connection limit ({server._cap}, "
                        f"--max-connections); retry shortly",
                        "server_busy",
                        type_="server_error",
                        path=req.path,
                    )
                )
                return
        direct = server.direct
        if direct is not None:
            try:
                result = direct(
                    req.method.decode("ascii"), req.path, req.query, req.headers, req.body
                )
            except Exception:
                logger.exception("Exception in the fast path")
                self._internal_error(req.path)
                self.close()
                return
            if result is not None:
                self._run_direct(req, *result)
                return
        self.busy = True
        self.task = self.loop.create_task(self._run_asgi(req))

    def _run_direct(self, req: _Request, plan: ResponsePlan, report: PlanReport) -> None:
        try:
            program = self.compile(req, plan)
        except Exception:
            report.outcome = Outcome.ERROR
            logger.exception("Exception in the fast path")
            self.close()
            return
        if not program.instant:
            # Paced (or ending otherwise than by a FIN or nothing): from callbacks, as
            # the task that ran it did, starting at the loop's next turn.
            self.busy = True
            self.player = player = _Player(self, program, report)
            self.loop.call_soon(player.start)
            return
        if self.closed or self.gone:
            report.outcome = Outcome.CLIENT_GONE
            self.close()
            return
        _, data, frames, size, head = program.segments[0]
        assert self.transport is not None
        if data:
            self.transport.write(data)
        if head:
            report.head_sent = True
        report.frames_sent += frames
        report.bytes_sent += size
        report.outcome = Outcome.COMPLETE
        if program.ending != _KEEP or not program.keep or self.must_close:
            self.close()

    async def _run_plan_task(self, program: _Program, report: PlanReport, start: int) -> None:
        keep = False
        try:
            keep = await self.execute(program, report, start)
        except Exception:
            logger.exception("Exception in the fast path")
            self.must_close = True
        finally:
            self._cycle_done(keep)

    async def _run_asgi(self, req: _Request) -> None:
        server = self.server
        scope: Scope = {
            "type": "http",
            "asgi": ASGI_VERSION,
            "http_version": req.http_version,
            "method": req.method.decode("ascii"),
            "scheme": "http",
            "path": req.path,
            "raw_path": req.raw_path,
            "query_string": req.query,
            "root_path": "",
            "headers": req.headers,
            "client": self.client,
            "server": self.local,
            "state": server._state.copy(),
            "extensions": {PLAN_EXTENSION: {}},
        }
        cycle = _Cycle(self, req)
        keep = False
        try:
            await server.app(scope, cycle.receive, cycle.send)
        except PlanAborted as exc:
            # The app aborts its response on purpose (a proxied upstream dropped mid-answer):
            # the connection closes with the message incomplete, as for a CLOSE plan.
            logger.debug("%s", exc)
            if not cycle.committed:
                self._internal_error(req.path)
            self.must_close = True
            if exc.reset:
                await self.flush()
                self.reset()
        except Exception:
            logger.exception("Exception in ASGI application")
            if not cycle.committed:
                self._internal_error(req.path)
            self.must_close = True
        else:
            if not cycle.committed:
                logger.error("ASGI application returned without starting a response")
                self._internal_error(req.path)
            elif not cycle.complete:
                logger.error("ASGI application returned without completing the response")
                self.must_close = True
            else:
                keep = cycle.keep
        finally:
            self._cycle_done(keep)

    def _cycle_done(self, keep: bool) -> None:
        self.busy = False
        self.task = None
        self.player = None
        if self.closed:
            return
        if not keep or self.must_close or self.gone or self.server.shutting_down:
            self.close()
            return
        self.ready_since = self.loop.time()
        self._pump()

    # -- plans --------------------------------------------------------------------------

    def compile(self, req: _Request, plan: ResponsePlan) -> _Program:
        """`plan` as segments for `req` (h11's framing; see the module docstring)."""
        server = self.server
        segments: list[tuple[float, bytes, int, int, bool]] = []
        parts: list[bytes] = []
        frames = size = 0
        head = False
        delay = plan.head_delay_ms / 1000
        raw = not plan.send_head
        mode, remaining, keep = _HTTP10, 0, False
        is_head = req.is_head
        if plan.send_head:
            if plan.close_after:
                self.must_close = True
            length = 0
            if plan.framing is Framing.LENGTH:
                length = sum(len(p.data) for p in plan.pieces)
                if plan.content_length is not None:
                    length = plan.content_length
            built = server._plan_head(plan, req, server.shutting_down or self.must_close, length)
            parts.append(built.render())
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
                if mode == _CHUNKED:
                    parts += (b"%x\r\n" % len(data), data, b"\r\n")
                elif mode == _LENGTH:
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
        ending = plan.ending
        stall_s = 0.0
        if ending is Ending.COMPLETE:
            code = _KEEP
            if raw or (mode == _LENGTH and remaining != 0):
                keep = False  # no head, or a body that is not the declared length
            elif mode == _CHUNKED and not is_head:
                parts.append(b"0\r\n\r\n")
        elif ending is Ending.CLOSE:
            code = _FIN
        elif ending is Ending.RESET:
            code = _RST
        else:
            code = _STALL
            stall_s = plan.stall_ms / 1000
        if code != _KEEP:
            keep = False
        segments.append((delay, b"".join(parts), frames, size, head))
        return _Program(segments, code, keep, stall_s)

    async def execute(self, program: _Program, report: PlanReport, start: int = 0) -> bool:
        """Put `program` on the socket, filling `report`; whether the connection can be
        kept alive after it. From segment `start` on, when a `_Player` wrote the ones
        before it (then first waiting for the transport's buffer to drain)."""
        try:
            await self._execute(program, report, start)
        except _Gone:
            report.outcome = Outcome.CLIENT_GONE
            self.must_close = True
            return False
        except BaseException:
            report.outcome = Outcome.ERROR
            raise
        report.outcome = Outcome.COMPLETE
        return program.keep

    async def _execute(self, program: _Program, report: PlanReport, start: int) -> None:
        segments = program.segments
        if start:
            await self.drain()
            segments = segments[start:]
        elif self.closed or self.gone:
            raise _Gone
        for delay, data, frames, size, head in segments:
            if delay > 0:
                await self.pause(delay)
            self.write(data)
            if head:
                report.head_sent = True
            report.frames_sent += frames
            report.bytes_sent += size
            if self.write_paused:
                await self.drain()
        ending = program.ending
        if ending == _KEEP:
            if not program.keep:
                self.close()
        elif ending == _FIN:
            self.close()
        elif ending == _RST:
            await self.flush()
            self.reset()
        else:
            if program.stall_s > 0:
                await self.pause(program.stall_s)
            self.close()

    # -- socket primitives --------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Write `data`; `_Gone` once the client has gone or the socket is closed."""
        if self.closed or self.gone:
            raise _Gone
        if data:
            assert self.transport is not None
            self.transport.write(data)

    def _write_quietly(self, data: bytes) -> None:
        if not self.closed and not self.gone:
            assert self.transport is not None
            self.transport.write(data)

    async def drain(self) -> None:
        """Wait while the transport's buffer is above its high-water mark."""
        while self.write_paused and not self.closed:
            future = self.loop.create_future()
            self.drain_waiters.append(future)
            try:
                await future
            finally:
                with contextlib.suppress(ValueError):
                    self.drain_waiters.remove(future)

    async def flush(self) -> None:
        """Wait until every byte written has been handed to the kernel."""
        transport = self.transport
        if self.closed or transport is None or transport.get_write_buffer_size() == 0:
            return
        transport.set_write_buffer_limits(high=0, low=0)
        while not self.closed and transport.get_write_buffer_size() > 0:
            self.write_paused = True
            await self.drain()

    async def pause(self, seconds: float) -> None:
        """Sleep, watching the client; `_Gone` if it leaves meanwhile."""
        if not (self.eof or self.closed):
            future = self.loop.create_future()
            self.waiters.append(future)
            sleep = _Sleep(self.loop, future, seconds)
            try:
                await future
            finally:
                sleep.cancel()
                with contextlib.suppress(ValueError):
                    self.waiters.remove(future)
        if self.eof or self.closed:
            self.gone = True
            raise _Gone

    async def wait_gone(self) -> None:
        """Return once the client has gone (EOF or a lost connection)."""
        if not (self.eof or self.closed):
            future = self.loop.create_future()
            self.waiters.append(future)
            try:
                await future
            finally:
                with contextlib.suppress(ValueError):
                    self.waiters.remove(future)
        self.gone = True

    @staticmethod
    def _wake(futures: list[asyncio.Future[None]]) -> None:
        for future in futures:
            if not future.done():
                future.set_result(None)

    def close(self) -> None:
        """Close the socket: FIN first, so that unread input cannot turn it into an RST."""
        if self.closed:
            return
        self.closed = True
        self._cleanup()
        transport = self.transport
        if transport is None:
            return
        with contextlib.suppress(Exception):
            if transport.can_write_eof():
                transport.write_eof()
        transport.close()

    def reset(self) -> None:
        """Close the socket with an RST (SO_LINGER on, 0 s)."""
        if self.closed:
            return
        self.closed = True
        self._cleanup()
        transport = self.transport
        assert transport is not None
        with contextlib.suppress(OSError, AttributeError, TypeError):
            sock = transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST_LINGER)
        transport.abort()

    def _cleanup(self) -> None:
        timer = self.timer
        if timer is not None:
            timer.cancel()
            self.timer = None
        self.server._forget(self)
        self._wake(self.waiters)
        self._wake(self.drain_waiters)

    def _error(
        self,
        status: int,
        message: str,
        code: str,
        type_: str = "invalid_request_error",
        *,
        path: str | None = None,
    ) -> None:
        """Answer with the JSON error envelope of the protocol on `path` (see `ErrorBody`)
        and mark the connection for closing."""
        self.must_close = True
        body = error_body(self.server.error_body, path, status, message, type_, code)
        self._write_quietly(error_response(body, status))

    def _internal_error(self, path: str) -> None:
        self._error(500, "Internal server error", "internal_error", "server_error", path=path)

    def _answer_refusal(self, refusal: _Refusal) -> None:
        self.discarding = True
        self._error(refusal.status, refusal.message, refusal.code, refusal.type_, path=refusal.path)
        if not refusal.linger or self.closed or self.eof:
            self.close()
            return
        # Lingering close: stop sending, drain what the client is still uploading for a
        # moment, so that it reads the refusal instead of a reset.
        transport = self.transport
        assert transport is not None
        with contextlib.suppress(Exception):
            transport.write_eof()
        if self.read_paused:
            self.read_paused = False
            transport.resume_reading()
        self.loop.call_later(LINGER_S, self.close)


class _Cycle(Cycle):
    """One request/response cycle of the ASGI app on the builtin server (`Cycle`)."""

    __slots__ = ("conn", "keep", "mode", "remaining", "req")

    def __init__(self, conn: _Conn, req: _Request) -> None:
        super().__init__()
        self.conn = conn
        self.req = req
        self.keep = False
        self.mode = _LENGTH
        self.remaining = 0

    def request_body(self) -> bytes:
        return self.req.body

    async def wait_gone(self) -> None:
        await self.conn.wait_gone()

    async def stream_head(self) -> None:
        conn = self.conn
        if conn.gone or conn.closed:
            return
        head = self._head()
        with contextlib.suppress(_Gone):
            conn.write(head)
        if conn.write_paused:
            await conn.drain()

    def _head(self) -> bytes:
        conn = self.conn
        req = self.req
        try:
            head = _build_head(
                self.status,
                self.headers,
                is_head=req.is_head,
                http10=req.http_version != "1.1",
                keep_alive=req.keep_alive,
                close=conn.server.shutting_down or conn.must_close,
            )
        except BaseException:
            conn.must_close = True
            raise
        self.mode, self.remaining, self.keep = head.mode, head.length, head.keep_alive
        return head.render()

    async def body_part(self, body: bytes, more: bool) -> None:
        conn = self.conn
        if conn.gone or conn.closed:
            return
        out: list[bytes] = []
        if not self.head_sent:
            self.head_sent = True
            out.append(self._head())
        mode = self.mode
        if body and not self.req.is_head:
            if mode == _CHUNKED:
                out += (b"%x\r\n" % len(body), body, b"\r\n")
            elif mode == _LENGTH:
                if len(body) > self.remaining:
                    conn.must_close = True
                    raise RuntimeError("Too much data for declared Content-Length")
                self.remaining -= len(body)
                out.append(body)
            else:
                out.append(body)
        if not more:
            if mode == _CHUNKED and not self.req.is_head:
                out.append(b"0\r\n\r\n")
            elif mode == _LENGTH and self.remaining != 0:
                conn.must_close = True
                raise RuntimeError("Too little data for declared Content-Length")
        if out:
            with contextlib.suppress(_Gone):
                conn.write(out[0] if len(out) == 1 else b"".join(out))
            if conn.write_paused:
                await conn.drain()

    async def run_plan(self, plan: ResponsePlan, report: PlanReport) -> None:
        conn = self.conn
        try:
            program = conn.compile(self.req, plan)
        except BaseException:
            report.outcome = Outcome.ERROR
            raise
        self.keep = await conn.execute(program, report)
