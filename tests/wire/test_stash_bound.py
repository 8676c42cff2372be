"""The builtin server's stash bound within one read, in memory: a read of hundreds of
pipelined requests (a read holds up to 256 KiB) is parsed only while the requests queued
hold less than `stash_full`; the rest waits unparsed, reading paused, and every request
is still answered in order. The request next in turn is read whole, whatever its size.

Each `Connection` is fed bytes directly, over a transport that keeps what is written and
whether reading is paused, on an event loop of the test's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from chaosllm.wire import WireServer
from chaosllm.wire.asgi import Receive, Scope, Send
from chaosllm.wire.flow import ANSWERS_A_TURN, STASH_REQUESTS
from chaosllm.wire.protocol import Connection
from chaosllm.wire.reader import SLICE
from tests.helpers import MemoryTransport


async def _echo(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers a request with its query and the length of its body."""
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    answer = json.dumps({"q": scope["query_string"].decode(), "size": size}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(answer))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _connect(loop: asyncio.AbstractEventLoop) -> tuple[Connection, MemoryTransport]:
    server = WireServer(_echo)
    server.loop = loop
    return _made(server)


def _made(server: WireServer) -> tuple[Connection, MemoryTransport]:
    conn = Connection(server)
    transport = MemoryTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]  # all it uses
    return conn, transport


def _settle_all(loop: asyncio.AbstractEventLoop, conns: list[Connection]) -> None:
    for conn in conns:
        _settle(loop, conn)


def _settle(loop: asyncio.AbstractEventLoop, conn: Connection) -> None:
    async def settled() -> None:
        for _ in range(100_000):  # bounded: each answer takes a few turns of the loop
            if not conn.busy and not conn.queue and not conn.reader.rest:
                return
            await asyncio.sleep(0)
        raise AssertionError("the connection did not settle")

    loop.run_until_complete(settled())


def _get(i: int) -> bytes:
    return b"GET /echo?n=%d HTTP/1.1\r\nHost: t\r\n\r\n" % i


def _post(i: int, body: bytes) -> bytes:
    return b"POST /echo?n=%d HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (
        i,
        len(body),
        body,
    )


def _answers(transport: MemoryTransport) -> list[dict[str, Any]]:
    """The bodies written, in order (each up to the next status line)."""
    parts = bytes(transport.written).split(b"\r\n\r\n")[1:]
    return [json.loads(part.split(b"HTTP/1.1")[0]) for part in parts if part]


def test_a_read_of_many_pipelined_requests_is_parsed_only_while_the_queue_has_room(
    loop: asyncio.AbstractEventLoop,
) -> None:
    conn, transport = _connect(loop)
    data = b"".join(_get(i) for i in range(4000))  # about 160 KiB in one read
    conn.data_received(data)
    # The first is answered in a task; what follows it is parsed up to the bound (and at
    # most one slice beyond), the rest held back unparsed.
    per_slice = SLICE // len(_get(0)) + 1
    assert STASH_REQUESTS <= len(conn.queue) <= STASH_REQUESTS + per_slice
    assert conn.reader.rest and not transport.reading
    _settle(loop, conn)
    assert [answer["q"] for answer in _answers(transport)] == [f"n={i}" for i in range(4000)]
    assert transport.reading and not transport.closed


def test_the_request_next_in_turn_is_read_whole_in_reads_of_any_size(
    loop: asyncio.AbstractEventLoop,
) -> None:
    conn, transport = _connect(loop)
    body = b"x" * (2 << 20)  # eight times the stash's bytes
    data = _post(0, body) + _get(1)
    for start in range(0, len(data), 256 * 1024):
        assert transport.reading
        conn.data_received(data[start : start + 256 * 1024])
    _settle(loop, conn)
    assert _answers(transport) == [{"q": "n=0", "size": len(body)}, {"q": "n=1", "size": 0}]


def test_a_large_body_behind_a_response_waits_and_is_then_read_whole(
    loop: asyncio.AbstractEventLoop,
) -> None:
    conn, transport = _connect(loop)
    body = b"y" * (1 << 20)
    conn.data_received(_get(0) + _post(1, body) + _get(2))
    assert conn.busy and conn.reader.rest and not transport.reading
    _settle(loop, conn)
    assert _answers(transport) == [
        {"q": "n=0", "size": 0},
        {"q": "n=1", "size": len(body)},
        {"q": "n=2", "size": 0},
    ]


def test_answers_from_reads_are_spread_over_turns_and_a_new_connection_goes_first(
    loop: asyncio.AbstractEventLoop,
) -> None:
    server = WireServer(_echo)
    server.loop = loop
    sides = [_made(server) for _ in range(ANSWERS_A_TURN + 72)]
    for i, (conn, _) in enumerate(sides):  # each served once: later reads take turns
        conn.data_received(_get(i))
    _settle_all(loop, [conn for conn, _ in sides])
    answered = [len(_answers(transport)) for _, transport in sides]
    assert answered == [1] * len(sides)

    async def one_turn() -> tuple[list[int], int]:
        # All in one callback, as the loop delivers reads: the second requests of every
        # connection, then a new connection's first.
        for i, (conn, _) in enumerate(sides):
            conn.data_received(_get(1000 + i))
        fresh, fresh_transport = _made(server)
        fresh.data_received(_get(9999))
        started = [int(conn.busy) + len(_answers(t)) - 1 for conn, t in sides]
        return started, int(fresh.busy) + len(_answers(fresh_transport))

    started, fresh_started = loop.run_until_complete(one_turn())
    assert sum(started) == ANSWERS_A_TURN  # the rest wait for the loop's next turn
    assert started == [1] * ANSWERS_A_TURN + [0] * 72  # in arrival order
    assert fresh_started == 1  # a connection's first request is answered as it is read
    _settle_all(loop, [conn for conn, _ in sides])
    assert [len(_answers(t)) for _, t in sides] == [2] * len(sides)


def test_a_request_waiting_for_its_turn_at_shutdown_is_answered_then_closed(
    loop: asyncio.AbstractEventLoop,
) -> None:
    server = WireServer(_echo)
    server.loop = loop
    sides = [_made(server) for _ in range(ANSWERS_A_TURN + 1)]
    for i, (conn, _) in enumerate(sides):
        conn.data_received(_get(i))
    _settle_all(loop, [conn for conn, _ in sides])

    last, transport = sides[-1]

    async def one_turn() -> None:
        for i, (conn, _) in enumerate(sides):
            conn.data_received(_get(1000 + i))
        server.shutting_down = True
        for conn, _ in sides:
            conn.shutdown()
        assert last.deferred and not transport.closed

    loop.run_until_complete(one_turn())
    _settle_all(loop, [conn for conn, _ in sides])
    answers = _answers(transport)
    assert [answer["q"] for answer in answers] == [f"n={len(sides) - 1}", f"n={999 + len(sides)}"]
    assert transport.closed
