"""The h11 server's WebSocket connections: an upgrade request answered on the
connection's anyio stream by the app's ``websocket`` scope, over the same sans-IO core
as the builtin server's (`chaosllm.wire.websocket.WebSocketCore`).

A reader task feeds the core what the socket delivers (reading stops while
`MAX_QUEUED` messages wait for the app); the app's sends are written in its own task.
Cancelled (the server stopping), the session closes with 1001."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final

import anyio

from chaosllm.wire.common import ASGI_VERSION, error_body
from chaosllm.wire.upgrade import DROP, STALL, WS_EXTENSION, check_upgrade, subprotocols
from chaosllm.wire.websocket import MAX_QUEUED, WebSocketCore

if TYPE_CHECKING:
    from chaosllm.wire.asgi import Message, Scope

__all__ = ["serve_websocket_stream"]

logger = logging.getLogger("chaosllm.wire")

CLOSE_WAIT_S: Final = 1.0


async def serve_websocket_stream(conn: Any, request: Any, path: str, early: bytes) -> None:
    """Answer an upgrade request on an h11 server connection (`conn`: its ``_Connection``:
    ``stream``, ``write``, ``close``, ``server``, ``client``, ``server_address``)."""
    server = conn.server
    headers = list(request.headers)
    raw_path, _, query = bytes(request.target).partition(b"?")
    problem = check_upgrade(headers)
    if problem is not None:
        await _refuse(conn, path, problem[0], problem[1])
        return
    core = WebSocketCore(headers)
    changed = anyio.Event()
    room = anyio.Event()
    pending = bytearray(early)

    def wake() -> None:
        nonlocal changed
        changed.set()
        changed = anyio.Event()

    async def reader() -> None:
        while not core.peer_closed:
            while len(core.inbox) >= MAX_QUEUED:
                await room.wait()
            data = await conn._recv()
            reply = core.feed(data or None)
            if reply:
                await _write(conn, reply)
            wake()
            if not data:
                return

    scope: Scope = {
        "type": "websocket",
        "asgi": ASGI_VERSION,
        "http_version": request.http_version.decode("ascii"),
        "scheme": "ws",
        "path": path,
        "raw_path": raw_path,
        "query_string": query,
        "root_path": "",
        "headers": headers,
        "client": conn.client,
        "server": conn.server_address,
        "subprotocols": subprotocols(headers),
        "state": server.lifespan_state.copy(),
        "extensions": {WS_EXTENSION: {}},
    }
    connected = False

    async with anyio.create_task_group() as tg:

        async def receive() -> Message:
            nonlocal connected, room
            if not connected:
                connected = True
                return {"type": "websocket.connect"}
            while not core.inbox:
                await changed.wait()
            message = core.inbox[0]
            if message["type"] != "websocket.disconnect":
                core.inbox.popleft()
                if len(core.inbox) < MAX_QUEUED // 2:
                    room.set()
                    room = anyio.Event()
            return message

        async def send(message: Message) -> None:
            kind = message["type"]
            if kind == "websocket.accept":
                await _write(conn, core.accept(dict(message)))
                if pending:
                    reply = core.feed(bytes(pending))
                    pending.clear()
                    if reply:
                        await _write(conn, reply)
                    wake()
                tg.start_soon(reader)
            elif kind == "websocket.send":
                await _write(conn, core.send(dict(message)))
            elif kind == "websocket.close":
                if not core.accepted:
                    core.closed = True
                    await _refuse(conn, path, 403, str(message.get("reason") or "refused"))
                    return
                await _write(
                    conn,
                    core.close(int(message.get("code", 1000)), str(message.get("reason") or "")),
                )
            elif kind == DROP:
                core.lost()
                await conn.close()
            elif kind == STALL:
                core.stalled = True
            else:
                raise RuntimeError(f"unexpected ASGI message {kind!r} on a WebSocket")

        going_away = False
        try:
            await server.app(scope, receive, send)
        except anyio.get_cancelled_exc_class():
            going_away = True
            raise
        except Exception:
            logger.exception("Exception in ASGI application (WebSocket)")
            if core.accepted:
                await _write(conn, core.close(1011, "internal error"))
            else:
                await _refuse(conn, path, 500, "Internal server error")
        finally:
            with anyio.CancelScope(shield=True):
                if core.accepted and not core.closed:
                    await _write(conn, core.close(1001 if going_away else 1000, ""))
                if not core.accepted and not core.closed:
                    await _refuse(conn, path, 403, "WebSocket refused")
                if core.accepted and not going_away:
                    with anyio.move_on_after(CLOSE_WAIT_S):
                        while not core.peer_closed and not conn.closed:
                            await changed.wait()
            tg.cancel_scope.cancel()


async def _write(conn: Any, data: bytes) -> None:
    if data and not conn.closed and not conn.gone:
        try:
            await conn.write(data)
        except Exception:  # the client has gone: _Gone
            return


async def _refuse(conn: Any, path: str, status: int, message: str) -> None:
    from chaosllm.wire.common import error_response

    body = error_body(
        conn.server.error_body, path, status, message, "invalid_request_error", "websocket_refused"
    )
    await _write(conn, error_response(body, status))
