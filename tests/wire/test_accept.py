"""The builtin server's acceptor on real sockets: every connection waiting in the listen
queue is accepted in one turn of the event loop (uvloop's own server takes one a turn,
which a loop busy with a flood of connections starves), each made with the server's
protocol; closing it stops accepting."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator

import pytest

from chaosllm.wire.accept import ACCEPT_BATCH, Acceptor
from chaosllm.wire.common import bind_sockets

pytestmark = pytest.mark.timeout(30)

LOOPS: list[tuple[str, Callable[[], asyncio.AbstractEventLoop]]] = [
    ("asyncio", asyncio.new_event_loop)
]
try:
    import uvloop

    LOOPS.append(("uvloop", uvloop.new_event_loop))
except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
    pass


@pytest.fixture(params=[factory for _, factory in LOOPS], ids=[name for name, _ in LOOPS])
def loop(request: pytest.FixtureRequest) -> Iterator[asyncio.AbstractEventLoop]:
    loop: asyncio.AbstractEventLoop = request.param()
    yield loop
    loop.close()


class _Count(asyncio.Protocol):
    made: list[_Count] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        _Count.made.append(self)


def _turns(loop: asyncio.AbstractEventLoop, turns: int) -> None:
    async def turn() -> None:
        for _ in range(turns):
            await asyncio.sleep(0)

    loop.run_until_complete(turn())


def test_every_waiting_connection_is_accepted_in_one_turn(
    loop: asyncio.AbstractEventLoop,
) -> None:
    (listening,) = bind_sockets("127.0.0.1", 0)
    port = listening.getsockname()[1]
    waiting = ACCEPT_BATCH + 44
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(waiting)]
    _Count.made = []
    acceptor = Acceptor(loop, listening, _Count)
    try:
        acceptor.start()
        # A turn to accept each batch, two for each connection to be made (its task's
        # first step, then connection_made): a few turns, not one per connection.
        _turns(loop, 6)
        assert len(_Count.made) == waiting
        acceptor.close()
        late = socket.create_connection(("127.0.0.1", port))
        _turns(loop, 6)
        assert len(_Count.made) == waiting  # closed: no more accepted
        late.close()
    finally:
        acceptor.close()
        for made in _Count.made:
            made.transport.close()
        _turns(loop, 2)
        for client in clients:
            client.close()
        listening.close()
