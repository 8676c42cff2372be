"""The awaiting executor: a wire program (`chaosllm.wire.program`) run by a task.

`execute` takes the program's segments in order -- wait the delay, write the data, add
the counts to the report -- then carries out its ending, through a `Sink`: the builtin
server's connection, the h11 server's, or an ASGI ``send`` (`chaosllm.wire.asgi`). A
sink says when the client has left (or the socket is closed) by returning False, which
ends the program with `Outcome.CLIENT_GONE`. The callback executor
(`chaosllm.wire.player`) takes the same steps from the event loop's callbacks, and hands
a program it cannot finish there to this one, from the segment it reached.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from chaosllm.core.report import Outcome, PlanReport
from chaosllm.wire.program import FIN, KEEP, RST, Steps

__all__ = ["Sink", "execute"]

T_contra = TypeVar("T_contra", contravariant=True)
T = TypeVar("T")


class Sink(Protocol[T_contra]):
    """Where a program goes. The methods that return a bool return False once the
    client has left (or the socket is closed): nothing more is written then."""

    def open(self) -> bool:
        """Before the first segment: whether the client is still there."""

    async def drain(self) -> None:
        """Before resuming a program another executor started: wait for what it wrote."""

    async def write(self, data: T_contra) -> bool:
        """Write one segment's data (waiting while the peer does not read)."""

    async def pause(self, seconds: float) -> bool:
        """Wait `seconds`, or less if the client leaves meanwhile."""

    async def close(self) -> None:
        """End the connection with a FIN."""

    async def reset(self) -> None:
        """Flush what was written, then reset the connection (RST)."""


async def execute(program: Steps[T], sink: Sink[T], report: PlanReport, start: int = 0) -> bool:
    """Run `program` into `sink` from segment `start`, filling `report`; whether the
    connection can serve another request after it."""
    try:
        done = await _steps(program, sink, report, start)
    except BaseException:
        report.outcome = Outcome.ERROR
        raise
    if not done:
        report.outcome = Outcome.CLIENT_GONE
        return False
    report.outcome = Outcome.COMPLETE
    return program.keep


async def _steps(program: Steps[T], sink: Sink[T], report: PlanReport, start: int) -> bool:
    """Whether the program ran to its end (False: the client left)."""
    segments = program.segments
    if start:
        await sink.drain()
    elif not sink.open():
        return False
    for index in range(start, len(segments)):
        delay, data, frames, size, head = segments[index]
        if delay > 0 and not await sink.pause(delay):
            return False
        if not await sink.write(program.first() if index == 0 else data):
            return False
        if head:
            report.head_sent = True
        report.frames_sent += frames
        report.bytes_sent += size
    ending = program.ending
    if ending == KEEP:
        if not program.keep:
            await sink.close()
    elif ending == FIN:
        await sink.close()
    elif ending == RST:
        await sink.reset()
    else:
        if program.stall_s > 0 and not await sink.pause(program.stall_s):
            return False
        await sink.close()
    return True
