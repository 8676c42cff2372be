"""Flow control on the builtin server's connections, both ways (as uvicorn's
``flow_control.py``): writing waits while the transport's buffer is above its
high-water mark (`drain`), reading stops while the client does not read or too much is
queued behind a response in flight (`pause_reading`).

What is queued is counted as the memory it holds, not the bytes it came in: a stash of
parsed requests waiting behind a response is full at `STASH_REQUESTS` requests or
`STASH_BYTES` bytes held (`held`: a request's bytes and what its Python objects cost),
whichever comes first (`stash_full`); reading stops then, so a client that pipelines
and never reads costs a bounded few hundred KiB, and the kernel's TCP window stops it.
And a connection answers at most `TURN` queued requests in one go before the event loop
serves the others (fairness: a fresh client is not kept waiting behind a pipeline).

Answers written at once (an instant program: the usual replay) during one turn of the
loop go to their sockets together when the turn ends (`Outbox`): the client that sent
them is woken once for the batch instead of once an answer, which under load is most of
what a write costs the kernel (on 32 busy connections the default server answered 1.36x
the JSON replays a second and 1.23x the 20-frame SSE ones). A connection's bytes keep their
order: any other write, a close, a reset or a flush writes out what it holds first."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Protocol

__all__ = [
    "ANSWERS_A_TURN",
    "CORK_BYTES",
    "STASH_BYTES",
    "STASH_REQUESTS",
    "TURN",
    "FlowControl",
    "Outbox",
    "Turns",
    "held",
    "stash_full",
]

STASH_BYTES = 256 * 1024
"""The most memory held by what waits behind a response in flight (estimated, `held`)."""
STASH_REQUESTS = 64
"""The most parsed requests waiting behind a response in flight."""
TURN = 32
"""The most queued requests a connection answers before others get the event loop."""
ANSWERS_A_TURN = 128
"""The most keep-alive requests answered from reads before the event loop looks at its
sockets again (`Turns`)."""
CORK_BYTES = 64 * 1024
"""The most a connection holds back for the turn's end (`Outbox`): more is written at
once, so that the transport's flow control sees it as before (asyncio's high-water
mark)."""
_REQUEST_COST = 600
"""What a parsed request's objects hold besides its bytes (request, lists, tuples)."""
_HEADER_COST = 120
"""What one header's objects hold besides its bytes (a tuple, two bytes objects)."""


def held(body: int, head: int, headers: int) -> int:
    """The memory a parsed request holds: its body and head bytes and its objects."""
    return body + head + _REQUEST_COST + _HEADER_COST * headers


def stash_full(requests: int, size: int) -> bool:
    """Whether a stash of `requests` holding `size` bytes must stop reading."""
    return requests >= STASH_REQUESTS or size > STASH_BYTES


class _Waiting(Protocol):
    deferred: bool
    turn: int

    def take_turn(self) -> None: ...


class Turns:
    """Fairness between connections, and for new ones: between two of the loop's looks
    at its sockets, at most `ANSWERS_A_TURN` connections already served answer what they
    read; the others wait their turn in arrival order (their requests read and queued).

    A loop with 2,000 busy keep-alive connections otherwise answered all 2,000 between
    two looks at its sockets, so a new connection waited two or three such rounds
    (accepted, made, its request read) of a third of a second each; now a round of the
    old connections is spread over many short turns, and a connection's first request
    is answered as it is read (`take` is asked only for the later ones). A connection
    that already answered in this turn goes on (its pipeline has `TURN`); the turn ends
    only once `ANSWERS_A_TURN` have, so with fewer connections nothing ever waits."""

    __slots__ = ("left", "loop", "scheduled", "turn", "waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.turn = 0
        self.left = ANSWERS_A_TURN
        self.waiting: deque[_Waiting] = deque()
        self.scheduled = False

    def take(self, conn: _Waiting) -> bool:
        """Whether `conn` may answer now; else it is called back (`take_turn`) later."""
        if conn.turn == self.turn:
            return True
        if self.left > 0:
            self.left -= 1
            conn.turn = self.turn
            return True
        if not conn.deferred:
            conn.deferred = True
            self.waiting.append(conn)
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self._next)
        return False

    def _next(self) -> None:
        self.scheduled = False
        self.turn += 1
        self.left = ANSWERS_A_TURN
        waiting = self.waiting
        while waiting and self.left > 0:
            conn = waiting.popleft()
            conn.deferred = False
            conn.turn = self.turn
            self.left -= 1
            conn.take_turn()
        if waiting:
            self.scheduled = True
            self.loop.call_soon(self._next)


class _Corked(Protocol):
    def uncork(self) -> None: ...


class Outbox:
    """The connections holding back answers for the end of the loop's turn (see the
    module docstring), written out by one callback a turn."""

    __slots__ = ("corked", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.corked: list[_Corked] = []

    def add(self, conn: _Corked) -> None:
        """`conn` holds bytes back: write them out when the turn ends."""
        corked = self.corked
        if not corked:
            self.loop.call_soon(self._flush)
        corked.append(conn)

    def _flush(self) -> None:
        corked, self.corked = self.corked, []
        for conn in corked:
            conn.uncork()


class FlowControl:
    """The transport's two directions, paused and resumed; `stop` once it is closed."""

    __slots__ = ("drain_waiters", "read_paused", "stopped", "transport", "write_paused")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.write_paused = False
        """The transport's buffer is above its high-water mark (`asyncio.Protocol`)."""
        self.read_paused = False
        self.stopped = False
        self.drain_waiters: list[asyncio.Future[None]] = []

    # -- writing ------------------------------------------------------------------------

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake()

    async def drain(self) -> None:
        """Wait while the transport's buffer is above its high-water mark."""
        while self.write_paused and not self.stopped:
            future = asyncio.get_running_loop().create_future()
            self.drain_waiters.append(future)
            try:
                await future
            finally:
                with contextlib.suppress(ValueError):
                    self.drain_waiters.remove(future)

    async def flush(self) -> None:
        """Wait until every byte written has been handed to the kernel."""
        transport = self.transport
        if self.stopped or transport is None or transport.get_write_buffer_size() == 0:
            return
        transport.set_write_buffer_limits(high=0, low=0)
        while not self.stopped and transport.get_write_buffer_size() > 0:
            self.write_paused = True
            await self.drain()

    # -- reading ------------------------------------------------------------------------

    def pause_reading(self) -> None:
        if not self.read_paused and not self.stopped:
            self.read_paused = True
            assert self.transport is not None
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            assert self.transport is not None
            self.transport.resume_reading()

    def stop(self) -> None:
        """The transport is closed: nothing more waits on it."""
        self.stopped = True
        self._wake()

    def _wake(self) -> None:
        for future in self.drain_waiters:
            if not future.done():
                future.set_result(None)
