"""The awaiting executor: a wire program (`chaosllm.wire.program`) run by a task.

`execute` takes the program's segments in order -- wait the delay, write the data, add
the counts to the report -- then carries out its ending, through a `Sink`: the builtin
server's connection, the h11 server's, or an ASGI ``send`` (`chaosllm.wire.asgi`). A
sink says when the client has left (or the socket is closed) by returning False, which
ends the program with `Outcome.CLIENT_GONE`. The callback executor
(`chaosllm.wire.player`) takes the same steps from the event loop's callbacks, and hands
a program it cannot finish there to this one, from the segment it reached.

A wait of the program (a delay, a stall) also ends when the engine stops the answer
(`PlanReport.stop`: the client cancelled the request): the connection is closed there,
the outcome `Outcome.CANCELLED`.
"""

from __future__ import annotations

import asyncio
import contextlib
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
    except _Stopped:
        await sink.close()
        report.outcome = Outcome.CANCELLED
        return False
    except BaseException:
        report.outcome = Outcome.ERROR
        raise
    if not done:
        report.outcome = Outcome.CLIENT_GONE
        return False
    report.outcome = Outcome.COMPLETE
    return program.keep


class _Stopped(Exception):
    """The engine stopped the answer during a wait (`PlanReport.stop`)."""


async def _pause(sink: Sink[T], seconds: float, report: PlanReport) -> bool:
    """`sink.pause(seconds)`, ended early by `report.stop` (raising `_Stopped`)."""
    if report.stopped:
        raise _Stopped
    loop = asyncio.get_running_loop()
    stopped = loop.create_future()

    def settle() -> None:
        if not stopped.done():
            stopped.set_result(None)

    def wake() -> None:
        loop.call_soon_threadsafe(settle)

    forget = report.on_stop(wake)
    waiting = asyncio.ensure_future(sink.pause(seconds))
    try:
        await asyncio.wait((waiting, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        forget()
        if not waiting.done():
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
        stopped.cancel()
    if report.stopped:
        raise _Stopped
    return waiting.result()


async def _steps(program: Steps[T], sink: Sink[T], report: PlanReport, start: int) -> bool:
    """Whether the program ran to its end (False: the client left)."""
    segments = program.segments
    if start:
        await sink.drain()
    elif not sink.open():
        return False
    for index in range(start, len(segments)):
        delay, data, frames, size, head = segments[index]
        if delay > 0 and not await _pause(sink, delay, report):
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
        if program.stall_s > 0 and not await _pause(sink, program.stall_s, report):
            return False
        await sink.close()
    return True
