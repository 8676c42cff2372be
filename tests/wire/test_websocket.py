"""WebSocket on real sockets (the builtin and h11 servers; uvicorn in tests/clients): the
upgrade handed over by the HTTP connection, ping/pong, permessage-deflate as the ``websockets``
client negotiates it, bad input closed with its code while the server keeps serving."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from chaosllm import ChaosServer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module", params=["builtin", "h11"])
def server(request: pytest.FixtureRequest) -> Iterator[ChaosServer]:
    with ChaosServer(server=request.param) as srv:
        yield srv


def ws_url(server: ChaosServer, path: str = "/v1/realtime?model=gpt-realtime") -> str:
    return server.url.replace("http://", "ws://") + path


def healthy(server: ChaosServer) -> bool:
    return httpx.get(server.url + "/health", timeout=5).status_code == 200


def test_a_session_opens_and_pings_are_answered(server: ChaosServer) -> None:
    with connect(ws_url(server), compression=None, open_timeout=5) as ws:
        first = json.loads(ws.recv(timeout=5))
        assert first["type"] == "session.created"
        assert ws.ping().wait(timeout=5)


def test_permessage_deflate_as_websockets_offers_it(server: ChaosServer) -> None:
    with connect(ws_url(server), compression="deflate", open_timeout=5) as ws:
        assert ws.response is not None
        assert "permessage-deflate" in ws.response.headers.get("Sec-WebSocket-Extensions", "")
        assert json.loads(ws.recv(timeout=5))["type"] == "session.created"
        ws.send(json.dumps({"type": "session.update", "session": {"instructions": "x" * 5000}}))
        assert json.loads(ws.recv(timeout=5))["type"] == "session.updated"


def test_an_oversized_message_closes_with_1009_and_the_server_serves_on(
    server: ChaosServer,
) -> None:
    with connect(ws_url(server), compression=None, max_size=None, open_timeout=5) as ws:
        ws.recv(timeout=5)
        with pytest.raises(ConnectionClosed) as caught:
            ws.send("x" * (16 * 1024 * 1024 + 1))
            ws.recv(timeout=10)
        assert caught.value.rcvd is not None and caught.value.rcvd.code == 1009
    assert healthy(server)


def test_a_binary_frame_closes_with_1008(server: ChaosServer) -> None:
    with connect(ws_url(server), compression=None, open_timeout=5) as ws:
        ws.recv(timeout=5)
        ws.send(b"\x00\x01")
        with pytest.raises(ConnectionClosed) as caught:
            ws.recv(timeout=5)
        assert caught.value.rcvd is not None and caught.value.rcvd.code == 1008
    assert healthy(server)


def test_a_text_frame_that_is_not_json_is_an_error_event(server: ChaosServer) -> None:
    with connect(ws_url(server), compression=None, open_timeout=5) as ws:
        ws.recv(timeout=5)
        ws.send("not json")
        error = json.loads(ws.recv(timeout=5))
        assert error["type"] == "error"
        assert error["error"]["type"] == "invalid_request_error"
        assert "not valid JSON" in error["error"]["message"]
        ws.send(json.dumps({"type": "session.update", "session": {}}))
        assert json.loads(ws.recv(timeout=5))["type"] == "session.updated"  # still served


def raw_upgrade(
    server: ChaosServer, path: str, version: bytes = b"13", extra: bytes = b""
) -> bytes:
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(
            b"GET " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: MDEyMzQ1Njc4OWFiY2RlZg==\r\n"
            b"Sec-WebSocket-Version: " + version + b"\r\n" + extra + b"\r\n"
        )
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def test_a_page_of_another_origin_is_refused(server: ChaosServer) -> None:
    evil = raw_upgrade(server, "/v1/realtime", extra=b"Origin: https://evil.example\r\n")
    assert evil.startswith(b"HTTP/1.1 403 ")
    local = raw_upgrade(server, "/v1/realtime", extra=b"Origin: http://localhost:3000\r\n")
    assert local.startswith(b"HTTP/1.1 101 ")


def test_a_bad_upgrade_is_refused_over_http(server: ChaosServer) -> None:
    assert raw_upgrade(server, "/v1/realtime", b"8").startswith(b"HTTP/1.1 426 ")
    assert raw_upgrade(server, "/v1/not-a-socket").startswith(b"HTTP/1.1 403 ")
    assert raw_upgrade(server, "/v1/realtime").startswith(b"HTTP/1.1 101 Switching Protocols")
    assert healthy(server)


@pytest.mark.parametrize("kind", ["builtin", "h11"])
def test_a_server_stopping_closes_its_sessions_with_1001(kind: str) -> None:
    srv = ChaosServer(server=kind).start()
    try:
        with connect(ws_url(srv), compression=None, open_timeout=5) as ws:
            ws.recv(timeout=5)
            srv.stop()
            with pytest.raises(ConnectionClosed) as caught:
                ws.recv(timeout=10)
            assert caught.value.rcvd is not None and caught.value.rcvd.code == 1001
    finally:
        srv.stop()
