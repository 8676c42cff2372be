"""The proxy's HTTP/1.1 client to the upstream: `h11` over `anyio`, with a keep-alive pool.

Why not httpx's `AsyncClient`: measured on this project's benchmark machine, its
connection pool (httpcore 1.x) gives ~250 requests/s at 32 concurrent requests
(~800/s at 1): each request scans every pooled connection with a readability
syscall under a lock. A proxy that must keep up with its upstream needs a few
tens of microseconds per request, so the common case -- a direct connection,
plain or TLS -- goes through this small client: one idle-connection stack per
event loop, a connection reused only if its socket shows nothing to read (a
server that closed an idle connection is noticed before the request is
sent), bytes passed on exactly as `h11` decodes the framing. When the
environment routes the upstream through an HTTP proxy (``HTTPS_PROXY``...),
`chaosllm.record.proxy.Upstream` uses httpx instead, which knows proxies.

Failures are classified for the proxy, which answers each differently:
`ConnectFailed` (nothing reached the upstream), `UpstreamTimeout`,
`ClosedBeforeAnswer` / `ResetBeforeAnswer` (the request was sent, no answer
came), and `DroppedMidAnswer` (the answer stopped before its end).
"""

from __future__ import annotations

import contextlib
import errno
import select
import socket
import ssl
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import h11

from chaosllm.errors import (
    ClosedBeforeAnswer,
    ConnectFailed,
    DroppedMidAnswer,
    ResetBeforeAnswer,
    UpstreamError,
    UpstreamTimeout,
    UpstreamTooLarge,
)

__all__ = [
    "ClosedBeforeAnswer",
    "ConnectFailed",
    "DroppedMidAnswer",
    "H11Pool",
    "ResetBeforeAnswer",
    "Timeouts",
    "UpstreamError",
    "UpstreamResponse",
    "UpstreamTimeout",
]

_READ_SIZE = 65536
_MAX_HEAD = 1024 * 1024
"""The longest answer head read (h11's bound on an incomplete event)."""


@dataclass(frozen=True)
class Timeouts:
    connect: float = 10.0
    read: float = 600.0
    """The longest silence while waiting for the answer (a model may think for minutes)."""
    write: float = 60.0


def _is_reset(exc: BaseException | None) -> bool:
    """Whether an error (or the one it wraps: anyio's BrokenResourceError) is a reset."""
    for _ in range(3):
        if exc is None:
            return False
        if isinstance(exc, ConnectionResetError) or (
            isinstance(exc, OSError) and exc.errno in (errno.ECONNRESET, errno.EPIPE)
        ):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class _Conn:
    __slots__ = ("h11", "raw", "stream")

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=_MAX_HEAD)
        raw = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
        self.raw: socket.socket | None = raw

    def reusable(self) -> bool:
        """An idle connection the server has not closed (nothing to read on it)."""
        if self.h11.our_state is not h11.IDLE or self.raw is None:
            return False
        try:
            readable, _, _ = select.select([self.raw], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await self.stream.aclose()


class UpstreamResponse:
    """An answer whose head has arrived; its body is read with `aiter_raw`."""

    def __init__(self, pool: H11Pool, conn: _Conn, response: h11.Response) -> None:
        self.status = response.status_code
        self.headers: list[tuple[bytes, bytes]] = [
            (bytes(name), bytes(value)) for name, value in response.headers.raw_items()
        ]
        self._pool = pool
        self._conn: _Conn | None = conn
        self._done = False
        self._early = b""
        self.finished = False
        """The whole body has been read (set before its last bytes are yielded)."""

    def header(self, name: str) -> str | None:
        wanted = name.lower().encode("latin-1")
        for key, value in self.headers:
            if key.lower() == wanted:
                return value.decode("latin-1")
        return None

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        """The body as it arrives (transfer coding removed, content coding kept). What
        arrived together goes on together: an SSE stream is one HTTP chunk per frame, and
        a write per frame would cost a syscall each."""
        conn = self._conn
        if conn is None:
            return
        h = conn.h11
        timeout = self._pool.timeouts.read
        pending: list[bytes] = [self._early] if self._early else []
        self._early = b""
        while True:
            try:
                event = h.next_event()
            except h11.RemoteProtocolError as exc:
                if pending:
                    yield b"".join(pending)
                await self._discard()
                raise DroppedMidAnswer(str(exc) or "the answer's framing is broken") from None
            if type(event) is h11.Data:
                pending.append(bytes(event.data))
                continue
            if pending:
                data = pending[0] if len(pending) == 1 else b"".join(pending)
                pending = []
                if type(event) is h11.EndOfMessage:
                    self._finish()
                    yield data
                    return
                yield data
            if event is h11.NEED_DATA:
                try:
                    with anyio.fail_after(timeout):
                        data = await conn.stream.receive(_READ_SIZE)
                except anyio.EndOfStream:
                    data = b""
                except TimeoutError:
                    await self._discard()
                    raise DroppedMidAnswer(f"no data for {timeout:g} s mid-answer") from None
                except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                    await self._discard()
                    what = "reset" if _is_reset(exc) else "broken"
                    raise DroppedMidAnswer(f"connection {what} mid-answer: {exc!r}") from None
                h.receive_data(data)
            elif type(event) is h11.EndOfMessage:
                self._finish()
                return
            else:  # ConnectionClosed (or anything else): the answer cannot go on
                await self._discard()
                raise DroppedMidAnswer("the upstream closed the connection mid-answer")

    def available(self) -> tuple[bytes, bool]:
        """The body bytes that have already arrived (no waiting), and whether they are
        the whole body."""
        conn = self._conn
        if conn is None:
            return b"", self.finished
        parts: list[bytes] = []
        while True:
            try:
                event = conn.h11.next_event()
            except h11.RemoteProtocolError:
                break  # aiter_raw reports it (h11 stays in its error state)
            if type(event) is h11.Data:
                parts.append(bytes(event.data))
                continue
            if type(event) is h11.EndOfMessage:
                self._finish()
                return b"".join(parts), True
            break  # NEED_DATA (or ConnectionClosed, which aiter_raw reports)
        if parts:
            self._early = b"".join(parts)
        return self._early, False

    def _finish(self) -> None:
        self._done = self.finished = True
        self._release()

    def _release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if conn.h11.our_state is h11.DONE and conn.h11.their_state is h11.DONE:
            try:
                conn.h11.start_next_cycle()
            except h11.LocalProtocolError:
                self._pool.dispose(conn)
                return
            self._pool.put(conn)
        else:
            self._pool.dispose(conn)

    async def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.aclose()

    async def aclose(self) -> None:
        """Done with the answer: an unfinished one closes its connection (which is how
        the upstream learns that the request was cancelled)."""
        if not self._done:
            await self._discard()


class H11Pool:
    """Keep-alive connections to one origin (scheme, host, port) for one event loop."""

    def __init__(
        self,
        scheme: str,
        host: str,
        port: int,
        *,
        timeouts: Timeouts,
        ssl_context: ssl.SSLContext | None = None,
        max_idle: int = 256,
    ) -> None:
        self.scheme = scheme
        self.host = host
        self.port = port
        self.timeouts = timeouts
        self.ssl_context = ssl_context
        self.max_idle = max_idle
        self._idle: list[_Conn] = []
        self._closing: list[_Conn] = []
        self.closed = False

    def put(self, conn: _Conn) -> None:
        if self.closed or len(self._idle) >= self.max_idle:
            self.dispose(conn)
        else:
            self._idle.append(conn)

    def dispose(self, conn: _Conn) -> None:
        """Close a connection later (from a sync context): `aclose` reaps it."""
        self._closing.append(conn)

    async def _reap(self) -> None:
        while self._closing:
            await self._closing.pop().aclose()

    async def _connect(self) -> _Conn:
        tls = self.scheme == "https"
        try:
            with anyio.fail_after(self.timeouts.connect):
                stream: anyio.abc.ByteStream
                if tls:
                    stream = await anyio.connect_tcp(
                        self.host,
                        self.port,
                        tls=True,
                        ssl_context=self.ssl_context,
                        tls_hostname=self.host,
                        tls_standard_compatible=False,
                    )
                else:
                    stream = await anyio.connect_tcp(self.host, self.port)
        except TimeoutError:
            raise UpstreamTimeout(
                f"connecting took longer than {self.timeouts.connect:g} s"
            ) from None
        except (OSError, ssl.SSLError, anyio.BrokenResourceError) as exc:
            raise ConnectFailed(str(exc) or type(exc).__name__) from None
        return _Conn(stream)

    async def send(
        self, method: str, target: bytes, headers: Sequence[tuple[bytes, bytes]], body: bytes
    ) -> UpstreamResponse:
        """Send a request; the response once its head has arrived."""
        if self._closing:
            await self._reap()
        conn = None
        while self._idle:
            candidate = self._idle.pop()
            if candidate.reusable():
                conn = candidate
                break
            await candidate.aclose()
        if conn is None:
            conn = await self._connect()
        try:
            return await self._exchange(conn, method, target, headers, body)
        except BaseException:
            await conn.aclose()
            raise

    async def _exchange(
        self,
        conn: _Conn,
        method: str,
        target: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
    ) -> UpstreamResponse:
        h = conn.h11
        head = list(headers)
        head.append((b"content-length", b"%d" % len(body)))
        try:
            data = h.send(h11.Request(method=method, target=target, headers=head))
            assert data is not None
            data += h.send(h11.Data(data=body)) or b"" if body else b""
            data += h.send(h11.EndOfMessage()) or b""
        except h11.LocalProtocolError as exc:
            raise ConnectFailed(f"cannot send this request: {exc}") from None
        try:
            with anyio.fail_after(self.timeouts.write):
                await conn.stream.send(data)
        except TimeoutError:
            raise UpstreamTimeout(f"sending took longer than {self.timeouts.write:g} s") from None
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            # The upstream went away while we wrote: it may still have answered (an early
            # error answer), so read what there is.
            if not _is_reset(exc):
                raise ClosedBeforeAnswer(f"the connection broke while sending: {exc}") from None
        got_bytes = False
        while True:
            try:
                event = h.next_event()
                if event is h11.NEED_DATA:
                    with anyio.fail_after(self.timeouts.read):
                        data = await conn.stream.receive(_READ_SIZE)
                    got_bytes = True
                    h.receive_data(data)
                    continue
            except anyio.EndOfStream:
                if not got_bytes:
                    raise ClosedBeforeAnswer(
                        "Server disconnected without sending a response."
                    ) from None
                h.receive_data(b"")
                continue
            except TimeoutError:
                raise UpstreamTimeout(f"no answer within {self.timeouts.read:g} s") from None
            except h11.RemoteProtocolError as exc:
                if exc.error_status_hint == 431:
                    raise UpstreamTooLarge(
                        f"an answer head over {_MAX_HEAD} bytes ({exc})"
                    ) from None
                raise ClosedBeforeAnswer(f"the answer is not HTTP: {exc}") from None
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                if _is_reset(exc):
                    raise ResetBeforeAnswer(f"connection reset: {exc}") from None
                raise ClosedBeforeAnswer(str(exc)) from None
            if type(event) is h11.Response:
                return UpstreamResponse(self, conn, event)
            if type(event) is h11.ConnectionClosed:
                raise ClosedBeforeAnswer("Server disconnected without sending a response.")
            # h11.InformationalResponse (100 Continue...): keep reading.

    async def aclose(self) -> None:
        self.closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.aclose()
        await self._reap()


def default_ssl_context() -> ssl.SSLContext:
    """Verified TLS with httpx's trust settings (certifi, or SSL_CERT_FILE/SSL_CERT_DIR)."""
    import httpx

    context: Any = httpx.create_ssl_context()
    with contextlib.suppress(NotImplementedError, ssl.SSLError):
        context.set_alpn_protocols(["http/1.1"])
    assert isinstance(context, ssl.SSLContext)
    return context
