"""Pure tests of the OpenAI chat provider: canonicalisation, digests, plans, assembly."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chaosllm.errors import InvalidRequest
from chaosllm.model import Exchange, Framing, RecordedChunk, RecordedRequest, RecordedResponse
from chaosllm.providers.openai_chat import OpenAIChat, OpenAIChatCodec, iter_frame_payloads

P = OpenAIChat()
CODEC = OpenAIChatCodec()  # typed: its stream_frames takes include_usage

REQUEST: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
}

COMPLETION: dict[str, Any] = {
    "id": "chatcmpl-abc",
    "object": "chat.completion",
    "created": 1790000000,
    "model": "gpt-4o-mini-2024-07-18",
    "system_fingerprint": "fp_1",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "The capital of France is Paris.",
                "refusal": None,
            },
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27},
}

TOOL_COMPLETION: dict[str, Any] = {
    **COMPLETION,
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "refusal": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {
                            "name": "get_weather",
                            "arguments": '{"city": "Paris", "unit": "c"}',
                        },
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {
                            "name": "get_weather",
                            "arguments": '{"city": "Tokyo", "unit": "c"}',
                        },
                    },
                ],
            },
            "logprobs": None,
            "finish_reason": "tool_calls",
        }
    ],
}


def exchange(
    body: dict[str, Any], chunks: tuple[RecordedChunk, ...] | None = None, status: int = 200
) -> Exchange:
    return Exchange(
        provider="openai.chat",
        request=RecordedRequest("POST", "/v1/chat/completions", REQUEST),
        response=RecordedResponse(
            status=status, body=body, stream=chunks is not None, chunks=chunks
        ),
        digest=P.digest(REQUEST),
        name="t/0001",
        scenario="t",
    )


def payloads(frames: list[bytes]) -> list[Any]:
    out = []
    for data in iter_frame_payloads([f.decode() for f in frames]):
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


# -- canonical requests and digests ------------------------------------------------


def test_digest_ignores_transport_and_sampling_knobs() -> None:
    noisy = {
        **REQUEST,
        "stream": True,
        "temperature": 0.2,
        "seed": 7,
        "max_tokens": 50,
        "stream_options": {"include_usage": True},
        "user": "u1",
    }
    assert P.digest(noisy) == P.digest(REQUEST)


def test_digest_is_sha256_of_sorted_compact_canonical_json() -> None:
    canonical = {
        "model": "gpt-4o-mini",
        "messages": REQUEST["messages"],
        "tools": None,
        "tool_choice": None,
        "response_format": None,
    }
    blob = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert P.digest(REQUEST) == hashlib.sha256(blob.encode()).hexdigest()


@pytest.mark.parametrize(
    "change",
    [
        lambda r: r.update(model="gpt-4o"),
        lambda r: r["messages"][1].update(content="What is the capital of Spain?"),
        lambda r: r["messages"][1].update(name="alice"),
        lambda r: r.update(tools=[{"type": "function", "function": {"name": "f"}}]),
        lambda r: r.update(tool_choice="required"),
        lambda r: r.update(response_format={"type": "json_object"}),
    ],
)
def test_digest_covers_what_decides_the_answer(change: Any) -> None:
    changed = copy.deepcopy(REQUEST)
    change(changed)
    assert P.digest(changed) != P.digest(REQUEST)


def test_canonical_message_drops_other_keys() -> None:
    request = copy.deepcopy(REQUEST)
    request["messages"][1]["cache_control"] = {"type": "ephemeral"}
    assert P.digest(request) == P.digest(REQUEST)


# -- validation -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ([], "body", "JSON object"),
        ({"messages": []}, "model", "Missing required parameter: 'model'"),
        ({"model": "m"}, "messages", "Missing required parameter: 'messages'"),
        ({"model": "m", "messages": "hi"}, "messages", "expected an array, but got a string"),
        ({"model": "m", "messages": []}, "messages", "empty array"),
        (
            {"model": 3, "messages": [{"role": "user", "content": "x"}]},
            "model",
            "expected a string",
        ),
        (
            {"model": "m", "messages": [{"role": "wizard", "content": "x"}]},
            "messages[0].role",
            "Invalid value",
        ),
        ({"model": "m", "messages": [{"content": "x"}]}, "messages[0].role", "Missing required"),
        (
            {"model": "m", "messages": [{"role": "user", "content": 5}]},
            "messages[0].content",
            "expected one of a string or array",
        ),
        (
            {"model": "m", "messages": [{"role": "tool", "content": "x"}]},
            "messages[0].tool_call_id",
            "tool_call_id",
        ),
        ({**REQUEST, "stream": "yes"}, "stream", "expected a boolean"),
        ({**REQUEST, "tools": {}}, "tools", "expected an array"),
    ],
)
def test_validation_names_the_parameter(body: Any, param: str, fragment: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        P.validate(body)
    assert info.value.param == param
    assert fragment in info.value.message


def test_valid_request_passes() -> None:
    P.validate({**REQUEST, "stream": True, "tools": [], "n": 1})


# -- rendering --------------------------------------------------------------------


def test_json_plan_is_the_body() -> None:
    plan = P.render(exchange(COMPLETION), REQUEST, timing=0)
    assert plan.status == 200 and plan.framing is Framing.LENGTH
    assert ("content-type", "application/json") in plan.headers
    assert json.loads(plan.body()) == COMPLETION
    assert plan.frame_count == 0


def test_stream_plan_renders_role_content_finish_done() -> None:
    plan = P.render(exchange(COMPLETION), {**REQUEST, "stream": True}, timing=0)
    assert plan.framing is Framing.CHUNKED
    frames = payloads([p.data for p in plan.pieces])
    assert frames[-1] == "[DONE]"
    chunks = frames[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == "The capital of France is Paris."
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == "chatcmpl-abc" for c in chunks)
    assert all("usage" not in c for c in chunks)
    assert len(chunks) > 4  # content arrives in several deltas


def test_stream_usage_chunk_when_include_usage() -> None:
    body = {**REQUEST, "stream": True, "stream_options": {"include_usage": True}}
    frames = payloads([p.data for p in P.render(exchange(COMPLETION), body, timing=0).pieces])
    usage_chunk = frames[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"] == COMPLETION["usage"]
    assert all(f["usage"] is None for f in frames[:-2])


def test_stream_tool_calls_index_id_name_then_fragments() -> None:
    plan = P.render(exchange(TOOL_COMPLETION), {**REQUEST, "stream": True}, timing=0)
    frames = payloads([p.data for p in plan.pieces])[:-1]
    deltas = [f["choices"][0]["delta"] for f in frames]
    assert deltas[0]["content"] is None
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    heads = [c for c in calls if "id" in c]
    assert [
        (h["index"], h["id"], h["type"], h["function"]["name"], h["function"]["arguments"])
        for h in heads
    ] == [
        (0, "call_1", "function", "get_weather", ""),
        (1, "call_2", "function", "get_weather", ""),
    ]
    for index, expected in (
        (0, '{"city": "Paris", "unit": "c"}'),
        (1, '{"city": "Tokyo", "unit": "c"}'),
    ):
        fragments = [
            c["function"]["arguments"] for c in calls if c["index"] == index and "id" not in c
        ]
        assert len(fragments) > 1
        assert "".join(fragments) == expected
    assert frames[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_stream_reasoning_deltas_come_before_content() -> None:
    body = copy.deepcopy(COMPLETION)
    body["choices"][0]["message"]["reasoning_content"] = "France's capital is well known."
    frames = payloads(
        [p.data for p in P.render(exchange(body), {**REQUEST, "stream": True}, timing=0).pieces]
    )[:-1]
    deltas = [f["choices"][0]["delta"] for f in frames]
    reasoning = [i for i, d in enumerate(deltas) if "reasoning_content" in d]
    content = [i for i, d in enumerate(deltas) if d.get("content")]
    assert reasoning and content and max(reasoning) < min(content)
    assert (
        "".join(deltas[i]["reasoning_content"] for i in reasoning)
        == "France's capital is well known."
    )


def test_recorded_frames_replay_verbatim_with_scaled_gaps() -> None:
    chunks = (
        RecordedChunk('data: {"weird":  "spacing"}\n\n', 100.0),
        RecordedChunk(": keep-alive comment\n\n", 20.0),
        RecordedChunk("data: [DONE]\n\n", 4.0),
    )
    plan = P.render(exchange(COMPLETION, chunks), {**REQUEST, "stream": True}, timing=0.5)
    assert [p.data for p in plan.pieces] == [c.data.encode() for c in chunks]
    assert [p.delay_ms for p in plan.pieces] == [50.0, 10.0, 2.0]
    fast = P.render(exchange(COMPLETION, chunks), {**REQUEST, "stream": True}, timing=0)
    assert all(p.delay_ms == 0 for p in fast.pieces)


def test_stream_recording_replays_as_json() -> None:
    chunks = tuple(
        RecordedChunk(f.decode())
        for f in (
            p.data
            for p in P.render(exchange(COMPLETION), {**REQUEST, "stream": True}, timing=0).pieces
        )
    )
    plan = P.render(exchange(COMPLETION, chunks), REQUEST, timing=0)
    assert json.loads(plan.body()) == COMPLETION


def test_recorded_error_answer_keeps_its_status() -> None:
    error = {
        "error": {
            "message": "Rate limit",
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    plan = P.render(exchange(error, status=429), {**REQUEST, "stream": True}, timing=0)
    assert plan.status == 429 and json.loads(plan.body()) == error


def test_render_error_envelope() -> None:
    plan = P.render_error(400, "bad", kind="invalid_request", code="c", param="p")
    assert json.loads(plan.body()) == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": "p", "code": "c"}
    }


# -- assembly ---------------------------------------------------------------------


@pytest.mark.parametrize("completion", [COMPLETION, TOOL_COMPLETION])
@pytest.mark.parametrize("include_usage", [False, True])
def test_assemble_inverts_render(completion: dict[str, Any], include_usage: bool) -> None:
    frames = CODEC.stream_frames(completion, include_usage=include_usage)
    assembled = P.assemble(frames)
    expected = copy.deepcopy(completion)
    if not include_usage:
        expected["usage"] = None
    assert assembled == expected


text = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=200)


@given(content=text, reasoning=text, arguments=text)
def test_assemble_inverts_render_for_any_text(content: str, reasoning: str, arguments: str) -> None:
    completion = copy.deepcopy(COMPLETION)
    message = completion["choices"][0]["message"]
    message["content"] = content
    if reasoning:
        message["reasoning_content"] = reasoning
    if arguments:
        message["tool_calls"] = [
            {"id": "call_x", "type": "function", "function": {"name": "f", "arguments": arguments}}
        ]
    assembled = P.assemble(CODEC.stream_frames(completion, include_usage=True))
    assert assembled == completion


def test_assemble_multi_line_data_and_crlf() -> None:
    frames = [
        'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m",\r\n'
        'data: "choices":[{"index":0,"delta":{"role":"assistant","content":"hi"},'
        '"finish_reason":"stop"}]}\r\n\r\n',
        "data: [DONE]\n\n",
    ]
    body = P.assemble(frames)
    assert body["choices"][0]["message"]["content"] == "hi"
    assert body["choices"][0]["finish_reason"] == "stop"


def test_fallback_is_deterministic() -> None:
    assert P.fallback(REQUEST, "d" * 64) == P.fallback(REQUEST, "d" * 64)
    assert "d" * 64 in P.fallback(REQUEST, "d" * 64)["choices"][0]["message"]["content"]
