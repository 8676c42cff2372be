"""The `anthropic.messages` provider, pure: digest, validation, render/assemble round
trip, and every fault hook through `apply_fault` on JSON and stream plans."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaosllm.errors import InvalidRequest
from chaosllm.faults.spec import parse_fault_spec
from chaosllm.faults.transform import FaultContext, apply_fault
from chaosllm.model import (
    JSON,
    Ending,
    Exchange,
    Framing,
    RecordedRequest,
    RecordedResponse,
    ResponsePlan,
)
from chaosllm.providers import PROVIDERS, provider_for_path
from chaosllm.providers.anthropic_messages import AnthropicMessages, iter_events
from chaosllm.providers.base import ErrorKind
from tests.helpers import all_recordings, piece_texts, recording

P = AnthropicMessages()
NAMES = all_recordings("anthropic.messages")
BASE = {
    "model": "claude-sonnet-4-6",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "Hi"}],
}


def events(plan: ResponsePlan) -> list[tuple[str | None, dict[str, Any]]]:
    return [(name, json.loads(data)) for name, data in iter_events(piece_texts(plan))]


def exchange(answer: JSON, *, request: JSON = BASE) -> Exchange:
    return Exchange(
        provider=P.name,
        request=RecordedRequest("POST", "/v1/messages", request),
        response=RecordedResponse(200, answer),
        digest=P.digest(request),
        name="t/0001",
        scenario="t",
    )


def test_registered() -> None:
    assert PROVIDERS["anthropic.messages"] is provider_for_path("/v1/messages")
    assert NAMES == [
        "anthropic-stream/0001",
        "anthropic-text/0001",
        "anthropic-thinking/0001",
        "anthropic-tools/0001",
        "anthropic-tools/0002",
    ]


def test_digest_ignores_sampling_and_transport() -> None:
    digest = P.digest(BASE)
    assert (
        P.digest(
            {
                **BASE,
                "max_tokens": 9,
                "temperature": 0.2,
                "stream": True,
                "metadata": {"user_id": "u"},
            }
        )
        == digest
    )
    assert P.digest({**BASE, "system": "Be brief."}) != digest
    assert P.digest({**BASE, "model": "claude-other"}) != digest
    assert P.digest({**BASE, "tools": [{"name": "f", "input_schema": {}}]}) != digest
    assert P.digest({**BASE, "tool_choice": {"type": "any"}}) != digest
    cached = {
        **BASE,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}],
            }
        ],
    }
    plain = {**BASE, "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}
    assert P.digest(cached) == P.digest(plain)
    assert P.codec.turn_text(BASE) == '{"content":"Hi","role":"user"}'


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "Input should be an object"),
        ({"max_tokens": 1, "messages": []}, "model: Field required"),
        ({"model": "m", "messages": []}, "max_tokens: Field required"),
        ({"model": "m", "max_tokens": 1}, "messages: Field required"),
        ({**BASE, "max_tokens": "1"}, "max_tokens: Input should be a valid integer"),
        ({**BASE, "messages": {}}, "messages: Input should be a valid list"),
        (
            {**BASE, "messages": [{"role": "system", "content": "x"}]},
            "messages.0.role: Input should be 'user' or 'assistant'",
        ),
        ({**BASE, "messages": [{"role": "user"}]}, "messages.0.content: Field required"),
        ({**BASE, "messages": [{"role": "user", "content": 3}]}, "messages.0.content"),
        (
            {**BASE, "messages": [{"role": "user", "content": [{"text": "x"}]}]},
            "messages.0.content.0.type: Field required",
        ),
        ({**BASE, "system": 5}, "system: Input should be a valid string or a valid list"),
        ({**BASE, "stream": "yes"}, "stream: Input should be a valid boolean"),
    ],
)
def test_validation(body: JSON, message: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        P.validate(body)
    assert message in info.value.message


def test_valid_bodies() -> None:
    P.validate({**BASE, "system": [{"type": "text", "text": "S"}], "stream": True})
    for name in NAMES:
        P.validate(recording(name)["request"]["body"])


def test_error_envelope() -> None:
    plan = P.render_error(400, "bad", kind=ErrorKind.INVALID_REQUEST)
    assert json.loads(plan.body()) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "bad"},
    }
    assert (
        json.loads(P.render_error(404, "x", kind=ErrorKind.NO_MATCH).body())["error"]["type"]
        == "not_found_error"
    )
    expected = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
        500: "api_error",
        529: "overloaded_error",
        502: "api_error",
        418: "invalid_request_error",
    }
    for status, type_ in expected.items():
        assert P.errors.error_answer("m", status=status) == {
            "type": "error",
            "error": {"type": type_, "message": "m"},
        }


def test_stream_event_sequence() -> None:
    body = recording("anthropic-tools/0001")["response"]["body"]
    plan = P.render(exchange(body), {**BASE, "stream": True}, timing=0)
    assert plan.framing is Framing.CHUNKED
    for piece in plan.pieces:
        text = piece.data.decode()
        name, data = text.removesuffix("\n\n").split("\n")
        assert name == f"event: {json.loads(data.removeprefix('data: '))['type']}"
    kinds = [e["type"] for _, e in events(plan)]
    assert kinds[:3] == ["message_start", "content_block_start", "ping"]
    assert kinds[-2:] == ["message_delta", "message_stop"]
    assert events(plan)[0][1]["message"]["content"] == []
    deltas = [e["delta"] for _, e in events(plan) if e["type"] == "content_block_delta"]
    assert {d["type"] for d in deltas} == {"text_delta", "input_json_delta"}
    assert (
        json.loads("".join(d["partial_json"] for d in deltas if d["type"] == "input_json_delta"))
        == body["content"][1]["input"]
    )
    assert P.assemble(piece_texts(plan)) == body


def test_thinking_stream_has_signature_delta() -> None:
    body = recording("anthropic-thinking/0001")["response"]["body"]
    plan = P.render(exchange(body), {**BASE, "stream": True}, timing=0)
    deltas = [e["delta"]["type"] for _, e in events(plan) if e["type"] == "content_block_delta"]
    assert "thinking_delta" in deltas and deltas.count("signature_delta") == 1
    assert P.assemble(piece_texts(plan)) == body


@pytest.mark.parametrize("name", NAMES)
def test_recordings_round_trip(name: str) -> None:
    data = recording(name)
    body = data["response"]["body"]
    assert data["digest"] == P.digest(data["request"]["body"])
    frames = [c["data"] for c in data["response"].get("chunks") or []] or P.codec.stream_frames(
        body
    )
    assert P.codec.stream_complete(frames) and P.assemble(frames) == body


_TEXT = st.text(st.characters(codec="utf-8"), max_size=40)
_BLOCK = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, _TEXT),
    st.builds(
        lambda i, n, a: {"type": "tool_use", "id": "toolu_" + i, "name": n, "input": a},
        st.text("abc123", min_size=1, max_size=8),
        st.sampled_from(["f", "get_weather"]),
        st.dictionaries(
            st.text(max_size=5),
            st.one_of(
                st.integers(), _TEXT, st.booleans(), st.none(), st.lists(st.integers(), max_size=3)
            ),
            max_size=4,
        ),
    ),
    st.builds(
        lambda t, s: {"type": "thinking", "thinking": t, "signature": s},
        _TEXT,
        st.text("abcXYZ09+/=", max_size=20),
    ),
)


@settings(max_examples=150, deadline=None)
@given(
    content=st.lists(_BLOCK, max_size=4),
    stop=st.sampled_from(["end_turn", "tool_use", "max_tokens", "stop_sequence"]),
    tokens=st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)),
)
def test_render_assemble_round_trip(
    content: list[dict[str, Any]], stop: str, tokens: tuple[int, int]
) -> None:
    body = {
        "id": "msg_x",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": tokens[0], "output_tokens": tokens[1]},
    }
    frames = P.codec.stream_frames(body)
    assert P.codec.stream_complete(frames) and not P.codec.stream_complete(frames[:-1])
    assert P.assemble(frames) == body
    assert P.assemble(["".join(frames)]) == body


# -- faults ------------------------------------------------------------------------------


def faulted(fault: dict[str, Any], name: str, *, stream: bool) -> ResponsePlan | None:
    data = recording(name)
    ex = Exchange(
        provider=P.name,
        request=RecordedRequest("POST", "/v1/messages", data["request"]["body"]),
        response=RecordedResponse(200, data["response"]["body"]),
        digest="d",
        name=name,
        scenario="s",
    )
    request = {**data["request"]["body"], "stream": stream}
    plan = P.render(ex, request, timing=0)

    def render(answer: JSON) -> ResponsePlan:
        return P.render(exchange(answer, request=request), request, timing=0)

    ctx = FaultContext(provider=P, stream=stream, answer=ex.response.body, render=render)
    return apply_fault(parse_fault_spec(fault), plan, ctx)


def test_answer_frame_count() -> None:
    body = recording("anthropic-text/0001")["response"]["body"]
    plan = P.render(exchange(body), {**BASE, "stream": True}, timing=0)
    assert P.faults.answer_frame_count(plan) == len(plan.pieces) - 2


@pytest.mark.parametrize("stream", [False, True])
def test_http_errors(stream: bool) -> None:
    plan = faulted({"type": "http_error", "status": 529}, "anthropic-text/0001", stream=stream)
    assert plan is not None and plan.status == 529
    assert json.loads(plan.body())["error"]["type"] == "overloaded_error"
    plan = faulted({"type": "http_429", "retry_after": 2}, "anthropic-text/0001", stream=stream)
    assert plan is not None and plan.status == 429 and ("retry-after", "2") in plan.headers
    assert json.loads(plan.body())["error"]["type"] == "rate_limit_error"


def test_error_in_200() -> None:
    plan = faulted({"type": "error_in_200", "after_chunks": 3}, "anthropic-text/0001", stream=True)
    assert plan is not None and plan.status == 200
    got = events(plan)
    assert [e["type"] for _, e in got] == ["message_start", "content_block_start", "ping", "error"]
    assert got[-1] == (
        "error",
        {
            "type": "error",
            "error": {"type": "api_error", "message": got[-1][1]["error"]["message"]},
        },
    )
    plan = faulted({"type": "error_in_200"}, "anthropic-text/0001", stream=False)
    assert plan is not None and json.loads(plan.body())["type"] == "error"


def test_cuts_never_keep_finishing_frames() -> None:
    for kind in ("truncated_stream", "dropped_connection", "connection_reset", "stall"):
        plan = faulted({"type": kind, "after_chunks": 999}, "anthropic-stream/0001", stream=True)
        assert plan is not None
        kinds = [e["type"] for _, e in events(plan)]
        assert "message_delta" not in kinds and "message_stop" not in kinds, kind
        assert not P.codec.stream_complete(piece_texts(plan))
    plan = faulted(
        {"type": "dropped_connection", "after_chunks": 2}, "anthropic-stream/0001", stream=True
    )
    assert plan is not None and plan.frame_count == 2 and plan.ending is Ending.CLOSE


@pytest.mark.parametrize("stream", [False, True])
def test_empty_response(stream: bool) -> None:
    plan = faulted({"type": "empty_response"}, "anthropic-tools/0001", stream=stream)
    assert plan is not None
    if stream:
        kinds = [e["type"] for _, e in events(plan)]
        assert kinds == ["message_start", "ping", "message_delta", "message_stop"]
        answer = P.assemble(piece_texts(plan))
    else:
        answer = json.loads(plan.body())
    assert answer["content"] == [] and answer["stop_reason"] == "end_turn"
    assert answer["usage"]["output_tokens"] == 0


def test_malformed_tool_args() -> None:
    assert faulted({"type": "malformed_tool_args"}, "anthropic-text/0001", stream=True) is None
    assert (
        P.faults.break_tool_arguments(recording("anthropic-text/0001")["response"]["body"]) is None
    )
    plan = faulted({"type": "malformed_tool_args"}, "anthropic-tools/0001", stream=True)
    assert plan is not None
    partial = "".join(
        e["delta"]["partial_json"]
        for _, e in events(plan)
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta"
    )
    with pytest.raises(json.JSONDecodeError):
        json.loads(partial)
    assert partial and '{"location": "San Francisco, CA", "unit": "celsius"}'.startswith(partial)
    delta = next(e for _, e in events(plan) if e["type"] == "message_delta")
    assert delta["delta"]["stop_reason"] == "max_tokens"
    # A JSON body cannot carry invalid JSON in `input` (an object): a tool call cut off by
    # max_tokens, with an empty input.
    plan = faulted({"type": "malformed_tool_args"}, "anthropic-tools/0001", stream=False)
    assert plan is not None
    answer = json.loads(plan.body())
    assert answer["stop_reason"] == "max_tokens"
    assert [b.get("input") for b in answer["content"]] == [None, {}]


def test_fallback_is_a_message() -> None:
    answer = P.fallback(BASE, "ab" * 32)
    assert answer["type"] == "message" and "ab" * 12 in answer["content"][0]["text"]
    plan = P.render(exchange(answer), {**BASE, "stream": True}, timing=0)
    assert P.assemble(piece_texts(plan)) == answer
