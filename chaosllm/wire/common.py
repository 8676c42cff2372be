"""What chaosllm's two HTTP/1.1 servers share: the fast-path hook (`Direct`), the error
envelope hook, the ASGI lifespan driver, the listening
sockets (dual-stack for ``::``), the open-file limit, and small HTTP helpers.

`chaosllm.wire.server.WireServer` (asyncio protocols + httptools, the default) and
`chaosllm.wire.h11_server.H11WireServer` (h11 + anyio streams, the pure-Python
fallback) import from here; nothing here does I/O on a connection.
"""

from __future__ import annotations

import abc
import contextlib
import importlib.util
import ipaddress
import json
import logging
import socket
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, Protocol
from urllib.parse import unquote

import anyio
import anyio.abc
import anyio.from_thread

from chaosllm.core.memo import Memo
from chaosllm.core.report import PlanReport
from chaosllm.errors import ServerError
from chaosllm.model import ResponsePlan
from chaosllm.wire.asgi import PLAN_EXTENSION, ASGIApp, Message
from chaosllm.wire.head import PHRASES, http_date

__all__ = [
    "CONTROL_PREFIX",
    "Cycle",
    "Direct",
    "ErrorBody",
    "ServerCore",
    "backend_options",
    "bind_sockets",
    "raise_nofile_limit",
]

logger = logging.getLogger("chaosllm.wire")

ASGI_VERSION: Final = {"version": "3.0", "spec_version": "2.3"}
MAX_STASH: Final = 1024 * 1024
"""Pipelined bytes buffered while a response is in flight before reading stops."""
MAX_HEAD: Final = 64 * 1024
"""The largest request head (request line and headers) accepted: 431 beyond. (h11 refuses
an incomplete head past 16 KiB, which lets a head that comes in one 64 KiB read through.)"""
LINGER_S: Final = 1.0
"""How long a refused upload is drained so that the client can read the refusal."""
FD_HEADROOM: Final = 256
"""Open files kept for everything but client connections (recordings, logs, upstreams)."""
RESERVE: Final = 64
"""Connections accepted beyond the limit when no idle one can be closed: they are served
only on the control plane and ``/health`` (a 503 elsewhere), so a full server can still
be inspected and disarmed."""
CONTROL_PREFIX: Final = "/__"
HEALTH_PATH: Final = "/health"
VERSIONS: Final = ("1.1", "1.0")

ErrorBody = Callable[[str, int, str, str], "Mapping[str, Any] | None"]
"""How the protocol served on a path words an error the server answers on its own (a 400,
408, 413 or 500): ``(path, status, message, code)`` -> the JSON body, or None for the
default envelope (OpenAI's shape). `chaosllm.providers.error_body_for_path` is one."""


class Direct(Protocol):
    """The fast path: ``direct(method, path, query, headers, body, kept)`` -> a plan for
    the request (and the report the server fills while executing it), or None to run the
    ASGI app. `path` is percent-decoded and `headers` are as received with names in lower
    case, as in the ASGI scope. `kept`, when given, is the request's object: what the
    fast path makes of the request may be kept on its ``derived`` attribute, and is
    found there when the same object comes again (`chaosllm.wire.reader` reads repeated
    bytes as the same object). Called on the event loop: it must not block.
    `chaosllm.http.direct.DirectHandler` is one."""

    def __call__(
        self,
        method: str,
        path: str,
        query: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        kept: Any = None,
        /,
    ) -> tuple[ResponsePlan, PlanReport] | None: ...


def error_body(
    hook: ErrorBody | None,
    path: str | None,
    status: int,
    message: str,
    type_: str,
    code: str,
) -> bytes:
    body = hook(path, status, message, code) if hook is not None and path is not None else None
    if body is None:
        body = {"error": {"message": message, "type": type_, "code": code}}
    return json.dumps(body).encode()


def error_response(body: bytes, status: int) -> bytes:
    """A complete JSON error response that closes the connection."""
    return (
        b"HTTP/1.1 %d %s\r\ndate: %s\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%s"
        % (status, PHRASES.get(status, b""), http_date(), len(body), body)
    )


def path_of(target: bytes) -> tuple[bytes, bytes, str]:
    """A request target's raw path, query and (percent-decoded) path; an absolute-form
    target (``http://host/v1/...``, RFC 9112 section 3.2.2) is answered as its path."""
    if target[:1] != b"/" and target[:4].lower() == b"http":
        target = _origin_form(target)
    raw_path, _, query = target.partition(b"?")
    path = raw_path.decode("latin-1")
    return raw_path, query, unquote(path) if "%" in path else path


def _origin_form(target: bytes) -> bytes:
    """The path and query of an absolute-form target (``/`` when it has no path)."""
    scheme, sep, rest = target.partition(b"://")
    if not sep or scheme.lower() not in (b"http", b"https"):
        return target
    cut = len(rest)
    for mark in (b"/", b"?"):
        at = rest.find(mark)
        if 0 <= at < cut:
            cut = at
    tail = rest[cut:]
    return tail if tail.startswith(b"/") else b"/" + tail


def address(value: object) -> tuple[str, int] | None:
    """``(host, port)`` of a socket address; an IPv4-mapped IPv6 address (a client of a
    dual-stack socket) is given as the IPv4 address it maps."""
    if isinstance(value, tuple) and len(value) >= 2:
        host = str(value[0])
        if host.startswith("::ffff:"):
            with contextlib.suppress(ValueError):
                mapped = ipaddress.IPv6Address(host).ipv4_mapped
                if mapped is not None:
                    host = str(mapped)
        return (host, int(value[1]))
    return None


def version_refusal(version: str) -> str | None:
    """Why a request of HTTP `version` is refused (505), or None for 1.0 and 1.1."""
    if version in VERSIONS:
        return None
    return f"HTTP/{version} is not supported: chaosllm speaks HTTP/1.1 and HTTP/1.0"


BOTH_FRAMINGS: Final = (
    "Malformed HTTP request: both Content-Length and Transfer-Encoding "
    "(refused, RFC 9112 section 6.1)"
)


def body_deadline(start: float, received: int, timeout_s: float, min_rate: float) -> float:
    """When a request body that started arriving at `start` must be complete: a grace of
    `timeout_s`, plus one second per `min_rate` bytes received so far."""
    return start + timeout_s + (received / min_rate if min_rate > 0 else float("inf"))


def is_control(path: str) -> bool:
    """The control plane and the health check: served even when the server is full."""
    return path.startswith(CONTROL_PREFIX) or path == HEALTH_PATH


def backend_options(backend: str = "asyncio") -> dict[str, Any]:
    """anyio's options for running `backend`: uvloop for asyncio where it is installed."""
    if backend != "asyncio" or sys.platform == "win32":
        return {}
    if importlib.util.find_spec("uvloop") is None:
        return {}
    return {"use_uvloop": True}


def raise_nofile_limit(wanted: int) -> int:
    """Raise the soft RLIMIT_NOFILE toward `wanted` (never above the hard limit); the soft
    limit now in force (`wanted` where the platform has no such limit)."""
    if sys.platform == "win32":  # pragma: no cover - no RLIMIT_NOFILE there
        return wanted
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return wanted if soft == resource.RLIM_INFINITY else soft
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            logger.debug("cannot raise RLIMIT_NOFILE to %d: %s", target, exc)
        else:
            soft = target
    return soft


def connection_cap(max_connections: int) -> int:
    """The connection limit in force: `max_connections`, lowered (with a warning) when the
    open-file limit cannot be raised far enough for it."""
    wanted = max_connections + RESERVE + FD_HEADROOM
    limit = raise_nofile_limit(wanted)
    if limit >= wanted:
        return max_connections
    cap = max(1, limit - RESERVE - FD_HEADROOM)
    logger.warning(
        "the open-file limit (ulimit -n) is %d: serving at most %d connections instead of "
        "--max-connections %d; raise the limit to serve more",
        limit,
        cap,
        max_connections,
    )
    return cap


def bind_sockets(
    host: str, port: int, backlog: int = 2048, receive_buffer: int | None = None
) -> list[socket.socket]:
    """Listening TCP sockets for `host`: one per address it resolves to (all on the same
    port when `port` is 0), the wildcard ``::`` as one dual-stack socket (IPv4 clients
    connect too). OSError when an address cannot be bound. `receive_buffer`, when given,
    is every accepted socket's SO_RCVBUF from its first byte (set before ``listen``:
    what a client sends before its connection is accepted is bounded by it too)."""
    flags = socket.AI_PASSIVE
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=flags)
    seen: set[tuple[int, str]] = set()
    sockets: list[socket.socket] = []
    dual = False
    try:
        for family, _, _, _, sockaddr in infos:
            key = (int(family), str(sockaddr[0]))
            if key in seen or family not in (socket.AF_INET, socket.AF_INET6):
                continue
            if dual and family == socket.AF_INET:
                continue  # the dual-stack socket already takes IPv4 clients
            seen.add(key)
            # proto must say TCP: asyncio sets TCP_NODELAY only on accepted sockets whose
            # proto is IPPROTO_TCP (without it, ~40 ms delayed ACKs).
            sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
            sockets.append(sock)
            if sys.platform != "win32":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                wildcard = ipaddress.ip_address(str(sockaddr[0]).split("%")[0]).is_unspecified
                has_v4 = any(s.family == socket.AF_INET for s in sockets)
                v6only = 0 if wildcard and not has_v4 else 1
                with contextlib.suppress(OSError, AttributeError):
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, v6only)
                dual = dual or v6only == 0
            bound_port = sockets[0].getsockname()[1] if len(sockets) > 1 else port
            sock.bind((sockaddr[0], bound_port, *sockaddr[2:]))
            if receive_buffer is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    if not sockets:
        raise OSError(f"no IPv4 or IPv6 address for {host!r}")
    return sockets


class Lifespan:
    """Drives the ASGI lifespan protocol; tolerates apps that do not support it."""

    def __init__(self, app: ASGIApp, state: dict[str, Any]) -> None:
        self.app = app
        self.state = state
        self.started = anyio.Event()
        self.shutdown_requested = anyio.Event()
        self.finished = anyio.Event()
        self.failed: str | None = None
        self.supported = True
        self._asked_startup = False

    async def run(self) -> None:
        scope = {"type": "lifespan", "asgi": dict(ASGI_VERSION), "state": self.state}
        try:
            await self.app(scope, self._receive, self._send)
        except Exception as exc:
            if not self.started.is_set():
                self.supported = False
                logger.debug("the ASGI app does not support lifespan: %r", exc)
            else:
                logger.exception("ASGI lifespan failed")
        finally:
            self.started.set()
            self.finished.set()

    async def _receive(self) -> Message:
        if not self._asked_startup:
            self._asked_startup = True
            return {"type": "lifespan.startup"}
        await self.shutdown_requested.wait()
        return {"type": "lifespan.shutdown"}

    async def _send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "lifespan.startup.complete":
            self.started.set()
        elif kind == "lifespan.startup.failed":
            self.failed = str(message.get("message", ""))
            self.started.set()
        elif kind == "lifespan.shutdown.complete":
            self.finished.set()
        elif kind == "lifespan.shutdown.failed":
            logger.error("ASGI lifespan shutdown failed: %s", message.get("message", ""))
            self.finished.set()


class ServerCore(abc.ABC):
    """What both servers are besides their parsers and loops: their settings, the ASGI
    lifespan around the listening sockets, the bound URL, the shutdown that waits, and
    serving from a background thread. A server implements `serve` (which calls
    `_serve_app`), `_serve_sockets` and `_shutdown_in_loop`."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body_bytes: int = 16 * 1024 * 1024,
        header_timeout_s: float = 10.0,
        keepalive_timeout_s: float = 75.0,
        max_connections: int = 10_000,
        graceful_timeout_s: float = 5.0,
        error_body: ErrorBody | None = None,
        body_timeout_s: float = 10.0,
        body_min_rate: float = 32 * 1024,
        direct: Direct | None = None,
        memo: Memo | None = None,
        ssl: Any = None,
    ) -> None:
        self.app = app
        self.ssl = ssl
        """The TLS context (`ssl.SSLContext`; `chaosllm.wire.tls`) sockets are wrapped in."""
        self.error_body = error_body
        """The error envelope by request path (see `ErrorBody`); None: OpenAI's always."""
        self.direct = direct
        """The fast path (see `Direct`): a plan for a request without the ASGI app."""
        self.memo = memo
        """Where what a read parsed to is kept for the same bytes (the engine's memo, as a
        pure entry); None: every read is parsed."""
        self.host = host
        self.port = port
        self.max_body_bytes = max_body_bytes
        self.header_timeout_s = header_timeout_s
        self.keepalive_timeout_s = keepalive_timeout_s
        self.max_connections = max_connections
        self.graceful_timeout_s = graceful_timeout_s
        self.body_timeout_s = body_timeout_s
        self.body_min_rate = body_min_rate
        self.bound: tuple[str, int] | None = None
        """The address actually listened on, once `serve` has started."""
        self.shutting_down = False
        self.lifespan_state: dict[str, Any] = {}
        """The ASGI lifespan's state, copied into every request's scope."""
        self._loop_thread: int | None = None
        self._stop: anyio.Event | None = None
        self._stopped: anyio.Event | None = None
        self._drained: anyio.Event | None = None
        self._init_state()

    @abc.abstractmethod
    def _init_state(self) -> None:
        """The server's own state (its connections), set up by `__init__`."""

    @property
    def url(self) -> str:
        """``http://host:port`` of the bound socket (only once started)."""
        if self.bound is None:
            raise ServerError("the server is not listening")
        host, port = self.bound
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{port}"

    @abc.abstractmethod
    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[tuple[str, int]] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until `request_shutdown`; ``task_status.started((host, port))`` once bound."""

    @abc.abstractmethod
    async def _serve_sockets(self, task_status: anyio.abc.TaskStatus[tuple[str, int]]) -> None:
        """Listen and serve connections until asked to stop."""

    @abc.abstractmethod
    def _shutdown_in_loop(self) -> None:
        """Stop accepting and wind the connections down (from the loop's thread)."""

    async def _serve_app(self, task_status: anyio.abc.TaskStatus[tuple[str, int]]) -> str | None:
        """Lifespan around the sockets; returns why the server could not run, if so."""
        failure: str | None = None
        async with anyio.create_task_group() as tg:
            lifespan = Lifespan(self.app, self.lifespan_state)
            tg.start_soon(lifespan.run)
            await lifespan.started.wait()
            if lifespan.failed is not None:
                failure = f"ASGI lifespan startup failed: {lifespan.failed}"
            else:
                try:
                    await self._serve_sockets(task_status)
                except OSError as exc:
                    failure = f"cannot listen on {self.host}:{self.port}: {exc}"
                finally:
                    if lifespan.supported:
                        lifespan.shutdown_requested.set()
                        with anyio.move_on_after(self.graceful_timeout_s, shield=True):
                            await lifespan.finished.wait()
            tg.cancel_scope.cancel()
        return failure

    async def shutdown(self) -> None:
        """Request shutdown and wait until `serve` has returned (from the loop's thread)."""
        self._shutdown_in_loop()
        if self._stopped is not None:
            await self._stopped.wait()

    def thread_options(self, backend: str) -> dict[str, Any] | None:
        """anyio's backend options for `run_in_thread` when none are given (the
        backend's defaults)."""
        return None

    @contextlib.contextmanager
    def run_in_thread(
        self,
        *,
        backend: str = "asyncio",
        timeout_s: float = 30.0,
        options: dict[str, Any] | None = None,
    ) -> Iterator[tuple[str, int]]:
        """Serve in a background thread (its own event loop, with `options`, default
        `thread_options`); yields ``(host, port)``.

        On exit the server is shut down and the thread joined (errors re-raised).
        """
        chosen = self.thread_options(backend) if options is None else options
        with anyio.from_thread.start_blocking_portal(backend, chosen) as portal:
            future, bound = portal.start_task(self.serve)
            try:
                yield bound
            finally:
                portal.call(self._shutdown_in_loop)
                future.result(timeout=timeout_s)


class Cycle:
    """One request/response cycle of the ASGI app on either server: the ``receive`` and
    ``send`` it is given, and the ASGI rules both enforce (one ``http.response.start``,
    the body after it and nothing after the last part, a plan instead of a start). A
    server says how its request body is read and how a head, a body part and a plan go
    on its wire (the methods below that raise `NotImplementedError`)."""

    __slots__ = ("body_sent", "committed", "complete", "head_sent", "headers", "started", "status")

    def __init__(self) -> None:
        self.body_sent = False
        self.started = False
        self.committed = False
        """Something of the response went (or was handed) to the wire: too late for a 500."""
        self.head_sent = False
        self.complete = False
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []

    # -- what each server provides ---------------------------------------------------

    def request_body(self) -> bytes:
        raise NotImplementedError

    async def wait_gone(self) -> None:
        """Until the client has left."""
        raise NotImplementedError

    async def stream_head(self) -> None:
        """Write the head of an answer without a Content-Length (a stream) now."""
        raise NotImplementedError

    async def body_part(self, body: bytes, more: bool) -> None:
        """Write a part of the body (with the head, when it has not gone yet)."""
        raise NotImplementedError

    async def run_plan(self, plan: ResponsePlan, report: PlanReport) -> None:
        """Execute `plan` on the wire, filling `report`."""
        raise NotImplementedError

    # -- ASGI --------------------------------------------------------------------------

    async def receive(self) -> Message:
        if not self.body_sent:
            self.body_sent = True
            return {"type": "http.request", "body": self.request_body(), "more_body": False}
        if not self.complete:
            await self.wait_gone()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.body":
            if not self.started:
                raise RuntimeError("http.response.body sent before http.response.start")
            if self.complete:
                raise RuntimeError("http.response.body sent after the response completed")
            more = bool(message.get("more_body", False))
            if not more:
                self.complete = True
            self.committed = True
            await self.body_part(message.get("body", b""), more)
        elif kind == "http.response.start":
            if self.started:
                raise RuntimeError("http.response.start sent twice")
            self.started = True
            self.status = int(message["status"])
            self.headers = headers = list(message.get("headers", ()))
            for name, _ in headers:
                if name.lower() == b"content-length":
                    # A complete body follows at once: head and body in one write.
                    return
            # A stream: the head goes out now, as the client may time it.
            self.committed = self.head_sent = True
            await self.stream_head()
        elif kind == PLAN_EXTENSION:
            if self.started:
                raise RuntimeError("chaosllm.plan sent after http.response.start")
            self.started = self.committed = True
            try:
                await self.run_plan(message["plan"], message["report"])
            finally:
                self.complete = True
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
