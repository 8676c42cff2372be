"""Two corners of HTTP/1.1 (issue #23), on every server over a raw socket: a chunked
body's trailer fields are never taken for headers (a trailer cannot set the session),
and an absolute-form request target (``POST http://host/v1/...``, as a client sends it
through a forward proxy) is answered as its path."""

from __future__ import annotations

import json
import socket

import pytest

from chaosllm import ChaosServer
from chaosllm.wire.common import path_of
from tests.helpers import read_response, request_body

pytestmark = pytest.mark.timeout(60)

SERVERS = ["builtin", "h11", "uvicorn"]
BODY = json.dumps(request_body("simple-chat/0001", stream=False)).encode()


def _send(server: ChaosServer, data: bytes) -> tuple[int, bytes, bytes]:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(data)
        return read_response(sock)


@pytest.mark.parametrize("server_kind", SERVERS)
def test_a_trailer_never_becomes_a_header(server_kind: str) -> None:
    with ChaosServer(server=server_kind) as server:
        data = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
            b"%x\r\n%s\r\n0\r\nx-chaosllm-session: from-a-trailer\r\n\r\n" % (len(BODY), BODY)
        )
        status, _, _ = _send(server, data)
        assert status == 200
        [entry] = server.requests()
    assert entry["session"] is None


@pytest.mark.parametrize("server_kind", SERVERS)
def test_an_absolute_form_target_is_answered_as_its_path(server_kind: str) -> None:
    with ChaosServer(server=server_kind) as server:
        port = server.port
        head = (
            f"POST http://127.0.0.1:{port}/v1/chat/completions HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(BODY)}\r\n\r\n"
        ).encode()
        status, _, body = _send(server, head + BODY)
        assert status == 200, body
        assert json.loads(body)["object"] == "chat.completion"
        health = f"GET http://127.0.0.1:{port}/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        status, _, body = _send(server, health.encode())
        assert status == 200, body
        assert [e["path"] for e in server.requests()] == ["/v1/chat/completions"]


def test_path_of_reads_absolute_and_origin_forms_alike() -> None:
    assert path_of(b"http://h:1/v1/x?a=b") == (b"/v1/x", b"a=b", "/v1/x")
    assert path_of(b"HTTPS://h/v1/%78") == (b"/v1/%78", b"", "/v1/x")
    assert path_of(b"http://h?q=1") == (b"/", b"q=1", "/")
    assert path_of(b"http://h") == (b"/", b"", "/")
    assert path_of(b"/v1/x?a") == (b"/v1/x", b"a", "/v1/x")
    assert path_of(b"httpfoo") == (b"httpfoo", b"", "httpfoo")
