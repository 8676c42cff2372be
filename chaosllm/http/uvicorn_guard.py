"""``--server uvicorn`` with the guarantees of chaosllm's own server.

uvicorn on its own reads a request head or body for as long as the client cares to
send it (a slowloris holds a connection forever), waits forever at shutdown for a
response that stalls, and, on the plain asyncio loop, logs thousands of tracebacks a
second once the open-file limit is reached (asyncio's accept loop retries every
pending connection and logs each failure). Here, mirroring `chaosllm.wire.server`:

- **Read deadlines** (`guarded_protocol`, a subclass of uvicorn's HTTP protocol): the
  first request's head must arrive within `HEADER_TIMEOUT_S` of the accept and a later
  one within `HEADER_TIMEOUT_S` of its first byte (408 for a partial head, a plain close
  for no byte at all); a body that pauses for `HEADER_TIMEOUT_S`, or arrives slower than
  `BODY_MIN_RATE` bytes a second once `BODY_TIMEOUT_S` has passed, gets 408 (or, when
  the response has started, a close). uvicorn's own keep-alive timeout closes idle
  connections between requests. A head over `MAX_HEAD` bytes gets 431. Errors uvicorn
  answers on its own (malformed HTTP) are JSON envelopes too. A chunked body's trailer
  fields are dropped, never merged into the request's headers.
- **Pipelined requests bounded** (`guarded_protocol`): a read is parsed in slices while
  the requests queued behind a response in flight hold less than the builtin server's
  bound (`chaosllm.wire.flow.stash_full`); the rest waits unparsed, reading paused,
  until a response completes. (uvicorn parses every read whole and resumes reading
  after each response, so a client that pipelines and never reads held megabytes.)
- **Connections** (``--max-connections``): the open-file soft limit is raised toward
  what the limit needs (the limit is lowered, with a warning, when it cannot be); when
  full, the oldest idle connection (waiting for a request, nothing of it received) is
  closed for a new one; with none idle, up to `RESERVE` more are accepted and served
  only on the control plane and ``/health`` (503 elsewhere), so a full server can still
  be inspected and disarmed; beyond those a new connection is closed at once.
- **Shutdown**: in-flight responses get `GRACEFUL_TIMEOUT_S`, then they are cancelled
  (``timeout_graceful_shutdown``): a stall does not hold SIGTERM.
- **The open-file limit**: accept failures are logged once per `ACCEPT_LOG_INTERVAL_S`
  with a count (`guarded_server`), not once per attempt.
- **Accepting** (`guarded_server`): the builtin server's acceptor
  (`chaosllm.wire.accept`) takes every waiting connection a turn of the loop, instead
  of uvloop's server, which takes one, and which a flood of busy connections starves.
- **Turns** (`chaosllm.wire.flow.Turns`, the builtin server's): a connection that was
  answered before parses what it reads only in its turn (held, reading paused,
  meanwhile), so between two looks at the sockets at most `ANSWERS_A_TURN` of them start
  a request; a new connection's first request is parsed as it is read. Without, a flood
  of 2,000 busy keep-alive connections put every fresh request behind a round of theirs
  (a second and more).

The body size limit (``--max-body-bytes``) is the ASGI middleware
`chaosllm.http.guards.BodyLimit`, in the app under every server. uvicorn is imported
only when one of these is called.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from collections import deque
from email.utils import formatdate
from typing import Any, Final

from chaosllm.http.web import error_response
from chaosllm.providers import error_body_for_path
from chaosllm.providers.base import ErrorKind
from chaosllm.wire.accept import Acceptor
from chaosllm.wire.common import RESERVE, connection_cap
from chaosllm.wire.flow import STASH_BYTES, Turns, held, stash_full

__all__ = [
    "ACCEPT_LOG_INTERVAL_S",
    "BODY_MIN_RATE",
    "BODY_TIMEOUT_S",
    "GRACEFUL_TIMEOUT_S",
    "HEADER_TIMEOUT_S",
    "MAX_HEAD",
    "RESERVE",
    "guarded_protocol",
    "guarded_server",
]

log = logging.getLogger("chaosllm")

HEADER_TIMEOUT_S = 10.0
"""Longest wait for a request head (and longest pause inside a body)."""
BODY_TIMEOUT_S = 10.0
"""Grace before a body must keep up `BODY_MIN_RATE`."""
BODY_MIN_RATE = 32 * 1024
"""Bytes a second a body must average once `BODY_TIMEOUT_S` has passed."""
GRACEFUL_TIMEOUT_S: Final = 5
"""How long in-flight responses may run on at shutdown before they are cancelled."""
MAX_HEAD: Final = 16 * 1024
"""The largest request head read (431 beyond, as the builtin server; h11's own default)."""
ACCEPT_LOG_INTERVAL_S = 10.0
"""At most one log line per this many seconds about failing accepts."""
_SLICE: Final = 4096
"""The most bytes parsed between two looks at the stash (`_cl_feed`): what one slice
of small pipelined requests can add beyond the bound."""

_ACCEPT_FAILED = "socket.accept() out of system resource"

_PHRASES: Final = {
    400: b"Bad Request",
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
}


def _reserved(app: Any, cap: int) -> Any:
    """`app` for a connection beyond the limit: the control plane and ``/health`` only."""

    async def reserved(scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path.startswith("/__") or path == "/health":
            await app(scope, receive, send)
            return
        response = error_response(
            path,
            503,
            f"The server is at its connection limit ({cap}, --max-connections); retry shortly",
            kind=ErrorKind.SERVER_ERROR,
            code="server_busy",
        )
        response.headers["connection"] = "close"
        await response(scope, receive, send)

    return reserved


def _refusal(status: int, message: str, code: str, path: str | None) -> bytes:
    """A complete response with the JSON envelope of the protocol on `path` (OpenAI's when
    it is unknown), closing the connection."""
    body = error_body_for_path(path, status, message, code) if path is not None else None
    if body is None:
        body = {"error": {"message": message, "type": "invalid_request_error", "code": code}}
    data = json.dumps(body).encode()
    date = formatdate(usegmt=True).encode("ascii")
    head = (
        b"HTTP/1.1 %d %s\r\ndate: %s\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n"
        % (status, _PHRASES.get(status, b""), date, len(data))
    )
    return head + data


_TURNS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Turns] = weakref.WeakKeyDictionary()


def _turns(loop: asyncio.AbstractEventLoop) -> Turns:
    """The loop's turns, shared by its connections (uvicorn runs one loop a server)."""
    turns = _TURNS.get(loop)
    if turns is None:
        turns = _TURNS[loop] = Turns(loop)
    return turns


def guarded_protocol(http: str, max_connections: int = 10_000) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class `http` (``"httptools"`` or ``"h11"``) with the read
    deadlines and the connection limit of the module docstring."""
    base: type[asyncio.Protocol]
    if http == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        base = HttpToolsProtocol
    else:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        base = H11Protocol
    cap = connection_cap(max_connections)

    class Guarded(base):  # type: ignore[valid-type, misc]
        """One connection: uvicorn's protocol, plus a deadline timer."""

        app: Any
        """The ASGI app its requests go to (uvicorn's attribute)."""

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            now = self.loop.time()
            self._cl_timer: asyncio.TimerHandle | None = None
            self._cl_seen: Any = None
            """The request whose head was read last."""
            self._cl_since: float | None = now
            """Since when the next head is awaited with a deadline (the first: the accept;
            a later one: its first byte); None: idle, uvicorn's keep-alive timer runs."""
            self._cl_bytes = 0
            """Bytes received while waiting for the next head."""
            self._cl_body_start = now
            self._cl_body_bytes = 0
            self._cl_last = now
            self._cl_rest = b""
            """Bytes received but not yet parsed: the stash was full (`_cl_feed`)."""
            self._cl_cycles: deque[Any] = deque()
            """The requests read whose response is not known to be complete, in order."""
            self._cl_answered = False
            """Whether a response of this connection completed (its reads take turns)."""
            self.deferred = False
            """Waiting for its turn (`Turns`), what it read held in `_cl_rest`."""
            self.turn = -1
            """The loop's turn in which it last started what it read (`Turns`)."""
            idle = self._cl_idle()
            if len(self.connections) > cap:
                oldest = next(iter(idle), None)
                if oldest is not None:
                    del idle[oldest]
                    oldest.transport.close()
                elif len(self.connections) > cap + RESERVE:
                    transport.close()
                    return
                else:
                    self.app = _reserved(self.app, cap)
            idle[self] = None
            self._cl_schedule()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cl_cancel()
            self._cl_idle().pop(self, None)
            # uvicorn marks only the request read last as disconnected; one answering
            # before it (pipelined) would write to the closed transport (a traceback).
            for cycle in self._cl_cycles:
                if not cycle.response_complete:
                    cycle.disconnected = True
            self._cl_cycles.clear()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            rest = self._cl_rest
            if rest:  # bytes held back come first (a body's receive resumed reading)
                self._cl_rest = b""
                data = rest + data
            if self._cl_answered and not _turns(self.loop).take(self):
                self._cl_rest = data  # the others' turn first; `take_turn` follows
                self.flow.pause_reading()
                return
            self._cl_feed(data)

        def take_turn(self) -> None:
            """Its turn has come (`Turns`): what it read is parsed now."""
            rest = self._cl_rest
            self._cl_rest = b""
            if self.transport.is_closing():
                return
            self.flow.resume_reading()
            if rest:
                self._cl_feed(rest)  # pauses reading again when the stash is full

        def on_response_complete(self) -> None:
            self._cl_answered = True
            super().on_response_complete()  # resumes reading, starts the next one queued
            if self.cycle is self._cl_seen and not self.transport.is_closing():
                self._cl_since = None
                self._cl_bytes = 0
                self._cl_idle()[self] = None
            self._cl_progress(0, self.loop.time())
            rest = self._cl_rest
            if self.transport.is_closing():
                self._cl_rest = b""  # nothing more is answered on this connection
            elif rest:
                self._cl_rest = b""
                self._cl_feed(rest)
            elif self._cl_full():
                self.flow.pause_reading()

        # -- the stash: pipelined requests waiting behind a response ------------------------

        def _cl_feed(self, data: bytes) -> None:
            """Parse `data` in slices while the stash has room; hold back the rest (and
            stop reading) once it is full (`chaosllm.wire.flow.stash_full`, the builtin
            server's bound). uvicorn parses every read whole and resumes reading after
            each response: a client that pipelines and never reads its answers made it
            queue every request it sent, megabytes a connection."""
            start = 0
            end = len(data)
            while start < end:
                if self.transport.is_closing():
                    return
                if self._cl_full():
                    self._cl_rest = data[start:]
                    self.flow.pause_reading()
                    return
                piece = data if start == 0 and end <= _SLICE else data[start : start + _SLICE]
                start += len(piece)
                now = self.loop.time()
                super().data_received(piece)
                self._cl_progress(len(piece), now)
                if self.transport.is_closing():
                    return
                protocol = self.transport.get_protocol()
                if protocol is not self:  # upgraded (a WebSocket): the rest is its own
                    if start < end:
                        protocol.data_received(data[start:])
                    return

        def _cl_full(self) -> bool:
            pipeline = getattr(self, "pipeline", None)
            if pipeline is None:  # uvicorn's h11 protocol: what h11 holds unparsed
                buffer = getattr(self.conn, "_receive_buffer", b"")  # h11's own; no public size
                return len(buffer) > STASH_BYTES
            size = 0
            for cycle, _ in pipeline:
                headers = cycle.scope["headers"]
                head = sum(len(name) + len(value) for name, value in headers)
                size += held(len(cycle.body), head, len(headers))
            return stash_full(len(pipeline), size)

        # -- httptools' callbacks (the h11 protocol has none) ------------------------------

        def on_message_begin(self) -> None:
            self._cl_trailing = False
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._cl_trailing = True
            super().on_headers_complete()
            cycles = self._cl_cycles
            while cycles and cycles[0].response_complete:
                cycles.popleft()
            if self.cycle is not None and (not cycles or cycles[-1] is not self.cycle):
                cycles.append(self.cycle)

        def on_header(self, name: bytes, value: bytes) -> None:
            # After the head, a field is a chunked body's trailer: uvicorn would append it
            # to the request's headers (a trailer could set the session). Dropped.
            if not getattr(self, "_cl_trailing", False):
                super().on_header(name, value)

        def send_400_response(self, msg: str) -> None:
            if not self.transport.is_closing():
                self.transport.write(
                    _refusal(400, f"Malformed HTTP request: {msg}", "bad_request", None)
                )
                self.transport.close()

        # -- the deadline -----------------------------------------------------------------

        def _cl_idle(self) -> dict[Any, None]:
            """The idle connections of this server, oldest first."""
            state = self.server_state
            idle: dict[Any, None] | None = getattr(state, "chaosllm_idle", None)
            if idle is None:
                idle = state.chaosllm_idle = {}
            return idle

        def _cl_waiting(self) -> bool:
            cycle = self.cycle
            return cycle is None or (cycle is self._cl_seen and cycle.response_complete)

        def _cl_progress(self, size: int, now: float) -> None:
            cycle = self.cycle
            if cycle is not None and cycle is not self._cl_seen:  # a new head was read
                self._cl_seen = cycle
                self._cl_since = None
                self._cl_bytes = 0
                self._cl_body_start = self._cl_last = now
                self._cl_body_bytes = 0
                self._cl_idle().pop(self, None)
            elif self._cl_waiting():
                if size:
                    self._cl_bytes += size
                    if self._cl_since is None:
                        self._cl_since = now
                    self._cl_idle().pop(self, None)
                    if self._cl_bytes > MAX_HEAD and not self.transport.is_closing():
                        self._cl_end(431, f"Request head too large: the limit is {MAX_HEAD} bytes")
                        return
            elif size:
                self._cl_body_bytes += size
                self._cl_last = now
            self._cl_schedule()

        def _cl_deadline(self) -> float | None:
            if self._cl_waiting():
                return None if self._cl_since is None else self._cl_since + HEADER_TIMEOUT_S
            if not self.cycle.more_body:
                return None  # the request is read: the response is the app's business
            rate = self._cl_body_bytes / BODY_MIN_RATE if BODY_MIN_RATE > 0 else float("inf")
            pause: float = self._cl_last + HEADER_TIMEOUT_S
            overall: float = self._cl_body_start + BODY_TIMEOUT_S + rate
            return min(pause, overall)

        def _cl_cancel(self) -> None:
            if self._cl_timer is not None:
                self._cl_timer.cancel()
                self._cl_timer = None

        def _cl_schedule(self) -> None:
            self._cl_cancel()
            if self.transport.is_closing():
                return
            deadline = self._cl_deadline()
            if deadline is not None:
                self._cl_timer = self.loop.call_at(deadline, self._cl_expire)

        def _cl_expire(self) -> None:
            self._cl_timer = None
            if self.transport.is_closing():
                return
            now = self.loop.time()
            if not self._cl_waiting() and self.flow.read_paused:
                # uvicorn stopped reading (the app has not taken the body yet): not the
                # client's delay.
                self._cl_last = now
                self._cl_schedule()
                return
            deadline = self._cl_deadline()
            if deadline is None:
                return
            if now < deadline:
                self._cl_schedule()
                return
            if self._cl_waiting():
                self._cl_end(408 if self._cl_bytes else None, "Timed out reading the request head")
            else:
                self._cl_end(408, "Timed out reading the request body")

        def _cl_end(self, status: int | None, message: str) -> None:
            """Close the connection, answering `status` first when a response may still be
            written: none is in flight or done for a request whose body is still coming
            (the bytes after a complete answer to such a request are its body's rest)."""
            cycle = self.cycle
            if status is not None:
                if cycle is None or (cycle.response_complete and not cycle.more_body):
                    code = "bad_request" if status == 431 else "timeout"
                    self.transport.write(_refusal(status, message, code, None))
                elif not cycle.response_started:
                    path = cycle.scope.get("path")
                    self.transport.write(_refusal(status, message, "timeout", path))
            if cycle is not None:
                cycle.disconnected = True  # what the app still sends goes nowhere
            self.transport.close()

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded


class _AcceptErrors:
    """A loop exception handler: failing accepts (the open-file limit) logged once per
    `ACCEPT_LOG_INTERVAL_S` with how many failed; everything else as the loop would."""

    def __init__(self) -> None:
        self.failed = 0
        self.reported = float("-inf")

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") != _ACCEPT_FAILED:
            loop.default_exception_handler(context)
            return
        self.failed += 1
        now = time.monotonic()
        if now - self.reported < ACCEPT_LOG_INTERVAL_S:
            return
        self.reported = now
        log.error(
            "cannot accept connections: %s (%d failed accepts since the last report; "
            "they wait in the listen queue). Raise the open-file limit (ulimit -n).",
            context.get("exception"),
            self.failed,
        )
        self.failed = 0


def guarded_server(config: Any) -> Any:
    """A `uvicorn.Server` for `config` whose loop logs failing accepts sparingly."""
    import uvicorn

    class GuardedServer(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            loop = asyncio.get_running_loop()
            loop.set_exception_handler(_AcceptErrors())
            if sockets is None:
                await super().startup(sockets)
                return
            # The lifespan and the server's state as uvicorn makes them, without its
            # listeners: the builtin server's acceptor takes every waiting connection a
            # turn (uvloop's create_server takes one, and a flood starves it).
            await super().startup([])
            config = self.config
            protocol_class: Any = config.http_protocol_class

            def protocol() -> asyncio.Protocol:
                made: asyncio.Protocol = protocol_class(
                    config=config,
                    server_state=self.server_state,
                    app_state=self.lifespan.state,
                    _loop=loop,
                )
                return made

            servers: list[Any] = []  # uvicorn closes each (``close``) at shutdown
            for sock in sockets:
                sock.setblocking(False)
                acceptor = Acceptor(loop, sock, protocol, config.ssl)
                acceptor.start()
                servers.append(acceptor)
            self.servers = servers

    return GuardedServer(config)
