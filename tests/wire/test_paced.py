"""Paced plans on the builtin server's fast path (`direct`): executed from the loop's
callbacks on one shared timer heap (`Player`, `Pacer`) instead of a task per answer,
they put the same bytes on the wire, end the connection the same way and fill the same
report as the same plan sent through the ASGI app (``chaosllm.plan``, run by a task as
before), on real sockets: every ending, the client leaving during a delay, a reader too
slow for the transport's buffer, many streams at once, shutdown's grace running out."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from chaosllm.core.report import Outcome, PlanReport
from chaosllm.model import Ending, Framing, Piece, ResponsePlan
from chaosllm.wire import WireServer, send_plan
from chaosllm.wire.asgi import Receive, Scope, Send
from chaosllm.wire.pacer import Pacer
from chaosllm.wire.player import Player
from chaosllm.wire.protocol import Connection

pytestmark = pytest.mark.timeout(60)

SOCKET_TIMEOUT = 5.0
SSE = (("content-type", "text/event-stream"),)
PATHS = ("/direct", "/asgi")


def frame(i: int, size: int = 0) -> bytes:
    return b'data: {"n": %d, "pad": "%s"}\n\n' % (i, b"x" * size)


@dataclass
class Plans:
    """The plan both paths serve, and every report filled, by path."""

    plan: ResponsePlan | None = None
    reports: list[tuple[str, PlanReport]] = field(default_factory=list)
    finished: threading.Condition = field(default_factory=threading.Condition)

    def new_report(self, path: str) -> PlanReport:
        report = PlanReport()
        with self.finished:
            self.reports.append((path, report))
        return report

    def done(self, count: int) -> list[tuple[str, PlanReport]]:
        """The reports, once `count` of them have an outcome."""

        def finished() -> bool:
            return sum(r.outcome is not None for _, r in self.reports) >= count

        with self.finished:
            assert self.finished.wait_for(finished, SOCKET_TIMEOUT), self.reports
            return list(self.reports)

    def notify(self) -> None:
        with self.finished:
            self.finished.notify_all()


@contextlib.contextmanager
def serving(**options: Any) -> Iterator[tuple[str, int, Plans]]:
    plans = Plans()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        assert plans.plan is not None
        report = plans.new_report("/asgi")
        try:
            await send_plan(scope, receive, send, plans.plan, report)
        finally:
            plans.notify()

    def direct(
        method: str,
        path: str,
        query: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        kept: Any = None,
        /,
    ) -> tuple[ResponsePlan, PlanReport] | None:
        if path != "/direct":
            return None
        assert plans.plan is not None
        return plans.plan, plans.new_report(path)

    server = WireServer(app, direct=direct, **options)
    # The fast path's report is filled outside any task: wake the waiting test on each.
    done = Connection.cycle_done

    def cycle_done(conn: Any, keep: bool) -> None:
        done(conn, keep)
        plans.notify()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Connection, "cycle_done", cycle_done)
        with server.run_in_thread() as (host, port):
            yield host, port, plans


def request(path: str, *, version: str = "1.1", method: str = "GET", close: bool = True) -> bytes:
    extra = "Connection: close\r\n" if close else ""
    return f"{method} {path} HTTP/{version}\r\nHost: test\r\n{extra}\r\n".encode()


def read_all(sock: socket.socket) -> tuple[bytes, str]:
    """Every byte until the server ends the connection, and how: FIN or RST."""
    data = bytearray()
    while True:
        try:
            got = sock.recv(65536)
        except ConnectionResetError:
            return bytes(data), "rst"
        if not got:
            return bytes(data), "fin"
        data += got


def normal(data: bytes) -> bytes:
    return re.sub(rb"\r\ndate: [^\r]*", b"\r\ndate: -", data, flags=re.IGNORECASE)


def paced(n: int = 3, delay_ms: float = 15, **changes: Any) -> ResponsePlan:
    plan = ResponsePlan(
        status=200,
        headers=SSE,
        pieces=tuple(Piece(frame(i), delay_ms=delay_ms) for i in range(n)),
        framing=Framing.CHUNKED,
    )
    return plan.with_(**changes)


VARIANTS: dict[str, tuple[ResponsePlan, dict[str, Any]]] = {
    "chunked": (paced(), {}),
    "head-delay-only": (paced(delay_ms=0, head_delay_ms=20), {}),
    "length": (paced(framing=Framing.LENGTH), {}),
    "length-short": (paced(framing=Framing.LENGTH, content_length=10), {}),
    "length-long": (paced(framing=Framing.LENGTH, content_length=10_000), {}),
    "close": (paced(ending=Ending.CLOSE), {}),
    "reset": (paced(ending=Ending.RESET), {}),
    "stall": (paced(ending=Ending.STALL, stall_ms=40), {}),
    "raw": (paced(send_head=False, ending=Ending.CLOSE), {}),
    "close-after": (paced(close_after=True), {}),
    "http10": (paced(), {"version": "1.0"}),
    "head-request": (paced(), {"method": "HEAD"}),
    "keep-alive-asked": (paced(), {"close": False, "version": "1.0"}),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_a_paced_plan_is_the_same_on_both_paths(name: str) -> None:
    plan, how = VARIANTS[name]
    seen: dict[str, tuple[bytes, str, float]] = {}
    with serving() as (host, port, plans):
        plans.plan = plan
        for path in PATHS:
            with socket.create_connection((host, port), timeout=SOCKET_TIMEOUT) as sock:
                started = time.monotonic()
                sock.sendall(request(path, **how))
                data, end = read_all(sock)
                seen[path] = (normal(data), end, time.monotonic() - started)
        reports = dict(plans.done(2))
    assert seen["/direct"][:2] == seen["/asgi"][:2]
    assert reports["/direct"] == reports["/asgi"]
    delays = plan.head_delay_ms + sum(p.delay_ms for p in plan.pieces)
    assert seen["/direct"][2] >= delays / 1000 - 0.002  # never early (monotonic clock)


@pytest.mark.parametrize("path", PATHS)
def test_keep_alive_after_a_paced_answer(path: str) -> None:
    with serving() as (host, port, plans):
        plans.plan = paced()
        with socket.create_connection((host, port), timeout=SOCKET_TIMEOUT) as sock:
            sock.sendall(request(path, close=False))
            got = bytearray()
            while not got.endswith(b"0\r\n\r\n"):
                got += sock.recv(65536)
            sock.sendall(request(path))
            rest, end = read_all(sock)
        reports = plans.done(2)
    assert got.count(b"\n\n") == 3 and rest.count(b"\n\n") == 3 and end == "fin"
    assert [r.outcome for _, r in reports] == [Outcome.COMPLETE, Outcome.COMPLETE]


@pytest.mark.parametrize("half", [False, True], ids=["close", "half-close"])
def test_the_client_leaving_during_a_delay_ends_the_answer_on_both_paths(half: bool) -> None:
    """The first frame read, the client closes (or only shuts its side): the server, in
    the 300 ms delay before the second, stops there - gone, one frame sent - and closes."""
    ends: dict[str, str] = {}
    with serving() as (host, port, plans):
        plans.plan = paced(delay_ms=300)
        for path in PATHS:
            with socket.create_connection((host, port), timeout=SOCKET_TIMEOUT) as sock:
                sock.sendall(request(path))
                got = bytearray()
                while frame(0) not in got:
                    got += sock.recv(65536)
                started = time.monotonic()
                if half:
                    sock.shutdown(socket.SHUT_WR)
                    data, ends[path] = read_all(sock)
                    assert data == b"" and time.monotonic() - started < 0.25
        reports = dict(plans.done(2))
    for path in PATHS:
        assert reports[path].outcome is Outcome.CLIENT_GONE
        assert reports[path].frames_sent == 1
    assert reports["/direct"] == reports["/asgi"]
    if half:
        assert ends == {"/direct": "fin", "/asgi": "fin"}


def test_a_reader_too_slow_for_the_buffer_gets_every_byte_on_both_paths() -> None:
    """Frames of 2 MB: the transport's buffer goes over its high-water mark at the first,
    and the rest of the answer waits for it to drain (the fast path hands it to a task),
    still paced; the bytes are the same on both paths."""
    handed = 0
    hand_over = Player._hand_over

    def counting(player: Any) -> None:
        nonlocal handed
        handed += 1
        hand_over(player)

    big = 2 * 1024 * 1024
    plan = ResponsePlan(
        status=200,
        headers=SSE,
        pieces=tuple(Piece(frame(i, big), delay_ms=10) for i in range(3)),
        framing=Framing.CHUNKED,
    )
    seen: dict[str, bytes] = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Player, "_hand_over", counting)
        with serving() as (host, port, plans):
            plans.plan = plan
            for path in PATHS:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                with sock:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                    sock.settimeout(SOCKET_TIMEOUT)
                    sock.connect((host, port))
                    sock.sendall(request(path))
                    data, end = read_all(sock)
                    assert end == "fin"
                    seen[path] = normal(data)
            reports = dict(plans.done(2))
    assert handed >= 1
    assert seen["/direct"] == seen["/asgi"]
    assert seen["/direct"].count(b"\n\n") == 3
    assert reports["/direct"] == reports["/asgi"]
    assert reports["/direct"].outcome is Outcome.COMPLETE


def test_many_paced_streams_at_once_each_complete_and_in_order() -> None:
    """200 streams of 5 frames 20 ms apart, all at once, on the fast path: each gets its
    frames in order and whole, each report says complete, and none finished before its
    delays had passed."""
    n = 200
    with serving() as (host, port, plans):
        plans.plan = paced(5, delay_ms=20)
        socks = [socket.create_connection((host, port), timeout=SOCKET_TIMEOUT) for _ in range(n)]
        try:
            started = time.monotonic()
            for sock in socks:
                sock.sendall(request("/direct"))
            bodies = [read_all(sock) for sock in socks]
            elapsed = time.monotonic() - started
        finally:
            for sock in socks:
                sock.close()
        reports = plans.done(n)
    assert elapsed >= 0.1 - 0.002
    expected = bodies[0][0].partition(b"\r\n\r\n")[2]
    assert expected == b"".join(b"%x\r\n%s\r\n" % (len(frame(i)), frame(i)) for i in range(5)) + (
        b"0\r\n\r\n"
    )
    assert all(body.partition(b"\r\n\r\n")[2] == expected for body, _ in bodies)
    assert all(end == "fin" for _, end in bodies)
    assert len(reports) == n
    assert all(r.outcome is Outcome.COMPLETE and r.frames_sent == 5 for _, r in reports)


def test_shutdown_ends_a_paced_answer_after_the_grace_as_on_the_asgi_path() -> None:
    """A stream with a second between frames, the server told to stop: after the grace
    (0.2 s) both paths end it the same way - the connection closed, the report an
    error, one frame sent."""
    ends: dict[str, tuple[bytes, str]] = {}
    reports: dict[str, PlanReport] = {}
    for path in PATHS:
        with serving(graceful_timeout_s=0.2) as (host, port, plans):
            plans.plan = paced(delay_ms=1000)
            sock = socket.create_connection((host, port), timeout=SOCKET_TIMEOUT)
            sock.sendall(request(path))
            got = bytearray()
            while frame(0) not in got:
                got += sock.recv(65536)
        # run_in_thread has returned: the server has stopped.
        with sock:
            rest, end = read_all(sock)
        ends[path] = (rest, end)
        [(_, reports[path])] = plans.done(1)
    assert ends["/direct"] == ends["/asgi"] == (b"", "fin")
    assert reports["/direct"] == reports["/asgi"]
    assert reports["/direct"].outcome is Outcome.ERROR
    assert reports["/direct"].frames_sent == 1


def test_pipelined_requests_get_their_paced_answers_in_order_on_both_paths() -> None:
    seen: dict[str, tuple[bytes, str]] = {}
    with serving() as (host, port, plans):
        plans.plan = paced()
        for path in PATHS:
            with socket.create_connection((host, port), timeout=SOCKET_TIMEOUT) as sock:
                sock.sendall(request(path, close=False) + request(path))
                data, end = read_all(sock)
                seen[path] = (normal(data), end)
        reports = plans.done(4)
    assert seen["/direct"] == seen["/asgi"]
    assert seen["/direct"][0].count(b"HTTP/1.1 200 ") == 2
    assert seen["/direct"][0].count(b"\n\n") == 6
    assert [r.outcome for _, r in reports] == [Outcome.COMPLETE] * 4


class _Ticking:
    """A player of the pacer's own shape (``entry``, ``due``) that asks to run again
    1 us after each run, and notes how many turns of the loop had passed each time."""

    def __init__(self, pacer: Any, turns: list[int]) -> None:
        self.pacer = pacer
        self.turns = turns
        self.seen: list[int] = []
        self.entry = 0

    def due(self) -> None:
        self.seen.append(self.turns[0])
        if len(self.seen) < 50:
            self.entry = self.pacer.add(time.monotonic() + 1e-6, self)


def test_the_pacer_runs_no_player_twice_in_one_pass() -> None:
    """Streams whose delays are shorter than a pass (1 us) still give the loop a turn
    between two of their frames (in which it reads its sockets: an EOF, a close), as
    their own timer per frame did."""
    loop = asyncio.new_event_loop()
    try:
        pacer = Pacer(loop)
        turns = [0]

        def turn() -> None:
            turns[0] += 1
            loop.call_soon(turn)

        players = [_Ticking(pacer, turns) for _ in range(3)]
        for player in players:
            player.entry = pacer.add(time.monotonic(), cast(Any, player))
        loop.call_soon(turn)
        deadline = time.monotonic() + 5
        while any(len(p.seen) < 50 for p in players) and time.monotonic() < deadline:
            loop.run_until_complete(asyncio.sleep(0.01))
    finally:
        loop.close()
    for player in players:
        assert len(player.seen) == 50
        assert all(b > a for a, b in itertools.pairwise(player.seen)), player.seen
