"""Hypothesis at the wire's boundaries, on both servers.

- The parser: arbitrary request bytes (random, and near-HTTP: odd methods, versions,
  line ends, framing headers, chunk sizes) never crash a server, never hang it (every
  connection ends once the client has sent everything), are answered with HTTP or not at
  all, log no error, and leave the server answering a request on a fresh connection.
- The writer: any plan, for any kind of request (GET, HEAD, POST; HTTP/1.1 or 1.0;
  keep-alive or not), gives the same bytes on the wire, the same end of the connection
  and the same report from the default server as from the h11 one (h11 is the reference
  for heads and framing).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaosllm.core.report import PlanReport
from chaosllm.model import Ending, ResponsePlan
from chaosllm.wire import H11WireServer, WireServer, send_plan
from chaosllm.wire.asgi import Receive, Scope, Send
from tests.helpers import wire_plans

pytestmark = pytest.mark.timeout(120)

SOCKET_TIMEOUT = 5.0
FUZZ = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclass
class App:
    plan: ResponsePlan | None = None
    reports: list[PlanReport] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            raise RuntimeError("no lifespan")
        size = 0
        while True:
            message = await receive()
            size += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        if scope["path"] == "/plan" and self.plan is not None:
            report = PlanReport()
            with self.lock:
                self.reports.append(report)
            await send_plan(scope, receive, send, self.plan, report)
            return
        answer = json.dumps({"path": scope["path"], "length": size}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(answer))]
        # As Starlette does (no route takes CONNECT): a 2xx would switch protocols in h11.
        status = 405 if scope["method"] == "CONNECT" else 200
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": answer})


class Errors(logging.Handler):
    """Collects what the servers log at ERROR and above."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class Served:
    host: str
    port: int
    app: App

    def connect(self) -> socket.socket:
        return socket.create_connection((self.host, self.port), timeout=SOCKET_TIMEOUT)


@pytest.fixture(scope="module")
def errors() -> Iterator[Errors]:
    """Errors the servers log, and those the event loop logs for them (an exception
    escaping a protocol callback)."""
    handler = Errors()
    loggers = [logging.getLogger("chaosllm.wire"), logging.getLogger("asyncio")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


@contextlib.contextmanager
def serving(cls: type[WireServer] | type[H11WireServer]) -> Iterator[Served]:
    app = App()
    server = cls(app, header_timeout_s=2.0, keepalive_timeout_s=2.0, max_body_bytes=4096)
    with server.run_in_thread() as (host, port):
        yield Served(host, port, app)


@pytest.fixture(scope="module")
def servers(errors: Errors) -> Iterator[dict[str, Served]]:
    with serving(WireServer) as fast, serving(H11WireServer) as h11:
        yield {"httptools": fast, "h11": h11}


# -- the parser ----------------------------------------------------------------------------

METHODS = [b"GET", b"POST", b"HEAD", b"PUT", b"OPTIONS", b"CONNECT", b"PATCH", b"get", b"G T"]
VERSIONS = [b"HTTP/1.1", b"HTTP/1.0", b"HTTP/9.9", b"HTTP/2.0", b"HTTP/1", b"http/1.1", b""]
NAMES = [
    b"Host",
    b"Content-Length",
    b"Transfer-Encoding",
    b"Connection",
    b"Expect",
    b"Upgrade",
    b"X-Chaosllm-Session",
    b"Bad Name",
    b"",
]
VALUES = [
    b"test",
    b"0",
    b"5",
    b"-1",
    b"99999999999999999999999",
    b"5, 6",
    b"chunked",
    b"gzip, chunked",
    b"gzip",
    b"close",
    b"keep-alive",
    b"upgrade",
    b"100-continue",
    b"h2c",
    b" padded ",
]
ENDS = [b"\r\n", b"\n", b"\r", b"\r\r\n"]
CHUNKED = [b"5\r\nhello\r\n0\r\n\r\n", b"zz\r\nxx\r\n", b"0\r\n\r\n", b"ffffffffffffffff\r\n"]

line_end = st.sampled_from(ENDS)
header = st.tuples(
    st.one_of(st.sampled_from(NAMES), st.binary(max_size=12)),
    st.one_of(st.sampled_from(VALUES), st.binary(max_size=24)),
    line_end,
).map(lambda t: t[0] + b": " + t[1] + t[2])
near_http = st.builds(
    lambda method, target, version, end, headers, blank, body: (
        method + b" " + target + b" " + version + end + b"".join(headers) + blank + body
    ),
    st.one_of(st.sampled_from(METHODS), st.binary(max_size=8)),
    st.one_of(st.sampled_from([b"/echo", b"/plan", b"/", b"*", b"/%zz", b"//x?y"]), st.binary()),
    st.sampled_from(VERSIONS),
    line_end,
    st.lists(header, max_size=6),
    line_end,
    st.one_of(st.sampled_from(CHUNKED), st.binary(max_size=64)),
)
raw_requests = st.one_of(
    st.binary(max_size=256),
    near_http,
    st.lists(near_http, min_size=2, max_size=3).map(b"".join),  # pipelined
)


def exchange(served: Served, data: bytes) -> bytes:
    """Send `data`, say it is all, read until the server closes. TimeoutError: a hang."""
    with served.connect() as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        received = b""
        while True:
            try:
                got = sock.recv(65536)
            except ConnectionResetError:
                return received
            if not got:
                return received
            received += got


def health(served: Served) -> int:
    with served.connect() as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        data = b""
        while got := sock.recv(65536):
            data += got
    return int(data.split(b" ")[1])


@FUZZ
@given(data=raw_requests)
def test_any_request_bytes(servers: dict[str, Served], errors: Errors, data: bytes) -> None:
    errors.records.clear()
    for name, served in servers.items():
        answer = exchange(served, data)
        assert not answer or answer.startswith(b"HTTP/1.1 "), (name, answer[:200])
        assert health(served) == 200, name
    assert [r.getMessage() for r in errors.records] == []


# -- the writer: the same bytes from both servers -------------------------------------------

plans = wire_plans(
    delay_ms=3.0,
    stall_ms=10.0,
    endings=[Ending.COMPLETE, Ending.COMPLETE, Ending.CLOSE, Ending.STALL],
)
requests = st.tuples(
    st.sampled_from(["GET", "HEAD", "POST"]),
    st.sampled_from(["1.1", "1.0"]),
    st.booleans(),
)
_DATE = re.compile(rb"(?im)^date: [^\r\n]*\r\n")
_END = b"GET /end HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"


def wire_of(served: Served, request: bytes) -> tuple[bytes, str]:
    with served.connect() as sock:
        sock.sendall(request)
        received = b""
        while True:
            try:
                got = sock.recv(65536)
            except ConnectionResetError:
                return received, "reset"
            if not got:
                return received, "eof"
            received += got


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=plans, kind=requests)
def test_both_servers_put_the_same_bytes_on_the_wire(
    servers: dict[str, Served], plan: ResponsePlan, kind: tuple[str, str, bool]
) -> None:
    method, version, close = kind
    head = f"{method} /plan HTTP/{version}\r\nHost: test\r\n"
    if close:
        head += "Connection: close\r\n"
    if method == "POST":
        head += "Content-Length: 2\r\n\r\n{}"
    else:
        head += "\r\n"
    # A second request behind it shows whether the connection was kept alive.
    request = head.encode() + (_END if version == "1.1" else b"")
    seen: dict[str, tuple[bytes, str, tuple[object, ...]]] = {}
    for name, served in servers.items():
        served.app.plan = plan
        served.app.reports.clear()
        data, end = wire_of(served, request)
        [report] = served.app.reports
        for _ in range(500):  # the report settles a moment after the last byte
            if report.outcome is not None:
                break
            threading.Event().wait(0.002)
        counts = (report.head_sent, report.frames_sent, report.bytes_sent, report.outcome)
        seen[name] = (_DATE.sub(b"date: -\r\n", data), end, counts)
    assert seen["httptools"] == seen["h11"]
