"""Timers for paced answers: one loop timer for every stream of a server (`Pacer`), and
a sleep that never ends early (`Sleep`).

`Pacer` keeps deadlines in a heap, by the monotonic clock; one loop timer is armed for
the earliest, and when it fires every entry then due runs, in deadline order, in one
pass (one that falls due while the pass runs too, but none twice: the loop reads its
sockets between two frames of a stream): 500 streams paced 50 ms apart cost no timer
handle, future or task wake-up a frame, and streams due in the same tick are written
back to back. No entry runs before its deadline (a loop's timers may fire a little
early: it looks again).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from typing import Protocol

__all__ = ["Due", "Pacer", "Sleep"]

logger = logging.getLogger("chaosllm.wire")


class Due(Protocol):
    """What waits on a `Pacer`: `entry` is the number `Pacer.add` gave it (0 once it has
    run, or to cancel it); `due` is called at the deadline."""

    entry: int

    def due(self) -> None: ...


class Pacer:
    """The timers of every paced answer of one loop (see the module docstring)."""

    __slots__ = ("armed_at", "handle", "heap", "loop", "seq")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.heap: list[tuple[float, int, Due]] = []
        self.seq = 0
        self.handle: asyncio.TimerHandle | asyncio.Handle | None = None
        self.armed_at = float("inf")

    def add(self, deadline: float, waiter: Due) -> int:
        """Run ``waiter.due()`` at `deadline`; the entry's number (for `Due.entry`)."""
        self.seq += 1
        heapq.heappush(self.heap, (deadline, self.seq, waiter))
        if deadline < self.armed_at:
            self._arm(deadline)
        return self.seq

    def _arm(self, deadline: float) -> None:
        if self.handle is not None:
            self.handle.cancel()
        self.armed_at = deadline
        self.handle = self.loop.call_later(deadline - time.monotonic(), self._fire)

    def _fire(self) -> None:
        self.handle = None
        self.armed_at = float("-inf")  # what the pass adds is armed once, after it
        heap = self.heap
        pop = heapq.heappop
        now = time.monotonic
        last = self.seq
        later: list[tuple[float, int, Due]] = []
        try:
            while heap and heap[0][0] <= now():
                entry = pop(heap)
                _, seq, waiter = entry
                if seq > last:  # added by this pass: the next one
                    later.append(entry)
                elif waiter.entry == seq:  # else cancelled: the client left, or shutdown
                    waiter.entry = 0
                    try:
                        waiter.due()
                    except Exception:
                        logger.exception("Exception in the fast path")
        finally:
            for entry in later:
                heapq.heappush(heap, entry)
            self.armed_at = float("inf")
            if heap:
                self._arm(heap[0][0])

    def clear(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        self.armed_at = float("inf")
        self.heap.clear()


class Sleep:
    """A timer that resolves `future` no earlier than `seconds` from now, by the monotonic
    clock (a loop's timers may fire a little early)."""

    __slots__ = ("deadline", "future", "handle", "loop")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[None], seconds: float
    ) -> None:
        self.loop = loop
        self.future = future
        self.deadline = time.monotonic() + seconds
        self.handle = loop.call_later(seconds, self.fire)

    def fire(self) -> None:
        left = self.deadline - time.monotonic()
        if left > 0:
            self.handle = self.loop.call_later(left, self.fire)
        elif not self.future.done():
            self.future.set_result(None)

    def cancel(self) -> None:
        self.handle.cancel()
