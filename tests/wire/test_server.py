"""The wire servers on real sockets: HTTP/1.1 behaviour and every plan ending, on the
default server (asyncio protocols + httptools) and on its pure-Python fallback (h11)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
import h11
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from chaosllm.core.report import Outcome, PlanReport
from chaosllm.errors import ServerError
from chaosllm.model import Ending, Framing, Piece, ResponsePlan
from chaosllm.wire import H11WireServer, PlanResponse, WireServer, send_plan
from chaosllm.wire.asgi import Receive, Scope, Send
from tests.helpers import CLOCK_SLACK, read_until_eof

pytestmark = pytest.mark.timeout(30)

AnyServer = WireServer | H11WireServer
ServerClass = type[WireServer] | type[H11WireServer]
SERVERS = [pytest.param(WireServer, id="httptools"), pytest.param(H11WireServer, id="h11")]

SOCKET_TIMEOUT = 5.0
SSE = (("content-type", "text/event-stream"),)


def frame(i: int) -> bytes:
    return b'data: {"n": %d}\n\n' % i


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


# -- the app under test ------------------------------------------------------------------


@dataclass
class PlanEndpoint:
    """An ASGI endpoint serving whatever plan the test set, recording the reports."""

    plan: ResponsePlan | None = None
    reports: list[tuple[ResponsePlan, PlanReport]] = field(default_factory=list)
    finished: threading.Condition = field(default_factory=threading.Condition)

    def serve(self, plan: ResponsePlan) -> None:
        self.plan = plan

    def report(self) -> PlanReport:
        """The report of the first request served with the current plan, once finished."""

        def mine() -> PlanReport | None:
            return next((r for p, r in self.reports if p is self.plan), None)

        with self.finished:
            assert self.finished.wait_for(mine, SOCKET_TIMEOUT), "the plan did not finish"
            found = mine()
        assert found is not None
        return found

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        plan = self.plan
        assert plan is not None
        report = PlanReport()
        try:
            await send_plan(scope, receive, send, plan, report)
        finally:
            with self.finished:
                self.reports.append((plan, report))
                self.finished.notify_all()


@dataclass
class AppState:
    release: threading.Event = field(default_factory=threading.Event)
    lifespan: list[str] = field(default_factory=list)
    scopes: list[Scope] = field(default_factory=list)


def make_app(endpoint: PlanEndpoint, state: AppState) -> Starlette:
    async def echo(request: Request) -> Response:
        body = await request.body()
        state.scopes.append(dict(request.scope))
        return JSONResponse(
            {
                "method": request.method,
                "path": request.url.path,
                "query": request.url.query,
                "length": len(body),
                "body": body.decode("latin-1")[:64],
            }
        )

    async def stream(request: Request) -> Response:
        async def frames() -> AsyncIterator[bytes]:
            yield frame(0)
            # The next frame only once the client has seen the first one.
            await anyio.to_thread.run_sync(state.release.wait, SOCKET_TIMEOUT)
            yield frame(1)
            yield frame(2)

        return StreamingResponse(frames(), media_type="text/event-stream")

    async def slow(request: Request) -> Response:
        await anyio.sleep(0.05)
        return JSONResponse({"ok": True})

    async def boom(request: Request) -> Response:
        raise RuntimeError("boom")

    async def plan_route(request: Request) -> PlanResponse:
        assert endpoint.plan is not None
        return PlanResponse(endpoint.plan)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.lifespan.append("startup")
        yield
        state.lifespan.append("shutdown")

    return Starlette(
        routes=[
            Route("/echo", echo, methods=["GET", "POST", "HEAD"]),
            Route("/stream", stream),
            Route("/slow", slow),
            Route("/boom", boom),
            Route("/plan", endpoint, methods=["GET", "POST"]),
            Route("/plan-response", plan_route),
        ],
        lifespan=lifespan,
    )


@dataclass
class Running:
    host: str
    port: int
    endpoint: PlanEndpoint
    state: AppState
    server: AnyServer

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def connect(self) -> socket.socket:
        return socket.create_connection((self.host, self.port), timeout=SOCKET_TIMEOUT)


@contextlib.contextmanager
def running(server_class: ServerClass, **options: Any) -> Iterator[Running]:
    endpoint = PlanEndpoint()
    state = AppState()
    server = server_class(make_app(endpoint, state), **options)
    with server.run_in_thread() as (host, port):
        yield Running(host, port, endpoint, state, server)


@pytest.fixture(scope="module", params=SERVERS)
def server_class(request: pytest.FixtureRequest) -> ServerClass:
    """Each test runs on both servers."""
    cls: ServerClass = request.param
    return cls


@pytest.fixture(scope="module")
def srv(server_class: ServerClass) -> Iterator[Running]:
    with running(server_class) as r:
        yield r


# -- raw socket helpers ------------------------------------------------------------------


def request_bytes(path: str = "/plan", method: str = "GET", extra: str = "") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: test\r\n{extra}\r\n".encode()


def read_until(sock: socket.socket, marker: bytes, data: bytearray) -> None:
    while marker not in data:
        got = sock.recv(65536)
        assert got, f"EOF before {marker!r}; got {bytes(data)!r}"
        data += got


def split_head(data: bytes) -> tuple[bytes, bytes]:
    head, sep, body = data.partition(b"\r\n\r\n")
    assert sep, data
    return head, body


def read_response(
    sock: socket.socket, leftover: bytearray | None = None
) -> tuple[h11.Response, bytes]:
    """Read one complete response with h11.

    Bytes read past its end (a pipelined next response) are kept in `leftover`.
    """
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method=b"GET", target="/", headers=[("host", "test")]))
    conn.send(h11.EndOfMessage())
    if leftover:
        conn.receive_data(bytes(leftover))
    response: h11.Response | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(sock.recv(65536))
        elif isinstance(event, h11.Response):
            response = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            assert response is not None
            if leftover is not None:
                leftover[:] = conn.trailing_data[0]
            return response, bytes(body)
        else:
            raise AssertionError(f"unexpected {event!r}")


def header(response: h11.Response, name: bytes) -> bytes | None:
    for key, value in response.headers:
        if key == name:
            return bytes(value)
    return None


# -- standard ASGI through the server --------------------------------------------------


def test_json_and_starlette_lifespan(srv: Running) -> None:
    with httpx.Client(base_url=srv.url, timeout=SOCKET_TIMEOUT) as client:
        got = client.get("/echo?a=1&b=%20")
        assert got.status_code == 200
        assert got.json() == {
            "method": "GET",
            "path": "/echo",
            "query": "a=1&b=%20",
            "length": 0,
            "body": "",
        }
        assert got.headers["content-type"] == "application/json"
        assert "date" in got.headers
        posted = client.post("/echo", content=b"x" * 300_000)
        assert posted.json()["length"] == 300_000
        head = client.head("/echo")
        assert head.status_code == 200
        assert head.content == b""
    assert srv.state.lifespan == ["startup"]
    scope = srv.state.scopes[0]
    assert scope["extensions"] == {"chaosllm.plan": {}}
    assert scope["asgi"] == {"version": "3.0", "spec_version": "2.3"}
    assert scope["http_version"] == "1.1"
    assert scope["raw_path"] == b"/echo"
    assert scope["query_string"] == b"a=1&b=%20"
    assert scope["root_path"] == ""
    assert scope["client"][0] == "127.0.0.1"
    assert scope["server"] == (srv.host, srv.port)
    assert (b"host", f"{srv.host}:{srv.port}".encode()) in scope["headers"]


def test_streaming_response_reaches_client_frame_by_frame(srv: Running) -> None:
    srv.state.release.clear()
    with srv.connect() as sock:
        sock.sendall(request_bytes("/stream"))
        data = bytearray()
        # The app holds frame 1 back until we saw frame 0: proves frame 0 was flushed.
        read_until(sock, frame(0), data)
        assert frame(1) not in data
        srv.state.release.set()
        read_until(sock, b"0\r\n\r\n", data)
        head, body = split_head(bytes(data))
        assert b"transfer-encoding: chunked" in head.lower()
        assert body == chunk(frame(0)) + chunk(frame(1)) + chunk(frame(2)) + b"0\r\n\r\n"


def test_keep_alive_two_requests_on_one_socket(srv: Running) -> None:
    with srv.connect() as sock:
        sock.sendall(request_bytes("/echo?n=1"))
        first, body1 = read_response(sock)
        sock.sendall(request_bytes("/echo?n=2", "POST", "Content-Length: 3\r\n") + b"abc")
        second, body2 = read_response(sock)
    assert first.status_code == second.status_code == 200
    assert json.loads(body1)["query"] == "n=1"
    assert json.loads(body2)["body"] == "abc"


def test_pipelined_requests(srv: Running) -> None:
    with srv.connect() as sock:
        sock.sendall(request_bytes("/echo?n=1") + request_bytes("/echo?n=2"))
        leftover = bytearray()
        _, body1 = read_response(sock, leftover)
        _, body2 = read_response(sock, leftover)
    assert json.loads(body1)["query"] == "n=1"
    assert json.loads(body2)["query"] == "n=2"


def test_pipelined_request_during_a_plan_with_delays(srv: Running) -> None:
    # The plan's delays read the socket (to notice a departing client): the next
    # request, read meanwhile, must be kept and served afterwards.
    pieces = (Piece(frame(0)), Piece(frame(1), delay_ms=50))
    srv.endpoint.serve(sse_plan(pieces=pieces))
    with srv.connect() as sock:
        sock.sendall(request_bytes())
        leftover = bytearray()
        read_until(sock, frame(0), leftover)
        sock.sendall(request_bytes("/echo?after=plan"))
        _, body1 = read_response(sock, leftover)
        _, body2 = read_response(sock, leftover)
    assert body1 == frame(0) + frame(1)
    assert json.loads(body2)["query"] == "after=plan"
    assert srv.endpoint.report().outcome is Outcome.COMPLETE


def test_expect_100_continue(srv: Running) -> None:
    with srv.connect() as sock:
        sock.sendall(
            request_bytes("/echo", "POST", "Content-Length: 4\r\nExpect: 100-continue\r\n")
        )
        data = bytearray()
        read_until(sock, b"\r\n\r\n", data)
        assert data.startswith(b"HTTP/1.1 100 ")
        sock.sendall(b"abcd")
        response, body = read_response(sock, data[data.index(b"\r\n\r\n") + 4 :])
    assert response.status_code == 200
    assert json.loads(body)["body"] == "abcd"


def test_connection_close_and_http10(srv: Running) -> None:
    with srv.connect() as sock:
        sock.sendall(request_bytes("/echo", extra="Connection: close\r\n"))
        data = read_until_eof(sock)
    head, body = split_head(data)
    assert head.startswith(b"HTTP/1.1 200")
    assert b"connection: close" in head.lower()
    assert json.loads(body)["path"] == "/echo"
    with srv.connect() as sock:
        sock.sendall(b"GET /echo HTTP/1.0\r\n\r\n")
        data = read_until_eof(sock)
    assert data.startswith(b"HTTP/1.1 200")
    assert json.loads(split_head(data)[1])["method"] == "GET"


def test_app_exception_gives_500(srv: Running) -> None:
    with httpx.Client(base_url=srv.url, timeout=SOCKET_TIMEOUT) as client:
        got = client.get("/boom")
    assert got.status_code == 500


def test_app_exception_before_response_gives_json_500(server_class: ServerClass) -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            raise RuntimeError("no lifespan here")  # must be tolerated
        raise RuntimeError("boom")

    with (
        server_class(app).run_in_thread() as (host, port),
        httpx.Client(timeout=SOCKET_TIMEOUT) as client,
    ):
        got = client.get(f"http://{host}:{port}/")
    assert got.status_code == 500
    assert got.json()["error"]["type"] == "server_error"


def test_oversize_body_gets_413(server_class: ServerClass) -> None:
    with running(server_class, max_body_bytes=1024) as r:
        with r.connect() as sock:
            sock.sendall(request_bytes("/echo", "POST", "Content-Length: 5000\r\n"))
            data = read_until_eof(sock)
        head, body = split_head(data)
        assert head.startswith(b"HTTP/1.1 413")
        assert json.loads(body)["error"] == {
            "message": "Request body too large: the limit is 1024 bytes",
            "type": "invalid_request_error",
            "code": "request_too_large",
        }
        with httpx.Client(base_url=r.url, timeout=SOCKET_TIMEOUT) as client:
            got = client.post("/echo", content=b"y" * 4096)
            assert got.status_code == 413
            assert got.json()["error"]["code"] == "request_too_large"
            # A chunked upload is counted as it arrives.
            streamed = client.post("/echo", content=iter([b"z" * 600, b"z" * 600]))
            assert streamed.status_code == 413
            assert client.post("/echo", content=b"y" * 1024).json()["length"] == 1024


def test_slow_header_timeout(server_class: ServerClass) -> None:
    with running(server_class, header_timeout_s=0.2) as r:
        with r.connect() as sock:
            started = time.monotonic()
            sock.sendall(b"GET /echo HT")
            data = read_until_eof(sock)
            assert time.monotonic() - started < SOCKET_TIMEOUT
        assert data.startswith(b"HTTP/1.1 408")
        with r.connect() as sock:
            # Nothing at all: closed without a word.
            assert read_until_eof(sock) == b""


def test_keepalive_idle_timeout(server_class: ServerClass) -> None:
    with running(server_class, keepalive_timeout_s=0.2) as r, r.connect() as sock:
        sock.sendall(request_bytes("/echo"))
        response, _ = read_response(sock)
        assert response.status_code == 200
        assert sock.recv(1) == b""


def test_malformed_request_gets_400(srv: Running) -> None:
    with srv.connect() as sock:
        sock.sendall(b"THIS IS NOT HTTP\r\n\r\n")
        data = read_until_eof(sock)
    head, body = split_head(data)
    assert head.startswith(b"HTTP/1.1 400")
    assert json.loads(body)["error"]["type"] == "invalid_request_error"


def test_200_concurrent_requests(srv: Running) -> None:
    async def main() -> list[int]:
        statuses: list[int] = []
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(base_url=srv.url, limits=limits, timeout=20) as client:

            async def one() -> None:
                statuses.append((await client.get("/slow")).status_code)

            async with anyio.create_task_group() as tg:
                for _ in range(200):
                    tg.start_soon(one)
        return statuses

    assert anyio.run(main) == [200] * 200


# -- plans -----------------------------------------------------------------------------


def sse_plan(n: int = 3, **changes: Any) -> ResponsePlan:
    plan = ResponsePlan(
        status=200,
        headers=SSE,
        pieces=tuple(Piece(frame(i)) for i in range(n)),
        framing=Framing.CHUNKED,
    )
    return plan.with_(**changes)


def json_plan(**changes: Any) -> ResponsePlan:
    plan = ResponsePlan(
        status=200,
        headers=(("content-type", "application/json"),),
        pieces=(Piece(b'{"id": ', frame=False), Piece(b'"x"}', frame=False)),
    )
    return plan.with_(**changes)


def test_plan_complete_chunked_three_frames_then_keep_alive(srv: Running) -> None:
    srv.endpoint.serve(sse_plan(3))
    with srv.connect() as sock:
        sock.sendall(request_bytes())
        data = bytearray()
        read_until(sock, b"0\r\n\r\n", data)
        head, body = split_head(bytes(data))
        assert head.startswith(b"HTTP/1.1 200 OK")
        assert b"content-type: text/event-stream" in head
        assert body == chunk(frame(0)) + chunk(frame(1)) + chunk(frame(2)) + b"0\r\n\r\n"
        report = srv.endpoint.report()
        assert report == PlanReport(
            frames_sent=3, bytes_sent=3 * len(frame(0)), head_sent=True, outcome=Outcome.COMPLETE
        )
        # The connection is reusable.
        sock.sendall(request_bytes("/echo"))
        response, _ = read_response(sock)
        assert response.status_code == 200


def test_plan_complete_length_with_httpx(srv: Running) -> None:
    srv.endpoint.serve(json_plan())
    with httpx.Client(base_url=srv.url, timeout=SOCKET_TIMEOUT) as client:
        got = client.post("/plan", json={"q": 1})
        assert got.json() == {"id": "x"}
        assert got.headers["content-length"] == str(len(b'{"id": "x"}'))
        # PlanResponse, as a route returns it.
        assert client.get("/plan-response").json() == {"id": "x"}
    report = srv.endpoint.report()
    assert report.frames_sent == 0
    assert report.bytes_sent == len(b'{"id": "x"}')


def test_plan_close_after(srv: Running) -> None:
    srv.endpoint.serve(json_plan(close_after=True))
    with srv.connect() as sock:
        sock.sendall(request_bytes())
        head, body = split_head(read_until_eof(sock))
    assert b"connection: close" in head.lower()
    assert body == b'{"id": "x"}'


def test_plan_close_mid_chunked_body(srv: Running) -> None:
    srv.endpoint.serve(sse_plan(2, ending=Ending.CLOSE))
    with srv.connect() as sock:
        sock.sendall(request_bytes())
        data = read_until_eof(sock)
    _, body = split_head(data)
    assert body == chunk(frame(0)) + chunk(frame(1))
    assert not body.endswith(b"0\r\n\r\n")
    report = srv.endpoint.report()
    assert (report.frames_sent, report.outcome) == (2, Outcome.COMPLETE)
    with (
        httpx.Client(base_url=srv.url, timeout=SOCKET_TIMEOUT) as client,
        pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)),
        client.stream("GET", "/plan") as response,
    ):
        for _ in response.iter_bytes():
            pass


def test_plan_close_with_content_length_larger_than_body(srv: Running) -> None:
    srv.endpoint.serve(json_plan(content_length=100, ending=Ending.CLOSE))
    with srv.connect() as sock:
        sock.sendall(request_bytes())
        head, body = split_head(read_until_eof(sock))
    assert b"content-length: 100" in head.lower()
    assert body == b'{"id": "x"}'
    with (
        httpx.Client(base_url=srv.url, timeout=SOCKET_TIMEOUT) as client,
        pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)),
    ):
        client.get("/plan")


def test_plan_reset(srv: Running) -> None:
    srv.endpoint.serve(sse_plan(2, ending=Ending.RESET))
    with srv.connect() as sock:
        sock.sendall(request_bytes())
        with pytest.raises(ConnectionResetError):
            read_until_eof(sock)
    assert srv.endpoint.report().outcome is Outcome.COMPLETE
    with (
        httpx.Client(base_url=srv.url, timeout=SOCKET_TIMEOUT) as client,
        pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)),
    ):
        client.get("/plan")


def test_plan_stall_until_client_gives_up(srv: Running) -> None:
    srv.endpoint.serve(sse_plan(1, ending=Ending.STALL, stall_ms=2000))
    with srv.connect() as sock:
        sock.sendall(request_bytes())
        data = bytearray()
        read_until(sock, frame(0), data)
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(65536)
    # The client went away during the stall: noticed, and reported.
    report = srv.endpoint.report()
    assert report.outcome is Outcome.CLIENT_GONE
    assert report.frames_sent == 1


def test_plan_stall_bounded_by_stall_ms(srv: Running) -> None:
    srv.endpoint.serve(sse_plan(1, ending=Ending.STALL, stall_ms=100))
    with srv.connect() as sock:
        sock.sendall(request_bytes())
        started = time.monotonic()
        data = read_until_eof(sock)
        assert time.monotonic() - started >= 0.09 - CLOCK_SLACK
    assert split_head(data)[1] == chunk(frame(0))
    assert srv.endpoint.report().outcome is Outcome.COMPLETE
    with (
        httpx.Client(base_url=srv.url, timeout=SOCKET_TIMEOUT) as client,
        pytest.raises(httpx.RemoteProtocolError),
    ):
        client.get("/plan")


def test_plan_empty_reply(srv: Running) -> None:
    srv.endpoint.serve(ResponsePlan(200, (), (), send_head=False, ending=Ending.CLOSE))
    with srv.connect() as sock:
        sock.sendall(request_bytes())
        assert sock.recv(65536) == b""
    report = srv.endpoint.report()
    assert report == PlanReport(head_sent=False, outcome=Outcome.COMPLETE)
    with (
        httpx.Client(base_url=srv.url, timeout=SOCKET_TIMEOUT) as client,
        pytest.raises(httpx.RemoteProtocolError),
    ):
        client.get("/plan")


def test_plan_garbage_without_head(srv: Running) -> None:
    garbage = b"\x00\xffnot http at all\r\n\r\n"
    pieces = (Piece(garbage[:5], frame=False), Piece(garbage[5:], delay_ms=20, frame=False))
    srv.endpoint.serve(ResponsePlan(200, (), pieces, send_head=False, ending=Ending.CLOSE))
    with srv.connect() as sock:
        sock.sendall(request_bytes())
        assert read_until_eof(sock) == garbage
    report = srv.endpoint.report()
    assert (report.bytes_sent, report.head_sent) == (len(garbage), False)


def test_plan_head_delay_and_piece_delays(srv: Running) -> None:
    pieces = (Piece(frame(0)), Piece(frame(1), delay_ms=100))
    srv.endpoint.serve(sse_plan(head_delay_ms=200, pieces=pieces))
    with httpx.Client(base_url=srv.url, timeout=SOCKET_TIMEOUT) as client:
        started = time.monotonic()
        with client.stream("GET", "/plan") as response:
            headed = time.monotonic()
            body = response.read()
        ended = time.monotonic()
    assert headed - started >= 0.19
    assert ended - started >= 0.29
    assert body == frame(0) + frame(1)


def test_plan_client_gone_during_piece_delay(srv: Running) -> None:
    pieces = (Piece(frame(0)), Piece(frame(1), delay_ms=3000))
    srv.endpoint.serve(sse_plan(pieces=pieces))
    started = time.monotonic()
    with srv.connect() as sock:
        sock.sendall(request_bytes())
        read_until(sock, frame(0), bytearray())
    report = srv.endpoint.report()
    assert report.outcome is Outcome.CLIENT_GONE
    assert report.frames_sent == 1
    assert time.monotonic() - started < 2.5  # noticed during the delay, not after it


# -- shutdown --------------------------------------------------------------------------


def test_shutdown_with_idle_keep_alive_connection(server_class: ServerClass) -> None:
    with running(server_class) as r, r.connect() as sock:
        sock.sendall(request_bytes("/echo"))
        response, _ = read_response(sock)
        assert response.status_code == 200
        started = time.monotonic()
        r.server.request_shutdown()  # thread-safe
        assert sock.recv(1) == b""
        assert time.monotonic() - started < 3
    assert r.state.lifespan == ["startup", "shutdown"]


def test_shutdown_lets_in_flight_request_finish(server_class: ServerClass) -> None:
    with running(server_class) as r:
        pieces = (Piece(frame(0)), Piece(frame(1), delay_ms=200))
        r.endpoint.serve(sse_plan(pieces=pieces))
        with r.connect() as sock:
            sock.sendall(request_bytes())
            data = bytearray()
            read_until(sock, frame(0), data)
            r.server.request_shutdown()
            data += read_until_eof(sock)
        # The response was finished, then the connection closed (no keep-alive).
        assert split_head(bytes(data))[1] == chunk(frame(0)) + chunk(frame(1)) + b"0\r\n\r\n"
        assert r.endpoint.report().outcome is Outcome.COMPLETE


def test_lifespan_failure_and_bind_failure_raise_server_error(server_class: ServerClass) -> None:
    @contextlib.asynccontextmanager
    async def failing(app: Starlette) -> AsyncIterator[None]:
        raise RuntimeError("no database")
        yield

    with pytest.raises(ServerError, match="lifespan"):
        anyio.run(server_class(Starlette(lifespan=failing)).serve)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        raise AssertionError("never called")

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ServerError, match="cannot listen"):
            anyio.run(server_class(app, port=port).serve)


def test_serve_in_task_group(server_class: ServerClass) -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def main() -> int:
        server = server_class(app)
        async with anyio.create_task_group() as tg:
            host, port = await tg.start(server.serve)
            async with httpx.AsyncClient(timeout=SOCKET_TIMEOUT) as client:
                status = (await client.get(f"http://{host}:{port}/")).status_code
            await server.shutdown()
        return status

    assert anyio.run(main) == 204
