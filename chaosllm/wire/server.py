"""chaosllm's own HTTP/1.1 server: asyncio protocols and httptools (llhttp).

Theory of operation
-------------------
`WireServer.serve` runs the ASGI lifespan (when the app supports it), binds the
listening sockets (`chaosllm.wire.common.bind_sockets`: ``::`` is dual-stack) and
accepts on them in bursts (`chaosllm.wire.accept`: uvloop's own server accepts one
connection a turn of the loop, which a flood of busy connections starves). Every
accepted connection is one `chaosllm.wire.protocol.Connection`, which parses, queues and
answers its requests; a plan is compiled once into a wire program
(`chaosllm.wire.program`) and run by the callback executor (`chaosllm.wire.player`, on
the server's one timer heap, `chaosllm.wire.pacer`) or the awaiting one
(`chaosllm.wire.executor`). This module holds what is the server's rather than a
connection's: the lifecycle, the connection limit, shutdown.

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
import logging
import threading
from typing import Any, Final

import anyio
import anyio.abc
import anyio.from_thread

from chaosllm.errors import ServerError
from chaosllm.wire.accept import Acceptor
from chaosllm.wire.common import (
    RESERVE,
    Direct,
    ErrorBody,
    ServerCore,
    address,
    backend_options,
    bind_sockets,
    connection_cap,
)
from chaosllm.wire.flow import Outbox, Turns
from chaosllm.wire.pacer import Pacer
from chaosllm.wire.protocol import Connection

__all__ = ["Direct", "ErrorBody", "WireServer"]

logger = logging.getLogger("chaosllm.wire")

_BACKLOG: Final = 2048


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
        self._conns: set[Connection] = set()
        self.idle: dict[Connection, None] = {}
        """Connections waiting for a request with nothing of it received, oldest first."""
        self.cap = self.max_connections
        self._full_warned = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pacer: Pacer | None = None
        self.turns: Turns | None = None
        self.outbox: Outbox | None = None

    def outbox_of(self, loop: asyncio.AbstractEventLoop) -> Outbox:
        outbox = self.outbox
        if outbox is None or outbox.loop is not loop:
            outbox = self.outbox = Outbox(loop)
        return outbox

    def turns_of(self, loop: asyncio.AbstractEventLoop) -> Turns:
        turns = self.turns
        if turns is None or turns.loop is not loop:
            turns = self.turns = Turns(loop)
        return turns

    def pacer_of(self, loop: asyncio.AbstractEventLoop) -> Pacer:
        pacer = self.pacer
        if pacer is None or pacer.loop is not loop:
            pacer = self.pacer = Pacer(loop)
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
        self.loop = loop
        self.loop_thread = threading.get_ident()
        self._stop = anyio.Event()
        self._stopped = anyio.Event()
        failure: str | None = None
        try:
            if self.shutting_down:
                self._stop.set()
            failure = await self._serve_app(task_status)
        finally:
            self.loop = None
            self._stopped.set()
        if failure is not None:
            raise ServerError(failure)

    def request_shutdown(self) -> None:
        """Ask `serve` to stop; callable from any thread.

        From the event loop's thread it returns at once; from another thread it
        returns once the loop has taken the request.
        """
        loop = self.loop
        if loop is not None and threading.get_ident() != self.loop_thread:
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
                if self.loop is None or loop.is_closed():
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
        assert self._stop is not None and self.loop is not None
        loop = self.loop
        self.cap = connection_cap(self.max_connections)
        sockets = bind_sockets(self.host, self.port, _BACKLOG)
        servers: list[asyncio.AbstractServer | Acceptor] = []
        try:
            for sock in sockets:
                acceptor = Acceptor(loop, sock, lambda: Connection(self), self.ssl)
                try:
                    acceptor.start()
                except NotImplementedError:  # no add_reader (Windows' proactor loop)
                    acceptor.close()
                    servers.append(
                        await loop.create_server(
                            lambda: Connection(self), sock=sock, backlog=_BACKLOG, ssl=self.ssl
                        )
                    )
                else:
                    servers.append(acceptor)
            bound = address(sockets[0].getsockname())
            assert bound is not None
            self.bound = bound
            task_status.started(bound)
            await self._stop.wait()
        finally:
            with anyio.CancelScope(shield=True):
                for server in servers:
                    server.close()
                for sock in sockets:  # (an asyncio server closes its own; again is a no-op)
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
        if self.pacer is not None:
            self.pacer.clear()
        if tasks:
            with anyio.move_on_after(self.graceful_timeout_s):
                await asyncio.wait(tasks)

    # -- connections --------------------------------------------------------------------

    def admit(self, conn: Connection) -> None:
        """Count a new connection in; make room by closing the oldest idle ones."""
        conns, idle = self._conns, self.idle
        while len(conns) >= self.cap and idle:
            next(iter(idle)).close()
            self._warn_full("closing the oldest idle connections")
        conns.add(conn)
        if len(conns) > self.cap:
            if len(conns) > self.cap + RESERVE:
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
                self.cap,
                doing,
            )

    def forget(self, conn: Connection) -> None:
        self.idle.pop(conn, None)
        self._conns.discard(conn)
        if self._drained is not None and not self._conns:
            self._drained.set()
