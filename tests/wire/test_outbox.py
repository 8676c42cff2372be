"""The builtin server's outbox, in memory: an answer written at once (an instant program)
is held back until the loop's turn ends and then written with the others of the turn;
a connection's bytes keep their order whatever comes next (another answer, a refusal, a
close), a connection holds back at most `CORK_BYTES`, and nothing reaches a lost one.

Each `Connection` is fed bytes directly, over a transport that keeps what is written,
on an event loop of the test's (`chaosllm.wire.flow.Outbox`)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaosllm.config import ServerConfig
from chaosllm.http.app import create_app
from chaosllm.http.direct import DirectHandler
from chaosllm.http.state import ChaosState
from chaosllm.wire import WireServer
from chaosllm.wire.flow import CORK_BYTES
from chaosllm.wire.protocol import Connection
from tests.helpers import MemoryTransport

RECORDINGS = Path(__file__).resolve().parents[2] / "recordings" / "simple-chat"
ASKED = json.dumps(json.loads((RECORDINGS / "0001.json").read_text())["request"]["body"])


def _request(*extra: bytes) -> bytes:
    body = ASKED.encode()
    head = [
        b"POST /v1/chat/completions HTTP/1.1",
        b"Host: 127.0.0.1:8000",
        b"Content-Type: application/json",
        *extra,
        b"Content-Length: %d" % len(body),
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


BAD_HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Length: x\r\n\r\n"
)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture
def server(loop: asyncio.AbstractEventLoop) -> WireServer:
    state = ChaosState.from_config(ServerConfig(recordings=[RECORDINGS]))
    server = WireServer(create_app(state=state), direct=DirectHandler(state), memo=state.memo)
    server.loop = loop
    return server


def _connect(server: WireServer) -> tuple[Connection, MemoryTransport]:
    conn = Connection(server)
    transport = MemoryTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]  # all it uses
    return conn, transport


def _turn(loop: asyncio.AbstractEventLoop) -> None:
    loop.run_until_complete(asyncio.sleep(0))


def _answers(written: bytes) -> list[tuple[int, bytes]]:
    """The responses in `written`, in order: (status, body), each read whole by its
    Content-Length (an assertion fails on a cut one)."""
    found = []
    rest = written
    while rest:
        head, sep, rest = rest.partition(b"\r\n\r\n")
        assert sep, f"a cut head: {head!r}"
        status = int(head.split(b" ", 2)[1])
        length = re.search(rb"(?im)^content-length: *(\d+)", head)
        assert length is not None, head
        size = int(length.group(1))
        assert len(rest) >= size, "a cut body"
        found.append((status, rest[:size]))
        rest = rest[size:]
    return found


def test_answers_written_at_once_go_out_together_when_the_turn_ends(
    loop: asyncio.AbstractEventLoop, server: WireServer
) -> None:
    sides = [_connect(server) for _ in range(3)]
    for conn, _ in sides:
        conn.data_received(_request())
    assert [bytes(t.written) for _, t in sides] == [b""] * 3  # held for the turn's end
    _turn(loop)
    answers = [_answers(bytes(t.written)) for _, t in sides]
    assert [[status for status, _ in a] for a in answers] == [[200]] * 3
    assert all(json.loads(a[0][1])["object"] == "chat.completion" for a in answers)
    assert not any(t.closed for _, t in sides)


def test_pipelined_answers_keep_their_order_and_a_refusal_comes_after_them(
    loop: asyncio.AbstractEventLoop, server: WireServer
) -> None:
    conn, transport = _connect(server)
    conn.data_received(_request() + _request(b"X-Chaosllm-Session: s1") + BAD_HEAD)
    # The refusal is written at once: what was held back went first.
    answers = _answers(bytes(transport.written))
    assert [status for status, _ in answers] == [200, 200, 400]
    assert transport.closed
    _turn(loop)
    assert len(_answers(bytes(transport.written))) == 3  # nothing written twice


def test_a_close_writes_out_what_is_held_first(
    loop: asyncio.AbstractEventLoop, server: WireServer
) -> None:
    conn, transport = _connect(server)
    conn.data_received(_request(b"Connection: close"))
    assert transport.closed
    assert [status for status, _ in _answers(bytes(transport.written))] == [200]


def test_a_connection_holds_back_at_most_cork_bytes(
    loop: asyncio.AbstractEventLoop, server: WireServer
) -> None:
    conn, transport = _connect(server)
    conn.send_at_turn_end(b"a" * 100)
    assert transport.written == b""
    conn.send_at_turn_end(b"b" * (CORK_BYTES - 100))  # the bound reached: written now
    assert bytes(transport.written) == b"a" * 100 + b"b" * (CORK_BYTES - 100)
    assert conn.corked == [] and conn.corked_size == 0
    _turn(loop)
    assert len(transport.written) == CORK_BYTES


def test_nothing_reaches_a_lost_connection(
    loop: asyncio.AbstractEventLoop, server: WireServer
) -> None:
    conn, transport = _connect(server)
    conn.data_received(_request())
    conn.connection_lost(None)
    assert conn.corked == [] and conn.corked_size == 0
    _turn(loop)
    assert transport.written == b""
