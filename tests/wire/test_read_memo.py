"""The builtin server's memoised reads against the plain path: for any sequence of reads
and state changes, a connection whose server keeps what reads parse to (and whose engine
keeps its answers) writes the same bytes and journals the same records as one that parses
and works out everything every time.

In memory: each server's `Connection` is fed bytes directly, over a transport that keeps
what is written; both run on one event loop and one manual clock's readings.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from chaosllm.config import RateLimit, ServerConfig
from chaosllm.core.clock import ManualClock
from chaosllm.faults.spec import parse_fault_spec
from chaosllm.http.app import create_app
from chaosllm.http.direct import DirectHandler
from chaosllm.http.state import ChaosState
from chaosllm.wire import WireServer
from chaosllm.wire.protocol import Connection
from tests.helpers import MemoryTransport

RECORDINGS = Path(__file__).resolve().parents[2] / "recordings" / "simple-chat"
ASKED = json.loads((RECORDINGS / "0001.json").read_text())["request"]["body"]


def _request(
    body: bytes, *extra: bytes, version: bytes = b"1.1", key: bytes = b"sk-test-key"
) -> bytes:
    head = [
        b"POST /v1/chat/completions HTTP/" + version,
        b"Host: 127.0.0.1:8000",
        b"Content-Type: application/json",
        b"Authorization: Bearer " + key,
        *extra,
        b"Content-Length: %d" % len(body),
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


EXACT = json.dumps(ASKED).encode()
OTHER = json.dumps({**ASKED, "temperature": 0.1}).encode()
MISS = json.dumps({**ASKED, "messages": [{"role": "user", "content": "nothing like it"}]})
READS: dict[str, list[bytes]] = {
    "exact": [_request(EXACT)],
    "exact again, a session": [_request(EXACT, b"X-Chaosllm-Session: s1")],
    "another session": [_request(EXACT, b"X-Chaosllm-Session: s2")],
    "another key": [_request(EXACT, key=b"sk-other-key")],
    "nearest": [_request(OTHER)],
    "miss": [_request(MISS.encode())],
    "bad json": [_request(b"{not json")],
    "split in two": [_request(EXACT)[:40], _request(EXACT)[40:]],
    "two pipelined": [_request(EXACT) + _request(EXACT, b"X-Chaosllm-Session: s1")],
    "crlf after": [_request(EXACT) + b"\r\n"],
    "expect": [_request(EXACT, b"Expect: 100-continue")],
    "close": [_request(EXACT, b"Connection: close")],
    "http/1.0": [_request(EXACT, version=b"1.0")],
    "get health": [b"GET /health HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n\r\n"],
}
CHANGES = ("arm a 503", "arm a 503 for s1", "rate limit on", "rate limit off", "reset")

_DATE = re.compile(rb"\r\ndate: [^\r]*", re.IGNORECASE)
_VARYING = ("time", "monotonic")


class _Side:
    """One server (memoised or plain), its clock and its open connection."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, memo: bool) -> None:
        self.clock = ManualClock()
        config = ServerConfig(recordings=[RECORDINGS], memo_bytes=32 << 20 if memo else 0)
        self.state = ChaosState.from_config(config, clock=self.clock)
        app = create_app(state=self.state)
        self.server = WireServer(
            app, direct=DirectHandler(self.state), memo=self.state.memo if memo else None
        )
        self.server.loop = loop
        self.loop = loop
        self.conn, self.transport = self._connect()

    def _connect(self) -> tuple[Connection, MemoryTransport]:
        conn = Connection(self.server)
        transport = MemoryTransport()
        conn.connection_made(transport)  # type: ignore[arg-type]  # all it uses
        return conn, transport

    def read(self, chunks: list[bytes]) -> bytes:
        if self.transport.closed:
            self.conn.connection_lost(None)
            self.conn, self.transport = self._connect()
        start = len(self.transport.written)
        for chunk in chunks:
            self.conn.data_received(chunk)
            self.loop.run_until_complete(self._settle())
        return _DATE.sub(b"\r\ndate: -", bytes(self.transport.written[start:]))

    async def _settle(self) -> None:
        for _ in range(10_000):  # bounded: an answer in a task, its frames, the next one
            if not self.conn.busy and not self.conn.queue:
                return
            await asyncio.sleep(0)
        raise AssertionError("the connection did not settle")

    def change(self, change: str) -> None:
        state = self.state
        if change == "arm a 503":
            state.board.arm([parse_fault_spec({"type": "http_503", "remaining": 1})])
        elif change == "arm a 503 for s1":
            state.board.arm(
                [parse_fault_spec({"type": "http_503", "remaining": 1, "match": {"session": "s1"}})]
            )
        elif change == "rate limit on":
            state.set_rate_limit(RateLimit(rpm=1))
        elif change == "rate limit off":
            state.set_rate_limit(None)
        else:
            state.reset()
        self.clock.advance(0.5)

    def journal(self) -> list[dict[str, Any]]:
        records = []
        for entry in self.state.journal.entries():
            record = entry.record._asdict()
            for name in _VARYING:
                record.pop(name)
            records.append(record)
        return records


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


STEPS = st.lists(
    st.one_of(
        st.sampled_from(sorted(READS)).map(lambda name: ("read", name)),
        st.sampled_from(CHANGES).map(lambda name: ("change", name)),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS)
@example(  # a request read before the live rate limit was on: keyed by its API key after
    steps=[
        ("read", "exact"),
        ("read", "another key"),
        ("change", "rate limit on"),
        ("read", "exact"),
        ("read", "another key"),
    ]
)
def test_memoised_reads_answer_as_the_plain_path(
    loop: asyncio.AbstractEventLoop, steps: list[tuple[str, str]]
) -> None:
    kept, plain = _Side(loop, memo=True), _Side(loop, memo=False)
    for kind, name in steps:
        if kind == "change":
            kept.change(name)
            plain.change(name)
            continue
        chunks = READS[name]
        assert kept.read(chunks) == plain.read(chunks), (name, steps)
        assert kept.transport.closed == plain.transport.closed
    assert kept.journal() == plain.journal()


def test_a_repeated_read_is_parsed_once_and_found_in_the_memo(
    loop: asyncio.AbstractEventLoop,
) -> None:
    side = _Side(loop, memo=True)
    first = side.read(READS["exact"])
    parsed = side.conn.reader.completed
    hits = side.state.memo.hits
    assert side.read(READS["exact"]) == first
    assert side.conn.reader.completed == parsed + 1
    # The read (the request as parsed) and the engine's answer: two hits.
    assert side.state.memo.hits == hits + 2
    # What is not one whole plain request is not kept: parsed every time.
    for name in ("split in two", "two pipelined", "expect", "close", "http/1.0"):
        side.read(READS[name])
        for chunk in READS[name]:
            key = ("request", side.server.max_body_bytes, chunk)
            assert side.state.memo.get(key) is None, name
    key = ("request", side.server.max_body_bytes, READS["exact"][0])
    assert side.state.memo.get(key) is not None
