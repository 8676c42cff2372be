"""The wire program and its two executors, in memory (no socket).

- The program's bytes are h11's: for any plan and any kind of request, the segments of
  `compile_program` joined are what h11 writes for the plan's head and pieces (h11 is
  the reference for heads and framing; both servers now write the program), and the
  connection is kept alive exactly when h11 would.
- The callback executor (`Player`, `play_at_once`, on a real loop and `Pacer`) and the
  awaiting one (`execute`) put the same bytes into the same kind of end (kept, FIN,
  RST), fill the same report and agree on keep-alive, for any plan; also when the client
  has left before the first byte, or leaves during the first delay.
- A program is compiled once per plan and variant and kept on the plan, which stays
  equal to (and hashes as) a plan that never compiled.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import re
import threading
from dataclasses import dataclass, field

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaosllm.core.report import Outcome, PlanReport
from chaosllm.model import Ending, Framing, ResponsePlan
from chaosllm.wire.executor import execute
from chaosllm.wire.flow import FlowControl
from chaosllm.wire.head import PHRASES
from chaosllm.wire.pacer import Pacer
from chaosllm.wire.player import Player, play_at_once
from chaosllm.wire.program import Program, compile_program, program_for
from tests.helpers import wire_plans

pytestmark = pytest.mark.timeout(120)

plans = wire_plans(delay_ms=1.0, stall_ms=2.0, endings=list(Ending))


@dataclass(frozen=True)
class Variant:
    method: bytes
    version: bytes
    client_close: bool
    server_close: bool

    def options(self) -> dict[str, bool]:
        http10 = self.version != b"1.1"
        return {
            "is_head": self.method == b"HEAD",
            "http10": http10,
            "keep_alive": not (http10 or self.client_close),
            "close": self.server_close,
        }


variants = st.builds(
    Variant,
    method=st.sampled_from([b"GET", b"HEAD", b"POST"]),
    version=st.sampled_from([b"1.1", b"1.0"]),
    client_close=st.booleans(),
    server_close=st.booleans(),
)
_DATE = re.compile(rb"(?im)^date: [^\r\n]*\r\n")


def undated(data: bytes) -> bytes:
    return _DATE.sub(b"date: -\r\n", data)


# -- the program's bytes are h11's ------------------------------------------------------


def h11_wire(plan: ResponsePlan, variant: Variant) -> tuple[bytes, bool]:
    """What h11 writes for `plan` answering `variant`'s request (as the h11 server did
    before it ran programs), and whether the connection is then kept alive."""
    conn = h11.Connection(h11.SERVER)
    headers = [(b"host", b"test")]
    if variant.client_close:
        headers.append((b"connection", b"close"))
    request = b"%s / HTTP/%s\r\n" % (variant.method, variant.version)
    request += b"".join(b"%s: %s\r\n" % pair for pair in headers) + b"\r\n"
    conn.receive_data(request)
    assert type(conn.next_event()) is h11.Request
    assert type(conn.next_event()) is h11.EndOfMessage
    out: list[bytes] = []
    raw = not plan.send_head
    is_head = variant.method == b"HEAD"
    if plan.send_head:
        head = [
            (name.encode("latin-1"), value.encode("latin-1"))
            for name, value in plan.headers
            if name.lower() not in ("content-length", "transfer-encoding")
        ]
        if plan.framing is Framing.LENGTH:
            head.append((b"content-length", b"%d" % plan.declared_length))
        else:
            head.append((b"transfer-encoding", b"chunked"))
        if not any(name.lower() == b"date" for name, _ in head):
            head.append((b"date", b"-"))
        if variant.server_close or plan.close_after:
            head.append((b"connection", b"close"))
        reason = PHRASES.get(plan.status, b"")
        response = h11.Response(status_code=plan.status, headers=head, reason=reason)
        out.append(conn.send(response) or b"")
    for piece in plan.pieces:
        if raw:
            out.append(piece.data)
        elif piece.data and not is_head:
            try:
                out.append(conn.send(h11.Data(data=piece.data)) or b"")
            except h11.LocalProtocolError:
                raw = True
                out.append(piece.data)
    keep = False
    if plan.ending is Ending.COMPLETE and not raw:
        try:
            out.append(conn.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError:
            pass
        else:
            keep = conn.our_state is h11.DONE
    return b"".join(out), keep


def program_wire(program: Program) -> bytes:
    return b"".join(
        program.first() if index == 0 else segment[1]
        for index, segment in enumerate(program.segments)
    )


@settings(max_examples=300, deadline=None)
@given(plan=plans, variant=variants)
def test_a_program_writes_what_h11_writes(plan: ResponsePlan, variant: Variant) -> None:
    try:
        expected, keep = h11_wire(plan, variant)
    except h11.LocalProtocolError:
        with pytest.raises(RuntimeError):
            compile_program(plan, **variant.options())
        return
    program = compile_program(plan, **variant.options())
    assert undated(program_wire(program)) == undated(expected)
    assert program.keep == keep


# -- the two executors agree ------------------------------------------------------------


@dataclass
class Line:
    """A connection in memory, for both executors: what is written, and how it ends."""

    loop: asyncio.AbstractEventLoop
    pacer: Pacer
    eof: bool = False
    closed: bool = False
    gone: bool = False
    must_close: bool = False
    flow: FlowControl = field(default_factory=FlowControl)
    waiters: list[asyncio.Future[None]] = field(default_factory=list)
    player: Player | None = None
    written: list[bytes] = field(default_factory=list)
    held: list[bytes] = field(default_factory=list)
    """Written at once, for the end of the loop's turn (`send_at_turn_end`)."""
    end: str = "open"
    kept: bool | None = None
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    # the callback executor's `Line`

    def send(self, data: bytes) -> None:
        self.uncork()
        assert not self.closed
        self.written.append(data)

    def send_at_turn_end(self, data: bytes) -> None:
        """As the server's connection does: held back until the loop's turn ends."""
        if not self.held:
            self.loop.call_soon(self.uncork)
        self.held.append(data)

    def uncork(self) -> None:
        held, self.held = self.held, []
        if held and not self.closed:
            self.written.extend(held)

    def close(self) -> None:
        self.uncork()
        if not self.closed:
            self.closed = True
            self.end = "fin"
            self._wake()

    def cycle_done(self, keep: bool) -> None:
        """As the server's connection does: close unless kept."""
        self.player = None
        self.kept = keep and not self.must_close
        if not self.kept:
            self.close()
        self.finished.set()

    def continue_in_task(self, program: Program, report: PlanReport, start: int) -> None:
        async def rest() -> None:
            self.cycle_done(await execute(program, Sink(self), report, start))

        task = self.loop.create_task(rest())
        self.tasks.add(task)

    def leave(self) -> None:
        """The client half-closes (EOF)."""
        self.eof = True
        self._wake()

    def _wake(self) -> None:
        for future in self.waiters:
            if not future.done():
                future.set_result(None)


@dataclass
class Sink:
    """`Line` as the awaiting executor's sink."""

    line: Line

    def open(self) -> bool:
        return not (self.line.closed or self.line.gone)

    async def drain(self) -> None:
        pass

    async def write(self, data: bytes) -> bool:
        if not self.open():
            return False
        if data:
            self.line.send(data)
        return True

    async def pause(self, seconds: float) -> bool:
        line = self.line
        if not (line.eof or line.closed):
            future = line.loop.create_future()
            line.waiters.append(future)
            timer = line.loop.call_later(seconds, future.set_result, None)
            try:
                await future
            finally:
                timer.cancel()
                line.waiters.remove(future)
        if line.eof or line.closed:
            line.gone = True
            return False
        return True

    async def close(self) -> None:
        self.line.close()

    async def reset(self) -> None:
        line = self.line
        if not line.closed:
            line.closed = True
            line.end = "rst"


@dataclass(frozen=True)
class Run:
    wire: bytes
    end: str
    kept: bool | None
    report: tuple[object, ...]


def counts(report: PlanReport) -> tuple[object, ...]:
    return (report.head_sent, report.frames_sent, report.bytes_sent, report.outcome)


async def by_callbacks(program: Program, leave: str) -> Run:
    loop = asyncio.get_running_loop()
    line = Line(loop, Pacer(loop))
    report = PlanReport()
    if leave == "before":
        line.gone = True
    if program.instant:
        play_at_once(line, program, report)
        line.kept = not line.closed
        await asyncio.sleep(0)  # the turn ends: what was held back is written
        assert not line.held
    else:
        line.player = player = Player(line, program, report)
        loop.call_soon(player.start)
        if leave == "during":
            loop.call_soon(line.leave)
        await asyncio.wait_for(line.finished.wait(), 10)
        if line.tasks:
            await asyncio.wait(line.tasks)
    return Run(undated(b"".join(line.written)), line.end, line.kept, counts(report))


async def awaiting(program: Program, leave: str) -> Run:
    loop = asyncio.get_running_loop()
    line = Line(loop, Pacer(loop))
    report = PlanReport()
    if leave == "before":
        line.gone = True
    if leave == "during" and not program.instant:
        loop.call_soon(line.leave)
    line.cycle_done(await asyncio.wait_for(execute(program, Sink(line), report), 10))
    return Run(undated(b"".join(line.written)), line.end, line.kept, counts(report))


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(plan=plans, variant=variants, leave=st.sampled_from(["never", "never", "before", "during"]))
def test_both_executors_write_the_same_bytes_and_end_alike(
    plan: ResponsePlan, variant: Variant, leave: str
) -> None:
    try:
        program = compile_program(plan, **variant.options())
    except RuntimeError:
        return
    callbacks = asyncio.run(by_callbacks(program, leave))
    awaited = asyncio.run(awaiting(program, leave))
    assert callbacks == awaited
    if leave == "never":
        assert callbacks.report[3] is Outcome.COMPLETE
        assert callbacks.wire == undated(program_wire(program))
        expected = {0: "open" if program.keep else "fin", 1: "fin", 2: "rst", 3: "fin"}
        assert callbacks.end == expected[program.ending]
    elif leave == "before":
        assert callbacks.report[3] is Outcome.CLIENT_GONE
        assert callbacks.wire == b""


# -- compiled once, kept on the plan --------------------------------------------------------


def test_a_plan_keeps_its_programs_and_its_value() -> None:
    plan = ResponsePlan(status=200, headers=(("content-type", "text/plain"),), pieces=())
    twin = ResponsePlan(status=200, headers=(("content-type", "text/plain"),), pieces=())
    options = {"is_head": False, "http10": False, "keep_alive": True, "close": False}
    first = program_for(plan, **options)
    assert program_for(plan, **options) is first
    assert program_for(plan, **{**options, "close": True}) is not first
    assert plan == twin and hash(plan) == hash(twin) and repr(plan) == repr(twin)
    assert not hasattr(plan.with_(status=201), "compiled")
    assert [f.name for f in dataclasses.fields(plan)] == [
        f.name for f in dataclasses.fields(twin)
    ] and "compiled" not in {f.name for f in dataclasses.fields(plan)}
    assert ResponsePlan(*(getattr(plan, f.name) for f in dataclasses.fields(plan))) == plan
    copied = pickle.loads(pickle.dumps(plan))
    assert copied == plan and not hasattr(copied, "compiled")


# -- a stopped answer (the client cancelled it) -------------------------------------------


@pytest.mark.parametrize("when", ["before", "during"])
def test_a_stopped_stall_ends_at_once_and_says_cancelled(when: str) -> None:
    """`PlanReport.stop` (from another thread, as the engine calls it) ends a stall of
    an hour where it is: the head was written, the connection closed with a FIN."""
    plan = ResponsePlan(status=200, headers=(), pieces=(), ending=Ending.STALL, stall_ms=3.6e6)
    program = compile_program(plan, is_head=False, http10=False, keep_alive=True, close=False)

    async def run() -> tuple[Line, PlanReport, bool]:
        loop = asyncio.get_running_loop()
        line = Line(loop, Pacer(loop))
        report = PlanReport()
        if when == "before":
            assert report.stop()
        else:
            loop.call_later(0.01, lambda: threading.Thread(target=report.stop).start())
        keep = await asyncio.wait_for(execute(program, Sink(line), report), 10)
        return line, report, keep

    line, report, keep = asyncio.run(run())
    assert report.outcome is Outcome.CANCELLED and report.head_sent and not keep
    assert line.end == "fin" and line.waiters == []
    assert not report.stop()  # over: stopping again changes nothing
