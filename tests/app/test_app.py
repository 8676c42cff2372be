"""The app in process (no sockets): routes, matching, errors, control plane."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from chaosllm.config import OnMiss, ServerConfig
from chaosllm.http.app import create_app
from chaosllm.store.recordings import shipped_dir
from tests.helpers import recording, request_body

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def make_client(**config: Any) -> httpx.AsyncClient:
    app = create_app(ServerConfig(**config))
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, client=("127.0.0.1", 5000)),
        base_url="http://127.0.0.1",  # a loopback Host: the control plane refuses others
    )


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with make_client() as c:
        yield c


CHAT = "/v1/chat/completions"


async def test_exact_match_serves_the_recording(client: httpx.AsyncClient) -> None:
    body = request_body("simple-chat/0001", stream=False)
    r = await client.post(CHAT, json=body)
    assert r.status_code == 200
    assert r.json() == recording("simple-chat/0001")["response"]["body"]
    assert r.headers["x-chaosllm-recording"] == "simple-chat/0001"
    assert r.headers["x-chaosllm-match"] == "exact"


async def test_alias_path_without_v1(client: httpx.AsyncClient) -> None:
    r = await client.post("/chat/completions", json=request_body("simple-chat/0001", stream=False))
    assert r.status_code == 200


async def test_stream_replay_of_recorded_frames_is_byte_identical(
    client: httpx.AsyncClient,
) -> None:
    rec = recording("streaming-usage/0001")
    r = await client.post(CHAT, json=rec["request"]["body"])
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.content == "".join(c["data"] for c in rec["response"]["chunks"]).encode()


async def test_miss_names_digest_and_nearest_with_differences(client: httpx.AsyncClient) -> None:
    body = request_body("knowledge/0001", stream=False)
    body["messages"][-1]["content"] = "What is the capital of Peru?"
    r = await client.post(CHAT, json=body)
    assert r.status_code == 404
    error = r.json()["error"]
    assert error["code"] == "no_recording" and error["type"] == "invalid_request_error"
    message = error["message"]
    assert r.headers["x-chaosllm-digest"] in message
    assert "knowledge/0001" in message.split("Nearest recordings")[1]
    assert "Peru" in message and "France" in message
    assert "--mode record-missing" in message


async def test_nearest_serves_a_request_that_differs_in_volatile_values(tmp_path: Path) -> None:
    rec = recording("tool-call/0002")
    (tmp_path / "s").mkdir()
    rec["request"]["body"]["messages"][1]["content"] += " I am in /home/alice/project."
    (tmp_path / "s" / "0001.json").write_text(json.dumps(rec))
    body = json.loads(json.dumps(rec["request"]["body"]))
    body["messages"][1]["content"] = body["messages"][1]["content"].replace(
        "/home/alice/project", "/Users/bob/work/tmp"
    )
    async with make_client(recordings=[tmp_path]) as c:
        r = await c.post(CHAT, json=body)
    assert r.status_code == 200 and r.headers["x-chaosllm-match"] == "nearest"
    assert r.json() == rec["response"]["body"]


async def test_fallback_on_miss_is_deterministic_and_journaled() -> None:
    async with make_client(on_miss=OnMiss.FALLBACK) as c:
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "unheard of"}]}
        first = (await c.post(CHAT, json=body)).json()
        second = (await c.post(CHAT, json=body)).json()
        assert (
            first == second and "[chaosllm fallback]" in first["choices"][0]["message"]["content"]
        )
        journal = (await c.get("/__requests")).json()["requests"]
        assert [e["match"] for e in journal] == ["fallback", "fallback"]
        assert all(e["miss"] for e in journal)


async def test_sequence_matching_per_session(client: httpx.AsyncClient) -> None:
    r = await client.post("/__scenario", json={"scenario": "multi-turn", "session": "a"})
    assert r.status_code == 200
    anything = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "next?"}]}
    names = []
    for _ in range(3):
        r = await client.post(CHAT, json=anything, headers={"x-chaosllm-session": "a"})
        names.append((r.headers["x-chaosllm-recording"], r.headers["x-chaosllm-match"]))
    assert names == [
        ("multi-turn/0001", "sequence"),
        ("multi-turn/0002", "sequence"),
        ("multi-turn/0003", "sequence"),
    ]
    r = await client.post(CHAT, json=anything, headers={"x-chaosllm-session": "b"})
    assert r.status_code == 404  # session b has no scenario
    r = await client.post(CHAT, json=anything, headers={"x-chaosllm-session": "a"})
    assert r.status_code == 404  # the scenario is used up
    await client.post("/__reset")
    r = await client.post("/__scenario", json={"scenario": "multi-turn", "session": "a"})
    r = await client.post(CHAT, json=anything, headers={"x-chaosllm-session": "a"})
    assert r.headers["x-chaosllm-recording"] == "multi-turn/0001"


async def test_unknown_scenario(client: httpx.AsyncClient) -> None:
    r = await client.post("/__scenario", json={"scenario": "../etc"})
    assert r.status_code == 404 and "loaded scenarios" in r.json()["error"]["message"]
    r = await client.post("/__scenario", json={"scenery": "x"})
    assert r.status_code == 400


@pytest.mark.parametrize(
    ("content", "param", "fragment"),
    [
        (b"{not json", None, "could not parse the JSON body"),
        (b'{"model": "gpt-4o-mini"}', "messages", "Missing required parameter: 'messages'"),
        (b'{"model": "gpt-4o-mini", "messages": "hi"}', "messages", "expected an array"),
        (
            b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": 1}]}',
            "messages[0].content",
            "expected one of a string or array",
        ),
        (b"[]", "body", "JSON object"),
    ],
)
async def test_bad_requests_get_the_openai_envelope(
    client: httpx.AsyncClient, content: bytes, param: str | None, fragment: str
) -> None:
    r = await client.post(CHAT, content=content, headers={"content-type": "application/json"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert fragment in error["message"]
    ok = await client.post(CHAT, json=request_body("simple-chat/0001", stream=False))
    assert ok.status_code == 200  # still serving


async def test_unknown_path_and_method(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url"
    r = await client.get(CHAT)
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


async def test_models_health_recordings_reload(client: httpx.AsyncClient) -> None:
    models = (await client.get("/v1/models")).json()
    ids = [m["id"] for m in models["data"]]
    assert "gpt-4o-mini" in ids and "deepseek-reasoner" in ids and models["object"] == "list"
    assert (await client.get("/models")).json() == models
    health = (await client.get("/health")).json()
    assert health["status"] == "ok" and health["recordings"] >= 20
    listing = (await client.get("/__recordings")).json()
    assert listing["errors"] == [] and len(listing["recordings"]) == health["recordings"]
    assert (await client.post("/__reload")).json()["recordings"] == health["recordings"]


async def test_embeddings_route(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/embeddings",
        json={"model": "text-embedding-3-small", "input": ["a", "b"], "dimensions": 8},
    )
    data = r.json()["data"]
    assert [len(d["embedding"]) for d in data] == [8, 8] and data[0] != data[1]
    r = await client.post("/embeddings", json={"model": "m"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"


async def test_corrupt_recording_reported_rest_served(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "0001.json").write_text("{oops")
    good = recording("simple-chat/0001")
    (tmp_path / "s" / "0002.json").write_text(json.dumps(good))
    async with make_client(recordings=[tmp_path]) as c:
        listing = (await c.get("/__recordings")).json()
        assert listing["errors"][0]["path"].endswith("0001.json")
        assert "not valid JSON" in listing["errors"][0]["problem"]
        r = await c.post(CHAT, json=good["request"]["body"])
        assert r.status_code == 200


async def test_control_plane_refuses_remote_clients_without_token() -> None:
    app = create_app(ServerConfig(recordings=[shipped_dir("recordings")]))
    remote = httpx.ASGITransport(app=app, client=("10.1.2.3", 5000))
    async with httpx.AsyncClient(transport=remote, base_url="http://x") as c:
        assert (await c.post("/__fault", json={"type": "http_503"})).status_code == 403
        assert (await c.get("/health")).status_code == 200
    app = create_app(ServerConfig(control_token="s3cret"))
    remote = httpx.ASGITransport(app=app, client=("10.1.2.3", 5000))
    # Host: the address the server was reached on (a name would need --allow-host)
    async with httpx.AsyncClient(transport=remote, base_url="http://10.0.0.5") as c:
        assert (await c.get("/__fault")).status_code == 403
        ok = await c.get("/__fault", headers={"authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        ok = await c.get("/__fault", headers={"x-chaosllm-token": "s3cret"})
        assert ok.status_code == 200


async def test_nearest_never_serves_a_different_question_behind_a_long_prompt(
    tmp_path: Path,
) -> None:
    rec = recording("knowledge/0001")
    long_prompt = " ".join(f"Rule {i}: answer precisely and cite nothing." for i in range(40))
    rec["request"]["body"]["messages"][0]["content"] = long_prompt
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "0001.json").write_text(json.dumps(rec))
    body = json.loads(json.dumps(rec["request"]["body"]))
    body["messages"][1]["content"] = "What is the capital of Peru?"
    async with make_client(recordings=[tmp_path]) as c:
        r = await c.post(CHAT, json=body)
        assert r.status_code == 404
        assert "s/0001" in r.json()["error"]["message"]
        # ...while a change in a volatile value of the same question still matches
        body["messages"][1]["content"] = "What is the capital of France?"
        body["messages"][0]["content"] = long_prompt + " Session 2026-11-30T10:00:00Z."
        r = await c.post(CHAT, json=body)
        assert r.status_code == 200 and r.headers["x-chaosllm-match"] == "nearest"
