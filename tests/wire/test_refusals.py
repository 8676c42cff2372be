"""What the wire servers refuse, and how they stay available, on real sockets: both
framings at once (request smuggling), HTTP versions other than 1.0 and 1.1, bodies that
arrive too slowly, a server full of idle or stalled connections, pipelined input beyond
what is buffered, a client that does not read; and the same bytes from both servers."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from chaosllm.core.report import Outcome, PlanReport
from chaosllm.model import Ending, Framing, Piece, ResponsePlan
from chaosllm.wire import H11WireServer, WireServer, send_plan
from chaosllm.wire.asgi import Receive, Scope, Send
from tests.helpers import read_head, read_response, read_until_eof

pytestmark = pytest.mark.timeout(30)

SOCKET_TIMEOUT = 5.0
ServerClass = type[WireServer] | type[H11WireServer]
SERVERS = [pytest.param(WireServer, id="httptools"), pytest.param(H11WireServer, id="h11")]
SSE = (("content-type", "text/event-stream"),)


def frame(i: int) -> bytes:
    return b'data: {"n": %d}\n\n' % i


@dataclass
class App:
    """An ASGI app: ``/plan`` serves the plan set last (reports kept), ``/health`` and
    ``/__control`` a small JSON answer, anything else echoes what it got."""

    plan: ResponsePlan | None = None
    reports: list[PlanReport] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            raise RuntimeError("no lifespan")  # tolerated by both servers
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        path = scope["path"]
        with self.lock:
            self.seen.append(f"{scope['method']} {path}?{scope['query_string'].decode()}")
        if path == "/plan" and self.plan is not None:
            report = PlanReport()
            with self.lock:
                self.reports.append(report)
            await send_plan(scope, receive, send, self.plan, report)
            return
        answer = json.dumps({"path": path, "length": len(body)}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(answer))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})


@dataclass
class Running:
    host: str
    port: int
    app: App
    server: WireServer | H11WireServer

    def connect(self) -> socket.socket:
        return socket.create_connection((self.host, self.port), timeout=SOCKET_TIMEOUT)


@contextlib.contextmanager
def running(server_class: ServerClass, **options: Any) -> Iterator[Running]:
    app = App()
    server = server_class(app, **options)
    with server.run_in_thread() as (host, port):
        yield Running(host, port, app, server)


@pytest.fixture(params=SERVERS)
def server_class(request: pytest.FixtureRequest) -> ServerClass:
    cls: ServerClass = request.param
    return cls


def get(path: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: test\r\n{extra}\r\n".encode()


def closed_by_peer(sock: socket.socket, timeout: float = SOCKET_TIMEOUT) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


# -- request smuggling: Content-Length with Transfer-Encoding --------------------------------


@pytest.mark.parametrize(
    "framing",
    [
        "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
        "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
    ],
    ids=["cl-te", "te-cl"],
)
def test_content_length_with_transfer_encoding_is_refused_and_closed(
    server_class: ServerClass, framing: str
) -> None:
    smuggled = b"GET /smuggled HTTP/1.1\r\nHost: test\r\n\r\n"
    request = (
        f"POST /echo HTTP/1.1\r\nHost: test\r\n{framing}\r\n".encode() + b"0\r\n\r\n" + smuggled
    )
    with running(server_class) as r:
        with r.connect() as sock:
            sock.sendall(request)
            data = read_until_eof(sock)
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 ")
        assert b"connection: close" in head.lower()
        assert data.count(b"HTTP/1.1") == 1  # nothing served after the refusal
        error = json.loads(body)["error"]
        assert "both Content-Length and Transfer-Encoding" in error["message"]
        assert error["code"] == "bad_request"
        assert r.app.seen == []  # neither request reached the app
        with r.connect() as sock:  # and the server still serves
            sock.sendall(get("/after"))
            assert read_response(sock)[0] == 200


# -- HTTP versions ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["9.9", "2.0", "3.0", "1.2", "0.9"])
def test_http_versions_other_than_1_0_and_1_1_are_refused(
    server_class: ServerClass, version: str
) -> None:
    with running(server_class) as r:
        with r.connect() as sock:
            sock.sendall(f"GET /echo HTTP/{version}\r\nHost: test\r\n\r\n".encode())
            data = read_until_eof(sock)
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 505 ")
        assert b"connection: close" in head.lower()
        error = json.loads(body)["error"]
        assert error["code"] == "http_version_not_supported"
        assert "HTTP/1.1 and HTTP/1.0" in error["message"]
        assert r.app.seen == []
        for good in ("1.0", "1.1"):
            with r.connect() as sock:
                sock.sendall(f"GET /echo HTTP/{good}\r\nHost: test\r\n\r\n".encode())
                assert read_response(sock)[0] == 200


# -- slow bodies --------------------------------------------------------------------------------


def test_a_body_trickling_in_too_slowly_is_cut_with_408(server_class: ServerClass) -> None:
    # A byte every 50 ms never pauses for header_timeout_s, but stays far below the rate.
    with running(server_class, header_timeout_s=5.0, body_timeout_s=0.4, body_min_rate=100) as r:
        with r.connect() as sock:
            sock.sendall(b"POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 1000\r\n\r\n")
            started = time.monotonic()
            sock.settimeout(0.05)
            data = b""
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                for _ in range(200):
                    sock.sendall(b"x")
                    try:
                        data += sock.recv(65536)
                    except TimeoutError:
                        continue
                    if b"\r\n\r\n" in data:
                        break
            elapsed = time.monotonic() - started
            sock.settimeout(SOCKET_TIMEOUT)
            with contextlib.suppress(ConnectionResetError):
                data += read_until_eof(sock)
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), data
        assert json.loads(body)["error"]["message"] == "Timed out reading the request body"
        # 0.4 s of grace plus a second per 100 bytes received (a few): cut well before 2 s.
        assert 0.35 < elapsed < 2.0
        assert r.app.seen == []


def test_a_body_at_a_fair_rate_is_read_whole(server_class: ServerClass) -> None:
    with running(server_class, header_timeout_s=5.0, body_timeout_s=0.2, body_min_rate=1000) as r:
        with r.connect() as sock:
            sock.sendall(b"POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 1000\r\n\r\n")
            for _ in range(10):  # 2,000 bytes a second, for half a second
                time.sleep(0.05)
                sock.sendall(b"y" * 100)
            status, _, body = read_response(sock)
        assert status == 200
        assert json.loads(body) == {"path": "/echo", "length": 1000}


def test_a_body_that_stops_gets_408_after_the_read_timeout(server_class: ServerClass) -> None:
    with running(server_class, header_timeout_s=0.3) as r, r.connect() as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 100\r\n\r\nabc")
        started = time.monotonic()
        data = read_until_eof(sock)
        assert 0.25 < time.monotonic() - started < 3
        assert data.startswith(b"HTTP/1.1 408 ")


# -- a full server -----------------------------------------------------------------------------


def test_idle_connections_are_closed_oldest_first_when_the_server_is_full(
    server_class: ServerClass,
) -> None:
    with running(server_class, max_connections=6) as r:
        idle = [r.connect() for _ in range(6)]
        try:
            for sock in idle:  # one request each: six idle keep-alive connections, in order
                sock.sendall(get("/echo"))
                assert read_response(sock)[0] == 200
            newcomers = [r.connect() for _ in range(2)]
            for sock in newcomers:
                sock.sendall(get("/echo?new"))
                assert read_response(sock)[0] == 200
            # The two oldest idle ones made room; the others are still served.
            assert [closed_by_peer(sock, 1.0) for sock in idle[:2]] == [True, True]
            for sock in idle[2:]:
                sock.sendall(get("/echo?again"))
                assert read_response(sock)[0] == 200
            for sock in newcomers:
                sock.close()
        finally:
            for sock in idle:
                sock.close()


def stall_plan() -> ResponsePlan:
    return ResponsePlan(
        200,
        SSE,
        (Piece(frame(0)),),
        framing=Framing.CHUNKED,
        ending=Ending.STALL,
        stall_ms=20_000,
    )


def test_a_server_full_of_stalled_clients_still_answers_its_control_plane() -> None:
    with running(WireServer, max_connections=5) as r:
        r.app.plan = stall_plan()
        stalled = [r.connect() for _ in range(5)]
        try:
            for sock in stalled:
                sock.sendall(get("/plan"))
                rest = read_head(sock)[2]
                while frame(0) not in rest:
                    rest += sock.recv(65536)
            # Nothing idle to close: the control plane and the health check answer anyway,
            # and quickly; a provider request is turned away rather than left waiting.
            for path in ("/health", "/__control"):
                started = time.monotonic()
                with r.connect() as sock:
                    sock.sendall(get(path))
                    status, head, body = read_response(sock)
                    assert status == 200 and json.loads(body)["path"] == path
                    assert b"connection: close" in head.lower()
                assert time.monotonic() - started < 1.0
            with r.connect() as sock:
                sock.sendall(get("/plan"))
                status, _, body = read_response(sock)
            assert status == 503
            assert json.loads(body)["error"]["code"] == "server_busy"
        finally:
            for sock in stalled:
                sock.close()
        # The stalled clients left: the stalls ended, each reported as such.
        deadline = time.monotonic() + SOCKET_TIMEOUT
        while time.monotonic() < deadline and any(rep.outcome is None for rep in r.app.reports):
            time.sleep(0.01)
        assert [rep.outcome for rep in r.app.reports] == [Outcome.CLIENT_GONE] * 5


# -- buffering and flow control --------------------------------------------------------------


def test_reading_stops_while_too_much_is_pipelined_behind_a_response(
    server_class: ServerClass,
) -> None:
    with running(server_class) as r:
        r.app.plan = stall_plan().with_(stall_ms=1500)
        body = b"z" * 65536
        one = b"POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 65536\r\n\r\n" + body
        with r.connect() as sock:
            sock.sendall(get("/plan"))
            read_head(sock)
            # 64 MiB behind a stalled response: more than the server buffers (1 MiB) plus
            # what the kernel holds, so the upload blocks until the response is over.
            sock.settimeout(0.5)
            sent = 0
            with pytest.raises(TimeoutError):
                for _ in range(1024):
                    sock.sendall(one)
                    sent += 1
            assert sent < 1024
        assert len([s for s in r.app.seen if s.startswith("POST")]) == 0


def test_a_client_that_reads_slowly_gets_a_large_streamed_plan_whole(
    server_class: ServerClass,
) -> None:
    piece = bytes(range(256)) * 800  # 200 KiB
    pieces = (Piece(piece, frame=False), Piece(piece, delay_ms=1, frame=False)) + tuple(
        Piece(piece, frame=False) for _ in range(98)
    )
    with running(server_class) as r:
        r.app.plan = ResponsePlan(200, (("content-type", "application/octet-stream"),), pieces)
        with r.connect() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
            sock.sendall(get("/plan"))
            time.sleep(0.5)  # the server meets a full socket buffer and waits
            status, _, body = read_response(sock)
        assert status == 200
        assert body == piece * 100
        deadline = time.monotonic() + SOCKET_TIMEOUT
        while r.app.reports[0].outcome is None and time.monotonic() < deadline:
            time.sleep(0.01)
        report = r.app.reports[0]
        assert (report.outcome, report.bytes_sent) == (Outcome.COMPLETE, len(piece) * 100)


# -- heads and pipelining ----------------------------------------------------------------------


@pytest.mark.parametrize("where", ["header", "target"])
def test_a_head_over_64_kib_gets_431(server_class: ServerClass, where: str) -> None:
    big = "x" * 100_000
    if where == "header":
        request = f"GET /echo HTTP/1.1\r\nHost: test\r\nX-Big: {big}\r\n\r\n"
    else:
        request = f"GET /echo?{big} HTTP/1.1\r\nHost: test\r\n\r\n"
    with running(server_class) as r:
        with r.connect() as sock:
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                # Sent in pieces, as a slow client would: no single read holds the head.
                for start in range(0, len(request), 4096):
                    sock.sendall(request[start : start + 4096].encode())
                    time.sleep(0.005)
            data = read_until_eof(sock)
        assert data.startswith(b"HTTP/1.1 431 "), data[:200]
        assert r.app.seen == []
        with r.connect() as sock:  # a large head that arrives at once is fine
            sock.sendall(get("/echo", "X-Fine: " + "y" * 20_000 + "\r\n"))
            assert read_response(sock)[0] == 200


def test_a_thousand_pipelined_requests_are_answered_in_order(server_class: ServerClass) -> None:
    with running(server_class) as r, r.connect() as sock:
        sock.sendall(b"".join(get(f"/echo?n={i}") for i in range(1000)))
        data = b""
        while data.count(b'"path"') < 1000:
            got = sock.recv(65536)
            assert got, "EOF before the last answer"
            data += got
        assert data.count(b"HTTP/1.1 200 ") == 1000
    assert r.app.seen == [f"GET /echo?n={i}" for i in range(1000)]
