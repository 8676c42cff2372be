"""Each fault as a pure transformation of a plan: no sockets."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chaosllm.faults import FAULT_TYPES, FaultContext, apply_fault, parse_fault_spec
from chaosllm.faults.transform import any_request
from chaosllm.model import (
    Ending,
    Exchange,
    Framing,
    RecordedRequest,
    RecordedResponse,
    ResponsePlan,
)
from chaosllm.providers.openai_chat import OpenAIChat, iter_frame_payloads
from tests.helpers import chat_completion, piece_texts, transformed

P = OpenAIChat()
REQUEST = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
ANSWER = chat_completion(
    "one two three four five six",
    model="gpt-4o-mini",
    message={"refusal": None},
    usage={"prompt_tokens": 1, "completion_tokens": 6, "total_tokens": 7},
)
TOOL_ANSWER: dict[str, Any] = {
    **ANSWER,
    "choices": [
        {
            "index": 0,
            "logprobs": None,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "f", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
        }
    ],
}


def context(answer: dict[str, Any], stream: bool) -> tuple[ResponsePlan, FaultContext]:
    body = {**REQUEST, "stream": stream, "stream_options": {"include_usage": True}}

    def render(new_answer: Any) -> ResponsePlan:
        exchange = Exchange(
            "openai.chat",
            RecordedRequest("POST", "/v1/chat/completions", body),
            RecordedResponse(200, new_answer),
            "d",
            "s/1",
            "s",
        )
        return P.render(exchange, body, timing=0)

    return render(answer), FaultContext(P, stream, answer, render)


def fault(
    type_: str, answer: dict[str, Any] = ANSWER, stream: bool = False, **params: Any
) -> tuple[ResponsePlan, ResponsePlan]:
    return transformed(context(answer, stream), type_, **params)


def frames(plan: ResponsePlan) -> list[str]:
    return list(iter_frame_payloads(piece_texts(plan, "replace")))


def test_every_type_transforms_both_kinds_of_request() -> None:
    for name in FAULT_TYPES:
        if FAULT_TYPES[name].on_request is not any_request:
            continue  # a wire quirk: SSE streams only (tests/wire/test_quirks.py)
        for stream in (False, True):
            answer = TOOL_ANSWER if name == "malformed_tool_args" else ANSWER
            plan, out = fault(name, answer, stream)
            assert out != plan, (name, stream)


@pytest.mark.parametrize("stream", [False, True])
def test_empty_response(stream: bool) -> None:
    _, out = fault("empty_response", stream=stream)
    assert out.status == 200 and out.ending is Ending.COMPLETE
    if stream:
        deltas = [json.loads(f)["choices"] for f in frames(out)[:-1]]
        assert not any(c and c[0]["delta"].get("content") for c in deltas)
        assert frames(out)[-1] == "[DONE]"
    else:
        message = json.loads(out.body())["choices"][0]["message"]
        assert message["content"] is None and "tool_calls" not in message


def test_truncated_stream_keeps_k_frames_without_finish_or_done() -> None:
    plan, out = fault("truncated_stream", stream=True, after_chunks=3)
    assert out.pieces == plan.pieces[:3] and out.ending is Ending.COMPLETE
    assert "[DONE]" not in "".join(frames(out))


def test_cut_never_keeps_the_finishing_frames() -> None:
    plan, out = fault("truncated_stream", stream=True, after_chunks=1000)
    assert len(out.pieces) == P.faults.answer_frame_count(plan) < len(plan.pieces)
    assert not any(json.loads(f)["choices"][0]["finish_reason"] for f in frames(out))


def test_truncated_json_is_invalid_and_closes() -> None:
    plan, out = fault("truncated_stream")
    assert plan.body().startswith(out.body()) and len(out.body()) < len(plan.body())
    with pytest.raises(json.JSONDecodeError):
        json.loads(out.body())
    assert out.close_after and out.declared_length == len(out.body())


def test_dropped_connection_declares_more_than_it_sends() -> None:
    plan, out = fault("dropped_connection")
    assert out.ending is Ending.CLOSE and out.declared_length == len(plan.body())
    assert out.body_length == len(plan.body()) // 2
    _, out = fault("dropped_connection", after_bytes=10)
    assert out.body_length == 10
    plan, out = fault("dropped_connection", stream=True, after_chunks=2)
    assert out.pieces == plan.pieces[:2] and out.ending is Ending.CLOSE


def test_error_in_200() -> None:
    _, out = fault("error_in_200", message="boom")
    assert out.status == 200
    assert json.loads(out.body())["error"]["message"] == "boom"
    plan, out = fault("error_in_200", stream=True, after_chunks=2)
    assert out.status == 200 and out.pieces[:2] == plan.pieces[:2] and len(out.pieces) == 3
    assert json.loads(frames(out)[-1])["error"]["type"] == "server_error"


@pytest.mark.parametrize("stream", [False, True])
def test_http_statuses(stream: bool) -> None:
    _, out = fault("http_503", stream=stream)
    assert out.status == 503 and out.framing is Framing.LENGTH
    assert json.loads(out.body())["error"]["type"] == "server_error"
    _, out = fault("http_429", stream=stream, retry_after=2)
    headers = dict(out.headers)
    assert out.status == 429 and headers["retry-after"] == "2"
    assert headers["retry-after-ms"] == "2000"
    assert json.loads(out.body())["error"]["code"] == "rate_limit_exceeded"
    for status, type_ in (
        (400, "invalid_request_error"),
        (401, "invalid_request_error"),
        (404, "invalid_request_error"),
        (500, "server_error"),
        (502, "server_error"),
        (504, "timeout"),
        (529, "server_error"),
    ):
        _, out = fault("http_error", stream=stream, status=status)
        assert out.status == status and json.loads(out.body())["error"]["type"] == type_


@pytest.mark.parametrize("stream", [False, True])
def test_malformed_tool_args(stream: bool) -> None:
    _, out = fault("malformed_tool_args", TOOL_ANSWER, stream)
    if stream:
        args = "".join(
            json.loads(f)["choices"][0]["delta"]
            .get("tool_calls", [{}])[0]
            .get("function", {})
            .get("arguments", "")
            for f in frames(out)[:-1]
            if json.loads(f)["choices"]
        )
    else:
        args = json.loads(out.body())["choices"][0]["message"]["tool_calls"][0]["function"][
            "arguments"
        ]
    assert '{"city": "Paris"}'.startswith(args) and args
    with pytest.raises(json.JSONDecodeError):
        json.loads(args)


def test_malformed_tool_args_does_not_apply_without_tool_calls() -> None:
    plan, ctx = context(ANSWER, False)
    assert apply_fault(parse_fault_spec({"type": "malformed_tool_args"}), plan, ctx) is None


def test_connection_reset() -> None:
    _, out = fault("connection_reset")
    assert not out.send_head and out.pieces == () and out.ending is Ending.RESET
    plan, out = fault("connection_reset", after_bytes=5)
    assert out.send_head and out.body() == plan.body()[:5] and out.ending is Ending.RESET
    plan, out = fault("connection_reset", stream=True, after_chunks=2)
    assert out.pieces == plan.pieces[:2] and out.ending is Ending.RESET


def test_empty_reply_latency_slow_stall_garbage() -> None:
    _, out = fault("empty_reply", stream=True)
    assert not out.send_head and out.pieces == () and out.ending is Ending.CLOSE
    plan, out = fault("latency", delay_ms=250)
    assert out.head_delay_ms == 250 and out.pieces == plan.pieces
    plan, out = fault("slow_stream", stream=True, delay_ms=30)
    assert [p.delay_ms for p in out.pieces] == [30.0] * len(plan.pieces)
    plan, out = fault("slow_stream", delay_ms=5, piece_bytes=16)
    assert out.body() == plan.body() and all(len(p.data) <= 16 for p in out.pieces)
    assert len(out.pieces) > 3
    _, out = fault("stall", max_ms=500)
    assert out.pieces == () and out.ending is Ending.STALL and out.stall_ms == 500
    plan, out = fault("stall", stream=True, after_chunks=2)
    assert out.pieces == plan.pieces[:2] and out.ending is Ending.STALL
    _, out = fault("garbage")
    assert not out.send_head and out.ending is Ending.CLOSE and out.body()
    plan, out = fault("garbage", stream=True, after_chunks=1, data="not sse")
    assert out.pieces[0] == plan.pieces[0] and out.pieces[1].data == b"not sse"
