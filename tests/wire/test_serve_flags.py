"""`chaosllm serve` on each builtin server, with the wire's own flags: ``--server h11``,
``--max-connections`` (its limit held, the oldest idle connection closed for a new one),
and what it refuses at start."""

from __future__ import annotations

import socket
import subprocess
from urllib.parse import urlsplit

import httpx
import pytest

from tests.helpers import CLI, request_body, serving

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("server", ["builtin", "h11"])
def test_serve_on_each_builtin_server_with_a_connection_limit(server: str) -> None:
    with serving("--server", server, "--max-connections", "3") as (url, _):
        parts = urlsplit(url)
        assert parts.hostname is not None and parts.port is not None
        idle = []
        try:
            for _ in range(3):  # three idle keep-alive connections fill the server
                sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
                idle.append(sock)
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
            with httpx.Client(timeout=10) as client:  # a fourth still gets in
                answer = client.post(
                    url + "/v1/chat/completions",
                    json=request_body("simple-chat/0001", stream=False),
                )
                assert answer.status_code == 200
                assert answer.headers["x-chaosllm-match"] == "exact"
            idle[0].settimeout(5)
            assert idle[0].recv(1) == b""  # the oldest idle one made room
        finally:
            for sock in idle:
                sock.close()


def test_max_connections_must_be_positive() -> None:
    done = subprocess.run(
        [*CLI, "serve", "--port", "0", "--max-connections", "0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "--max-connections must be at least 1" in done.stderr
