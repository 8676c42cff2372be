"""The proxy's bounds on what an upstream answers (issue #23), over real sockets: a
compression bomb, an oversized head and streams that never end are refused or passed on
without being held whole, and nothing of them is recorded.

The upstream is a loopback `http.server` that speaks HTTP/1.1 and sends what each test
needs; the proxy under test is a `ChaosServer` in record or passthrough mode, on each
wire server."""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import httpx
import pytest

from chaosllm import ChaosServer
from chaosllm.errors import UpstreamTooLarge
from chaosllm.record import bounds
from tests.helpers import loopback_upstream, request_body, write_chunk

pytestmark = pytest.mark.timeout(60)

SERVERS = ["builtin", "h11", "uvicorn"]


def _bomb() -> bytes:
    """256 MiB of zeros gzip-compressed: about 250 KB on the wire."""
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(1 << 20)
    return b"".join(squeeze.compress(block) for _ in range(256)) + squeeze.flush()


BOMB = _bomb()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mode = "bomb"

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        mode = type(self).mode
        if mode == "bomb":
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-encoding", "gzip")
            self.send_header("content-length", str(len(BOMB)))
            self.end_headers()
            self.wfile.write(BOMB)
        elif mode == "head":
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("x-huge", "a" * (2 << 20))
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"{}")
        elif mode == "endless":
            # SSE without a blank line, 24 MiB of it, then the end.
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            piece = b"data: " + b"x" * (1 << 20)
            for _ in range(24):
                write_chunk(self, piece)
            write_chunk(self, b"")


@pytest.fixture
def upstream() -> Iterator[type[_Handler]]:
    handler = type("Handler", (_Handler,), {})
    yield handler


def _post(url: str, *, stream: bool = False) -> httpx.Response:
    with httpx.Client(timeout=30) as client:
        return client.post(
            url + "/v1/chat/completions",
            json=request_body("simple-chat/0001", stream=stream),
            headers={"authorization": "Bearer sk-test"},
        )


@pytest.mark.parametrize("server", SERVERS)
def test_a_gzip_bomb_is_a_502_nothing_recorded_and_the_server_keeps_answering(
    upstream: type[_Handler], server: str, tmp_path: Path
) -> None:
    upstream.mode = "bomb"
    with (
        loopback_upstream(upstream) as url,
        ChaosServer(mode="record", upstream=url, record_dir=tmp_path, server=server) as proxy,
    ):
        worst = 0.0
        stop = threading.Event()

        def probe() -> None:
            nonlocal worst
            with httpx.Client(timeout=30) as client:
                while not stop.is_set():
                    start = time.monotonic()
                    client.get(proxy.url + "/__fault")
                    worst = max(worst, time.monotonic() - start)
                    stop.wait(0.01)

        prober = threading.Thread(target=probe)
        prober.start()
        try:
            started = time.monotonic()
            response = _post(proxy.url)
            took = time.monotonic() - started
        finally:
            stop.set()
            prober.join(timeout=30)
        entry = proxy.requests()[-1]
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert error["code"] == "upstream_too_large"
    assert "compression bomb" in error["message"]
    assert list(tmp_path.rglob("*.json")) == []
    assert entry["status"] == 502
    assert took < 10
    assert worst < 1.0, f"the control plane waited {worst:.2f} s during the decode"


@pytest.mark.parametrize("server", SERVERS)
def test_an_upstream_head_over_1_mib_is_a_502_naming_it(
    upstream: type[_Handler], server: str
) -> None:
    upstream.mode = "head"
    with (
        loopback_upstream(upstream) as url,
        ChaosServer(mode="passthrough", upstream=url, server=server) as proxy,
    ):
        response = _post(proxy.url)
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "upstream_too_large"
    assert "head over 1048576 bytes" in error["message"]


def test_a_stream_with_no_blank_line_passes_on_whole_and_is_not_recorded(
    upstream: type[_Handler], tmp_path: Path
) -> None:
    upstream.mode = "endless"
    with (
        loopback_upstream(upstream) as url,
        ChaosServer(mode="record", upstream=url, record_dir=tmp_path) as proxy,
    ):
        started = time.monotonic()
        response = _post(proxy.url, stream=True)
        took = time.monotonic() - started
        entry = proxy.requests()[-1]
    assert response.status_code == 200
    assert len(response.content) == 24 * ((1 << 20) + 6)
    assert list(tmp_path.rglob("*.json")) == []
    assert "not recorded" in entry["error"]
    assert took < 20


def test_an_answer_over_the_body_bound_is_passed_on_and_not_recorded(
    upstream: type[_Handler], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream.mode = "endless"
    monkeypatch.setattr("chaosllm.record.proxy.MAX_BODY", 4 << 20)
    with (
        loopback_upstream(upstream) as url,
        ChaosServer(mode="record", upstream=url, record_dir=tmp_path) as proxy,
    ):
        response = _post(proxy.url, stream=True)
        entry = proxy.requests()[-1]
    assert len(response.content) == 24 * ((1 << 20) + 6)
    assert f"over {4 << 20} bytes" in entry["error"]
    assert list(tmp_path.rglob("*.json")) == []


def test_decode_refuses_a_ratio_and_a_size_and_decodes_what_is_fair() -> None:
    text = b'{"ok": true}' * 1000
    assert bounds.decode(zlib.compress(text), "deflate") == text
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    gz = squeeze.compress(bytes(8 << 20)) + squeeze.flush()
    with pytest.raises(UpstreamTooLarge, match="compression bomb"):
        bounds.decode(gz, "gzip")
    with pytest.raises(UpstreamTooLarge):
        bounds.decode(zlib.compress(text), "deflate", limit=100)
    with pytest.raises(zlib.error):
        bounds.decode(zlib.compress(text)[:-8], "deflate")
