"""The builtin server frees a connection when it is lost, by reference counting: no
reference cycle is left for the garbage collector (whose full collections pause every
stream in flight), whether the answer was instant or paced by ``--timing recorded``."""

from __future__ import annotations

import gc
import json
import socket
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaosllm import ChaosServer
from chaosllm.wire.protocol import Connection
from tests.helpers import write

pytestmark = pytest.mark.timeout(30)

FRAMES = 4
BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Count."}]}


def _recordings(root: Path) -> Path:
    """One stream of `FRAMES` frames (role, content, finish, ``[DONE]``), each recorded
    20 ms after the one before."""
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o-mini"}
    deltas: list[tuple[dict[str, str], str | None]] = [
        ({"role": "assistant", "content": ""}, None),
        ({"content": "one"}, None),
        ({}, "stop"),
    ]
    chunks = [
        {
            "data": "data: "
            + json.dumps({**base, "choices": [{"index": 0, "delta": d, "finish_reason": f}]})
            + "\n\n",
            "delay_ms": 20,
        }
        for d, f in deltas
    ]
    chunks.append({"data": "data: [DONE]\n\n", "delay_ms": 20})
    message = {"role": "assistant", "content": "one", "refusal": None}
    answer = {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
    }
    write(
        root / "timed" / "0001.json",
        {
            "chaosllm": 1,
            "provider": "openai.chat",
            "request": {"method": "POST", "path": "/v1/chat/completions", "body": BODY},
            "response": {"status": 200, "stream": True, "chunks": chunks, "body": answer},
        },
    )
    return root


@pytest.fixture
def collector_off() -> Iterator[None]:
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _live_conns() -> set[int]:
    return {id(o) for o in gc.get_objects() if type(o) is Connection}


@pytest.mark.parametrize("timing", ["fast", "recorded"])
def test_a_lost_connection_is_freed_without_the_collector(
    tmp_path: Path, timing: str, collector_off: None
) -> None:
    request = json.dumps({**BODY, "stream": True}).encode()
    with ChaosServer(_recordings(tmp_path), timing=timing) as server:
        host, _, port = server.url.removeprefix("http://").rpartition(":")
        before = _live_conns()
        socks = [socket.create_connection((host, int(port)), timeout=5) for _ in range(3)]
        try:
            for sock in socks:
                sock.sendall(
                    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(request), request)
                )
            for sock in socks:
                got = b""
                while b"0\r\n\r\n" not in got:
                    data = sock.recv(65536)
                    assert data, got
                    got += data
                assert got.count(b"\n\n") == FRAMES
            mine = [
                weakref.ref(o)
                for o in gc.get_objects()
                if type(o) is Connection and id(o) not in before
            ]
            assert len(mine) == 3
        finally:
            for sock in socks:
                sock.close()
        # Bounded wait for the server's loop to see the three connections go.
        deadline = time.monotonic() + 5
        while any(ref() is not None for ref in mine) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [ref() for ref in mine] == [None, None, None]
