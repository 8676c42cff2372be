"""WebSocket, sans-IO: an upgraded HTTP request as an ASGI ``websocket`` connection.

Theory of operation
-------------------
`WebSocketCore` holds one connection's protocol state and does no I/O, as h11 does for
HTTP: the servers (the builtin asyncio one, `chaosllm.wire.ws_protocol`; the h11 one)
feed it the bytes they read and write the bytes it returns. It speaks wsproto's frame
layer (`wsproto.connection.Connection`) once the handshake, which the HTTP parser of the
server has already read, is answered here:

- `check_upgrade` says what is wrong with an upgrade request (400, 426 for a version
  other than 13) before the app is asked;
- the app's ``websocket.accept`` becomes the 101 response (``Sec-WebSocket-Accept``,
  the subprotocol, permessage-deflate when the client offered it, as wsproto negotiates
  it); a ``websocket.close`` before it a 403 (ASGI);
- `feed` turns frames into ``websocket.receive`` messages for the app, answers pings
  (unless the app stalls the session: `STALL`), answers the client's close, and closes
  with 1009 a message over `max_message_bytes` and with wsproto's code (1002, 1007) a
  protocol error;
- `send` turns ``websocket.send`` / ``websocket.close`` into frames; `DROP` (a message
  of chaosllm's own server, the scope extension `WS_EXTENSION`) asks the server to end
  the TCP connection with no close frame.

Bounded: a message is at most `max_message_bytes` (fragments and inflated
permessage-deflate data counted as they arrive: compressed input is fed in
`_DEFLATE_SLICE` pieces, so that one read never inflates past a few MiB); the server
stops reading while `MAX_QUEUED` messages wait for the app.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
from collections import deque
from typing import Any, Final

from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage
from wsproto.extensions import Extension, PerMessageDeflate
from wsproto.frame_protocol import CloseReason
from wsproto.handshake import server_extensions_handshake
from wsproto.utilities import LocalProtocolError

__all__ = ["MAX_MESSAGE_BYTES", "MAX_QUEUED", "WebSocketCore"]

MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
"""The largest message a client may send (OpenAI's own limit is 15 MiB of audio)."""
MAX_QUEUED: Final = 64
"""Messages waiting for the app before the server stops reading."""
_DEFLATE_SLICE: Final = 4096
_GUID: Final = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def _offers(headers: list[tuple[bytes, bytes]]) -> list[str]:
    return [
        offer.strip()
        for name, value in headers
        if name == b"sec-websocket-extensions"
        for offer in value.decode("latin-1").split(",")
        if offer.strip()
    ]


class WebSocketCore:
    """One upgraded connection's WebSocket state: ASGI messages in and out, bytes in and
    out, no I/O."""

    def __init__(
        self, headers: list[tuple[bytes, bytes]], *, max_message_bytes: int = MAX_MESSAGE_BYTES
    ) -> None:
        self.headers = headers
        self.max_message_bytes = max_message_bytes
        self.accepted = False
        self.closed = False
        """A close frame was sent (or the connection ended): nothing more is sent."""
        self.peer_closed = False
        self.stalled = False
        self.close_code: int | None = None
        self.inbox: deque[dict[str, Any]] = deque()
        """Messages for the app's ``receive`` (``websocket.receive``/``disconnect``)."""
        self._ws: Connection | None = None
        self._deflate = False
        self._parts: list[Any] = []
        self._size = 0

    # -- handshake ----------------------------------------------------------------------

    def accept(self, message: dict[str, Any]) -> bytes:
        """The 101 response to the app's ``websocket.accept``."""
        found = {name: value for name, value in self.headers}
        key = found.get(b"sec-websocket-key", b"").strip()
        token = base64.b64encode(hashlib.sha1(key + _GUID).digest())
        lines = [
            b"HTTP/1.1 101 Switching Protocols",
            b"Upgrade: websocket",
            b"Connection: Upgrade",
            b"Sec-WebSocket-Accept: " + token,
        ]
        extensions: list[Extension] = []
        pmd = PerMessageDeflate()
        agreed = server_extensions_handshake(_offers(self.headers), [pmd])
        if agreed is not None:
            lines.append(b"Sec-WebSocket-Extensions: " + agreed)
            extensions.append(pmd)
            self._deflate = True
        subprotocol = message.get("subprotocol")
        if subprotocol:
            lines.append(b"Sec-WebSocket-Protocol: " + str(subprotocol).encode("latin-1"))
        for name, value in message.get("headers") or ():
            lines.append(bytes(name) + b": " + bytes(value))
        self._ws = Connection(ConnectionType.SERVER, extensions=extensions)
        self.accepted = True
        return b"\r\n".join(lines) + b"\r\n\r\n"

    # -- inbound ------------------------------------------------------------------------

    def feed(self, data: bytes | None) -> bytes:
        """Take bytes read from the client (None: it ended the connection); queue what the
        app receives in `inbox`; the bytes to write back (pongs, the close handshake)."""
        ws = self._ws
        if ws is None or self.peer_closed:
            return b""
        if data is None or not self._deflate or len(data) <= _DEFLATE_SLICE:
            return self._feed(ws, data)
        out = []
        for start in range(0, len(data), _DEFLATE_SLICE):
            out.append(self._feed(ws, data[start : start + _DEFLATE_SLICE]))
            if self.peer_closed or self.closed:
                break
        return b"".join(out)

    def _feed(self, ws: Connection, data: bytes | None) -> bytes:
        out: list[bytes] = []
        if ws.state is ConnectionState.CLOSED:
            return b""
        ws.receive_data(data)
        for event in ws.events():
            if isinstance(event, (TextMessage, BytesMessage)):
                self._size += len(event.data)
                if self._size > self.max_message_bytes:
                    out.append(
                        self.close(
                            CloseReason.MESSAGE_TOO_BIG,
                            f"message over {self.max_message_bytes} bytes",
                        )
                    )
                    self._disconnect(CloseReason.MESSAGE_TOO_BIG)
                    break
                self._parts.append(event.data)
                if event.message_finished:
                    self._deliver(isinstance(event, TextMessage))
            elif isinstance(event, Ping):
                if not self.stalled and not self.closed:
                    out.append(ws.send(event.response()))
            elif isinstance(event, CloseConnection):
                self.peer_closed = True
                if not self.closed and _state(ws) is not ConnectionState.CLOSED:
                    # wsproto's code for a protocol error it found (1002, 1007), or the
                    # peer's close echoed.
                    self.closed = True
                    self.close_code = event.code
                    with contextlib.suppress(LocalProtocolError):  # the state moved on
                        out.append(ws.send(event.response()))
                self._disconnect(event.code)
                break
        return b"".join(out)

    def _deliver(self, text: bool) -> None:
        parts = self._parts
        self._parts = []
        self._size = 0
        if text:
            self.inbox.append({"type": "websocket.receive", "text": "".join(parts)})
        else:
            self.inbox.append({"type": "websocket.receive", "bytes": b"".join(parts)})

    def _disconnect(self, code: int) -> None:
        self.peer_closed = True
        self.inbox.append({"type": "websocket.disconnect", "code": int(code)})

    def lost(self) -> None:
        """The connection ended (no close frame): the app's next receive says 1006."""
        if not self.peer_closed:
            self._disconnect(CloseReason.ABNORMAL_CLOSURE)
        self.closed = True

    # -- outbound -----------------------------------------------------------------------

    def send(self, message: dict[str, Any]) -> bytes:
        """The frames of the app's ``websocket.send``."""
        ws = self._ws
        if ws is None or self.closed or ws.state is not ConnectionState.OPEN:
            return b""
        text = message.get("text")
        if text is not None:
            return ws.send(TextMessage(data=str(text)))
        data = message.get("bytes")
        if data is not None:
            return ws.send(BytesMessage(data=bytes(data)))
        return b""

    def close(self, code: int = 1000, reason: str = "") -> bytes:
        """The close frame (once); the server then waits a moment for the client's."""
        ws = self._ws
        if ws is None or self.closed or ws.state is not ConnectionState.OPEN:
            self.closed = True
            return b""
        self.closed = True
        self.close_code = code
        # A close reason is at most 123 bytes of UTF-8 (RFC 6455 section 5.5).
        cut = reason.encode("utf-8")[:123].decode("utf-8", "ignore")
        return ws.send(CloseConnection(code=code, reason=cut or None))


def _state(ws: Connection) -> ConnectionState:
    """The connection's state, read again (it moves as events are taken)."""
    return ws.state
