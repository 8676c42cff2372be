"""A small WebSocket client to the upstream (record and passthrough modes), on wsproto
and anyio: ``--upstream https://host`` means ``wss://host`` for sessions.

`UpstreamSocket.open` dials the upstream with the client's path, query and credentials
(``Authorization``, ``api-key``, ``x-goog-api-key``: forwarded, never recorded),
answers pings, and yields text messages; `send` and `close` go the other way."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Sequence
from typing import Final

import anyio
import anyio.abc
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.extensions import PerMessageDeflate

from chaosllm.errors import UpstreamError

__all__ = ["FORWARDED", "UpstreamSocket"]

FORWARDED: Final = ("authorization", "api-key", "x-goog-api-key", "openai-beta")
"""Client headers passed to the upstream (credentials never reach a recording)."""
_READ: Final = 65536
MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024


class UpstreamSocket:
    """One upstream WebSocket connection."""

    def __init__(self, stream: anyio.abc.ByteStream, ws: WSConnection) -> None:
        self.stream = stream
        self.ws = ws
        self.parts: list[str] = []
        self.size = 0
        self.close_code: int | None = None
        self.close_reason = ""

    @classmethod
    async def open(
        cls,
        base: str,
        path: str,
        query: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        *,
        timeout: float = 10.0,
    ) -> UpstreamSocket:
        """Connect to `base` (``http(s)://host[:port][/prefix]``) at `path`."""
        import httpx

        url = httpx.URL(base)
        tls = url.scheme == "https"
        port = url.port or (443 if tls else 80)
        host = url.host
        target = url.path.rstrip("/") + path + (("?" + query.decode("latin-1")) if query else "")
        try:
            with anyio.fail_after(timeout):
                stream: anyio.abc.ByteStream
                if tls:
                    stream = await anyio.connect_tcp(
                        host,
                        port,
                        tls=True,
                        ssl_context=ssl.create_default_context(),
                        tls_standard_compatible=False,
                    )
                else:
                    stream = await anyio.connect_tcp(host, port)
                ws = WSConnection(ConnectionType.CLIENT)
                extra = [(k, v) for k, v in headers if k.decode("latin-1").lower() in FORWARDED]
                await stream.send(
                    ws.send(
                        Request(
                            host=host if url.port is None else f"{host}:{port}",
                            target=target,
                            extra_headers=list(extra),
                            extensions=[PerMessageDeflate()],
                        )
                    )
                )
                sock = cls(stream, ws)
                while True:
                    data = await stream.receive(_READ)
                    ws.receive_data(data)
                    for event in ws.events():
                        if isinstance(event, AcceptConnection):
                            return sock
                        if isinstance(event, RejectConnection):
                            raise UpstreamError(
                                f"the upstream refused the WebSocket: {event.status_code}"
                            )
        except (OSError, anyio.EndOfStream, anyio.BrokenResourceError, TimeoutError) as exc:
            raise UpstreamError(f"cannot open the upstream WebSocket {url.host}: {exc}") from exc

    async def receive(self) -> str | None:
        """The next text message (None: the upstream closed; `close_code` says how)."""
        while True:
            for event in self.ws.events():
                if isinstance(event, (TextMessage, BytesMessage)):
                    data = (
                        event.data
                        if isinstance(event.data, str)
                        else event.data.decode("utf-8", "replace")
                    )
                    self.parts.append(data)
                    self.size += len(data)
                    if self.size > MAX_MESSAGE_BYTES:
                        await self.close(1009, "message too big")
                        return None
                    if event.message_finished:
                        text = "".join(self.parts)
                        self.parts, self.size = [], 0
                        return text
                elif isinstance(event, Ping):
                    if self.ws.state is ConnectionState.OPEN:
                        await self._send(self.ws.send(event.response()))
                elif isinstance(event, CloseConnection):
                    self.close_code, self.close_reason = event.code, event.reason or ""
                    # Echoed only when the upstream began the close: when chaosllm did
                    # (its client left meanwhile), this is the echo, and the connection
                    # is closed already.
                    if self.ws.state is ConnectionState.REMOTE_CLOSING:
                        await self._send(self.ws.send(event.response()))
                    return None
            try:
                raw = await self.stream.receive(_READ)
            except (
                anyio.EndOfStream,
                anyio.BrokenResourceError,
                anyio.ClosedResourceError,
                OSError,
            ):
                self.close_code = 1006
                return None
            self.ws.receive_data(raw)

    async def send(self, text: str) -> None:
        await self._send(self.ws.send(TextMessage(data=text)))

    async def close(self, code: int = 1000, reason: str = "") -> None:
        with contextlib.suppress(Exception):  # already closing
            await self._send(self.ws.send(CloseConnection(code=code, reason=reason or None)))
        with contextlib.suppress(Exception):
            await self.stream.aclose()

    async def _send(self, data: bytes) -> None:
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            await self.stream.send(data)
