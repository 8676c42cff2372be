"""MCP's streamable HTTP on a raw socket, on each server (builtin, h11, uvicorn): the
POST with its session, the GET stream, DELETE, and the transport's error answers."""

from __future__ import annotations

import json
import socket
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from chaosllm.core.mcp import sessions_of
from chaosllm.server import ChaosServer
from tests.helpers import loopback_upstream, read_head, read_until_eof
from tests.mcp_helpers import INIT_PARAMS, QUERY, write_recordings

pytestmark = pytest.mark.timeout(30)

SERVERS = ["builtin", "h11", "uvicorn"]


def read_whole(sock: socket.socket) -> tuple[int, bytes, bytes]:
    """A response read to EOF (``connection: close``), a chunked body joined."""
    data = read_until_eof(sock)
    head, _, body = data.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        joined = b""
        while body:
            size, _, rest = body.partition(b"\r\n")
            length = int(size, 16)
            if length == 0:
                break
            joined, body = joined + rest[:length], rest[length + 2 :]
        body = joined
    return int(head.split(b" ")[1]), head, body


def send(
    server: ChaosServer,
    method: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    *,
    read: Any = read_whole,
) -> tuple[int, bytes, bytes]:
    head = {
        "host": f"127.0.0.1:{server.port}",
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "content-length": str(len(body)),
        "connection": "close",
        **(headers or {}),
    }
    lines = "".join(f"{k}: {v}\r\n" for k, v in head.items())
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(f"{method} /mcp/search HTTP/1.1\r\n{lines}\r\n".encode() + body)
        result: tuple[int, bytes, bytes] = read(sock)
        return result


def rpc(method: str, rpc_id: int | None = 1, params: Any = None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params or {}}
    if rpc_id is not None:
        message["id"] = rpc_id
    return json.dumps(message).encode()


def header(head: bytes, name: str) -> str | None:
    for line in head.decode("latin-1").split("\r\n")[1:]:
        key, _, value = line.partition(":")
        if key.strip().lower() == name:
            return value.strip()
    return None


@pytest.fixture(params=SERVERS)
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    with ChaosServer(write_recordings(tmp_path), server=request.param, max_body_bytes=4096) as s:
        yield s


def test_a_session_on_a_raw_socket(server: ChaosServer) -> None:
    status, head, body = send(server, "POST", rpc("initialize", 1, INIT_PARAMS))
    assert status == 200 and b"event: message" in body and b'"id": 1' in body
    session = header(head, "mcp-session-id")
    assert session is not None
    with_session = {"mcp-session-id": session}
    status, _, body = send(server, "POST", rpc("notifications/initialized", None), with_session)
    assert status == 202 and body == b""
    status, _, body = send(server, "POST", rpc("tools/list", 2), with_session)
    assert status == 200 and b'"search"' in body
    # the GET stream opens (then this client leaves)
    status, head, _ = send(server, "GET", b"", with_session, read=read_head)
    assert status == 200 and "text/event-stream" in (header(head, "content-type") or "")
    assert send(server, "DELETE", b"", with_session)[0] == 200
    status, _, body = send(server, "POST", rpc("tools/list", 3), with_session)
    assert status == 404 and json.loads(body)["error"]["code"] == -32600


@pytest.mark.parametrize(
    ("body", "headers", "status", "code"),
    [
        (b"{nope", {"mcp-session-id": "x"}, 400, -32700),
        (b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', {}, 400, -32600),
        (rpc("tools/list"), {}, 400, -32600),  # no session id
        (rpc("tools/list"), {"mcp-session-id": "never-minted"}, 404, -32600),
        (rpc("ping"), {"mcp-protocol-version": "1999-01-01"}, 400, -32600),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "pad": "' + b"x" * 5000 + b'"}',
            {},
            413,
            None,
        ),
    ],
    ids=["malformed", "batch", "no-session", "unknown-session", "bad-version", "oversized"],
)
def test_bad_input_gets_the_transport_answers(
    server: ChaosServer, body: bytes, headers: dict[str, str], status: int, code: int | None
) -> None:
    got, _, answer = send(server, "POST", body, headers)
    assert got == status
    error = json.loads(answer)
    assert error["jsonrpc"] == "2.0" and "error" in error
    if code is not None:
        assert error["error"]["code"] == code
    assert all(e["recording"] is None for e in server.requests())


def test_get_and_delete_need_a_session(server: ChaosServer) -> None:
    assert send(server, "GET", b"", read=read_head)[0] == 400
    assert send(server, "DELETE", b"", {"mcp-session-id": "never-minted"})[0] == 404


# -- each MCP fault on a raw socket -------------------------------------------------------

CALL = rpc("tools/call", 7, {"name": "search", "arguments": {"q": QUERY}})


def _session(server: ChaosServer) -> dict[str, str]:
    _, head, _ = send(server, "POST", rpc("initialize", 1, INIT_PARAMS))
    session = header(head, "mcp-session-id")
    assert session is not None
    return {"mcp-session-id": session}


def _events(body: bytes) -> list[Any]:
    return [
        json.loads(line[len(b"data: ") :])
        for line in body.split(b"\n")
        if line.startswith(b"data: ")
    ]


def _call_with(server: ChaosServer, spec: dict[str, Any]) -> tuple[int, list[Any]]:
    with_session = _session(server)
    server.arm({**spec, "match": {"server": "search", "tool": "search"}})
    status, _, body = send(server, "POST", CALL, with_session)
    return status, _events(body)


def test_mcp_error_on_a_raw_socket(server: ChaosServer) -> None:
    status, events = _call_with(server, {"type": "mcp_error", "code": -32002})
    assert status == 200 and events[-1]["error"]["code"] == -32002 and events[-1]["id"] == 7


def test_tool_error_on_a_raw_socket(server: ChaosServer) -> None:
    status, events = _call_with(server, {"type": "tool_error", "message": "quota"})
    assert status == 200 and events[-1]["result"]["isError"] is True
    assert "quota" in json.dumps(events[-1]["result"]["content"])


def test_mcp_timeout_on_a_raw_socket(server: ChaosServer) -> None:
    status, events = _call_with(server, {"type": "mcp_timeout", "max_ms": 300})
    assert status == 200 and not any("result" in e or "error" in e for e in events)


def test_mcp_stream_drop_on_a_raw_socket(server: ChaosServer) -> None:
    status, events = _call_with(server, {"type": "mcp_stream_drop", "after_events": 1})
    assert status == 200 and [e.get("method") for e in events] == ["notifications/progress"]


def test_mcp_session_lost_on_a_raw_socket(server: ChaosServer) -> None:
    status, _ = _call_with(server, {"type": "mcp_session_lost"})
    assert status == 404


def test_tools_changed_on_a_raw_socket(server: ChaosServer) -> None:
    status, events = _call_with(server, {"type": "tools_changed"})
    methods = [e.get("method") for e in events]
    assert status == 200 and "notifications/tools/list_changed" in methods
    assert "result" in events[-1]


def test_bad_tool_output_on_a_raw_socket(server: ChaosServer) -> None:
    status, events = _call_with(server, {"type": "bad_tool_output"})
    hits = events[-1]["result"]["structuredContent"]["hits"]
    assert status == 200 and not isinstance(hits, int)


def test_a_cancelled_mcp_timeout_ends_its_stream(server: ChaosServer) -> None:
    """The client's ``notifications/cancelled`` stops the silent answer at once (not at
    max_ms) and the journal says which request it cancelled."""
    with_session = _session(server)
    server.arm({"type": "mcp_timeout", "max_ms": 30_000, "match": {"tool": "search"}})
    head = {
        "host": f"127.0.0.1:{server.port}",
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "content-length": str(len(CALL)),
        **with_session,
    }
    lines = "".join(f"{k}: {v}\r\n" for k, v in head.items())
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(f"POST /mcp/search HTTP/1.1\r\n{lines}\r\n".encode() + CALL)
        status, _, _ = read_head(sock)
        assert status == 200
        started = time.monotonic()
        note = rpc("notifications/cancelled", None, {"requestId": 7, "reason": "timeout"})
        assert send(server, "POST", note, with_session)[0] == 202
        rest = read_until_eof(sock)  # the stream is closed: no result ever came
        waited = time.monotonic() - started
    assert waited < 5 and b'"result"' not in rest
    journal = server.requests()
    call = next(e for e in journal if e["method"] == "tools/call")
    cancel = next(e for e in journal if e["method"] == "notifications/cancelled")
    assert call["outcome"] == "cancelled" and call["rpc_id"] == 7
    assert cancel["cancels"] == call["seq"]


# -- the GET stream: server notifications, Last-Event-ID ---------------------------------


def _open_get(server: ChaosServer, headers: dict[str, str]) -> socket.socket:
    """A GET stream of the session, open, its head read."""
    head = {"host": f"127.0.0.1:{server.port}", "accept": "text/event-stream", **headers}
    lines = "".join(f"{k}: {v}\r\n" for k, v in head.items())
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(f"GET /mcp/search HTTP/1.1\r\n{lines}\r\n".encode())
    status, _, _ = read_head(sock)
    assert status == 200
    return sock


def test_tools_changed_is_sent_on_the_open_get_stream(server: ChaosServer) -> None:
    with_session = _session(server)
    session = sessions_of(server.state).get(with_session["mcp-session-id"], "search")
    assert session is not None
    with _open_get(server, with_session) as stream:
        deadline = time.monotonic() + 5
        while not session.listeners:  # the stream is listening once its body begins
            assert time.monotonic() < deadline, "the GET stream never listened"
            time.sleep(0.01)
        server.arm({"type": "tools_changed", "match": {"tool": "search"}})
        status, _, body = send(server, "POST", CALL, with_session)
        assert status == 200 and b"list_changed" not in body  # not on the answer: once only
        got = b""
        while b"list_changed" not in got:
            got += stream.recv(65536)
    assert b"id: 0-1\n" in got and b'"notifications/tools/list_changed"' in got


def test_a_resumable_stream_drop_resumes_with_last_event_id(server: ChaosServer) -> None:
    with_session = _session(server)
    server.arm({"type": "mcp_stream_drop", "after_events": 1, "retry_ms": 10})
    status, _, body = send(server, "POST", CALL, with_session)
    assert status == 200 and b"id: 1-1\nretry: 10\n" in body
    assert [e.get("method") for e in _events(body)] == ["notifications/progress"]
    got = send(server, "GET", b"", {**with_session, "last-event-id": "1-1"})
    status, _, rest = got
    (result,) = _events(rest)
    assert status == 200 and b"id: 1-2\n" in rest and result["result"]["structuredContent"]
    assert result["id"] == 7  # the live request's id
    refused = send(server, "GET", b"", {**with_session, "last-event-id": "9-1"})
    assert refused[0] == 400  # no stream of the session to resume


# -- the older HTTP+SSE transport (2024-11-05) ---------------------------------------------


def test_the_http_sse_transport_on_a_raw_socket(server: ChaosServer) -> None:
    head = f"GET /mcp/search/sse HTTP/1.1\r\nhost: 127.0.0.1:{server.port}\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sse:
        sse.sendall(f"{head}accept: text/event-stream\r\n\r\n".encode())
        status, _, got = read_head(sse)
        while b"\n\n" not in got:
            got += sse.recv(65536)
        assert status == 200 and b"event: endpoint" in got
        endpoint = next(line for line in got.split(b"\n") if line.startswith(b"data: "))[6:]
        path = endpoint.decode().strip()
        assert path.startswith("/mcp/search/messages/?session_id=")

        def post(body: bytes, target: str = path) -> int:
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
                sock.sendall(
                    f"POST {target} HTTP/1.1\r\nhost: 127.0.0.1:{server.port}\r\n"
                    f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
                    f"connection: close\r\n\r\n".encode()
                    + body
                )
                return read_whole(sock)[0]

        assert post(rpc("initialize", 1, INIT_PARAMS)) == 202
        while b'"serverInfo"' not in got:
            got += sse.recv(65536)
        assert b"event: message\r\n" not in got and b'"id": 1' in got
        assert post(b"{nope") == 400
        assert post(rpc("ping"), "/mcp/search/messages/?session_id=unknown") == 404


class _SessionUpstream(BaseHTTPRequestHandler):
    """A loopback MCP server that keeps sessions (``up-1``) and notes each DELETE."""

    deleted: list[str | None] = []

    def do_POST(self) -> None:
        message = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if "id" not in message:  # a notification
            self.send_response(202)
            self.send_header("content-length", "0")
            self.end_headers()
            return
        result: dict[str, Any] = {"tools": []}
        if message["method"] == "initialize":
            result = {"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {}}
        answer = {"jsonrpc": "2.0", "id": message["id"], "result": result}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("mcp-session-id", "up-1")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_DELETE(self) -> None:
        type(self).deleted.append(self.headers.get("mcp-session-id"))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_record_missing_ends_the_upstreams_session_with_the_clients(tmp_path: Path) -> None:
    """A DELETE of the client's session (chaosllm's id) ends the upstream session that
    record-missing opened for it (the upstream's id), so none is left open upstream."""
    _SessionUpstream.deleted = []
    with (
        loopback_upstream(_SessionUpstream) as upstream,
        ChaosServer(tmp_path, mode="record-missing", mcp_upstreams={"search": upstream}) as s,
    ):
        status, head, _ = send(s, "POST", rpc("initialize", 1, INIT_PARAMS))
        ours = header(head, "mcp-session-id")
        assert status == 200 and ours is not None and ours != "up-1"
        session = {"mcp-session-id": ours, "mcp-protocol-version": "2025-11-25"}
        assert send(s, "POST", rpc("notifications/initialized", None), session)[0] == 202
        assert send(s, "POST", rpc("tools/list", 2), session)[0] == 200
        assert _SessionUpstream.deleted == []
        assert send(s, "DELETE", b"", session)[0] == 200
        assert _SessionUpstream.deleted == ["up-1"]
        assert send(s, "POST", rpc("tools/list", 3), session)[0] == 404  # ours ended too
