"""The provider endpoints behind the control plane's Host rule when the server is bound to
loopback, and CORS only when asked (issue #23), on every server, over raw sockets: a
DNS-rebinding page (its own name in ``Host``) can neither read recorded answers nor
miss messages, and no page of another origin can read an answer unless ``--cors`` lets
it."""

from __future__ import annotations

import json
import socket

import pytest

from chaosllm import ChaosServer
from tests.helpers import read_response, request_body

pytestmark = pytest.mark.timeout(60)

SERVERS = ["builtin", "h11", "uvicorn"]
BODY = json.dumps(request_body("simple-chat/0001", stream=False)).encode()


def _ask(
    server: ChaosServer, host: str, extra: str = "", method: str = "POST", path: str = ""
) -> tuple[int, bytes, bytes]:
    target = path or "/v1/chat/completions"
    body = BODY if method == "POST" else b""
    head = (
        f"{method} {target} HTTP/1.1\r\nHost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{extra}\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head + body)
        return read_response(sock)


@pytest.mark.parametrize("server_kind", SERVERS)
def test_bound_to_loopback_a_foreign_host_is_refused_on_provider_endpoints(
    server_kind: str,
) -> None:
    with ChaosServer(server=server_kind, allow_hosts=["chaosllm"]) as server:
        port = server.port
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"chaosllm:{port}", "[::1]"):
            status, _, _ = _ask(server, host)
            assert status == 200, host
        for host in ("evil.example", f"evil.example:{port}", "chaosllm.evil.example"):
            status, _, body = _ask(server, host)
            assert status == 403, host
            error = json.loads(body)["error"]
            assert error["code"] == "host_forbidden"
            assert "--allow-host" in error["message"]
            assert b"recorded" not in body
        # A miss (its message quotes recordings) is refused the same way.
        status, _, _ = _ask(server, "evil.example", path="/v1/responses")
        assert status == 403
        assert [e["status"] for e in server.requests()] == [200] * 4


@pytest.mark.parametrize("server_kind", SERVERS)
def test_cors_is_answered_only_for_the_origins_asked(server_kind: str) -> None:
    preflight = "Origin: http://localhost:5173\r\nAccess-Control-Request-Method: POST\r\n"
    with ChaosServer(server=server_kind) as server:
        host = f"127.0.0.1:{server.port}"
        status, head, _ = _ask(server, host, preflight, method="OPTIONS")
        assert status != 204 and b"access-control-allow-origin" not in head.lower()
        status, head, _ = _ask(server, host, "Origin: http://localhost:5173\r\n")
        assert status == 200 and b"access-control-allow-origin" not in head.lower()
    with ChaosServer(server=server_kind, cors=["http://localhost:5173"]) as server:
        host = f"127.0.0.1:{server.port}"
        status, head, _ = _ask(server, host, preflight, method="OPTIONS")
        assert status == 204
        assert b"access-control-allow-origin: http://localhost:5173" in head.lower()
        status, head, _ = _ask(server, host, "Origin: http://localhost:5173\r\n")
        assert status == 200
        assert b"access-control-allow-origin: http://localhost:5173" in head.lower()
        status, head, _ = _ask(server, host, "Origin: http://other.example\r\n")
        assert status == 200 and b"access-control-allow-origin" not in head.lower()
        status, head, _ = _ask(server, host, preflight, method="OPTIONS", path="/__requests")
        assert status != 204


def test_bound_to_every_address_provider_endpoints_answer_any_host() -> None:
    with ChaosServer(host="0.0.0.0") as server:
        status, _, _ = _ask(server, "chaosllm-in-compose:8000")
        assert status == 200
        status, _, _ = _ask(server, "chaosllm-in-compose:8000", method="GET", path="/__fault")
        assert status == 403  # the control plane keeps its rule
