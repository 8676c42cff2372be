"""Clients that pipeline requests and never read an answer, on every server (builtin,
h11, uvicorn), over real sockets: the server stops reading from them and keeps answering
others, and when they leave (with unread answers, so the kernel resets the connection)
it goes on serving as before."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import struct
import time
from collections.abc import Iterator

import pytest

from chaosllm import ChaosServer
from chaosllm.server import ServerKind
from tests.helpers import read_response, request_body

pytestmark = pytest.mark.timeout(60)

SOCKET_TIMEOUT = 5.0
BODY = json.dumps(request_body("simple-chat/0001", stream=False)).encode()
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(BODY), BODY)
)
KINDS = [ServerKind.BUILTIN, ServerKind.H11, ServerKind.UVICORN]


@pytest.fixture(params=KINDS, ids=[kind.value for kind in KINDS])
def server(request: pytest.FixtureRequest) -> Iterator[ChaosServer]:
    with ChaosServer(server=request.param.value, journal_size=100) as running:
        yield running


def answered(server: ChaosServer) -> float:
    """Seconds a fresh client waits for the answer to one request (fails on none)."""
    assert server.port is not None
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=SOCKET_TIMEOUT) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        status, _, _ = read_response(sock)
    assert status == 200
    return time.monotonic() - started


def pipeline_until_blocked(server: ChaosServer, clients: int) -> list[socket.socket]:
    """`clients` connections that send pipelined requests, never reading, until the
    server stops taking them (each send would block for 0.3 s)."""
    assert server.port is not None
    socks: list[socket.socket] = []
    for _ in range(clients):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=SOCKET_TIMEOUT)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        socks.append(sock)
    burst = REQUEST * 64
    last_sent = [time.monotonic()] * clients
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        now = time.monotonic()
        if all(now - last > 0.3 for last in last_sent):
            return socks
        for i, sock in enumerate(socks):
            with contextlib.suppress(BlockingIOError):
                if sock.send(burst):
                    last_sent[i] = now
        time.sleep(0.01)
    raise AssertionError("the server went on reading from clients that read nothing")


def test_clients_that_leave_with_unread_answers_leave_the_server_serving(
    server: ChaosServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    answered(server)
    socks = pipeline_until_blocked(server, 20)
    for sock in socks:
        # Answers unread: the close is a reset, which the server meets mid-write.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    # The server notices the resets within the loop's next turns: keep asking for a
    # second, every answer prompt.
    until = time.monotonic() + 1.0
    while time.monotonic() < until:
        assert answered(server) < 1.0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
