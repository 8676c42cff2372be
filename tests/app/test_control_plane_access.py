"""No web page drives the control plane (issue #12 item 1), on real sockets and on both
servers: a cross-origin simple POST, a foreign ``Host`` (DNS rebinding), a non-JSON body
are refused and change nothing, while the SDK, the CLI and scripts keep working. Also the
settle waits (item 7: no worker thread, bounded) and the token scheme (item 9)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest

from chaosllm import ChaosServer
from chaosllm.errors import ServerError
from chaosllm.http.control import SETTLE_LIMIT
from tests.helpers import CLI, openai_client, read_until_eof, request_body, serving

pytestmark = pytest.mark.timeout(60)

CHAT = "/v1/chat/completions"
NAME = "knowledge/0004"
SOCKET_TIMEOUT = 10.0
ARM = json.dumps({"type": "http_503"}).encode()
KINDS = ["builtin", "uvicorn"]


@pytest.fixture(scope="module", params=KINDS)
def kind_server(request: pytest.FixtureRequest) -> Iterator[ChaosServer]:
    with ChaosServer(server=request.param) as server:
        yield server


@pytest.fixture
def server(kind_server: ChaosServer) -> ChaosServer:
    kind_server.reset()
    return kind_server


class Answer:
    def __init__(self, raw: bytes) -> None:
        head, _, self.body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1])
        self.headers = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(":") for line in lines[1:])
        }

    def json(self) -> Any:
        return json.loads(self.body)


def raw(
    server: ChaosServer,
    method: str,
    path: str,
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
    *,
    version: str = "HTTP/1.1",
) -> Answer:
    """One request written byte for byte (``Host`` defaults to the server's address)."""
    assert server.port is not None
    given = {"Host": f"127.0.0.1:{server.port}", **(headers or {})}
    lines = [f"{method} {path} {version}"]
    lines += [f"{name}: {value}" for name, value in given.items() if value]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    lines.append("Connection: close")
    data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
    with socket.create_connection(("127.0.0.1", server.port), timeout=SOCKET_TIMEOUT) as sock:
        sock.sendall(data)
        return Answer(read_until_eof(sock))


def assert_refused(answer: Answer, *fragments: str) -> None:
    assert answer.status == 403, answer.body
    error = answer.json()["error"]
    assert error["code"] == "control_forbidden" and error["type"] == "invalid_request_error"
    for fragment in fragments:
        assert fragment in error["message"], error["message"]


def chat_body() -> bytes:
    return json.dumps(request_body(NAME, stream=False)).encode()


# -- a web page cannot arm a fault ---------------------------------------------------------


def test_a_cross_origin_simple_post_arms_nothing(server: ChaosServer) -> None:
    """What a page's ``fetch(url, {method: "POST", mode: "no-cors", body})`` sends: no
    preflight, ``text/plain``, the page's Origin."""
    answer = raw(
        server,
        "POST",
        "/__fault",
        {"Origin": "http://evil.example", "Content-Type": "text/plain;charset=UTF-8"},
        ARM,
    )
    assert_refused(answer, "another origin", "http://evil.example")
    assert server.faults()["armed"] == []
    answer = raw(server, "POST", CHAT, {"Content-Type": "application/json"}, chat_body())
    assert answer.status == 200, answer.body


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""],
)
def test_a_body_that_is_not_json_is_refused_even_without_origin(
    server: ChaosServer, content_type: str
) -> None:
    """A browser (or extension) that strips Origin still can only send these cross-origin
    without a preflight; the control plane never grants one. (A body that parses as JSON
    is taken as JSON when no Origin or Sec-Fetch-Site says a browser sent it:
    tests/app/test_control_plain_json.py.)"""
    answer = raw(server, "POST", "/__fault", {"Content-Type": content_type}, b"type=http_503")
    assert_refused(answer, "Content-Type: application/json")
    answer = raw(server, "POST", "/__workspace", {"Content-Type": content_type}, b"path=")
    assert_refused(answer, "Content-Type: application/json")
    assert server.faults()["armed"] == []


@pytest.mark.parametrize(
    "origin",
    [
        "http://evil.example",
        "null",  # sandboxed frames, file:// pages
        "http://localhost:3000",  # another loopback origin: a dev web app on this machine
        "https://127.0.0.1",
    ],
)
def test_a_foreign_origin_is_refused_even_with_json_and_without_a_body(
    server: ChaosServer, origin: str
) -> None:
    answer = raw(
        server, "POST", "/__fault", {"Origin": origin, "Content-Type": "application/json"}, ARM
    )
    assert_refused(answer, "another origin")
    server.arm("http_503", match={"session": "kept"})
    assert_refused(raw(server, "POST", "/__reset", {"Origin": origin}), "another origin")
    assert_refused(raw(server, "DELETE", "/__fault", {"Origin": origin}), "another origin")
    assert_refused(raw(server, "POST", "/__fault/http_429", {"Origin": origin}, b""))
    assert_refused(raw(server, "GET", "/__requests", {"Origin": origin}))
    assert [f["type"] for f in server.faults()["armed"]] == ["http_503"]


def test_the_servers_own_origin_and_json_are_accepted(server: ChaosServer) -> None:
    own = f"http://127.0.0.1:{server.port}"
    answer = raw(
        server,
        "POST",
        "/__fault",
        {"Origin": own, "Content-Type": "application/json; charset=utf-8"},
        ARM,
    )
    assert answer.status == 201, answer.body
    listed = raw(server, "GET", "/__fault", {"Origin": own, "Sec-Fetch-Site": "same-origin"})
    assert [f["type"] for f in listed.json()["armed"]] == ["http_503"]
    host = f"localhost:{server.port}"
    answer = raw(server, "GET", "/__fault", {"Host": host, "Origin": f"http://{host}"})
    assert answer.status == 200, answer.body
    assert raw(server, "POST", "/__reset", {"Origin": own}).status == 200
    assert server.faults()["armed"] == []


def test_bodyless_calls_without_origin_keep_working(server: ChaosServer) -> None:
    """``curl -X POST``, scripts: no body, no content type (or an irrelevant one)."""
    answer = raw(server, "POST", "/__fault/http_503?remaining=2", {}, b"")
    assert answer.status == 201, answer.body
    answer = raw(server, "POST", "/__fault/http_429", {"Content-Type": "text/plain"}, b"")
    assert answer.status == 201, answer.body
    assert len(server.faults()["armed"]) == 2
    assert raw(server, "DELETE", "/__fault").json() == {"disarmed": 2}
    assert raw(server, "POST", "/__reset").status == 200


def test_a_cross_site_fetch_marked_by_the_browser_is_refused(server: ChaosServer) -> None:
    """A no-cors GET (``<img src>``) carries no Origin, but Sec-Fetch-Site names it."""
    for site in ("cross-site", "same-site"):
        assert_refused(raw(server, "GET", "/__requests", {"Sec-Fetch-Site": site}), site)
    assert raw(server, "GET", "/__requests", {"Sec-Fetch-Site": "none"}).status == 200


# -- DNS rebinding: a foreign Host is refused ----------------------------------------------


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "localhost.evil.example"])
def test_a_foreign_host_reads_and_resets_nothing(server: ChaosServer, host: str) -> None:
    """A page that rebinds evil.example to 127.0.0.1 is same-origin with itself: only
    Host tells it apart."""
    host = host.format(port=server.port)
    own = {"Origin": f"http://{host}"}
    answer = raw(server, "POST", CHAT, {"Content-Type": "application/json"}, chat_body())
    assert answer.status == 200, answer.body
    server.arm("http_503", match={"session": "kept"})
    for path in ("/__recordings", "/__requests", "/__fault", "/__findings"):
        assert_refused(raw(server, "GET", path, {"Host": host}), "refuses Host", "--allow-host")
        assert_refused(raw(server, "GET", path, {"Host": host, **own}), "refuses Host")
    assert_refused(raw(server, "POST", "/__reset", {"Host": host}), "refuses Host")
    assert_refused(
        raw(server, "POST", "/__reset", {"Host": host, **own, "Content-Type": "application/json"})
    )
    assert len(server.requests(settle=0)) == 1
    assert [f["type"] for f in server.faults()["armed"]] == ["http_503"]


@pytest.mark.parametrize(
    "host",
    ["localhost", "localhost:{port}", "127.0.0.1", "127.9.8.7:{port}", "[::1]", "[::1]:{port}"],
)
def test_loopback_hosts_are_accepted(server: ChaosServer, host: str) -> None:
    answer = raw(server, "GET", "/__fault", {"Host": host.format(port=server.port)})
    assert answer.status == 200, answer.body


def test_a_request_without_host_is_accepted(server: ChaosServer) -> None:
    """HTTP/1.0 has no Host; no browser sends a request without one."""
    answer = raw(server, "GET", "/__fault", {"Host": ""}, version="HTTP/1.0")
    assert answer.status == 200, answer.body


def test_provider_endpoints_and_health_are_not_control_calls(server: ChaosServer) -> None:
    """A foreign Origin does not matter to them; a foreign Host does, bound to loopback
    (the same Host rule: `tests/wire/test_host_rule.py`)."""
    foreign = {"Host": f"127.0.0.1:{server.port}", "Origin": "http://evil.example"}
    answer = raw(server, "POST", CHAT, {**foreign, "Content-Type": "application/json"}, chat_body())
    assert answer.status == 200, answer.body
    assert answer.json()["object"] == "chat.completion"
    assert raw(server, "GET", "/health", foreign).json()["status"] == "ok"
    assert raw(server, "GET", "/v1/models", foreign).status == 200
    rebound = {"Host": "evil.example", "Content-Type": "application/json"}
    answer = raw(server, "POST", CHAT, rebound, chat_body())
    assert answer.status == 403 and answer.json()["error"]["code"] == "host_forbidden"


def test_the_openai_sdk_still_works_on_the_guarded_server(server: ChaosServer) -> None:
    with openai_client(server) as client:
        body = request_body(NAME, stream=False)
        reply = client.chat.completions.create(**body)
        assert reply.choices[0].message.content
        server.arm("http_503")
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(**body)
        assert refused.value.status_code == 503
        chunks = list(client.chat.completions.create(**request_body(NAME, stream=True)))
        assert chunks


# -- allowed hosts -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_allowed_hosts_are_answered_and_others_still_refused(kind: str) -> None:
    with ChaosServer(server=kind, allow_hosts=["DevBox.lan", "ci.internal:1234"]) as server:
        for host in ("devbox.lan", f"devbox.lan:{server.port}", "ci.internal:1234"):
            answer = raw(server, "GET", "/__fault", {"Host": host})
            assert answer.status == 200, (host, answer.body)
        for host in ("other.lan", "ci.internal", "ci.internal:80", "devbox.lan.evil.example"):
            assert_refused(raw(server, "GET", "/__fault", {"Host": host}), "refuses Host")


def test_a_bad_allowed_host_is_refused_at_start() -> None:
    for bad in ("", "a b", "devbox:port", "http://devbox"):
        with pytest.raises(ServerError, match="--allow-host"):
            ChaosServer(allow_hosts=[bad])


def test_serve_allow_host_flag() -> None:
    with serving("--allow-host", "devbox.lan", "--allow-host", "ci.internal") as (url, _):
        port = int(url.rsplit(":", 1)[1])
        for host, status in (("devbox.lan", 200), ("ci.internal:9", 200), ("evil.example", 403)):
            with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT) as sock:
                sock.sendall(f"GET /__fault HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
                sock.shutdown(socket.SHUT_WR)
                assert Answer(read_until_eof(sock)).status == status, host
    result = subprocess.run(
        [*CLI, "serve", "--port", "0", "--allow-host", "a b"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and "--allow-host 'a b'" in result.stderr


# -- the existing clients ------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAOSLLM_")}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=30, env=env)


def test_the_fault_cli_still_works(server: ChaosServer, tmp_path: Path) -> None:
    armed = run_cli("fault", "arm", "http_503", "--remaining", "2", "--url", server.url)
    assert armed.returncode == 0, armed.stderr
    assert [(f["type"], f["remaining"]) for f in server.faults()["armed"]] == [("http_503", 2)]
    profile = tmp_path / "mine.json"
    profile.write_text(json.dumps({"description": "d", "faults": [{"type": "http_429"}]}))
    loaded = run_cli("fault", "profile", str(profile), "--url", server.url)
    assert loaded.returncode == 0, loaded.stderr
    assert [f["type"] for f in server.faults()["armed"]] == ["http_503", "http_429"]
    assert "http_429" in run_cli("fault", "list", "--url", server.url).stdout
    cleared = run_cli("fault", "clear", "--url", server.url)
    assert cleared.returncode == 0, cleared.stderr
    assert server.faults()["armed"] == []


# -- the control token (item 9) -----------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_control_token_argument_and_case_insensitive_bearer(kind: str) -> None:
    with ChaosServer(server=kind, control_token="s3cret") as server:
        assert_refused(raw(server, "GET", "/__fault"), "control token")
        assert_refused(raw(server, "GET", "/__fault", {"Authorization": "Bearer wrong"}))
        assert_refused(raw(server, "GET", "/__fault", {"Authorization": "Basic s3cret"}))
        for given in ("Bearer s3cret", "bearer s3cret", "BEARER  s3cret"):
            answer = raw(server, "GET", "/__fault", {"Authorization": given})
            assert answer.status == 200, (given, answer.body)
        assert raw(server, "GET", "/__fault", {"X-Chaosllm-Token": "s3cret"}).status == 200
        # the token does not let a web page in
        answer = raw(
            server,
            "GET",
            "/__fault",
            {"Authorization": "bearer s3cret", "Host": "evil.example"},
        )
        assert_refused(answer, "refuses Host")
        # the methods call the state directly, and the provider endpoints need no token
        assert server.arm("http_503") and server.faults()["armed"]
        answer = raw(server, "POST", CHAT, {"Content-Type": "application/json"}, chat_body())
        assert answer.status == 503


# -- settle waits (item 7) ------------------------------------------------------------------


async def _stalled(client: httpx.AsyncClient, ready: anyio.Event, release: anyio.Event) -> None:
    """A request the server stalls on: held open until `release`."""
    headers = {"X-Chaosllm-Session": "stuck"}
    body = request_body(NAME, stream=True)
    async with client.stream("POST", CHAT, json=body, headers=headers) as response:
        assert response.status_code == 200
        ready.set()
        await release.wait()


def _active_settles(server: ChaosServer) -> int:
    slots = getattr(server.app.state, "control_settle_slots", None)
    return 0 if slots is None else int(slots.active)


async def _until(condition: Any, within: float = 10.0) -> None:
    with anyio.fail_after(within):
        while not condition():
            await anyio.sleep(0.01)


def _settling(server: ChaosServer, waiting: int, measure: Any) -> dict[str, Any]:
    """With a stalled request pending, `waiting` concurrent ``GET /__requests?settle=30``
    waiting on it: `measure(client)` (its result), then the settles' answers once the
    stalled request is released."""
    server.arm("stall", match={"session": "stuck"}, max_ms=20_000)
    results: dict[str, Any] = {"settles": []}

    async def main() -> None:
        limits = httpx.Limits(max_connections=waiting + 10, max_keepalive_connections=0)
        async with httpx.AsyncClient(
            base_url=server.url, limits=limits, timeout=SOCKET_TIMEOUT * 4
        ) as client:
            ready, release = anyio.Event(), anyio.Event()

            async def settle_once() -> None:
                answer = await client.get("/__requests", params={"settle": 30})
                results["settles"].append(answer)

            async with anyio.create_task_group() as tg:
                tg.start_soon(_stalled, client, ready, release)
                with anyio.fail_after(10):
                    await ready.wait()
                for _ in range(waiting):
                    tg.start_soon(settle_once)
                await _until(lambda: _active_settles(server) >= min(waiting, SETTLE_LIMIT))
                results["measured"] = await measure(client)
                release.set()
                started = time.monotonic()
            results["released_in"] = time.monotonic() - started

    anyio.run(main)
    return results


@pytest.mark.parametrize("kind", KINDS)
def test_settles_use_no_worker_thread_and_do_not_slow_requests(kind: str, tmp_path: Path) -> None:
    """45 settles (more than anyio's 40 worker threads) while a recorded request goes
    upstream and is written to disk in a worker thread."""
    with (
        ChaosServer() as upstream,
        ChaosServer(
            server=kind, mode="record-missing", upstream=upstream.url, record_dir=tmp_path
        ) as proxy,
    ):

        async def measure(client: httpx.AsyncClient) -> list[float]:
            took = []
            for served in ("upstream", "exact"):  # recorded, then replayed from the recording
                started = time.monotonic()
                body = request_body("simple-chat/0001", stream=False)
                answer = await client.post(CHAT, json=body)
                took.append(time.monotonic() - started)
                assert answer.status_code == 200
                assert answer.headers["x-chaosllm-match"].split(",")[-1].strip() == served
            return took

        results = _settling(proxy, 45, measure)
        assert max(results["measured"]) < 0.5, results["measured"]
        assert len(list(tmp_path.rglob("*.json"))) >= 1
        settles = results["settles"]
        assert [a.status_code for a in settles] == [200] * 45
        assert results["released_in"] < 5.0
        outcomes = {e["session"]: e["outcome"] for e in settles[0].json()["requests"]}
        assert outcomes["stuck"] == "client_gone"


def test_settles_beyond_the_limit_are_answered_429(server: ChaosServer) -> None:
    async def measure(client: httpx.AsyncClient) -> httpx.Response:
        return await client.get("/__requests", params={"settle": 30})

    results = _settling(server, SETTLE_LIMIT, measure)
    busy = results["measured"]
    assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
    assert busy.json()["error"]["code"] == "too_many_settles"
    assert [a.status_code for a in results["settles"]] == [200] * SETTLE_LIMIT
    assert _active_settles(server) == 0
    # nothing pending: a settle answers at once and takes no slot
    started = time.monotonic()
    assert raw(server, "GET", "/__requests?settle=30").status == 200
    assert time.monotonic() - started < 1.0
