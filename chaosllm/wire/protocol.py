"""The builtin server's connection: an `asyncio.Protocol` fed to httptools (llhttp).

Theory of operation
-------------------
Every accepted socket is one `Connection`. There is no task per connection, and none
per request unless the request needs one:

1. The reader (`chaosllm.wire.reader`, httptools' callbacks) builds each request, head
   and whole body, within the limits, or a refusal of it. Complete requests queue in
   arrival order (pipelining); reading pauses while the requests queued behind a
   response in flight hold too much memory (`chaosllm.wire.flow.stash_full`), or while
   the client does not read, and a connection answers `TURN` queued requests at most
   before the others' turn (`chaosllm.wire.flow`).
2. The first queued request is answered when no other is in flight: the fast path
   (`direct`) first, which may return a plan for it; else the ASGI app, in a task, with
   an `AppCycle`'s ``receive``/``send`` (`chaosllm.wire.cycle`). A plan is compiled
   into a wire program (`chaosllm.wire.program`); the fast path's runs from the loop's
   callbacks (`chaosllm.wire.player`: at once when it has no delay and needs no waiting,
   the usual replay; else paced on the server's `Pacer`) until it must wait for
   something else, then in a task (`chaosllm.wire.executor`), which also runs the app's
   plans.
3. The connection is kept alive unless either side asked to close, the response was
   not completed, or the server is shutting down; the next queued request follows.

Timers, one per connection at most and only while no response is in flight: the first
request's head must arrive within `header_timeout_s` of the accept and a later one
within `header_timeout_s` of its first byte (408 for a partial head, a plain close for
no byte at all); an idle keep-alive connection is closed after `keepalive_timeout_s`;
a body that pauses for `header_timeout_s`, or arrives slower than `body_min_rate` bytes
a second once `body_timeout_s` has passed, gets 408.

The client is noticed leaving at once (the protocol reads all the time): EOF or a lost
connection ends a plan's delay, answers the app's second ``receive()`` with
``http.disconnect``, and turns the rest of the response into no-ops. Endings: FIN
(`close`, after ``write_eof`` so that unread input cannot turn it into an RST), RST
with SO_LINGER 0 once every byte written reached the kernel (`reset`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections import deque
from typing import TYPE_CHECKING, Final, cast

from chaosllm.core.report import Outcome, PlanReport
from chaosllm.model import ResponsePlan
from chaosllm.wire.asgi import PLAN_EXTENSION, PlanAborted, Scope
from chaosllm.wire.common import (
    ASGI_VERSION,
    LINGER_S,
    address,
    body_deadline,
    error_body,
    error_response,
    is_control,
)
from chaosllm.wire.cycle import AppCycle
from chaosllm.wire.executor import execute
from chaosllm.wire.flow import CORK_BYTES, TURN, FlowControl, stash_full
from chaosllm.wire.pacer import Pacer, Sleep
from chaosllm.wire.player import Player, play_at_once
from chaosllm.wire.program import Program, program_for
from chaosllm.wire.reader import BODY, HEAD, IDLE, RequestReader
from chaosllm.wire.request import CONTINUE, Refusal, Request

if TYPE_CHECKING:
    from chaosllm.wire.server import WireServer

__all__ = ["Connection"]

logger = logging.getLogger("chaosllm.wire")

_RST_LINGER: Final = struct.pack("ii", 1, 0)


class Connection(asyncio.Protocol):
    """One accepted socket: the parser's callbacks, the request queue, the plan executor
    and the socket primitives."""

    def __init__(self, server: WireServer) -> None:
        self.server = server
        loop = server.loop
        assert loop is not None
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.client: tuple[str, int] | None = None
        self.local: tuple[str, int] | None = None
        self.reader = RequestReader(self, loop.time())
        # answering
        self.queue: deque[Request | Refusal] = deque()
        self.queued = 0
        self.busy = False
        self.task: asyncio.Task[None] | None = None
        self.player: Player | None = None
        self.served = 0
        self.finish_one = False
        self.upgraded = False
        """Handed over to a WebSocket (`chaosllm.wire.ws_protocol`), in `task`."""
        self.over_cap = False
        self.turns = server.turns_of(loop)
        self.outbox = server.outbox_of(loop)
        self.corked: list[bytes] = []
        """Bytes held back for the end of the loop's turn (`chaosllm.wire.flow.Outbox`)."""
        self.corked_size = 0
        self.deferred = False
        """Waiting for its turn to answer what it read (`chaosllm.wire.flow.Turns`)."""
        self.turn = -1
        """The server's turn in which it last answered what it read."""
        self.must_close = False
        self.discarding = False
        # the socket
        self.closed = False
        self.eof = False
        self.gone = False
        self.flow = FlowControl()
        self.waiters: list[asyncio.Future[None]] = []
        """Woken when the client leaves (EOF or a lost connection)."""
        # timers
        now = loop.time()
        self.accepted = now
        self.ready_since = now
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = transport = cast(asyncio.Transport, transport)
        self.flow.transport = transport
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
        server.admit(self)
        if not self.closed:
            self._wait_next()

    def data_received(self, data: bytes) -> None:
        if self.discarding or self.closed:
            return
        self.reader.feed(data)
        if not self.busy:
            if self.served and not self.turns.take(self):
                return  # the others' turn first (`Turns`); `take_turn` follows
            self._pump()
        elif not self.flow.read_paused and stash_full(
            len(self.queue), self.queued + self.reader.body_size
        ):
            self.flow.pause_reading()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake(self.waiters)
        if self.discarding and not self.queue and not self.busy:
            self.close()
        elif not self.busy:
            self._pump()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.corked = []  # nothing reaches a lost connection
        self.corked_size = 0
        if not self.closed:
            self.closed = True
            self._cleanup()
        # The parser holds the reader's callbacks, the reader this connection: without
        # these reference cycles the connection is freed here, by reference counting,
        # instead of being left for the garbage collector (about 20 tracked objects a
        # connection, whose full collections then pause every stream in flight). Nothing
        # reads from a lost connection.
        self.reader.release()

    def pause_writing(self) -> None:
        self.flow.pause_writing()

    def resume_writing(self) -> None:
        self.flow.resume_writing()
        if not self.busy and not self.closed:
            self._pump()

    def take_turn(self) -> None:
        """This connection's turn, deferred by the server's `Turns`, has come."""
        if not self.busy and not self.closed:
            self._pump()

    # -- the queue ----------------------------------------------------------------------

    def _pump(self) -> None:
        """Answer queued requests in order while none is in flight; then wait for more."""
        server = self.server
        queue = self.queue
        turn = TURN
        while not self.busy:
            if self.closed:
                return
            if not queue:
                if not self.reader.rest:
                    break
                self.reader.feed(b"")  # what was held back while the queue was full
                continue
            turn -= 1
            if turn < 0:  # fairness: the others' turn; the rest from the next iteration
                self.flow.pause_reading()
                self.loop.call_soon(self._pump)
                return
            if server.shutting_down:
                if not self.finish_one:
                    self.close()
                    return
                self.finish_one = False
            if self.flow.write_paused:
                self.flow.pause_reading()
                return
            item = queue.popleft()
            self.queued -= item.size
            if type(item) is Refusal:
                self._answer_refusal(item)
                return
            assert type(item) is Request
            self._start(item)
            if not self.busy:
                self.ready_since = self.loop.time()
        if self.busy or self.closed:
            return
        self._wait_next()

    def _wait_next(self) -> None:
        """Nothing in flight and nothing queued: close, or arm the timer for what comes."""
        server = self.server
        if server.shutting_down and not (self.finish_one and self.reader.pstate == BODY):
            self.close()
            return
        if self.eof:
            if self.reader.pstate == IDLE or self.discarding:
                self.close()
            else:
                self._answer_refusal(
                    Refusal(
                        400,
                        "Malformed HTTP request: the connection ended inside the request",
                        "bad_request",
                    )
                )
            return
        if not self.flow.write_paused:
            self.flow.resume_reading()
        req = self.reader.req
        if req is not None and req.want_continue:
            req.want_continue = False
            self.write_quietly(CONTINUE)
        if self.reader.pstate == IDLE and not self.discarding:
            server.idle[self] = None
        else:
            server.idle.pop(self, None)
        self._arm(self._deadline())

    def _deadline(self) -> float:
        server = self.server
        reader = self.reader
        pstate = reader.pstate
        if pstate == IDLE:
            if self.served == 0:
                return self.accepted + server.header_timeout_s
            return self.ready_since + server.keepalive_timeout_s
        if pstate == HEAD:
            if self.served == 0:
                return self.accepted + server.header_timeout_s
            return max(reader.head_since, self.ready_since) + server.header_timeout_s
        since = max(reader.last_data, self.ready_since)
        rate = body_deadline(
            max(reader.body_since, self.ready_since),
            reader.body_size,
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
        pstate = self.reader.pstate
        if pstate == IDLE or self.server.shutting_down:
            self.close()
        elif pstate == HEAD:
            self._answer_refusal(Refusal(408, "Timed out reading the request head", "timeout"))
        else:
            req = self.reader.req
            self._answer_refusal(
                Refusal(
                    408,
                    "Timed out reading the request body",
                    "timeout",
                    path=req.path if req is not None else None,
                )
            )

    def shutdown(self) -> None:
        """The server is stopping: close if waiting for a request; finish a request whose
        body is arriving, or one read that waits for its turn (`Turns`); an in-flight one
        closes the connection when done."""
        if self.upgraded and self.task is not None:
            self.task.cancel()  # the session closes with 1001, going away
            return
        if self.closed or self.busy:
            return
        if self.deferred or (self.reader.pstate == BODY and not self.discarding):
            self.finish_one = True  # a request read and waiting for its turn is answered
            return
        self.close()

    # -- answering one request ----------------------------------------------------------

    def _start(self, req: Request) -> None:
        server = self.server
        self.served += 1
        self.server.idle.pop(self, None)
        # The read timer stays armed: it does nothing while a response is in flight, and
        # keeping it spares a timer per request under keep-alive load.
        if req.want_continue:
            req.want_continue = False
            self.write_quietly(CONTINUE)
        if self.over_cap:
            self.must_close = True
            if not is_control(req.path):
                self._answer_refusal(
                    Refusal(
                        503,
                        f"The server is at its connection limit ({server.cap}, "
                        f"--max-connections); retry shortly",
                        "server_busy",
                        type_="server_error",
                        path=req.path,
                    )
                )
                return
        if req.upgrade is not None:
            self.busy = self.upgraded = True
            self.task = self.loop.create_task(self._run_websocket(req))
            return
        direct = server.direct
        if direct is not None:
            try:
                result = direct(
                    req.method.decode("ascii"), req.path, req.query, req.headers, req.body, req
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

    def program(self, req: Request, plan: ResponsePlan) -> Program:
        """`plan` compiled for `req` on this connection (`chaosllm.wire.program`)."""
        if plan.close_after and plan.send_head:
            self.must_close = True
        return program_for(
            plan,
            is_head=req.is_head,
            http10=req.http_version != "1.1",
            keep_alive=req.keep_alive,
            close=self.server.shutting_down or self.must_close,
        )

    def _run_direct(self, req: Request, plan: ResponsePlan, report: PlanReport) -> None:
        try:
            program = self.program(req, plan)
        except Exception:
            report.outcome = Outcome.ERROR
            logger.exception("Exception in the fast path")
            self.close()
            return
        if program.instant:
            play_at_once(self, program, report)
            return
        # Paced (or ending otherwise than by a FIN or nothing): from callbacks, as the
        # task that ran it did, starting at the loop's next turn.
        self.busy = True
        self.player = player = Player(self, program, report)
        self.loop.call_soon(player.start)

    async def execute(self, program: Program, report: PlanReport, start: int = 0) -> bool:
        """The awaiting executor on this connection; whether it can be kept alive."""
        keep = await execute(program, _Sink(self), report, start)
        if report.outcome is Outcome.CLIENT_GONE:
            self.must_close = True
        return keep

    def continue_in_task(self, program: Program, report: PlanReport, start: int) -> None:
        self.task = self.loop.create_task(self._resume(program, report, start))

    async def _resume(self, program: Program, report: PlanReport, start: int) -> None:
        keep = False
        try:
            keep = await self.execute(program, report, start)
        except Exception:
            logger.exception("Exception in the fast path")
            self.must_close = True
        finally:
            self.cycle_done(keep)

    @property
    def pacer(self) -> Pacer:
        return self.server.pacer_of(self.loop)

    async def _run_asgi(self, req: Request) -> None:
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
            "headers": list(req.headers),  # the app's to change: a memoised request is shared
            "client": self.client,
            "server": self.local,
            "state": server.lifespan_state.copy(),
            "extensions": {PLAN_EXTENSION: {}},
        }
        cycle = AppCycle(self, req)
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
                if not (self.eof or self.closed):  # else the client left first: no error
                    logger.error("ASGI application returned without completing the response")
                self.must_close = True
            else:
                keep = cycle.keep
        finally:
            self.cycle_done(keep)

    async def _run_websocket(self, req: Request) -> None:
        from chaosllm.wire.ws_protocol import serve_websocket  # wsproto, on the first session

        try:
            await serve_websocket(self, req, req.upgrade or b"")
        except Exception:
            logger.exception("Exception in the WebSocket session")
        finally:
            self.cycle_done(False)

    def cycle_done(self, keep: bool) -> None:
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

    # -- socket primitives --------------------------------------------------------------

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        if self.corked:  # (checked here: a paced stream sends each frame this way)
            self.uncork()
        self.transport.write(data)

    def send_at_turn_end(self, data: bytes) -> None:
        """Write `data` when the loop's turn ends, with the other answers written at once
        in it (`chaosllm.wire.flow.Outbox`); at once when the connection already holds
        back `CORK_BYTES`."""
        corked = self.corked
        if not corked:
            self.outbox.add(self)
        corked.append(data)
        self.corked_size += len(data)
        if self.corked_size >= CORK_BYTES:
            self.uncork()

    def uncork(self) -> None:
        """Write out what is held back for the turn's end."""
        corked = self.corked
        if corked:
            self.corked = []
            self.corked_size = 0
            if not self.closed:
                assert self.transport is not None
                self.transport.write(corked[0] if len(corked) == 1 else b"".join(corked))

    async def flush(self) -> None:
        """Wait until every byte written has been handed to the kernel."""
        self.uncork()
        await self.flow.flush()

    def write_quietly(self, data: bytes) -> None:
        """Write `data` unless the client has gone or the socket is closed."""
        if not self.closed and not self.gone:
            self.send(data)

    async def pause(self, seconds: float) -> bool:
        """Sleep, watching the client; whether it is still there (False: it left)."""
        if not (self.eof or self.closed):
            future = self.loop.create_future()
            self.waiters.append(future)
            sleep = Sleep(self.loop, future, seconds)
            try:
                await future
            finally:
                sleep.cancel()
                with contextlib.suppress(ValueError):
                    self.waiters.remove(future)
        if self.eof or self.closed:
            self.gone = True
            return False
        return True

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
        self.uncork()
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
        self.uncork()
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
        self.server.forget(self)
        self._wake(self.waiters)
        self.flow.stop()

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
        self.write_quietly(error_response(body, status))

    def _internal_error(self, path: str) -> None:
        self._error(500, "Internal server error", "internal_error", "server_error", path=path)

    def _answer_refusal(self, refusal: Refusal) -> None:
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
        self.flow.resume_reading()
        self.loop.call_later(LINGER_S, self.close)


class _Sink:
    """A connection as the awaiting executor's `chaosllm.wire.executor.Sink`."""

    __slots__ = ("conn",)

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def open(self) -> bool:
        return not (self.conn.closed or self.conn.gone)

    async def drain(self) -> None:
        await self.conn.flow.drain()

    async def write(self, data: bytes) -> bool:
        conn = self.conn
        if conn.closed or conn.gone:
            return False
        if data:
            conn.send(data)
        if conn.flow.write_paused:
            await conn.flow.drain()
        return True

    async def pause(self, seconds: float) -> bool:
        return await self.conn.pause(seconds)

    async def close(self) -> None:
        self.conn.close()

    async def reset(self) -> None:
        await self.conn.flush()
        self.conn.reset()
