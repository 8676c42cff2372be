"""The official `openai` SDK against a real chaosllm server: every shipped recording
comes back as the SDK objects it encodes, sync and async, JSON and stream."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from chaosllm import ChaosServer
from chaosllm.providers.openai_chat import iter_frame_payloads
from tests.helpers import all_recordings, async_openai_client, recording, request_body, run_within

NAMES = all_recordings()


def expected_completion(name: str) -> ChatCompletion:
    return ChatCompletion.model_validate(recording(name)["response"]["body"])


def accumulate(chunks: list[ChatCompletionChunk]) -> dict[str, Any]:
    """What a client assembles from chunks: text, reasoning, tool calls, finish, usage."""
    text, reasoning, finish, usage = "", "", None, None
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
        for choice in chunk.choices:
            delta = choice.delta
            text += delta.content or ""
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            for call in delta.tool_calls or []:
                slot = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] += call.id or ""
                if call.function is not None:
                    slot["name"] += call.function.name or ""
                    slot["arguments"] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    return {
        "text": text,
        "reasoning": reasoning,
        "finish": finish,
        "usage": usage,
        "calls": [calls[i] for i in sorted(calls)],
    }


def expected_stream(name: str) -> dict[str, Any]:
    body = recording(name)["response"]["body"]
    choice = body["choices"][0]
    message = choice["message"]
    return {
        "text": message.get("content") or "",
        "reasoning": message.get("reasoning_content") or "",
        "finish": choice["finish_reason"],
        "usage": body.get("usage"),
        "calls": [
            {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            for c in message.get("tool_calls") or []
        ],
    }


@pytest.mark.parametrize("name", NAMES)
def test_sync_json(sdk: openai.OpenAI, name: str) -> None:
    completion = sdk.chat.completions.create(**request_body(name, stream=False))
    assert completion == expected_completion(name)


@pytest.mark.parametrize("name", NAMES)
def test_sync_stream(sdk: openai.OpenAI, name: str) -> None:
    with sdk.chat.completions.create(**request_body(name, stream=True)) as stream:
        chunks = list(stream)
    got = accumulate(chunks)
    want = expected_stream(name)
    assert got["text"] == want["text"] and got["reasoning"] == want["reasoning"]
    assert got["calls"] == want["calls"] and got["finish"] == want["finish"]
    usage = ChatCompletion.model_validate(recording(name)["response"]["body"]).usage
    assert usage is None or got["usage"] == usage.model_dump()
    frames = recording(name)["response"].get("chunks")
    if frames:  # recorded from a stream: the very chunks that were recorded
        recorded = [
            ChatCompletionChunk.model_validate_json(data)
            for data in iter_frame_payloads([f["data"] for f in frames])
            if data != "[DONE]"
        ]
        assert chunks == recorded


@pytest.mark.parametrize(
    "name",
    [
        "tool-call/0001",
        "parallel-tools/0001",
        "streaming-tools/0001",
        "streaming-usage/0001",
        "reasoning/0001",
        "structured-output/0001",
    ],
)
def test_async_json_and_stream(shared_server: ChaosServer, name: str) -> None:
    async def exercise() -> None:
        async with async_openai_client(shared_server) as client:
            completion = await client.chat.completions.create(**request_body(name, stream=False))
            assert completion == expected_completion(name)
            stream = await client.chat.completions.create(**request_body(name, stream=True))
            chunks = [chunk async for chunk in stream]
            got, want = accumulate(chunks), expected_stream(name)
            assert (got["text"], got["calls"], got["finish"]) == (
                want["text"],
                want["calls"],
                want["finish"],
            )

    run_within(20, exercise)


def test_parallel_tool_calls_as_sdk_objects(sdk: openai.OpenAI) -> None:
    completion = sdk.chat.completions.create(**request_body("parallel-tools/0001", stream=False))
    calls = completion.choices[0].message.tool_calls
    assert calls is not None and len(calls) == 2
    arguments = [json.loads(c.function.arguments) for c in calls]
    assert all(isinstance(a, dict) and a for a in arguments) and arguments[0] != arguments[1]
    assert len({c.id for c in calls}) == 2
    assert completion.choices[0].finish_reason == "tool_calls"


def test_recorded_frames_replay_byte_identical_on_the_wire(server: ChaosServer) -> None:
    rec = recording("long-answer/0001")
    with (
        httpx.Client(timeout=10) as client,
        client.stream(
            "POST", server.url + "/v1/chat/completions", json=rec["request"]["body"]
        ) as response,
    ):
        received = b"".join(response.iter_raw())
    assert received == "".join(c["data"] for c in rec["response"]["chunks"]).encode()


def test_embeddings_and_models_through_the_sdk(sdk: openai.OpenAI) -> None:
    client = sdk
    result = client.embeddings.create(
        model="text-embedding-3-small", input=["a", "b"], dimensions=32
    )
    assert [len(d.embedding) for d in result.data] == [32, 32]
    again = client.embeddings.create(model="text-embedding-3-small", input="a", dimensions=32)
    assert again.data[0].embedding == pytest.approx(result.data[0].embedding, rel=1e-6)
    assert "gpt-4o-mini" in [m.id for m in client.models.list()]


def test_miss_is_a_not_found_error_naming_the_nearest(sdk: openai.OpenAI) -> None:
    body = request_body("knowledge/0002", stream=False)
    body["messages"][-1]["content"] = "What is the capital of Kenya?"
    with pytest.raises(openai.NotFoundError) as info:
        sdk.chat.completions.create(**body)
    assert "knowledge/0002" in info.value.message
