"""The builtin server's WebSocket connections: an upgraded `Connection`'s transport taken
over by a `WebSocketProtocol` that hosts the ASGI app's ``websocket`` scope.

The HTTP connection (`chaosllm.wire.protocol`) hands an upgrade request over in its
task (`serve_websocket`); from then on the transport's protocol is the WebSocket one,
which feeds `chaosllm.wire.websocket.WebSocketCore` and forwards the transport's
callbacks (flow control, the connection lost) to the HTTP connection, which the server
still counts, shuts down and closes. Shutdown closes a session with 1001 (going away).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Final

from chaosllm.wire.common import ASGI_VERSION, MAX_HEAD, error_body, error_response
from chaosllm.wire.upgrade import DROP, STALL, WS_EXTENSION, check_upgrade, subprotocols
from chaosllm.wire.websocket import MAX_QUEUED, WebSocketCore

if TYPE_CHECKING:
    from chaosllm.wire.asgi import Message, Scope
    from chaosllm.wire.protocol import Connection
    from chaosllm.wire.request import Request

__all__ = ["WebSocketProtocol", "serve_websocket"]

logger = logging.getLogger("chaosllm.wire")

CLOSE_WAIT_S: Final = 1.0
"""How long a close frame sent waits for the client's before the socket is closed."""


class WebSocketProtocol(asyncio.Protocol):
    """The transport's protocol once upgraded."""

    def __init__(self, conn: Connection, core: WebSocketCore, early: bytes) -> None:
        self.conn = conn
        self.core = core
        self.early = bytearray(early)
        """Bytes that came before the app accepted (fed then)."""
        self.wakeup: asyncio.Future[None] | None = None
        self.lost = False

    def data_received(self, data: bytes) -> None:
        core = self.core
        if not core.accepted:
            self.early += data
            if len(self.early) > MAX_HEAD:
                self.conn.close()
            return
        reply = core.feed(data)
        if reply:
            self.conn.write_quietly(reply)
        if len(core.inbox) >= MAX_QUEUED:
            self.conn.flow.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.core.lost()
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.core.lost()
        self._wake()
        self.conn.connection_lost(exc)

    def pause_writing(self) -> None:
        self.conn.pause_writing()

    def resume_writing(self) -> None:
        self.conn.flow.resume_writing()

    def _wake(self) -> None:
        if self.wakeup is not None and not self.wakeup.done():
            self.wakeup.set_result(None)

    async def wait(self, timeout: float | None = None) -> None:
        self.wakeup = self.conn.loop.create_future()
        try:
            if timeout is None:
                await self.wakeup
            else:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self.wakeup), timeout)
        finally:
            self.wakeup = None


async def serve_websocket(conn: Connection, req: Request, early: bytes) -> None:
    """Answer an upgrade request with the app's ``websocket`` scope (run as the
    connection's task; the connection closes after it)."""
    server = conn.server
    problem = check_upgrade(req.headers)
    if problem is not None:
        status, message = problem
        body = error_body(
            server.error_body,
            req.path,
            status,
            message,
            "invalid_request_error",
            "bad_websocket_upgrade",
        )
        conn.write_quietly(error_response(body, status))
        return
    transport = conn.transport
    assert transport is not None
    core = WebSocketCore(req.headers)
    proto = WebSocketProtocol(conn, core, early)
    transport.set_protocol(proto)
    scope: Scope = {
        "type": "websocket",
        "asgi": ASGI_VERSION,
        "http_version": req.http_version,
        "scheme": "ws",
        "path": req.path,
        "raw_path": req.raw_path,
        "query_string": req.query,
        "root_path": "",
        "headers": req.headers,
        "client": conn.client,
        "server": conn.local,
        "subprotocols": subprotocols(req.headers),
        "state": server.lifespan_state.copy(),
        "extensions": {WS_EXTENSION: {}},
    }
    connected = False

    async def receive() -> Message:
        nonlocal connected
        if not connected:
            connected = True
            return {"type": "websocket.connect"}
        while not core.inbox:
            if proto.lost:
                return {"type": "websocket.disconnect", "code": 1006}
            await proto.wait()
        message = core.inbox.popleft()
        if len(core.inbox) < MAX_QUEUED // 2:
            conn.flow.resume_reading()
        if message["type"] == "websocket.disconnect":
            core.inbox.appendleft(message)  # every later receive says it again
        return message

    async def send(message: Message) -> None:
        kind = message["type"]
        if kind == "websocket.send":
            data = core.send(dict(message))
        elif kind == "websocket.accept":
            if core.accepted:
                raise RuntimeError("websocket.accept sent twice")
            conn.write_quietly(core.accept(dict(message)))
            data = core.feed(bytes(proto.early)) if proto.early else b""
            proto.early.clear()
        elif kind == "websocket.close":
            if not core.accepted:
                _refuse(conn, req, 403, str(message.get("reason") or "WebSocket refused"))
                core.closed = True
                return
            data = core.close(int(message.get("code", 1000)), str(message.get("reason") or ""))
        elif kind == DROP:
            core.lost()
            conn.close()
            return
        elif kind == STALL:
            core.stalled = True
            return
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r} on a WebSocket")
        if data:
            conn.write_quietly(data)
            if conn.flow.write_paused:
                await conn.flow.drain()

    going_away = False
    try:
        await server.app(scope, receive, send)
    except asyncio.CancelledError:
        going_away = True
        raise
    except Exception:
        logger.exception("Exception in ASGI application (WebSocket)")
        if not core.accepted:
            _refuse(conn, req, 500, "Internal server error")
        else:
            conn.write_quietly(core.close(1011, "internal error"))
    finally:
        if core.accepted and not core.closed:
            conn.write_quietly(core.close(1001 if going_away else 1000, ""))
        if core.accepted and not going_away:
            deadline = conn.loop.time() + CLOSE_WAIT_S
            while not (proto.lost or core.peer_closed or conn.closed):
                left = deadline - conn.loop.time()
                if left <= 0:
                    break
                await proto.wait(left)
        if not core.accepted and not core.closed and not proto.lost:
            _refuse(conn, req, 403, "WebSocket refused")


def _refuse(conn: Connection, req: Request, status: int, message: str) -> None:
    """An HTTP answer instead of the upgrade."""
    body = error_body(
        conn.server.error_body,
        req.path,
        status,
        message,
        "invalid_request_error",
        "websocket_refused",
    )
    conn.write_quietly(error_response(body, status))
