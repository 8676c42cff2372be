"""``--server uvicorn`` keeps the builtin server's guarantees (issue #12 item 5).

Each on real sockets, under `ChaosServer(server="uvicorn")` or ``chaosllm serve
--server uvicorn``: ``--max-body-bytes`` (413, declared or counted), read deadlines for
heads and bodies (408; a silent connection closed; slowloris cut), a SIGTERM (or
`ChaosServer.stop`) during a stall exits after the graceful timeout, and at the
open-file limit the log stays small and the server recovers. Under both of uvicorn's
HTTP protocols (httptools, h11) where the protocol matters.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

import chaosllm.http.uvicorn_guard as guard
import chaosllm.server
from chaosllm import ChaosServer
from tests.helpers import free_port, request_body, serving
from tests.helpers import read_response as content_response

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
LIMIT = 64 * 1024
SHORT = 0.5
"""The read deadlines in these tests (the defaults are 10 s)."""


def head(path: str, length: int | None = None, *, chunked: bool = False) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_response(sock: socket.socket, timeout: float = 10.0) -> tuple[int, dict[str, str], Any]:
    """One response with a Content-Length body: status, headers, JSON body."""
    sock.settimeout(timeout)
    status, head, body = content_response(sock)
    _, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in header_lines)}
    return status, headers, json.loads(body[: int(headers["content-length"])])


def closed(sock: socket.socket, timeout: float = 10.0) -> bool:
    """Whether the server closes the connection (EOF or reset) within `timeout`."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


@pytest.fixture(params=["httptools", "h11"])
def server(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ChaosServer]:
    """uvicorn with each of its HTTP protocols, short read deadlines, a small body limit."""
    real_has = chaosllm.server._has
    if request.param == "h11":
        monkeypatch.setattr(chaosllm.server, "_has", lambda m: m != "httptools" and real_has(m))
    monkeypatch.setattr(guard, "HEADER_TIMEOUT_S", SHORT)
    monkeypatch.setattr(guard, "BODY_TIMEOUT_S", SHORT)
    with ChaosServer(server="uvicorn", max_body_bytes=LIMIT) as running:
        yield running


def connect(server: ChaosServer) -> socket.socket:
    assert server.port is not None
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


# -- --max-body-bytes ------------------------------------------------------------------


def test_a_declared_50_mb_body_is_refused_at_once(server: ChaosServer) -> None:
    with connect(server) as sock:
        sock.sendall(head(MESSAGES, 50 * 1024 * 1024) + b"{" * 1000)
        status, headers, body = read_response(sock)
        assert status == 413 and headers["connection"] == "close"
        assert body["type"] == "error"  # the Anthropic envelope on /v1/messages
        assert body["error"]["message"] == f"Request body too large: the limit is {LIMIT} bytes"
        assert closed(sock)
    assert server.requests() == []  # never reached the engine


def test_a_chunked_body_is_cut_when_it_grows_beyond_the_limit(server: ChaosServer) -> None:
    with connect(server) as sock:
        sock.sendall(head(CHAT, chunked=True))
        chunk = b"%x\r\n%s\r\n" % (16 * 1024, b" " * 16 * 1024)
        try:
            for _ in range(LIMIT // (16 * 1024) + 2):
                sock.sendall(chunk)
        except OSError:
            pass  # the server may close while we still write
        status, _, body = read_response(sock)
        assert status == 413 and body["error"]["code"] == "request_too_large"


def test_a_body_within_the_limit_is_served(server: ChaosServer) -> None:
    body = request_body("simple-chat/0001", stream=False)
    body["user"] = "x" * (LIMIT - 1000)
    with connect(server) as sock:
        raw = json.dumps(body).encode()
        assert len(raw) <= LIMIT
        sock.sendall(head(CHAT, len(raw)) + raw)
        status, _, _ = read_response(sock)
        assert status != 413


def test_the_cli_flag_is_enforced(tmp_path: Path) -> None:
    with (
        serving("--server", "uvicorn", "--max-body-bytes", "1000") as (url, _),
        socket.create_connection(("127.0.0.1", urlsplit(url).port or 0), timeout=10) as sock,
    ):
        sock.sendall(head(CHAT, 50 * 1024 * 1024))
        status, _, body = read_response(sock)
        assert status == 413
        assert body["error"]["message"].endswith("the limit is 1000 bytes")


# -- read deadlines ----------------------------------------------------------------------


def test_a_partial_head_gets_408_then_close(server: ChaosServer) -> None:
    with connect(server) as sock:
        started = time.monotonic()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0")
        status, headers, body = read_response(sock)
        assert status == 408 and headers["connection"] == "close"
        assert body["error"]["code"] == "timeout"
        assert closed(sock)
        assert SHORT - 0.05 <= time.monotonic() - started < SHORT + 3


def test_a_silent_connection_is_closed(server: ChaosServer) -> None:
    with connect(server) as sock:
        started = time.monotonic()
        sock.settimeout(10)
        assert sock.recv(100) == b""  # a plain close: nothing was asked
        assert time.monotonic() - started < SHORT + 3


def test_a_slowloris_head_is_cut(server: ChaosServer) -> None:
    with connect(server) as sock:
        started = time.monotonic()
        request = head(CHAT, 2)
        cut = False
        for byte in request:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                cut = True
                break
            if time.monotonic() - started > SHORT + 3:
                break
            time.sleep(0.05)
        assert cut or closed(sock, 3)
        assert time.monotonic() - started < SHORT + 4


def test_a_stalled_body_gets_408_in_the_protocols_envelope(server: ChaosServer) -> None:
    with connect(server) as sock:
        sock.sendall(head(MESSAGES, 100) + b"{")
        status, _, body = read_response(sock)
        assert status == 408
        assert body == {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "Timed out reading the request body",
            },
        }
        assert closed(sock)


def test_a_body_trickled_below_the_minimum_rate_is_cut(server: ChaosServer) -> None:
    with connect(server) as sock:
        sock.sendall(head(CHAT, 60_000) + b"{")
        started = time.monotonic()
        sock.settimeout(0.1)
        answer = b""
        while time.monotonic() - started < 10 and not answer:
            try:
                sock.sendall(b" ")  # a byte every 0.1 s: never a pause, far too slow
                answer = sock.recv(1000)
                break
            except TimeoutError:
                continue
            except OSError:
                break
        assert answer.startswith(b"HTTP/1.1 408 ") or not answer
        assert time.monotonic() - started < SHORT + guard.BODY_TIMEOUT_S + 3


def test_keep_alive_between_requests_is_not_a_head_deadline(server: ChaosServer) -> None:
    raw = json.dumps(request_body("simple-chat/0001", stream=False)).encode()
    with connect(server) as sock:
        sock.sendall(head(CHAT, len(raw)) + raw)
        assert read_response(sock)[0] == 200
        time.sleep(SHORT * 3)  # idle: uvicorn's keep-alive (5 s) governs, not the head's
        sock.sendall(head(CHAT, len(raw)) + raw)
        assert read_response(sock)[0] == 200


def test_a_large_body_sent_at_once_is_read(server: ChaosServer) -> None:
    body = request_body("simple-chat/0001", stream=False)
    body["user"] = "x" * (LIMIT - 1000)
    raw = json.dumps(body).encode()
    with connect(server) as sock:
        sock.sendall(head(CHAT, len(raw)))
        time.sleep(SHORT / 2)
        sock.sendall(raw)
        assert read_response(sock)[0] not in (408, 413)


def test_a_head_over_16_kib_is_refused(server: ChaosServer) -> None:
    with connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 20_000)
        status, headers, body = read_response(sock)
        # 431 as the builtin server says; h11 refuses such a head itself (a 400).
        assert status in (431, 400) and headers["connection"] == "close"
        assert body["error"]["code"] == "bad_request"
        assert closed(sock)


def test_malformed_http_gets_a_json_envelope(server: ChaosServer) -> None:
    with connect(server) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        status, headers, body = read_response(sock)
        assert status == 400 and headers["connection"] == "close"
        assert body["error"]["code"] == "bad_request"


# -- --max-connections -------------------------------------------------------------------


def test_max_connections_closes_idle_ones_first_and_keeps_the_control_plane() -> None:
    raw = json.dumps(request_body("simple-chat/0001", stream=False)).encode()
    replay = head(CHAT, len(raw)) + raw

    def opened(server: ChaosServer, first: bytes = b"") -> socket.socket:
        sock = connect(server)
        if first:
            sock.sendall(first)
        time.sleep(0.05)  # accepted in this order
        return sock

    with ChaosServer(server="uvicorn", max_connections=3) as server:
        # Full of connections that each began a request: a new one is in the reserve.
        busy = [opened(server, b"GET /health HTTP/1.1\r\n") for _ in range(3)]
        with opened(server, replay) as extra:
            status, headers, body = read_response(extra)
            assert status == 503 and headers["connection"] == "close"
            assert body["error"]["code"] == "server_busy"
            assert "--max-connections" in body["error"]["message"]
        with opened(server, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n") as health:
            assert read_response(health)[0] == 200
        for sock in busy:
            sock.close()
        # Full of idle connections: the oldest is closed for a new one, which is served.
        idle = [opened(server) for _ in range(3)]
        with opened(server, replay) as new:
            assert read_response(new)[0] == 200
        assert closed(idle[0], 3)
        idle[1].settimeout(0.2)
        with pytest.raises(TimeoutError):
            idle[1].recv(1)  # still open
        for sock in idle:
            sock.close()


# -- shutdown ----------------------------------------------------------------------------


def _stalled_request(port: int) -> socket.socket:
    raw = json.dumps(request_body("simple-chat/0001", stream=False)).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(head(CHAT, len(raw)) + raw)
    sock.settimeout(10)
    assert sock.recv(12) == b"HTTP/1.1 200"  # the head, then silence
    return sock


def test_sigterm_during_a_stall_exits_after_the_graceful_timeout() -> None:
    with serving("--server", "uvicorn") as (base, proc):
        armed = httpx.post(f"{base}/__fault", json={"type": "stall", "max_ms": 120_000})
        assert armed.status_code == 201
        with _stalled_request(urlsplit(base).port or 0):
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(guard.GRACEFUL_TIMEOUT_S + 10)
            assert time.monotonic() - started < guard.GRACEFUL_TIMEOUT_S + 5


def test_stop_during_a_stall_returns() -> None:
    server = ChaosServer(server="uvicorn").start()
    try:
        server.arm("stall", max_ms=120_000)
        assert server.port is not None
        with _stalled_request(server.port):
            started = time.monotonic()
            server.stop(timeout=guard.GRACEFUL_TIMEOUT_S + 5)
            assert time.monotonic() - started < guard.GRACEFUL_TIMEOUT_S + 5
    finally:
        server.stop()


# -- the open-file limit -----------------------------------------------------------------

_ASYNCIO_UVICORN = """
import sys
import chaosllm.server as server
real_has = server._has
server._has = lambda m: m != "uvloop" and real_has(m)  # asyncio's accept loop: the flood
from chaosllm.cli import main
sys.exit(main(["serve", "--server", "uvicorn", "--port", sys.argv[1]]))
"""
"""`chaosllm serve --server uvicorn` on the plain asyncio loop (uvloop fails accepts
quietly)."""


def _limit_open_files() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


def _health(port: int, within: float) -> httpx.Response:
    deadline = time.monotonic() + within
    while True:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=within)
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_NOFILE")
def test_the_open_file_limit_logs_little_and_recovers(tmp_path: Path) -> None:
    """At 256 open files: silent connections are closed for new ones (health answers
    while 600 are open), and connections that hold their files (a head begun) make the
    accepts fail, logged once per interval instead of thousands of times a second."""
    port = free_port()
    log_path = tmp_path / "stderr.log"
    with (
        log_path.open("wb") as log,
        subprocess.Popen(
            [sys.executable, "-c", _ASYNCIO_UVICORN, str(port)],
            stdout=subprocess.PIPE,
            stderr=log,
            preexec_fn=_limit_open_files,
        ) as proc,
    ):
        try:
            assert proc.stdout is not None
            assert b"listening" in proc.stdout.readline()
            silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(600)]
            started = time.monotonic()
            assert _health(port, 5).status_code == 200
            assert time.monotonic() - started < 4  # asyncio retries a failed accept after 1 s
            for sock in silent:
                sock.close()
            busy = []
            for _ in range(600):  # each holds its file: a head begun is not idle
                sock = socket.create_connection(("127.0.0.1", port), timeout=10)
                sock.sendall(b"GET /health HTTP/1.1\r\n")
                busy.append(sock)
            time.sleep(3)
            size = os.path.getsize(log_path)
            assert size < 64 * 1024, f"{size} bytes of log in 3 s"
            for sock in busy:
                sock.close()
            assert _health(port, 10).status_code == 200
        finally:
            proc.terminate()
            proc.wait(15)
    text = log_path.read_text("utf-8", "replace")
    # Accepts fail in bursts (asyncio accepts a whole backlog before any connection can be
    # closed): at most one line per interval says so, with no traceback.
    assert text.count("cannot accept connections") <= 2
    assert text.count("Traceback") <= 3
