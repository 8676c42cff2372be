"""VCR.py cassettes of OpenAI chat calls replay through the official openai SDK.

The test vectors are cassettes in the layout vcrpy writes for an httpx request to
api.openai.com (its httpcore stubs: ``request: {body, headers, method, uri}``,
``response: {body: {string}, headers: {name: [values]}, status: {code, message}}``,
``version: 1``), serialised as vcrpy's YAML serializer does (``yaml.dump``): the raw
transport body, so a gzip-encoded answer is ``!!binary``. Plus a cassette of the older
vcrpy httpx format (``content``, ``status_code``)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml  # type: ignore[import-untyped, unused-ignore]
from openai.types.chat import ChatCompletionMessageParam

from chaosllm import ChaosServer
from chaosllm.store.recordings import RecordingStore
from tests.helpers import openai_client

URI = "https://api.openai.com/v1/chat/completions"
ASK: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello in French."}]
COMPLETION = {
    "id": "chatcmpl-BXy8rQ3bT2mZ1",
    "object": "chat.completion",
    "created": 1747310000,
    "model": "gpt-4o-mini-2024-07-18",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Bonjour !",
                "refusal": None,
                "annotations": [],
            },
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 13, "completion_tokens": 3, "total_tokens": 16},
    "service_tier": "default",
    "system_fingerprint": "fp_0392822090",
}
STREAM_ASK: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Count to three."}]
STREAM_TEXT = ["1", ",", " 2", ",", " 3", "."]


def stream_body() -> str:
    base = {
        "id": "chatcmpl-BXy9Stream",
        "object": "chat.completion.chunk",
        "created": 1747310001,
        "model": "gpt-4o-mini-2024-07-18",
        "service_tier": "default",
        "system_fingerprint": "fp_0392822090",
    }
    frames = [
        {
            **base,
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": "", "refusal": None},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        }
    ]
    frames += [
        {
            **base,
            "choices": [
                {"index": 0, "delta": {"content": piece}, "logprobs": None, "finish_reason": None}
            ],
        }
        for piece in STREAM_TEXT
    ]
    frames.append(
        {**base, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]}
    )
    return (
        "".join(f"data: {json.dumps(f, separators=(',', ':'))}\n\n" for f in frames)
        + "data: [DONE]\n\n"
    )


def request_headers(body: bytes) -> dict[str, list[str]]:
    """What the openai SDK's httpx request carries, as vcrpy stores it (no
    authorization: filtered with filter_headers=['authorization'])."""
    return {
        "accept": ["application/json"],
        "accept-encoding": ["gzip, deflate"],
        "connection": ["keep-alive"],
        "content-length": [str(len(body))],
        "content-type": ["application/json"],
        "host": ["api.openai.com"],
        "user-agent": ["OpenAI/Python 1.82.0"],
        "x-stainless-arch": ["x64"],
        "x-stainless-async": ["false"],
        "x-stainless-lang": ["python"],
        "x-stainless-os": ["Linux"],
        "x-stainless-package-version": ["1.82.0"],
        "x-stainless-raw-response": ["true"],
        "x-stainless-retry-count": ["0"],
        "x-stainless-runtime": ["CPython"],
        "x-stainless-runtime-version": ["3.12.3"],
    }


def interaction(
    request_body: dict[str, Any], status: int, headers: dict[str, list[str]], body: bytes | str
) -> dict[str, Any]:
    raw = json.dumps(request_body, separators=(",", ":"))
    return {
        "request": {
            "body": raw,
            "headers": request_headers(raw.encode()),
            "method": "POST",
            "uri": URI,
        },
        "response": {
            "body": {"string": body},
            "headers": headers,
            "status": {"code": status, "message": "OK"},
        },
    }


def cassette() -> dict[str, Any]:
    json_headers = {
        "CF-RAY": ["93f1b0b5ecd8e4b3-LHR"],
        "Connection": ["keep-alive"],
        "Content-Encoding": ["gzip"],
        "Content-Type": ["application/json"],
        "Date": ["Thu, 15 May 2025 12:00:00 GMT"],
        "Server": ["cloudflare"],
        "Transfer-Encoding": ["chunked"],
        "openai-processing-ms": ["312"],
        "x-request-id": ["req_5c2b7f0e0c5a4a7d9b8e"],
        "x-ratelimit-remaining-requests": ["9999"],
    }
    stream_headers = {
        "Connection": ["keep-alive"],
        "Content-Type": ["text/event-stream; charset=utf-8"],
        "Date": ["Thu, 15 May 2025 12:00:01 GMT"],
        "Transfer-Encoding": ["chunked"],
        "x-request-id": ["req_9a1f"],
    }
    return {
        "interactions": [
            interaction(
                {"messages": ASK, "model": "gpt-4o-mini", "temperature": 0},
                200,
                json_headers,
                gzip.compress(json.dumps(COMPLETION).encode()),
            ),
            interaction(
                {
                    "messages": STREAM_ASK,
                    "model": "gpt-4o-mini",
                    "stream": True,
                    "stream_options": {"include_usage": False},
                },
                200,
                stream_headers,
                stream_body(),
            ),
            {
                "request": {
                    "body": None,
                    "headers": {},
                    "method": "GET",
                    "uri": "https://api.openai.com/v1/models",
                },
                "response": {
                    "body": {"string": "{}"},
                    "headers": {},
                    "status": {"code": 200, "message": "OK"},
                },
            },
        ],
        "version": 1,
    }


@pytest.fixture
def cassettes(tmp_path: Path) -> Path:
    root = tmp_path / "cassettes"
    root.mkdir()
    text = yaml.dump(cassette(), Dumper=yaml.Dumper)  # what vcrpy's yaml serializer does
    assert "!!binary" in text
    (root / "test_openai_chat.yaml").write_text(text, "utf-8")
    return root


@pytest.fixture
def server(cassettes: Path) -> Iterator[ChaosServer]:
    with ChaosServer(cassettes) as srv:
        yield srv


def test_cassette_loads_its_chat_calls(cassettes: Path) -> None:
    store = RecordingStore.load([cassettes])
    assert store.errors == []
    assert [e.name for e in store.exchanges] == ["test_openai_chat/0001", "test_openai_chat/0002"]
    first, second = store.exchanges
    assert first.response.body == COMPLETION and not first.response.stream
    assert dict(first.response.headers)["x-request-id"] == "req_5c2b7f0e0c5a4a7d9b8e"
    assert "cf-ray" not in dict(first.response.headers)
    assert second.response.stream and second.response.chunks is not None
    assert second.response.body["choices"][0]["message"]["content"] == "".join(STREAM_TEXT)
    assert first.meta["vcr"]["uri"] == URI


def test_a_recorded_json_call_replays(sdk: openai.OpenAI, server: ChaosServer) -> None:
    completion = sdk.chat.completions.create(model="gpt-4o-mini", messages=ASK, temperature=0)
    assert completion.model_dump(
        exclude_none=True
    ) == openai.types.chat.ChatCompletion.model_validate(COMPLETION).model_dump(exclude_none=True)
    assert server.requests()[0]["match"] == "exact"


def test_a_recorded_stream_replays_frame_for_frame(sdk: openai.OpenAI, server: ChaosServer) -> None:
    with sdk.chat.completions.create(
        model="gpt-4o-mini", messages=STREAM_ASK, stream=True
    ) as stream:
        chunks = list(stream)
    assert [c.choices[0].delta.content for c in chunks[1:-1]] == STREAM_TEXT
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert chunks[0].id == "chatcmpl-BXy9Stream"
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        raw = client.post(
            "/chat/completions",
            json={"model": "gpt-4o-mini", "stream": True, "messages": STREAM_ASK},
        )
    assert raw.text == stream_body()  # byte for byte


def test_a_recorded_stream_replays_as_json_and_json_as_stream(sdk: openai.OpenAI) -> None:
    completion = sdk.chat.completions.create(model="gpt-4o-mini", messages=STREAM_ASK)
    assert completion.choices[0].message.content == "".join(STREAM_TEXT)
    with sdk.chat.completions.create(
        model="gpt-4o-mini", messages=ASK, temperature=0, stream=True
    ) as stream:
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "Bonjour !"


OLD_FORMAT = """\
interactions:
- request:
    body: '{"messages":[{"role":"user","content":"Ping?"}],"model":"gpt-4o-mini"}'
    headers:
      host:
      - api.openai.com
      content-type:
      - application/json
    method: POST
    uri: https://api.openai.com/v1/chat/completions
  response:
    content: '{"id":"chatcmpl-old","object":"chat.completion","created":1700000000,
      "model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant",
      "content":"Pong."},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,
      "completion_tokens":2,"total_tokens":11}}'
    headers:
      content-type:
      - application/json
    http_version: HTTP/1.1
    status_code: 200
version: 1
"""


def test_older_vcrpy_httpx_cassettes_replay(tmp_path: Path) -> None:
    (tmp_path / "old.yml").write_text(OLD_FORMAT, "utf-8")
    with (
        ChaosServer(tmp_path) as server,
        openai_client(server) as sdk,
    ):
        completion = sdk.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "Ping?"}]
        )
    assert completion.choices[0].message.content == "Pong."


def test_cassettes_without_chat_calls_or_with_bad_bodies_are_reported(tmp_path: Path) -> None:
    only_models = cassette()
    only_models["interactions"] = only_models["interactions"][2:]
    (tmp_path / "models.yaml").write_text(yaml.dump(only_models), "utf-8")
    broken = cassette()
    broken["interactions"][0]["response"]["headers"]["Content-Encoding"] = ["br"]
    (tmp_path / "brotli.yaml").write_text(yaml.dump(broken), "utf-8")
    (tmp_path / "notes.yaml").write_text("just: a note\n", "utf-8")
    store = RecordingStore.load([tmp_path])
    problems = {Path(e.path).name: e.problem for e in store.errors}
    assert "no OpenAI chat completion call" in problems["models.yaml"]
    assert "decode_compressed_response=True" in problems["brotli.yaml"]
    assert "unknown format" in problems["notes.yaml"]
