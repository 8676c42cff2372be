"""The stored-response and gateway fault types on a raw socket (what
`tests/wire/test_faults.py`'s catalogue check counts as their wire tests): each one's
status, body or frames as the bytes arrive."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from chaosllm import ChaosServer
from chaosllm.core.clock import ManualClock
from chaosllm.providers.sse import iter_events
from tests.helpers import request_body
from tests.wire.test_faults import NAME, Wire, call, connect, read_wire, send_post

pytestmark = pytest.mark.timeout(60)

COVERED = frozenset(
    {
        "background_failed",
        "resume_refused",
        "cancel_ignored",
        "response_expired",
        "openrouter_credits",
        "openrouter_midstream_error",
        "vllm_stream_error",
        "reasoning_preamble",
        "unsupported_param",
    }
)
HAIKU = {
    "model": "gpt-4.1-mini",
    "input": [{"role": "user", "content": "Write a haiku about the sea."}],
    "background": True,
}
RID = "resp_68c1a3d2b1f08190a6e5d4c3b2a19087"


@pytest.fixture(scope="module")
def server() -> Iterator[ChaosServer]:
    with ChaosServer(clock=ManualClock()) as running:  # a response stays queued until moved
        yield running


def send_get(sock: socket.socket, path: str) -> float:
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    return time.monotonic()


def get(server: ChaosServer, path: str) -> Wire:
    with connect(server) as sock:
        return read_wire(sock, send_get(sock, path))


def post(server: ChaosServer, body: dict[str, Any], path: str) -> Wire:
    with connect(server) as sock:
        return read_wire(sock, send_post(sock, body, path=path))


def created(server: ChaosServer, *, stream: bool = False) -> None:
    server.reset()
    wire = post(server, {**HAIKU, "stream": stream}, "/v1/responses")
    assert wire.status == 200 and wire.complete


def events(wire: Wire) -> list[dict[str, Any]]:
    """The Responses events of a stream (``event:`` and ``data:`` lines)."""
    return [json.loads(data) for _, data in iter_events([wire.body.decode("utf-8")])]


def test_background_failed_on_the_wire_poll_and_resume(server: ChaosServer) -> None:
    created(server, stream=True)
    assert get(server, f"/v1/responses/{RID}").json()["status"] == "queued"
    server.arm({"type": "background_failed"})
    poll = get(server, f"/v1/responses/{RID}")
    assert poll.status == 200 and poll.json()["status"] == "failed"
    resumed = get(server, f"/v1/responses/{RID}?stream=true&starting_after=3")
    assert resumed.status == 200 and resumed.terminated
    assert [(e["type"], e["sequence_number"]) for e in events(resumed)] == [("response.failed", 4)]


def test_resume_refused_on_the_wire(server: ChaosServer) -> None:
    created(server, stream=True)
    server.arm({"type": "resume_refused"})
    wire = get(server, f"/v1/responses/{RID}?stream=true&starting_after=3")
    assert wire.status == 400 and wire.complete
    assert "no longer be streamed" in wire.json()["error"]["message"]


def test_cancel_ignored_on_the_wire(server: ChaosServer) -> None:
    created(server)
    server.arm({"type": "cancel_ignored"})
    wire = post(server, {}, f"/v1/responses/{RID}/cancel")
    assert wire.status == 200 and wire.json()["status"] == "cancelled"
    assert get(server, f"/v1/responses/{RID}").json()["status"] == "queued"  # not cancelled


def test_response_expired_on_the_wire(server: ChaosServer) -> None:
    created(server)
    server.arm({"type": "response_expired"})
    for _ in range(2):
        wire = get(server, f"/v1/responses/{RID}")
        assert wire.status == 404 and wire.complete
        assert wire.json()["error"]["type"] == "invalid_request_error"


def test_openrouter_credits_on_the_wire(server: ChaosServer) -> None:
    server.reset()
    server.arm({"type": "openrouter_credits"})
    wire = call(server, stream=True)
    assert wire.status == 402 and wire.complete and wire.json()["error"]["code"] == 402


def test_openrouter_midstream_error_on_the_wire(server: ChaosServer) -> None:
    server.reset()
    server.arm({"type": "openrouter_midstream_error", "after_chunks": 3})
    wire = call(server, stream=True)
    assert wire.status == 200 and wire.terminated and len(wire.frames) == 4
    last = json.loads(wire.payloads[-1])
    assert last["error"]["code"] == "server_error"
    assert last["choices"][0]["finish_reason"] == "error"


def test_vllm_stream_error_on_the_wire(server: ChaosServer) -> None:
    server.reset()
    server.arm({"type": "vllm_stream_error", "after_chunks": 3})
    wire = call(server, stream=True)
    assert wire.status == 200 and wire.terminated and len(wire.frames) == 5
    assert json.loads(wire.payloads[3])["object"] == "error"
    assert wire.payloads[4] == "[DONE]"


def test_reasoning_preamble_on_the_wire(server: ChaosServer) -> None:
    server.reset()
    server.arm({"type": "reasoning_preamble", "reasoning": "Hmm."})
    wire = call(server, stream=True)
    deltas = [json.loads(p)["choices"][0]["delta"] for p in wire.payloads[1:3]]
    assert wire.status == 200 and wire.terminated
    assert deltas[0] == {"content": None, "reasoning_content": "Hmm."}
    assert deltas[1].get("content")


def test_unsupported_param_on_the_wire(server: ChaosServer) -> None:
    server.reset()
    server.arm({"type": "unsupported_param"})
    assert call(server, stream=False).status == 200  # carries none: the fault waits
    with connect(server) as sock:
        body = request_body(NAME, stream=False)
        wire = read_wire(sock, send_post(sock, {**body, "logprobs": True}))
    assert wire.status == 400
    assert wire.json() == {
        "error": {"message": "property 'logprobs' is unsupported", "type": "invalid_request_error"}
    }
