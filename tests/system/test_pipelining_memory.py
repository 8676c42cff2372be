"""Memory bounds that are real: 100 clients that pipeline requests and never read an
answer cost each server a bounded amount of memory (a `chaosllm serve` subprocess, its
RSS read from /proc), and a fresh client is answered meanwhile. The full figures come
from ``python benchmarks/security.py pipeline``."""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import request_body, serving

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(120),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]

BODY = json.dumps(request_body("simple-chat/0001", stream=False)).encode()
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(BODY), BODY)
)
LIMIT_MB = 100
"""RSS growth allowed for 100 clients (before the bounds: builtin 0.9 GB, h11 1-1.5 GB,
uvicorn 0.9-1.2 GB)."""
FRESH_WITHIN_S = 3.0
"""The longest a fresh client may wait meanwhile (measured: 0.15-1 s on 2 busy cores)."""


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _fresh(url: str, timeout: float = 10.0) -> float:
    """Seconds for a fresh client to get an answer."""
    port = int(url.rsplit(":", 1)[1])
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    return time.monotonic() - start


@pytest.mark.parametrize("server", ["builtin", "h11", "uvicorn"])
def test_100_non_reading_pipelining_clients_keep_memory_bounded(server: str) -> None:
    with serving("--server", server, "--journal-size", "100", "-q") as (url, proc):
        port = int(url.rsplit(":", 1)[1])
        _fresh(url)
        base = _rss(proc.pid)
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(100)]
        waits: list[float] = []
        stop = threading.Event()

        def probe() -> None:  # a fresh client every 100 ms meanwhile
            while not stop.wait(0.1):
                waits.append(_fresh(url))

        prober = threading.Thread(target=probe)
        try:
            for sock in socks:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.setblocking(False)
            prober.start()
            burst = REQUEST * 64
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                for sock in socks:
                    with contextlib.suppress(BlockingIOError):
                        sock.send(burst)
                time.sleep(0.02)
            stop.set()
            prober.join(timeout=30)
            grown = (_rss(proc.pid) - base) / 2**20
            assert grown < LIMIT_MB, f"{grown:.0f} MB for 100 non-reading clients"
            assert waits and max(waits) < FRESH_WITHIN_S, waits
        finally:
            stop.set()
            for sock in socks:
                sock.close()
        assert _fresh(url) < FRESH_WITHIN_S  # and once they have left
