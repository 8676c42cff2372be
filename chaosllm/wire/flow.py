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
serves the others (fairness: a fresh client is not kept waiting behind a pipeline)."""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["STASH_BYTES", "STASH_REQUESTS", "TURN", "FlowControl", "held", "stash_full"]

STASH_BYTES = 256 * 1024
"""The most memory held by what waits behind a response in flight (estimated, `held`)."""
STASH_REQUESTS = 64
"""The most parsed requests waiting behind a response in flight."""
TURN = 32
"""The most queued requests a connection answers before others get the event loop."""
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
