"""The builtin server's hot path (`chaosllm.http.direct`) answers provider requests with
the same bytes and the same journal as the ASGI app, and declines everything else."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from chaosllm.config import Mode, ServerConfig
from chaosllm.faults import parse_fault_specs
from chaosllm.http.app import create_app
from chaosllm.http.direct import DirectFront, DirectHandler
from chaosllm.http.state import ChaosState
from tests.helpers import RECORDINGS, all_recordings, recording

pytestmark = pytest.mark.anyio

CASES = [
    (f"/v1/{path}", name)
    for provider, path in [
        ("openai.chat", "chat/completions"),
        ("anthropic.messages", "messages"),
        ("openai.responses", "responses"),
    ]
    for name in all_recordings(provider)
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def state() -> ChaosState:
    return ChaosState.from_config(ServerConfig(recordings=[RECORDINGS]))


async def asgi_answer(app_state: ChaosState, path: str, body: bytes) -> bytes:
    app = create_app(state=app_state)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        response = await client.post(path, content=body)
        return response.content


@pytest.mark.parametrize(("path", "name"), CASES, ids=[n for _, n in CASES])
@pytest.mark.parametrize("stream", [False, True])
async def test_the_same_bytes_and_journal_as_the_app(path: str, name: str, stream: bool) -> None:
    body = dict(recording(name)["request"]["body"], stream=stream)
    raw = json.dumps(body).encode()
    direct_state, app_state = state(), state()
    answer = DirectHandler(direct_state)("POST", path, b"", [(b"X-Chaosllm-Session", b"s")], raw)
    assert answer is not None
    plan, report = answer
    assert plan.body() == await asgi_answer(app_state, path, raw)
    [direct_entry] = direct_state.journal.entries()
    [app_entry] = app_state.journal.entries()
    assert direct_entry.report is report
    ignored = {"time", "monotonic", "session"}

    def fields(entry: dict[str, object]) -> dict[str, object]:
        return {k: v for k, v in entry.items() if k not in ignored}

    assert fields(direct_entry.record.to_json()) == fields(app_entry.record.to_json())
    assert direct_entry.session == "s" and app_entry.session is None


def test_faults_apply_on_the_direct_path() -> None:
    app_state = state()
    app_state.board.arm(parse_fault_specs({"type": "http_503"}))
    raw = json.dumps(recording("knowledge/0004")["request"]["body"]).encode()
    answer = DirectHandler(app_state)("POST", "/v1/chat/completions", b"", [], raw)
    assert answer is not None and answer[0].status == 503
    assert app_state.board.armed() == []


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/chat/completions"),
        ("POST", "/__fault"),
        ("POST", "/v1/embeddings"),
        ("GET", "/v1/models"),
        ("POST", "/health"),
    ],
)
def test_everything_else_goes_through_the_app(method: str, path: str) -> None:
    app_state = state()
    assert DirectHandler(app_state)(method, path, b"", [], b"{}") is None
    assert app_state.journal.entries() == []


def proxying_state(record_dir: Path) -> ChaosState:
    """A server in record-missing mode (its upstream never reached by these tests)."""
    config = ServerConfig(
        recordings=[RECORDINGS],
        mode=Mode.RECORD_MISSING,
        upstream="http://127.0.0.1:9",
        record_dir=record_dir,
    )
    return ChaosState.from_config(config)


def test_the_proxy_modes_go_through_the_app(tmp_path: Path) -> None:
    app_state = proxying_state(tmp_path)
    raw = json.dumps(recording("knowledge/0004")["request"]["body"]).encode()
    assert DirectHandler(app_state)("POST", "/v1/chat/completions", b"", [], raw) is None
    assert app_state.journal.entries() == []


# -- DirectFront: the same hot path in front of the app under another ASGI server ----------


class Counting:
    """The app, counting the requests it is asked to answer."""

    def __init__(self, app_state: ChaosState) -> None:
        self.app = create_app(state=app_state)
        self.seen: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.seen.append(f"{scope['method']} {scope['path']}")
        await self.app(scope, receive, send)


async def front_answer(
    front: DirectFront, method: str, path: str, body: bytes, headers: dict[str, str]
) -> httpx.Response:
    transport = httpx.ASGITransport(app=front, client=("127.0.0.1", 5000))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        return await client.request(method, path, content=body, headers=headers)


@pytest.mark.parametrize(("path", "name"), CASES[::3], ids=[n for _, n in CASES[::3]])
@pytest.mark.parametrize("stream", [False, True])
async def test_the_front_answers_provider_requests_as_the_app_without_it(
    path: str, name: str, stream: bool
) -> None:
    raw = json.dumps(dict(recording(name)["request"]["body"], stream=stream)).encode()
    front_state, app_state = state(), state()
    inner = Counting(front_state)
    front = DirectFront(inner, front_state, 1 << 20)
    answer = await front_answer(front, "POST", path, raw, {"x-chaosllm-session": "s"})
    assert inner.seen == []  # answered in front of the app
    assert answer.content == await asgi_answer(app_state, path, raw)
    [front_entry] = front_state.journal.entries()
    [app_entry] = app_state.journal.entries()
    ignored = {"time", "monotonic", "session"}
    assert {k: v for k, v in front_entry.record.to_json().items() if k not in ignored} == {
        k: v for k, v in app_entry.record.to_json().items() if k not in ignored
    }
    assert front_entry.session == "s"


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "status"),
    [
        ("GET", "/v1/models", b"", {}, 200),
        ("GET", "/health", b"", {}, 200),
        ("POST", "/__reset", b"", {}, 200),
        ("POST", "/v1/embeddings", b'{"model": "m", "input": "x"}', {}, 200),
        # Bodies the app's BodyLimit refuses, and one without a Content-Length.
        ("POST", "/v1/chat/completions", b"x" * 65, {}, 413),
        ("POST", "/v1/chat/completions", b"{}", {"transfer-encoding": "chunked"}, 400),
    ],
)
async def test_the_front_leaves_everything_else_to_the_app(
    method: str, path: str, body: bytes, headers: dict[str, str], status: int
) -> None:
    front_state = ChaosState.from_config(ServerConfig(recordings=[RECORDINGS], max_body_bytes=64))
    inner = Counting(front_state)
    front = DirectFront(inner, front_state, front_state.config.max_body_bytes)
    answer = await front_answer(front, method, path, body, headers)
    assert inner.seen == [f"{method} {path}"]
    assert answer.status_code == status


async def test_the_front_leaves_the_proxy_modes_to_the_app(tmp_path: Path) -> None:
    front_state = proxying_state(tmp_path)
    inner = Counting(front_state)
    raw = json.dumps(recording("knowledge/0004")["request"]["body"]).encode()
    await front_answer(
        DirectFront(inner, front_state, 1 << 20), "POST", "/v1/chat/completions", raw, {}
    )
    assert inner.seen == ["POST /v1/chat/completions"]
