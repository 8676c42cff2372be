"""The callback executor: a wire program (`chaosllm.wire.program`) run from the event
loop's callbacks, without a task, on the builtin server's fast path.

`play_at_once` writes a program with no delay and an ending that needs no waiting (the
usual replay) there and then. `Player` runs any other: segment by segment, as
`chaosllm.wire.executor.execute` does, each delay on the loop's `Pacer`, ended early when
the client leaves (a future among the connection's ``waiters``, woken on EOF or a lost
connection). What waits for anything else -- the transport's buffer to drain below its
high-water mark, an RST's flush, a stall -- is handed with the rest of the program to a
task that runs the awaiting executor from there (`Line.continue_in_task`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Protocol

from chaosllm.core.report import Outcome, PlanReport
from chaosllm.wire.flow import FlowControl
from chaosllm.wire.pacer import Pacer
from chaosllm.wire.program import FIN, KEEP, Program

__all__ = ["Line", "Player", "play_at_once"]

logger = logging.getLogger("chaosllm.wire")


class Line(Protocol):
    """What a player needs of its connection."""

    loop: asyncio.AbstractEventLoop
    closed: bool
    eof: bool
    gone: bool
    must_close: bool
    flow: FlowControl
    waiters: list[asyncio.Future[None]]
    player: Player | None

    @property
    def pacer(self) -> Pacer: ...

    def send(self, data: bytes) -> None:
        """Write to the transport (the connection is open)."""

    def send_at_turn_end(self, data: bytes) -> None:
        """Write to the transport when the loop's turn ends, with the other answers written
        at once in it (`chaosllm.wire.flow.Outbox`); the connection's later writes, its
        close or reset, write it out first."""

    def close(self) -> None: ...

    def cycle_done(self, keep: bool) -> None:
        """The response is over; whether the connection may serve another."""

    def continue_in_task(self, program: Program, report: PlanReport, start: int) -> None:
        """Run the rest of `program`, from segment `start`, in a task."""


def play_at_once(line: Line, program: Program, report: PlanReport) -> None:
    """Write an instant program (`Program.instant`) now, filling `report`, and close the
    connection when it must not serve another request."""
    if line.closed or line.gone:
        report.outcome = Outcome.CLIENT_GONE
        line.close()
        return
    _put(line.send_at_turn_end, program, 0, report)
    report.outcome = Outcome.COMPLETE
    if program.ending != KEEP or not program.keep or line.must_close:
        line.close()


def _put(send: Callable[[bytes], None], program: Program, index: int, report: PlanReport) -> None:
    """Write segment `index` with `send` and count it in `report`."""
    _, data, frames, size, head = program.segments[index]
    if index == 0:
        data = program.first()
    if data:
        send(data)
    if head:
        report.head_sent = True
    report.frames_sent += frames
    report.bytes_sent += size


class Player:
    """A program run from the loop's callbacks (see the module docstring)."""

    __slots__ = ("entry", "index", "line", "paused", "program", "report", "watch")

    def __init__(self, line: Line, program: Program, report: PlanReport) -> None:
        self.line = line
        self.program = program
        self.report = report
        self.index = 0
        """The next segment to write."""
        self.paused = False
        """The delay before segment `index` has been waited (or cut short)."""
        self.entry = 0
        """The pacer's entry this player waits on; 0: none."""
        self.watch: asyncio.Future[None] | None = None

    def start(self) -> None:
        line = self.line
        if line.player is not self:  # ended before its first turn (shutdown)
            return
        if line.closed or line.gone:
            self._gone()
        else:
            self._run()

    def due(self) -> None:
        self.paused = True
        self._run()

    def _woken(self, _: asyncio.Future[None]) -> None:
        if self.entry:  # waiting: the client left (EOF or the connection lost)
            self.entry = 0
            self.paused = True
            self._run()

    def _run(self) -> None:
        line = self.line
        program = self.program
        segments = program.segments
        report = self.report
        try:
            while self.index < len(segments):
                delay = segments[self.index][0]
                if delay > 0:
                    if not self.paused and not (line.eof or line.closed):
                        self._wait(delay)
                        return
                    self.paused = False
                    if line.eof or line.closed:
                        line.gone = True
                        self._gone()
                        return
                if line.closed or line.gone:
                    self._gone()
                    return
                _put(line.send, program, self.index, report)
                self.index += 1
                if line.flow.write_paused:
                    self._hand_over()
                    return
            ending = program.ending
            if ending == KEEP:
                if not program.keep:
                    line.close()
            elif ending == FIN:
                line.close()
            else:
                self._hand_over()
                return
        except Exception:
            report.outcome = Outcome.ERROR
            logger.exception("Exception in the fast path")
            line.must_close = True
            self._end(False)
            return
        report.outcome = Outcome.COMPLETE
        self._end(program.keep)

    def _wait(self, delay: float) -> None:
        line = self.line
        if self.watch is None:
            self.watch = watch = line.loop.create_future()
            watch.add_done_callback(self._woken)
            line.waiters.append(watch)
        self.entry = line.pacer.add(time.monotonic() + delay, self)

    def _gone(self) -> None:
        self.report.outcome = Outcome.CLIENT_GONE
        self.line.must_close = True
        self._end(False)

    def _unwatch(self) -> None:
        self.entry = 0
        watch = self.watch
        if watch is not None:
            self.watch = None
            watch.remove_done_callback(self._woken)
            with contextlib.suppress(ValueError):
                self.line.waiters.remove(watch)

    def _hand_over(self) -> None:
        """The rest of the program, from segment `index`, in a task."""
        self._unwatch()
        line = self.line
        line.player = None
        line.continue_in_task(self.program, self.report, self.index)

    def _end(self, keep: bool) -> None:
        self._unwatch()
        self.line.cycle_done(keep)

    def cancel(self) -> None:
        """Shutdown's grace has run out: end as a cancelled task does."""
        self.report.outcome = Outcome.ERROR
        self._end(False)
