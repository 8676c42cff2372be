"""The official `ollama` client against a real chaosllm server: every shipped Ollama
recording comes back as the SDK objects it encodes (sync, async, JSON, stream), the
auxiliary endpoints answer in Ollama's shapes, record -> replay through a loopback Ollama
upstream, and per fault, what the client does (the README's table, observed)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import anyio
import httpx
import ollama
import pydantic
import pytest
from ollama import ChatResponse, GenerateResponse

from chaosllm import ChaosServer
from chaosllm.providers.ollama import OllamaChat
from tests.helpers import (
    all_recordings,
    chunk_data,
    loopback_upstream,
    recording,
    recording_proxy,
    serving,
    write_chunk,
    written_chunk_data,
)
from tests.helpers import sdk_arguments as request

CHAT_NAMES = all_recordings("ollama.chat")
GENERATE_NAMES = all_recordings("ollama.generate")
TEXT = "ollama-chat/0001"
STREAM = "ollama-stream/0001"
TOOLS = "ollama-tools/0001"
GENERATE = "ollama-generate/0001"


def client(server: ChaosServer, **options: Any) -> ollama.Client:
    return ollama.Client(host=server.url, **{"timeout": 10, **options})


def client_at(url: str) -> ollama.Client:
    return ollama.Client(host=url, timeout=10)


@pytest.fixture
def sdk(server: ChaosServer) -> Iterator[ollama.Client]:
    with client(server) as c:
        yield c


def chat_parts(sdk: ollama.Client, name: str) -> list[ChatResponse]:
    return list(sdk.chat(**request(name), stream=True))


def expected_parts(name: str) -> list[dict[str, Any]]:
    """The NDJSON lines a stream request gets: the recorded ones, or those rendered."""
    data = recording(name)
    if "chunks" in data["response"]:
        return [json.loads(c["data"]) for c in data["response"]["chunks"]]
    return [json.loads(f) for f in OllamaChat().codec.stream_frames(data["response"]["body"])]


# -- replay ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CHAT_NAMES)
def test_chat_json_and_stream(sdk: ollama.Client, name: str) -> None:
    body = recording(name)["response"]["body"]
    assert sdk.chat(**request(name)) == ChatResponse(**body)
    parts = chat_parts(sdk, name)
    assert parts == [ChatResponse(**line) for line in expected_parts(name)]
    assert "".join(p.message.content or "" for p in parts) == body["message"]["content"]
    assert parts[-1].done and parts[-1].done_reason == "stop"
    assert parts[-1].eval_count == body["eval_count"]
    calls = [c for p in parts for c in p.message.tool_calls or []]
    assert calls == (ChatResponse(**body).message.tool_calls or [])


@pytest.mark.parametrize("name", GENERATE_NAMES)
def test_generate_json_and_stream(sdk: ollama.Client, name: str) -> None:
    body = recording(name)["response"]["body"]
    assert sdk.generate(**request(name)) == GenerateResponse(**body)
    parts = list(sdk.generate(**request(name), stream=True))
    chunks = recording(name)["response"]["chunks"]
    assert parts == [GenerateResponse(**json.loads(c["data"])) for c in chunks]
    assert "".join(p.response or "" for p in parts) == body["response"]
    assert parts[-1].context == body["context"]


def test_async_client(shared_server: ChaosServer) -> None:
    async def main() -> None:
        with anyio.fail_after(20):
            async with ollama.AsyncClient(host=shared_server.url, timeout=10) as c:
                for name in CHAT_NAMES:
                    body = recording(name)["response"]["body"]
                    assert await c.chat(**request(name)) == ChatResponse(**body)
                    parts = [p async for p in await c.chat(**request(name), stream=True)]
                    assert parts == [ChatResponse(**line) for line in expected_parts(name)]
                gen = recording(GENERATE)["response"]["body"]
                assert await c.generate(**request(GENERATE)) == GenerateResponse(**gen)
                streamed = [p async for p in await c.generate(**request(GENERATE), stream=True)]
                assert "".join(p.response or "" for p in streamed) == gen["response"]
                assert len((await c.embed(model="nomic-embed-text", input="x")).embeddings) == 1
                assert [m.model for m in (await c.list()).models] == ["llama3.2:latest"]

    anyio.run(main)


def test_the_tool_loop(sdk: ollama.Client) -> None:
    first = sdk.chat(**request(TOOLS))
    [call] = first.message.tool_calls or []
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    body = request(TOOLS)
    follow_up = sdk.chat(
        model=body["model"],
        tools=body["tools"],
        messages=[
            *body["messages"],
            first.message,
            {
                "role": "tool",
                "content": recording("ollama-tools/0002")["request"]["body"]["messages"][-1][
                    "content"
                ],
                "tool_name": call.function.name,
            },
        ],
    )
    assert follow_up == ChatResponse(**recording("ollama-tools/0002")["response"]["body"])


def test_the_model_name_with_its_latest_tag_is_the_same_model(sdk: ollama.Client) -> None:
    assert sdk.chat(**{**request(TEXT), "model": "llama3.2:latest"}).message.content


def test_auxiliary_endpoints(sdk: ollama.Client, server: ChaosServer) -> None:
    [model] = sdk.list().models
    assert model.model == "llama3.2:latest" and model.details is not None
    assert sdk.show("llama3.2").details is not None
    with pytest.raises(ollama.ResponseError) as info:
        sdk.show("mistral")
    assert info.value.status_code == 404
    assert info.value.error == 'model "mistral" not found, try pulling it first'
    vectors = sdk.embed(model="nomic-embed-text", input=["a", "b"]).embeddings
    assert len(vectors) == 2 and vectors[0] != vectors[1] and len(vectors[0]) == 768
    assert sdk.embed(model="nomic-embed-text", input="a").embeddings[0] == vectors[0]
    assert list(sdk.embeddings(model="nomic-embed-text", prompt="a").embedding) == vectors[0]
    assert httpx.get(f"{server.url}/api/version", timeout=5).json() == {"version": "0.12.6"}


def test_the_openai_compatible_paths_are_the_openai_protocol(server: ChaosServer) -> None:
    """Ollama's ``/v1`` paths are OpenAI's: a client pointed at ``<host>/v1`` gets the
    OpenAI chat recordings (see the README)."""
    answer = httpx.post(
        f"{server.url}/v1/chat/completions",
        json=recording("simple-chat/0001")["request"]["body"],
        timeout=5,
    )
    assert answer.status_code == 200 and answer.json()["object"] == "chat.completion"


def test_errors_are_response_errors(sdk: ollama.Client, server: ChaosServer) -> None:
    with pytest.raises(ollama.ResponseError) as info:
        sdk.chat(**{**request(TEXT), "model": "mistral"})
    assert info.value.status_code == 404 and "No recording matches" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        list(sdk.chat(**{**request(TEXT), "model": "mistral"}, stream=True))
    assert info.value.status_code == 404
    # An empty model is refused by the client itself; the server's 400, in Ollama's words:
    bad = httpx.post(f"{server.url}/api/chat", json={"messages": []}, timeout=5)
    assert (bad.status_code, bad.json()) == (400, {"error": "model is required"})


# -- faults: one test per row of the README's table -------------------------------------------


@pytest.mark.parametrize(("kind", "status"), [("http_503", 503), ("http_429", 429)])
@pytest.mark.parametrize("stream", [False, True])
def test_http_errors_raise_response_error_without_retrying(
    sdk: ollama.Client, server: ChaosServer, kind: str, status: int, stream: bool
) -> None:
    server.arm(kind)
    with pytest.raises(ollama.ResponseError) as info:
        if stream:
            chat_parts(sdk, STREAM)
        else:
            sdk.chat(**request(TEXT))
    assert info.value.status_code == status
    assert len(server.requests()) == 1  # the client never retries


@pytest.mark.parametrize("stream", [False, True])
def test_http_error_404_is_a_response_error(
    sdk: ollama.Client, server: ChaosServer, stream: bool
) -> None:
    server.arm("http_error", status=404, message='model "llama3.2" not found, try pulling it first')
    with pytest.raises(ollama.ResponseError) as info:
        if stream:
            chat_parts(sdk, STREAM)
        else:
            sdk.chat(**request(TEXT))
    assert info.value.status_code == 404
    assert info.value.error == 'model "llama3.2" not found, try pulling it first'


def test_error_in_200(sdk: ollama.Client, server: ChaosServer) -> None:
    server.arm("error_in_200", after_chunks=2, message="boom")
    got: list[ChatResponse] = []
    with pytest.raises(ollama.ResponseError) as info:
        for part in sdk.chat(**request(STREAM), stream=True):
            got.append(part)
    assert len(got) == 2 and (info.value.error, info.value.status_code) == ("boom", -1)
    # A JSON answer that is the envelope: the client's model validation refuses it
    # (chat), or it is an empty GenerateResponse (generate: every field is optional).
    server.arm("error_in_200", message="boom", remaining=2)
    with pytest.raises(pydantic.ValidationError):
        sdk.chat(**request(TEXT))
    assert sdk.generate(**request(GENERATE)).response is None


def test_truncated_stream(sdk: ollama.Client, server: ChaosServer) -> None:
    server.arm("truncated_stream", after_chunks=3)
    parts = chat_parts(sdk, STREAM)
    # The iterator just ends: no done line, no exception.
    assert len(parts) == 3 and not any(p.done for p in parts)
    server.arm("truncated_stream")
    with pytest.raises(json.JSONDecodeError):
        sdk.chat(**request(TEXT))


@pytest.mark.parametrize("stream", [False, True])
def test_malformed_tool_args_is_a_tool_call_parse_error(
    sdk: ollama.Client, server: ChaosServer, stream: bool
) -> None:
    server.arm("malformed_tool_args")
    with pytest.raises(ollama.ResponseError) as info:
        if stream:
            chat_parts(sdk, TOOLS)
        else:
            sdk.chat(**request(TOOLS))
    assert info.value.status_code == (-1 if stream else 500)
    assert info.value.error.startswith("error parsing tool call: raw='{")
    assert info.value.error.endswith("err=unexpected end of JSON input")


def test_empty_response(sdk: ollama.Client, server: ChaosServer) -> None:
    server.arm("empty_response", remaining=2)
    answer = sdk.chat(**request(TOOLS))
    assert answer.message.content == "" and answer.message.tool_calls is None and answer.done
    [part] = chat_parts(sdk, STREAM)
    assert part.done and part.message.content == ""


@pytest.mark.parametrize(
    ("kind", "json_error", "stream_error"),
    [
        ("dropped_connection", httpx.RemoteProtocolError, httpx.RemoteProtocolError),
        ("connection_reset", httpx.ReadError, httpx.ReadError),
        ("empty_reply", httpx.RemoteProtocolError, httpx.RemoteProtocolError),
        ("garbage", httpx.RemoteProtocolError, json.JSONDecodeError),
    ],
)
def test_socket_faults_reach_the_caller_unwrapped(
    sdk: ollama.Client,
    server: ChaosServer,
    kind: str,
    json_error: type[Exception],
    stream_error: type[Exception],
) -> None:
    after = {} if kind == "empty_reply" else {"after_chunks": 2}
    server.arm(kind, **after)
    with pytest.raises(json_error):
        sdk.chat(**request(TEXT))
    server.arm(kind, **after)
    got: list[ChatResponse] = []
    with pytest.raises(stream_error):
        for part in sdk.chat(**request(STREAM), stream=True):
            got.append(part)
    assert len(got) == (0 if kind == "empty_reply" else 2)
    assert sdk.chat(**request(TEXT)).done  # the next request is served


def test_stall_needs_a_client_timeout(server: ChaosServer) -> None:
    with client(server, timeout=0.5) as c:
        server.arm("stall", max_ms=3000)
        with pytest.raises(httpx.ReadTimeout):
            c.chat(**request(TEXT))
        server.arm("stall", after_chunks=2, max_ms=3000)
        got: list[ChatResponse] = []
        with pytest.raises(httpx.ReadTimeout):
            for part in c.chat(**request(STREAM), stream=True):
                got.append(part)
        assert len(got) == 2
    # Without a timeout (the client's default) it waits for the server to give up.
    server.arm("stall", max_ms=300)
    started = time.monotonic()
    with client(server, timeout=None) as c, pytest.raises(httpx.RemoteProtocolError):
        c.chat(**request(TEXT))
    assert time.monotonic() - started >= 0.3 - 0.02


def test_latency_and_slow_stream_only_delay(sdk: ollama.Client, server: ChaosServer) -> None:
    server.arm("latency", delay_ms=200)
    started = time.monotonic()
    assert sdk.chat(**request(TEXT)) == ChatResponse(**recording(TEXT)["response"]["body"])
    assert time.monotonic() - started >= 0.2 - 0.02
    server.arm("slow_stream", delay_ms=40)
    started = time.monotonic()
    parts = chat_parts(sdk, STREAM)
    assert len(parts) == 5 and parts[-1].done
    assert time.monotonic() - started >= 5 * 0.04 - 0.02


# -- record -> replay -----------------------------------------------------------------------

KEY = "ollama-secret-key-0123456789"


class _Upstream(BaseHTTPRequestHandler):
    """A tiny Ollama: ``/api/chat`` answers "Hello from the upstream." to anything, as NDJSON
    (unless ``stream: false``), and remembers the Authorization header it got."""

    protocol_version = "HTTP/1.1"
    seen: list[str | None] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        type(self).seen.append(self.headers.get("authorization"))
        base = {"model": body["model"], "created_at": "2026-12-01T10:00:00.000000Z"}
        final = {
            **base,
            "message": {"role": "assistant", "content": ""},
            "done_reason": "stop",
            "done": True,
            "total_duration": 1000,
            "prompt_eval_count": 3,
            "eval_count": 4,
        }
        words = ["Hello", " from", " the", " upstream."]
        if body.get("stream") is False:
            data = json.dumps(
                {**final, "message": {"role": "assistant", "content": "".join(words)}}
            )
            self.send_response(200)
            self.send_header("content-type", "application/json; charset=utf-8")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data.encode())
            return
        self.send_response(200)
        self.send_header("content-type", "application/x-ndjson")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        lines = [
            {**base, "message": {"role": "assistant", "content": w}, "done": False} for w in words
        ]
        for item in [*lines, final]:
            frame = (json.dumps(item, separators=(",", ":")) + "\n").encode()
            write_chunk(self, frame)
        self.wfile.write(b"0\r\n\r\n")


@pytest.fixture
def upstream() -> Iterator[str]:
    _Upstream.seen = []
    with loopback_upstream(_Upstream) as url:
        yield url


def test_record_then_replay(tmp_path: Path, upstream: str) -> None:
    question = {"model": "llama3.2", "messages": [{"role": "user", "content": "Say hello."}]}
    other = {"model": "llama3.2", "messages": [{"role": "user", "content": "Say hi."}]}
    headers = {"authorization": f"Bearer {KEY}"}
    with (
        ChaosServer(mode="record", upstream=upstream, record_dir=tmp_path) as proxy,
        client(proxy, headers=headers) as c,
    ):
        live = list(c.chat(**question, stream=True))
        live_json = c.chat(**other)
    assert "".join(p.message.content or "" for p in live) == "Hello from the upstream."
    assert live_json.message.content == "Hello from the upstream."
    assert _Upstream.seen == [f"Bearer {KEY}"] * 2  # forwarded, never stored
    written = sorted(tmp_path.rglob("*.json"))
    assert len(written) == 2
    for path in written:
        text = path.read_text()
        assert KEY not in text
        assert json.loads(text)["provider"] == "ollama.chat"
    streamed = next(json.loads(p.read_text()) for p in written if "Say hello" in p.read_text())
    assert len(streamed["response"]["chunks"]) == 5
    assert streamed["response"]["body"]["message"]["content"] == "Hello from the upstream."
    with ChaosServer(tmp_path) as replay, client(replay) as c:
        assert list(c.chat(**question, stream=True)) == live
        assert c.chat(**other) == live_json
        # each recorded the other way round: a stream recorded replays as JSON and vice versa
        assert c.chat(**question).message.content == "Hello from the upstream."
        assert "".join(p.message.content or "" for p in c.chat(**other, stream=True)) == (
            "Hello from the upstream."
        )


def test_chaosllm_serve_records_then_replays(tmp_path: Path, upstream: str) -> None:
    question = {"model": "llama3.2", "messages": [{"role": "user", "content": "Say hello."}]}
    args = ("--mode", "record", "--upstream", upstream, "--record-dir", str(tmp_path))
    with serving(*args) as (url, _), client_at(url) as c:
        live = list(c.chat(**question, stream=True))
    [written] = tmp_path.rglob("*.json")
    assert json.loads(written.read_text())["request"]["path"] == "/api/chat"
    with serving("--recordings", str(tmp_path)) as (url, _), client_at(url) as c:
        assert list(c.chat(**question, stream=True)) == live


def test_the_recorder_never_stores_a_cut_stream(tmp_path: Path) -> None:
    with recording_proxy(record_dir=tmp_path) as (upstream, proxy), client(proxy) as c:
        upstream.arm("truncated_stream", after_chunks=2)
        assert len(chat_parts(c, STREAM)) == 2
        assert list(tmp_path.rglob("*.json")) == []
        assert chat_parts(c, STREAM)[-1].done
        assert written_chunk_data(tmp_path) == chunk_data(STREAM)


# -- the pytest fixture ---------------------------------------------------------------------


@pytest.mark.chaosllm(shared=True)
def test_the_fixture_gives_an_ollama_client_and_env(
    chaosllm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = recording(TEXT)["response"]["body"]
    with chaosllm.ollama(timeout=10) as c:
        assert c.chat(**request(TEXT)) == ChatResponse(**body)
    assert chaosllm.env["OLLAMA_HOST"] == chaosllm.url
    monkeypatch.setenv("OLLAMA_HOST", chaosllm.env["OLLAMA_HOST"])
    with ollama.Client(headers=chaosllm.headers, timeout=10) as c:  # what a program reads
        assert c.chat(**request(TEXT)) == ChatResponse(**body)

    async def main() -> None:
        async with chaosllm.async_ollama(timeout=10) as c:
            assert await c.chat(**request(TEXT)) == ChatResponse(**body)

    anyio.run(main)
    records = chaosllm.requests()
    assert [r["path"] for r in records] == ["/api/chat"] * 3
    assert {r["session"] for r in records} == {chaosllm.session}  # the session header is sent
