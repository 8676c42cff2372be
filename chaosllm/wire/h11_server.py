"""chaosllm's pure-Python HTTP/1.1 server: `h11` for the protocol, `anyio` for the sockets.

The fallback beside the default `chaosllm.wire.server.WireServer` (asyncio protocols and
httptools): the same constructor, the same behaviour on the wire, selected with
``--server h11``. It runs on any anyio backend.

Theory of operation
-------------------
`H11WireServer.serve` runs the ASGI lifespan (when the app supports it), binds the
listening sockets (`chaosllm.wire.common.bind_sockets`: ``::`` is dual-stack) and runs
one accept loop per listening socket. Every accepted connection gets one task and one
`_Connection`; there are no per-request tasks. The connection task loops over
request/response cycles:

1. read the request head through `h11` (a first-request or keep-alive idle
   deadline, then `header_timeout_s` once bytes arrived: 408 when a partial
   head times out, plain close when nothing came; malformed HTTP gets 400, an
   HTTP version other than 1.0 and 1.1 505, Content-Length with Transfer-Encoding
   400 and the connection closed);
2. read the whole body (bounded by `max_body_bytes`: 413, then close; a body
   that stops for `header_timeout_s` or arrives slower than `body_min_rate`
   after `body_timeout_s` gets 408);
3. ask the fast path (`direct`), else call the app in the same task with a
   `_Cycle`'s ``receive``/``send``;
4. keep the connection alive (``start_next_cycle``) unless either side asked
   to close, the response was not completed, or the server is shutting down.

Standard ``http.response.*`` messages go through `h11` and are written as soon
as they arrive (a head with Content-Length waits for the first body message,
so a small response is a single write; a streaming head goes out at once).
The custom ``chaosllm.plan`` message (see `chaosllm.wire.asgi.send_plan`) is
executed here on the socket: delays, pieces, and endings that ASGI cannot
express -- FIN or RST mid-body, raw bytes without a head, an empty reply, a
stall. Consecutive pieces without delay are coalesced into one write; a piece
after a delay is flushed on its own. `h11` serialises heads and chunks; a
short body is simply never completed, bytes beyond a declared Content-Length
are written raw, and a message that is not completed always ends the
connection.

The client is noticed leaving by reading the socket while the app runs: the
second ``receive()`` and every delay inside a plan read (and stash into `h11`
any pipelined bytes) until EOF. A write to a vanished client silently turns
the rest of the response into no-ops, as uvicorn does (ASGI spec 2.3).

At `max_connections` the oldest idle connection (waiting for a request head,
nothing of it received) is closed to make room for a new one; with none idle,
accepting waits.

Shutdown (`request_shutdown`, thread-safe) stops accepting, closes the
connections that are waiting for a request head, lets in-flight requests finish
for `graceful_timeout_s`, then cancels them; every socket is closed on the way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import threading
from typing import Any, Final, cast

import anyio
import anyio.abc
import anyio.from_thread
import anyio.streams.stapled
import h11
from anyio._backends._asyncio import SocketStream as AsyncioSocketStream
from anyio._backends._asyncio import StreamProtocol
from anyio._backends._asyncio import TCPSocketListener as AsyncioListener

from chaosllm.core.report import Outcome, PlanReport
from chaosllm.errors import ServerError
from chaosllm.model import ResponsePlan
from chaosllm.wire.asgi import PLAN_EXTENSION, PlanAborted, Scope
from chaosllm.wire.common import (
    ASGI_VERSION,
    BOTH_FRAMINGS,
    LINGER_S,
    Cycle,
    Direct,
    ServerCore,
    address,
    bind_sockets,
    body_deadline,
    connection_cap,
    error_body,
    error_response,
    path_of,
    version_refusal,
)
from chaosllm.wire.executor import execute
from chaosllm.wire.flow import STASH_BYTES, Turns
from chaosllm.wire.head import PHRASES, http_date, tokens
from chaosllm.wire.program import program_for
from chaosllm.wire.upgrade import is_upgrade

__all__ = ["H11WireServer"]


class _Gone(Exception):
    """The client went away (or the socket is closed): stop writing."""


logger = logging.getLogger("chaosllm.wire")

_READ_SIZE: Final = 65536
_ACCEPT_BATCH: Final = 256
"""The most connections accepted in one turn of the event loop."""
_CHUNK_COST: Final = 64
"""What a queued read holds besides its bytes (the bytes object, its deque slot)."""
_RST_LINGER: Final = struct.pack("ii", 1, 0)
_GONE_ERRORS: Final = (
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    OSError,
)
_HALF_CLOSE_ERRORS: Final = (*_GONE_ERRORS, RuntimeError, NotImplementedError, TypeError)
"""What a half-close (``send_eof``) raises on a socket that cannot take one: uvloop's
transport once the peer's reset closed it (RuntimeError, anyio passes it on); a TLS
stream without half-close (NotImplementedError, or TypeError once its session ended)."""


def _buffered(conn: h11.Connection) -> int:
    """The bytes `h11` holds unread (pipelined requests not yet parsed)."""
    buffer = getattr(conn, "_receive_buffer", None)  # h11's own; no public size
    return len(buffer) if buffer is not None else len(conn.trailing_data[0])


def _emit(conn: h11.Connection, event: h11.Event) -> list[bytes]:
    parts = conn.send_with_data_passthrough(event)
    assert parts is not None
    return parts


class H11WireServer(ServerCore):
    """An HTTP/1.1 server hosting an ASGI app, able to execute `ResponsePlan`s exactly.

    Usage (in an anyio task group)::

        server = H11WireServer(app, port=0)
        host, port = await tg.start(server.serve)
        ...
        server.request_shutdown()   # or: await server.shutdown()

    From synchronous code (tests, the CLI)::

        with H11WireServer(app).run_in_thread() as (host, port):
            ...
    """

    def _init_state(self) -> None:
        self._connections: set[_Connection] = set()
        self._idle: dict[_Connection, None] = {}
        """Connections waiting for a request head with nothing of it received, oldest first."""
        self._portal: anyio.from_thread.BlockingPortal | None = None
        self.turns: Turns | None = None
        """Fairness between connections (`chaosllm.wire.flow.Turns`), on asyncio."""

    # -- lifecycle ----------------------------------------------------------------------

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[tuple[str, int]] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until `request_shutdown`; ``task_status.started((host, port))`` once bound.

        Raises `ServerError` when the app's lifespan startup fails or the address
        cannot be bound.
        """
        self._loop_thread = threading.get_ident()
        self._stop = anyio.Event()
        self._stopped = anyio.Event()
        failure: str | None = None
        try:
            async with anyio.from_thread.BlockingPortal() as portal:
                self._portal = portal
                if self.shutting_down:
                    self._stop.set()
                failure = await self._serve_app(task_status)
        finally:
            self._portal = None
            self._stopped.set()
        if failure is not None:
            raise ServerError(failure)

    def request_shutdown(self) -> None:
        """Ask `serve` to stop; callable from any thread.

        From the event loop's thread it returns at once; from another thread it
        returns once the loop has taken the request.
        """
        portal = self._portal
        if portal is not None and threading.get_ident() != self._loop_thread:
            # The portal is stopped only when serve() is over: nothing left to stop then.
            with contextlib.suppress(RuntimeError):
                portal.call(self._shutdown_in_loop)
            return
        self._shutdown_in_loop()

    def _shutdown_in_loop(self) -> None:
        self.shutting_down = True
        if self._stop is not None:
            self._stop.set()
        for connection in self._connections:
            if connection.head_scope is not None:
                connection.head_scope.cancel()

    async def _listeners(self) -> anyio.abc.Listener[anyio.abc.SocketStream]:
        from_socket = getattr(anyio.abc.SocketListener, "from_socket", None)
        if from_socket is None:  # anyio < 4.7: no dual-stack wildcard
            return await anyio.create_tcp_listener(local_host=self.host, local_port=self.port)
        listeners: list[anyio.abc.SocketListener] = []
        sockets = bind_sockets(self.host, self.port, receive_buffer=STASH_BYTES)
        try:
            for sock in sockets:
                listeners.append(await from_socket(sock))
        except BaseException:
            for sock in sockets[len(listeners) :]:
                sock.close()
            raise
        return anyio.streams.stapled.MultiListener(listeners)

    async def _serve_sockets(self, task_status: anyio.abc.TaskStatus[tuple[str, int]]) -> None:
        assert self._stop is not None
        multi = await self._listeners()
        async with multi:
            assert isinstance(multi, anyio.streams.stapled.MultiListener)
            listeners = [
                listener
                for listener in multi.listeners
                if isinstance(listener, anyio.abc.SocketListener)
            ]
            sockname = listeners[0].extra(anyio.abc.SocketAttribute.local_address)
            assert isinstance(sockname, tuple)
            self.bound = bound = address(sockname)
            assert bound is not None
            slots = anyio.Semaphore(connection_cap(self.max_connections))
            if isinstance(listeners[0], AsyncioListener):
                self.turns = Turns(asyncio.get_running_loop())
            try:
                async with anyio.create_task_group() as connections:
                    async with anyio.create_task_group() as acceptors:
                        for listener in listeners:
                            acceptors.start_soon(self._accept_loop, listener, connections, slots)
                        task_status.started(bound)
                        await self._stop.wait()
                        acceptors.cancel_scope.cancel()
                    if self._connections:
                        self._drained = anyio.Event()
                        with anyio.move_on_after(self.graceful_timeout_s):
                            await self._drained.wait()
                    connections.cancel_scope.cancel()
            finally:
                with anyio.CancelScope(shield=True):
                    for connection in list(self._connections):
                        await connection.close()
                    self._connections.clear()

    async def _accept_loop(
        self,
        listener: anyio.abc.SocketListener,
        tg: anyio.abc.TaskGroup,
        slots: anyio.Semaphore,
    ) -> None:
        while True:
            try:
                accepted = await _accept(listener)
            except anyio.ClosedResourceError:
                return
            except (OSError, anyio.BrokenResourceError) as exc:
                logger.warning("accept() failed: %s", exc)
                await anyio.sleep(0.05)
                continue
            for index, item in enumerate(accepted):
                if slots.value == 0 and self._idle:
                    # Full: the oldest idle connection makes room (idle ones go first).
                    oldest = next(iter(self._idle))
                    oldest.evict()
                try:
                    try:
                        slots.acquire_nowait()  # no turn of the loop per connection
                    except anyio.WouldBlock:
                        await slots.acquire()
                except BaseException:
                    with anyio.CancelScope(shield=True):
                        for rest in accepted[index:]:
                            await _discard(rest)
                    raise
                tg.start_soon(self._run_connection, item, slots)

    async def _run_connection(
        self, accepted: socket.socket | anyio.abc.SocketStream, slots: anyio.Semaphore
    ) -> None:
        connection: _Connection | None = None
        try:
            try:
                stream = await _open(accepted) if isinstance(accepted, socket.socket) else accepted
            except OSError as exc:  # the client left before its connection was set up
                logger.debug("setting up an accepted connection failed: %s", exc)
                return
            connection = _Connection(self, stream)
            self._connections.add(connection)
            if self.ssl is not None:
                from anyio.streams.tls import TLSStream

                with anyio.move_on_after(self.header_timeout_s):
                    try:
                        connection.stream = await TLSStream.wrap(  # type: ignore[assignment]
                            connection.stream,
                            server_side=True,
                            ssl_context=self.ssl,
                            standard_compatible=False,
                        )
                    except Exception as exc:  # a failed handshake ends this connection only
                        logger.debug("TLS handshake failed: %s", exc)
                if not isinstance(connection.stream, TLSStream):
                    return
            await connection.run()
        except Exception:  # one connection's failure never ends the server's task group
            logger.exception("connection handler failed")
        finally:
            if connection is not None:
                self._connections.discard(connection)
                if not connection.closed:
                    await connection.close()
            slots.release()
            if self._drained is not None and not self._connections:
                self._drained.set()


async def _accept(
    listener: anyio.abc.SocketListener,
) -> list[socket.socket | anyio.abc.SocketStream]:
    """The connections waiting on `listener` (at least one: waits for it). On asyncio,
    every one waiting (up to `_ACCEPT_BATCH`), as sockets that their connection's task
    sets up (`_open`): a loop busy with other connections accepts a burst in one turn,
    not one connection every few turns. Elsewhere, anyio's accept."""
    if not isinstance(listener, AsyncioListener):
        return [await listener.accept()]
    raw = listener.extra(anyio.abc.SocketAttribute.raw_socket)
    loop = asyncio.get_running_loop()
    await anyio.lowlevel.checkpoint()
    try:
        sock, _ = await loop.sock_accept(raw)
    except asyncio.CancelledError:
        with contextlib.suppress(ValueError, NotImplementedError, OSError):
            loop.remove_reader(raw)  # as anyio does (python/cpython#85489)
        raise
    accepted: list[socket.socket | anyio.abc.SocketStream] = [sock]
    while len(accepted) < _ACCEPT_BATCH:
        try:
            sock, _ = raw.accept()
        except OSError:  # none waiting, or a failure that the next accept reports
            break
        accepted.append(sock)
    return accepted


async def _open(sock: socket.socket) -> anyio.abc.SocketStream:
    """An accepted socket as anyio's stream, as anyio's accept makes it (TCP_NODELAY),
    on `_BoundedReads`."""
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.connect_accepted_socket(_BoundedReads, sock)
    except BaseException:
        sock.close()
        raise
    return AsyncioSocketStream(transport, protocol)


async def _discard(accepted: socket.socket | anyio.abc.SocketStream) -> None:
    if isinstance(accepted, socket.socket):
        accepted.close()
    else:
        await accepted.aclose()


class _BoundedReads(StreamProtocol):
    """anyio's stream protocol (asyncio), with reading paused once the bytes it holds
    unreceived pass `STASH_BYTES`, the builtin server's bound (`chaosllm.wire.flow`).

    anyio pauses reading only once a receive has waited: meanwhile the event loop reads
    all the client sends (uvloop: up to 32 reads of 256 KiB a wakeup), so a client that
    pipelines and never reads its answers (each write waits for the socket) queued
    megabytes, most of them before its connection's task first ran. This protocol is the
    connection's from its first byte (`_accept`); paused, the kernel's TCP window stops
    the client; anyio resumes reading when a receive finds the queue empty."""

    held = 0
    """At least the memory the queue holds (exact after each recount)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self.held += len(data) + _CHUNK_COST
        if self.held > STASH_BYTES:  # recounted (receives took some): rarely, not per read
            self.held = sum(len(chunk) + _CHUNK_COST for chunk in self.read_queue)
            if self.held > STASH_BYTES:
                self.transport.pause_reading()


class _Connection:
    """One accepted socket: the request/response loop and the socket primitives."""

    __slots__ = (
        "_transport",
        "client",
        "closed",
        "deferred",
        "evicted",
        "gone",
        "gone_event",
        "h11",
        "head_scope",
        "must_close",
        "planned",
        "server",
        "server_address",
        "stream",
        "turn",
        "waiter",
        "watching",
    )

    def __init__(self, server: H11WireServer, stream: anyio.abc.SocketStream) -> None:
        self.server = server
        self.stream = stream
        self.h11 = h11.Connection(h11.SERVER)
        self.gone = False
        self.closed = False
        self.evicted = False
        self.must_close = False
        self.planned = False
        """A plan answered the request: `h11` did not see the response."""
        self.watching = False
        self.deferred = False
        self.turn = -1
        self.waiter: asyncio.Future[None] | None = None
        """Set when the connection's turn comes (`_wait_turn`)."""
        self.gone_event: anyio.Event | None = None
        self.head_scope: anyio.CancelScope | None = None
        self.client = address(stream.extra(anyio.abc.SocketAttribute.remote_address, None))
        self.server_address = address(stream.extra(anyio.abc.SocketAttribute.local_address, None))
        self._transport: Any = getattr(stream, "_transport", None)
        """anyio's transport (asyncio): reading is paused after each receive (`_recv`),
        and once what it queued unreceived is full (`_BoundedReads`)."""
        raw = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
        if raw is not None:  # what the kernel holds unread for us is bounded too
            with contextlib.suppress(OSError):
                raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, STASH_BYTES)

    # -- the request/response loop ---------------------------------------------------------

    async def run(self) -> None:
        try:
            first = True
            while True:
                request = await self._read_request(first)
                if request is None:
                    return
                if not first:
                    await self._wait_turn()
                first = False
                await self._run_app(*request)
                if self.closed or self.gone or self.must_close or self.server.shutting_down:
                    return
                if self.planned:
                    self._renew()
                else:
                    conn = self.h11
                    if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                        return
                    conn.start_next_cycle()
        except Exception:
            logger.exception("connection handler failed")
        finally:
            await self.close()

    async def _read_request(self, first: bool) -> tuple[h11.Request, bytes] | None:
        conn = self.h11
        server = self.server
        try:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                event = await self._wait_head(first)
            if type(event) is not h11.Request:
                return None
            limit = server.max_body_bytes
            path = path_of(event.target)[2]
            refusal = version_refusal(event.http_version.decode("ascii"))
            if refusal is not None:
                await self._error(505, refusal, "http_version_not_supported", path=path)
                return None
            framings = 0
            for name, value in event.headers:
                if name == b"content-length":
                    framings |= 1
                    if int(value) > limit:
                        await self._refuse_body(limit, path)
                        return None
                elif name == b"transfer-encoding":
                    framings |= 2
            if framings == 3:
                await self._error(400, BOTH_FRAMINGS, "bad_request", path=path)
                return None
            if conn.they_are_waiting_for_100_continue:
                await self.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])))
            parts: list[bytes] = []
            size = 0
            started = anyio.current_time()
            while True:
                body_event = conn.next_event()
                if body_event is h11.NEED_DATA:
                    data = b""
                    # A pause of header_timeout_s, or a body slower than body_min_rate once
                    # body_timeout_s has passed: 408.
                    rate_deadline = body_deadline(
                        started, size, server.body_timeout_s, server.body_min_rate
                    )
                    wait = min(server.header_timeout_s, rate_deadline - anyio.current_time())
                    with anyio.move_on_after(max(wait, 0.0)) as timeout:
                        data = await self._recv()
                    if timeout.cancelled_caught:
                        await self._error(
                            408, "Timed out reading the request body", "timeout", path=path
                        )
                        return None
                    conn.receive_data(data)
                elif type(body_event) is h11.Data:
                    size += len(body_event.data)
                    if size > limit:
                        await self._refuse_body(limit, path)
                        return None
                    parts.append(body_event.data)
                elif type(body_event) is h11.EndOfMessage:
                    break
                else:
                    return None
        except h11.RemoteProtocolError as exc:
            status = exc.error_status_hint
            await self._error(status, f"Malformed HTTP request: {exc}", "bad_request")
            return None
        except _Gone:
            return None
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        return event, bytes(body)

    async def _wait_head(self, first: bool) -> Any:
        """Read until `h11` yields an event; None on timeout or shutdown."""
        server = self.server
        if server.shutting_down:
            return None
        conn = self.h11
        got_bytes = bool(conn.trailing_data[0])
        wait = server.header_timeout_s if first or got_bytes else server.keepalive_timeout_s
        event: Any = h11.NEED_DATA
        ended = False
        if not got_bytes:
            server._idle[self] = None
        with anyio.CancelScope(deadline=anyio.current_time() + wait) as scope:
            self.head_scope = scope
            try:
                while event is h11.NEED_DATA:
                    data = await self._recv()
                    if not data:
                        ended = True
                        break
                    if not got_bytes:
                        got_bytes = True
                        server._idle.pop(self, None)
                        if not first:
                            scope.deadline = anyio.current_time() + server.header_timeout_s
                    conn.receive_data(data)
                    event = conn.next_event()
            finally:
                self.head_scope = None
                server._idle.pop(self, None)
        if event is h11.NEED_DATA:
            if got_bytes and not server.shutting_down and not self.evicted:
                if ended:
                    message = "Malformed HTTP request: the connection ended inside the head"
                    await self._error(400, message, "bad_request")
                else:
                    await self._error(408, "Timed out reading the request head", "timeout")
            return None
        return event

    def evict(self) -> None:
        """Close this idle connection to make room for a new one."""
        self.evicted = True
        if self.head_scope is not None:
            self.head_scope.cancel()

    async def _run_app(self, request: h11.Request, body: bytes) -> None:
        server = self.server
        raw_path, query, path = path_of(request.target)
        if is_upgrade(request.method, list(request.headers)):
            from chaosllm.wire.ws_stream import serve_websocket_stream  # wsproto, when asked

            self.must_close = True
            await serve_websocket_stream(self, request, path, self.h11.trailing_data[0])
            return
        direct = server.direct
        if direct is not None and await self._run_direct(direct, request, body, query, path):
            return
        scope: Scope = {
            "type": "http",
            "asgi": ASGI_VERSION,
            "http_version": request.http_version.decode("ascii"),
            "method": request.method.decode("ascii"),
            "scheme": "http",
            "path": path,
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": list(request.headers),
            "client": self.client,
            "server": self.server_address,
            "state": server.lifespan_state.copy(),
            "extensions": {PLAN_EXTENSION: {}},
        }
        cycle = _Cycle(self, body, request)
        try:
            await server.app(scope, cycle.receive, cycle.send)
        except PlanAborted as exc:
            # The app aborts its response on purpose (a proxied upstream dropped mid-answer):
            # the connection closes with the message incomplete, as for a CLOSE plan.
            logger.debug("%s", exc)
            if not cycle.committed:
                await self._internal_error(path)
            self.must_close = True
            if exc.reset:
                await self.reset()
            return
        except Exception:
            logger.exception("Exception in ASGI application")
            if not cycle.committed:
                await self._internal_error(path)
            self.must_close = True
            return
        if not cycle.committed:
            logger.error("ASGI application returned without starting a response")
            await self._internal_error(path)
        elif not cycle.complete:
            logger.error("ASGI application returned without completing the response")
            self.must_close = True

    async def _run_direct(
        self,
        direct: Direct,
        request: h11.Request,
        body: bytes,
        query: bytes,
        path: str,
    ) -> bool:
        """Answer through the fast path; False when it leaves the request to the app."""
        result: tuple[ResponsePlan, PlanReport] | None = None
        try:
            result = direct(
                request.method.decode("ascii"), path, query, list(request.headers), body
            )
            if result is None:
                return False
            cycle = _Cycle(self, body, request)
            await cycle.run_plan(*result)
        except Exception:
            logger.exception("Exception in the fast path")
            if result is None:
                await self._internal_error(path)
            self.must_close = True
        return True

    async def _wait_turn(self) -> None:
        """Wait, when the server's `Turns` says so, before answering a request read on a
        connection already served (a connection's first request is answered at once)."""
        turns = self.server.turns
        if turns is None or turns.take(self):
            return
        self.waiter = waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self.waiter = None

    def take_turn(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- socket primitives ----------------------------------------------------------------

    async def _recv(self) -> bytes:
        try:
            data = await self.stream.receive(_READ_SIZE)
        except _GONE_ERRORS:
            return b""
        # anyio pauses reading after a receive that waited, not after one that found data
        # already queued (a pipelining client's first): reading would then go on with
        # nobody receiving, queueing all the client sends. Paused here; anyio resumes it
        # when a receive waits.
        if self._transport is not None:
            with contextlib.suppress(AttributeError, RuntimeError):
                self._transport.pause_reading()
        return data

    async def write(self, data: bytes) -> None:
        if self.gone or self.closed:
            raise _Gone
        try:
            await self.stream.send(data)
        except _GONE_ERRORS:
            self._mark_gone()
            raise _Gone from None

    def _renew(self) -> None:
        """After a plan, which went to the socket without `h11`: a fresh `h11` for the
        next request, holding the bytes already read of it."""
        self.planned = False
        data, closed = self.h11.trailing_data
        self.h11 = h11.Connection(h11.SERVER)
        if data:
            self.h11.receive_data(data)
        if closed:
            self.h11.receive_data(b"")

    def _mark_gone(self) -> None:
        self.gone = True
        if self.gone_event is not None:
            self.gone_event.set()

    async def wait_disconnect(self) -> None:
        """Return once the client has gone (EOF or error); stash pipelined bytes."""
        if self.gone or self.closed:
            return
        if self.watching:
            if self.gone_event is None:
                self.gone_event = anyio.Event()
            await self.gone_event.wait()
            return
        self.watching = True
        try:
            while True:
                data = await self._recv()
                if not data:
                    break
                self.h11.receive_data(data)
                if _buffered(self.h11) > STASH_BYTES:
                    # Enough pipelined bytes wait in h11's buffer (what the next requests
                    # will read: it only grows here): stop reading, as the builtin server
                    # pauses its transport; the kernel's TCP window stops the client.
                    await anyio.sleep_forever()
            self._mark_gone()
        finally:
            self.watching = False

    async def close(self) -> None:
        """Close the socket: FIN first, so that unread input cannot turn it into an RST."""
        if self.closed:
            return
        self.closed = True
        self.head_scope = None
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(*_HALF_CLOSE_ERRORS):  # the close follows either way
                await self.stream.send_eof()
            try:
                await self.stream.aclose()
            except Exception:  # a TLS stream whose peer has gone: close what is under it
                with contextlib.suppress(Exception):
                    await getattr(self.stream, "transport_stream", self.stream).aclose()
        if self.gone_event is not None:
            self.gone_event.set()

    async def reset(self) -> None:
        """Close the socket with an RST (SO_LINGER on, 0 s)."""
        if self.closed:
            return
        with contextlib.suppress(OSError):
            raw = self.stream.extra(anyio.abc.SocketAttribute.raw_socket)
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST_LINGER)
        self.closed = True
        with anyio.CancelScope(shield=True):
            await self.stream.aclose()
        if self.gone_event is not None:
            self.gone_event.set()

    async def _error(
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
        with contextlib.suppress(_Gone):
            await self.write(error_response(body, status))

    async def _internal_error(self, path: str) -> None:
        await self._error(500, "Internal server error", "internal_error", "server_error", path=path)

    async def _refuse_body(self, limit: int, path: str) -> None:
        await self._error(
            413,
            f"Request body too large: the limit is {limit} bytes",
            "request_too_large",
            path=path,
        )
        if self.gone or self.closed:
            return
        # Lingering close: stop sending, drain what the client is still uploading for a
        # moment, so that it reads the 413 instead of a reset.
        with contextlib.suppress(*_HALF_CLOSE_ERRORS):
            await self.stream.send_eof()
        with anyio.move_on_after(LINGER_S):
            while await self._recv():
                pass


class _Cycle(Cycle):
    """One request/response cycle on the h11 server (`Cycle`)."""

    __slots__ = ("body", "conn", "request")

    def __init__(self, conn: _Connection, body: bytes, request: h11.Request) -> None:
        super().__init__()
        self.conn = conn
        self.body = body
        self.request = request

    def request_body(self) -> bytes:
        return self.body

    async def wait_gone(self) -> None:
        await self.conn.wait_disconnect()

    def _response(self, status: int, headers: list[tuple[bytes, bytes]]) -> h11.Response:
        has_date = False
        for name, _ in headers:
            if name.lower() == b"date":
                has_date = True
                break
        if not has_date:
            headers.append((b"date", http_date()))
        if self.conn.server.shutting_down or self.conn.must_close:
            headers.append((b"connection", b"close"))
        return h11.Response(status_code=status, headers=headers, reason=PHRASES.get(status, b""))

    async def stream_head(self) -> None:
        conn = self.conn
        if conn.gone or conn.closed:
            return
        head = b"".join(_emit(conn.h11, self._response(self.status, self.headers)))
        with contextlib.suppress(_Gone):
            await conn.write(head)

    async def body_part(self, body: bytes, more: bool) -> None:
        conn = self.conn
        if conn.gone or conn.closed:
            return
        h = conn.h11
        out: list[bytes] = []
        if not self.head_sent:
            self.head_sent = True
            out += _emit(h, self._response(self.status, self.headers))
        if body and self.request.method != b"HEAD":
            out += _emit(h, h11.Data(data=body))
        if not more:
            out += _emit(h, h11.EndOfMessage())
        if out:
            with contextlib.suppress(_Gone):
                await conn.write(out[0] if len(out) == 1 else b"".join(out))

    async def run_plan(self, plan: ResponsePlan, report: PlanReport) -> None:
        conn = self.conn
        request = self.request
        http10 = request.http_version != b"1.1"
        close = False
        for name, value in request.headers:
            if name == b"connection":
                close = close or b"close" in tokens(value)
        try:
            if plan.close_after and plan.send_head:
                conn.must_close = True
            program = program_for(
                plan,
                is_head=request.method == b"HEAD",
                http10=http10,
                keep_alive=not (http10 or close),
                close=conn.server.shutting_down or conn.must_close,
            )
        except BaseException:
            report.outcome = Outcome.ERROR
            raise
        conn.planned = True
        if not await execute(program, _Sink(conn), report):
            conn.must_close = True


class _Sink:
    """A connection as the awaiting executor's `chaosllm.wire.executor.Sink`."""

    __slots__ = ("conn",)

    def __init__(self, conn: _Connection) -> None:
        self.conn = conn

    def open(self) -> bool:
        return not (self.conn.gone or self.conn.closed)

    async def drain(self) -> None:
        pass  # every write waits until the socket took it

    async def write(self, data: bytes) -> bool:
        if not data:
            return True  # nothing to write: whether the client left shows at the next
        try:
            await self.conn.write(data)
        except _Gone:
            return False
        return True

    async def pause(self, seconds: float) -> bool:
        conn = self.conn
        with anyio.move_on_after(seconds):
            await conn.wait_disconnect()
        return not (conn.gone or conn.closed)

    async def close(self) -> None:
        await self.conn.close()

    async def reset(self) -> None:
        await self.conn.reset()
