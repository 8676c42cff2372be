"""send_plan outside chaosllm's server: the degraded path (httpx.ASGITransport, uvicorn)."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator

import anyio
import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from chaosllm.core.report import Outcome, PlanReport
from chaosllm.model import Ending, Framing, Piece, ResponsePlan
from chaosllm.wire import PlanAborted, PlanResponse, send_plan
from chaosllm.wire.asgi import Receive, Scope, Send
from tests.helpers import read_until_eof

pytestmark = pytest.mark.timeout(30)

FRAMES = tuple(b'data: {"n": %d}\n\n' % i for i in range(3))


def sse_plan(**changes: object) -> ResponsePlan:
    plan = ResponsePlan(
        status=200,
        headers=(("content-type", "text/event-stream"),),
        pieces=tuple(Piece(f) for f in FRAMES),
        framing=Framing.CHUNKED,
    )
    return plan.with_(**changes)


class Holder:
    """The plan to serve next and the reports of what was served."""

    def __init__(self) -> None:
        self.plan = sse_plan()
        self.reports: list[PlanReport] = []
        self.done = threading.Event()


def make_app(holder: Holder) -> Starlette:
    async def plan_route(request: Request) -> PlanResponse:
        report = PlanReport()
        holder.reports.append(report)
        return PlanResponse(holder.plan, report)

    return Starlette(routes=[Route("/plan", plan_route), Route("/raw", RawEndpoint(holder))])


class RawEndpoint:
    """A plain ASGI endpoint (Starlette routes to callables that are not functions as ASGI)."""

    def __init__(self, holder: Holder) -> None:
        self.holder = holder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        report = PlanReport()
        try:
            await send_plan(scope, receive, send, self.holder.plan, report)
        finally:
            self.holder.reports.append(report)
            self.holder.done.set()


def test_complete_plan_through_asgi_transport() -> None:
    holder = Holder()
    holder.plan = sse_plan(pieces=(Piece(FRAMES[0]), Piece(FRAMES[1], delay_ms=10)))

    async def main() -> httpx.Response:
        transport = httpx.ASGITransport(app=make_app(holder))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.get("/plan")

    response = anyio.run(main)
    assert response.status_code == 200
    assert response.content == FRAMES[0] + FRAMES[1]
    assert response.headers["content-type"] == "text/event-stream"
    (report,) = holder.reports
    assert report == PlanReport(
        frames_sent=2,
        bytes_sent=len(FRAMES[0] + FRAMES[1]),
        head_sent=True,
        outcome=Outcome.COMPLETE,
        degraded=None,
    )


def test_length_plan_through_asgi_transport() -> None:
    holder = Holder()
    body = b'{"id": "x"}'
    holder.plan = ResponsePlan(200, (("content-type", "application/json"),), (Piece(body),))

    async def main() -> httpx.Response:
        transport = httpx.ASGITransport(app=make_app(holder))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.get("/plan")

    response = anyio.run(main)
    assert response.content == body
    assert response.headers["content-length"] == str(len(body))


def test_no_head_under_asgi_transport_aborts_before_the_response(
    caplog: pytest.LogCaptureFixture,
) -> None:
    holder = Holder()
    holder.plan = ResponsePlan(200, (), (), send_head=False, ending=Ending.CLOSE)

    async def main() -> None:
        transport = httpx.ASGITransport(app=make_app(holder))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            await client.get("/raw")

    with caplog.at_level(logging.WARNING, logger="chaosllm.wire"), pytest.raises(PlanAborted):
        anyio.run(main)
    (report,) = holder.reports
    assert report.degraded is not None
    assert "send_head=False" in report.degraded
    assert report.head_sent is False


@contextlib.contextmanager
def uvicorn_server(app: Starlette) -> Iterator[str]:
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, lifespan="off", log_level="critical", http="httptools"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:  # bounded wait for the server thread to bind
            assert thread.is_alive(), "uvicorn failed to start"
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        assert not thread.is_alive()


def test_close_mid_stream_under_uvicorn(caplog: pytest.LogCaptureFixture) -> None:
    holder = Holder()
    holder.plan = sse_plan(
        pieces=(Piece(FRAMES[0]), Piece(FRAMES[1], delay_ms=5)), ending=Ending.CLOSE
    )
    with uvicorn_server(make_app(holder)) as url:
        with (
            caplog.at_level(logging.WARNING, logger="chaosllm.wire"),
            httpx.Client(base_url=url, timeout=5) as client,
            pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)),
            client.stream("GET", "/raw") as response,
        ):
            for _ in response.iter_bytes():
                pass
        assert holder.done.wait(5)
        # The same on a raw socket: two frames, then EOF without the terminating chunk.
        holder.done.clear()
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(b"GET /raw HTTP/1.1\r\nHost: test\r\n\r\n")
            data = read_until_eof(sock)
        assert data.startswith(b"HTTP/1.1 200")
        assert FRAMES[1] in data
        assert not data.endswith(b"0\r\n\r\n")
        assert holder.done.wait(5)
    report = holder.reports[0]
    assert report.frames_sent == 2
    assert report.head_sent is True
    assert report.outcome is Outcome.COMPLETE
    assert report.degraded is not None
    assert "CLOSE" in report.degraded


def test_length_close_under_uvicorn_declares_the_length() -> None:
    holder = Holder()
    holder.plan = ResponsePlan(
        200, (), (Piece(b'{"id": '),), content_length=100, ending=Ending.CLOSE
    )
    with uvicorn_server(make_app(holder)) as url:
        with (
            httpx.Client(base_url=url, timeout=5) as client,
            pytest.raises(httpx.RemoteProtocolError),
        ):
            client.get("/raw")
        assert holder.done.wait(5)
    assert holder.reports[0].degraded is not None
