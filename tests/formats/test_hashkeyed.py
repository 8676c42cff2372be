"""Hash-keyed fixture directories (seeds/hash-keyed-fixtures.md), served to the official
openai SDK exactly as that document prescribes: fixtures named by the hash its own
snippet computes, JSON and stream, the fallback and the missing-hash log line."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam

from chaosllm import ChaosServer
from chaosllm.model import Keying
from chaosllm.store.formats import hashkeyed
from chaosllm.store.recordings import RecordingStore
from tests.helpers import openai_client


def compute_hash(payload: dict[str, Any]) -> str:
    """scripts/e2e/compute_hash.py from the seed document, as it is written there."""
    canonical = {
        "model": payload.get("model"),
        "messages": [
            {
                k: v
                for k, v in msg.items()
                if k in {"role", "content", "name", "tool_call_id", "tool_calls"}
            }
            for msg in payload.get("messages", [])
        ],
        "tool_choice": payload.get("tool_choice"),
    }
    blob = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


TOOLS: list[ChatCompletionFunctionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]

ASK: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "messages": [
        {"role": "system", "content": "You are DocsGPT."},
        {"role": "user", "content": "Summarise the onboarding guide, please — briefly."},
    ],
}
ANSWER = (
    "The onboarding guide covers **account setup**, the first project, and where to "
    "ask for help. It takes about an hour."
)

WEATHER: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": "weather in London?"}],
    "tool_choice": "auto",
}
WEATHER_CALL = {
    "id": "call_e2e_weather_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city":"London"}'},
}


def write_fixture(directory: Path, request: dict[str, Any], fixture: dict[str, Any]) -> str:
    digest = compute_hash(request)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{digest}.json").write_text(json.dumps(fixture, indent=2), "utf-8")
    return digest


@pytest.fixture
def fixtures(tmp_path: Path) -> Path:
    directory = tmp_path / "mock_llm_fixtures"
    digest = write_fixture(
        directory,
        ASK,
        {
            "request_digest": compute_hash(ASK),
            "description": "Summary of the onboarding guide",
            "response": {
                "content": ANSWER,
                "tool_calls": None,
                "finish_reason": "stop",
                "usage": {"prompt_tokens": 12, "completion_tokens": 34},
            },
        },
    )
    assert digest == compute_hash(ASK)
    write_fixture(
        directory,
        WEATHER,
        {
            "request_digest": compute_hash(WEATHER),
            "description": "Agent calls the weather tool for 'weather in London?'",
            "response": {
                "content": "",
                "tool_calls": [WEATHER_CALL],
                "finish_reason": "tool_calls",
            },
        },
    )
    (directory / "README.md").write_text("# Mock LLM fixtures\n", "utf-8")
    return directory


def test_the_loader_computes_the_documents_hash() -> None:
    for request in (
        ASK,
        WEATHER,
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "see"},
                        {"type": "image_url", "image_url": {"url": "x"}},
                    ],
                    "extra": 1,
                }
            ],
            "temperature": 0.3,
            "tools": TOOLS,
        },
    ):
        assert hashkeyed.request_digest(request) == compute_hash(request)


def test_fixtures_load_keyed_by_their_hash(fixtures: Path) -> None:
    store = RecordingStore.load([fixtures])
    assert store.errors == []
    assert sorted(e.digest for e in store.exchanges) == sorted(
        [compute_hash(ASK), compute_hash(WEATHER)]
    )
    assert all(
        e.keyed_by == Keying.HASH_KEYED and e.meta["format"] == "hash-keyed"
        for e in store.exchanges
    )
    assert store.by_digest == {}  # never matched by chaosllm's own digest
    names = {e.meta["description"] for e in store.exchanges}
    assert "Summary of the onboarding guide" in names


def test_content_fixture_as_json(sdk: openai.OpenAI, server: ChaosServer) -> None:
    # Sampling knobs and tools are not in the fixture hash: the same fixture answers.
    completion = sdk.chat.completions.create(
        **ASK, temperature=0.2, seed=7, max_tokens=300, tools=TOOLS
    )
    choice = completion.choices[0]
    assert choice.message.content == ANSWER and choice.finish_reason == "stop"
    assert choice.message.tool_calls is None
    assert completion.usage is not None
    assert (
        completion.usage.prompt_tokens,
        completion.usage.completion_tokens,
        completion.usage.total_tokens,
    ) == (12, 34, 46)
    [entry] = server.requests()
    assert entry["match"] == "exact" and entry["recording"].endswith(compute_hash(ASK))


def test_content_fixture_streams_in_about_five_deltas(sdk: openai.OpenAI) -> None:
    with sdk.chat.completions.create(**ASK, stream=True) as stream:
        chunks = list(stream)
    deltas = [c.choices[0] for c in chunks]
    assert "".join(d.delta.content or "" for d in deltas) == ANSWER
    assert len(deltas) == 5
    assert [d.finish_reason for d in deltas] == [None, None, None, None, "stop"]
    sizes = [len(d.delta.content or "") for d in deltas]
    assert max(sizes) - min(sizes) <= len(ANSWER) // 5  # split by character length
    assert deltas[0].delta.role == "assistant"


def test_tool_call_fixture_as_json(sdk: openai.OpenAI) -> None:
    completion = sdk.chat.completions.create(**WEATHER, tools=TOOLS)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert call.id == "call_e2e_weather_1" and call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "London"}
    usage = completion.usage
    assert usage is not None and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_tool_call_fixture_streams_as_one_delta_then_finish(sdk: openai.OpenAI) -> None:
    with sdk.chat.completions.create(**WEATHER, tools=TOOLS, stream=True) as stream:
        chunks = list(stream)
    assert len(chunks) == 2
    first, last = chunks[0].choices[0], chunks[1].choices[0]
    [call] = first.delta.tool_calls or []
    assert (call.index, call.id, call.function and call.function.name) == (
        0,
        "call_e2e_weather_1",
        "get_weather",
    )
    assert call.function is not None and call.function.arguments == '{"city":"London"}'
    assert first.finish_reason is None
    assert last.delta.content is None and not last.delta.tool_calls
    assert last.finish_reason == "tool_calls"


UNKNOWN: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": "unheard of"}],
}
"""A request no fixture answers."""


def test_a_miss_logs_the_hash_line_and_the_request(
    fixtures: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        ChaosServer(fixtures, on_miss="fallback") as server,
        openai_client(server) as sdk,
        caplog.at_level(logging.WARNING, "chaosllm"),
    ):
        first = sdk.chat.completions.create(**UNKNOWN)
        second = sdk.chat.completions.create(**UNKNOWN)
    assert first.choices[0].message.content == second.choices[0].message.content
    # DocsGPT's stub's generic answer (issue #14: its code is the reference)
    assert first.choices[0].message.content == (
        "I don't have enough information to answer that from the provided sources."
    )
    lines = "\n".join(r.getMessage() for r in caplog.records).splitlines()
    hash_line = f"[mock-llm] unknown fixture hash {compute_hash(UNKNOWN)}"
    assert hash_line in lines
    request_line = lines[lines.index(hash_line) + 1]  # the request on the next line
    dumped = json.loads(request_line.removeprefix("[mock-llm] request: "))
    assert dumped["messages"] == UNKNOWN["messages"]


def test_a_miss_in_error_mode_names_the_fixture_hash(
    server: ChaosServer, sdk: openai.OpenAI
) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.chat.completions.create(**UNKNOWN)
    assert f"{compute_hash(UNKNOWN)}.json" in str(caught.value)


def test_fixture_errors_say_what_is_wrong(tmp_path: Path) -> None:
    good = {"response": {"content": "hi"}}
    write_fixture(tmp_path / "d", {"model": "a", "messages": []}, good)
    (tmp_path / "d" / "not-a-hash.json").write_text(json.dumps(good), "utf-8")
    write_fixture(
        tmp_path / "d",
        {"model": "b", "messages": []},
        {
            "response": {
                "content": "",
                "tool_calls": [
                    {
                        "id": "c",
                        "type": "function",
                        "function": {"name": "f", "arguments": {"city": "London"}},
                    }
                ],
            }
        },
    )
    write_fixture(
        tmp_path / "d", {"model": "c", "messages": []}, {"response": {"finish_reason": "stop"}}
    )
    store = RecordingStore.load([tmp_path / "d"])
    assert len(store.exchanges) == 1
    problems = sorted(e.problem for e in store.errors)
    assert any("must be named <sha256>.json" in p for p in problems)
    assert any("must be a JSON string, not an object" in p for p in problems)
    assert any('"response.content" is required' in p for p in problems)


def test_total_tokens_is_recomputed_and_defaults_apply() -> None:
    body = hashkeyed.completion(
        {"content": "abcdefgh", "usage": {"prompt_tokens": 3, "total_tokens": 99}}, "f" * 64
    )
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert body["choices"][0]["finish_reason"] == "stop"
    frames = hashkeyed.stream_frames(hashkeyed.completion({"content": ""}, "e" * 64))
    assert frames[-1] == "data: [DONE]\n\n" and len(frames) == 2
