"""Pure tests of the OpenAI Responses provider: validation, digests, plans, assembly and
every fault hook through `apply_fault` on JSON and stream plans."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from chaosllm.errors import InvalidRequest
from chaosllm.faults import FAULT_TYPES, FaultContext, apply_fault, parse_fault_spec
from chaosllm.faults.transform import any_request
from chaosllm.model import (
    Ending,
    Exchange,
    Framing,
    RecordedChunk,
    RecordedRequest,
    RecordedResponse,
    ResponsePlan,
)
from chaosllm.providers import PROVIDERS, provider_for_path
from chaosllm.providers.openai_responses import OpenAIResponses, iter_events
from tests.helpers import all_recordings, piece_texts, recording, transformed

P = OpenAIResponses()
EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
NAMES = all_recordings("openai.responses")

REQUEST: dict[str, Any] = {
    "model": "gpt-4.1-mini",
    "instructions": "Be brief.",
    "input": "What is the capital of France?",
}
USAGE = {
    "input_tokens": 12,
    "input_tokens_details": {"cache_write_tokens": 0, "cached_tokens": 0},
    "output_tokens": 7,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 19,
}


def response(*output: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1790000000,
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": "Be brief.",
        "model": "gpt-4.1-mini-2025-04-14",
        "output": list(output),
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": USAGE,
    }


def message(text: str, id_: str = "msg_1") -> dict[str, Any]:
    return {
        "type": "message",
        "id": id_,
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def call(arguments: str, id_: str = "fc_1") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": id_,
        "call_id": "call_" + id_,
        "name": "get_weather",
        "arguments": arguments,
        "status": "completed",
    }


REASONING = {
    "type": "reasoning",
    "id": "rs_1",
    "summary": [{"type": "summary_text", "text": "Thinking about Paris."}],
}
ANSWER = response(message("The capital of France is Paris."))
TOOL_ANSWER = response(
    call('{"location": "Paris, France", "unit": "celsius"}'), call('{"location": "Tokyo"}', "fc_2")
)


def exchange(
    body: dict[str, Any],
    request: dict[str, Any] = REQUEST,
    chunks: tuple[RecordedChunk, ...] | None = None,
) -> Exchange:
    return Exchange(
        provider=P.name,
        request=RecordedRequest("POST", "/v1/responses", request),
        response=RecordedResponse(200, body, stream=chunks is not None, chunks=chunks),
        digest=P.digest(request),
        name="t/0001",
        scenario="t",
    )


def events(plan: ResponsePlan) -> list[dict[str, Any]]:
    out = []
    for name, data in iter_events(piece_texts(plan)):
        event = json.loads(data)
        assert name == event["type"]
        out.append(event)
    return out


def stream_plan(answer: dict[str, Any]) -> ResponsePlan:
    body = {**REQUEST, "stream": True}
    return P.render(exchange(answer, body), body, timing=0)


# -- registry, validation, digests -----------------------------------------------


def test_registered_for_both_paths() -> None:
    assert PROVIDERS["openai.responses"].name == "openai.responses"
    assert provider_for_path("/v1/responses") is provider_for_path("/responses")
    assert isinstance(provider_for_path("/v1/responses"), OpenAIResponses)


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ([], "body", "invalid_type"),
        ({"input": "hi"}, "model", "missing_required_parameter"),
        ({"model": 3, "input": "hi"}, "model", "invalid_type"),
        ({"model": "m"}, "input", "missing_required_parameter"),
        ({"model": "m", "input": {"role": "user"}}, "input", "invalid_type"),
        ({"model": "m", "input": ["hi"]}, "input[0]", "invalid_type"),
        (
            {"model": "m", "input": [{"content": "hi"}]},
            "input[0].role",
            "missing_required_parameter",
        ),
        (
            {"model": "m", "input": [{"role": "robot", "content": "x"}]},
            "input[0].role",
            "invalid_value",
        ),
        (
            {"model": "m", "input": [{"role": "user", "content": None}]},
            "input[0].content",
            "invalid_type",
        ),
        (
            {"model": "m", "input": [{"type": "function_call_output", "output": "x"}]},
            "input[0].call_id",
            "missing_required_parameter",
        ),
        ({"model": "m", "input": "hi", "tools": {}}, "tools", "invalid_type"),
        (
            {"model": "m", "input": "hi", "tools": [{"type": "function"}]},
            "tools[0].name",
            "missing_required_parameter",
        ),
        ({"model": "m", "input": "hi", "stream": "yes"}, "stream", "invalid_type"),
        (
            {"model": "m", "input": "hi", "max_output_tokens": True},
            "max_output_tokens",
            "invalid_type",
        ),
    ],
)
def test_validation_refuses_what_the_api_refuses(body: Any, param: str, code: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        P.validate(body)
    assert (info.value.param, info.value.code) == (param, code)


def test_every_shipped_request_validates() -> None:
    assert len(NAMES) >= 4
    for name in NAMES:
        P.validate(recording(name)["request"]["body"])


def test_error_envelope_is_openais() -> None:
    plan = P.render_error(400, "bad", kind="invalid_request", code="c", param="input")
    assert json.loads(plan.body()) == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": "input", "code": "c"}
    }


def test_digest_ignores_transport_sampling_and_storage() -> None:
    noisy = {
        **REQUEST,
        "stream": True,
        "temperature": 0.1,
        "max_output_tokens": 9,
        "store": False,
        "metadata": {"a": "b"},
        "top_p": 0.5,
    }
    assert P.digest(noisy) == P.digest(REQUEST)


@pytest.mark.parametrize(
    "change",
    [
        {"model": "gpt-4.1"},
        {"instructions": "Be long."},
        {"input": "Capital of Spain?"},
        {"tools": [{"type": "function", "name": "f", "parameters": {}}]},
        {"tool_choice": "required"},
        {"text": {"format": {"type": "json_object"}}},
    ],
)
def test_digest_covers_what_decides_the_answer(change: dict[str, Any]) -> None:
    assert P.digest({**REQUEST, **change}) != P.digest(REQUEST)


def test_output_items_passed_back_match_whatever_their_status() -> None:
    with_status = {
        **REQUEST,
        "input": [{"role": "user", "content": "hi"}, {**call("{}"), "status": "completed"}],
    }
    without = copy.deepcopy(with_status)
    del without["input"][1]["status"]
    assert P.digest(with_status) == P.digest(without)
    assert P.codec.turn_text(with_status) == P.codec.turn_text(without)
    assert "hi" in P.codec.match_text(with_status)


def test_shipped_digests_are_current() -> None:
    for name in NAMES:
        data = recording(name)
        assert data["digest"] == P.digest(data["request"]["body"]), name


# -- rendering and assembly ---------------------------------------------------------


def test_json_plan_is_the_response() -> None:
    plan = P.render(exchange(ANSWER), REQUEST, timing=0)
    assert plan.framing is not Framing.CHUNKED and json.loads(plan.body()) == ANSWER
    Response.model_validate(json.loads(plan.body()))


def test_stream_has_the_typed_events_in_order() -> None:
    answer = response(REASONING, message("one two three four"), call('{"a": "bcdefghijk"}'))
    got = events(stream_plan(answer))
    for event in got:
        EVENTS.validate_python(event)
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    types = [e["type"] for e in got]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed" and got[-1]["response"] == answer
    assert got[0]["response"]["status"] == "in_progress" and got[0]["response"]["output"] == []
    assert types.count("response.output_text.delta") == 4
    assert types.count("response.function_call_arguments.delta") >= 2
    for name in (
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.function_call_arguments.done",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
    ):
        assert name in types
    assert (
        types.count("response.output_item.added") == types.count("response.output_item.done") == 3
    )
    assert "[DONE]" not in stream_plan(answer).body().decode()


def test_recorded_frames_replay_verbatim() -> None:
    data = recording("responses-streaming/0001")
    chunks = tuple(RecordedChunk(c["data"], c["delay_ms"]) for c in data["response"]["chunks"])
    body = data["request"]["body"]
    plan = P.render(exchange(data["response"]["body"], body, chunks), body, timing=0)
    assert plan.body().decode() == "".join(c["data"] for c in data["response"]["chunks"])
    assert P.assemble([c.data for c in chunks]) == data["response"]["body"]


@pytest.mark.parametrize("name", NAMES)
def test_shipped_responses_are_sdk_responses_and_round_trip(name: str) -> None:
    body = recording(name)["response"]["body"]
    assert Response.model_validate(body).status == "completed"
    frames = P.codec.stream_frames(body)
    assert P.assemble(frames) == body and P.codec.stream_complete(frames)


_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=60)
_ITEM = st.one_of(
    st.builds(lambda t, i: message(t, f"msg_{i}"), _TEXT, st.integers(0, 99)),
    st.builds(
        lambda a, i: call(json.dumps(a), f"fc_{i}"),
        st.dictionaries(st.text(max_size=8), st.text(max_size=20), max_size=4),
        st.integers(0, 99),
    ),
    st.builds(
        lambda t: {
            "type": "reasoning",
            "id": "rs_x",
            "summary": [{"type": "summary_text", "text": t}],
        },
        _TEXT,
    ),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_ITEM, max_size=4))
def test_assemble_inverts_rendering(output: list[dict[str, Any]]) -> None:
    answer = response(*output)
    frames = P.codec.stream_frames(answer)
    assert P.assemble(frames) == answer
    # Without the terminal event, the items are rebuilt from their events.
    rebuilt = P.assemble(frames[:-1])
    assert isinstance(rebuilt, dict) and rebuilt["output"] == output
    assert rebuilt["status"] == "in_progress"
    assert P.codec.stream_complete(frames) and not P.codec.stream_complete(frames[:-1])


def test_stream_complete_on_failure_events() -> None:
    frames = P.codec.stream_frames(ANSWER)[:3]
    error = P.faults.stream_error_frame("boom", status=500).decode()
    assert P.codec.stream_complete([*frames, error])
    assert P.assemble([*frames, error]) == {
        "error": {"message": "boom", "type": "server_error", "param": None, "code": "server_error"}
    }
    failed = P.codec.stream_frames(
        {**ANSWER, "status": "failed", "error": {"code": "server_error", "message": "x"}}
    )
    assert failed[-1].startswith("event: response.failed\n") and P.codec.stream_complete(failed)
    assert not P.codec.stream_complete([])


def test_fallback_is_a_response() -> None:
    body = P.fallback(REQUEST, "ab" * 32)
    assert Response.model_validate(body).output_text.startswith("[chaosllm fallback]")


# -- fault hooks through apply_fault --------------------------------------------------


def context(answer: dict[str, Any], stream: bool) -> tuple[ResponsePlan, FaultContext]:
    body = {**REQUEST, "stream": stream}

    def render(new_answer: Any) -> ResponsePlan:
        return P.render(exchange(new_answer, body), body, timing=0)

    return render(answer), FaultContext(P, stream, answer, render)


def fault(
    type_: str, answer: dict[str, Any] = ANSWER, stream: bool = False, **params: Any
) -> tuple[ResponsePlan, ResponsePlan]:
    return transformed(context(answer, stream), type_, **params)


def test_every_fault_type_applies_to_both_kinds_of_request() -> None:
    for name in FAULT_TYPES:
        if FAULT_TYPES[name].on_request is not any_request:
            continue  # a wire quirk: SSE streams only, where it applies (tests/wire/test_quirks.py)
        for stream in (False, True):
            answer = TOOL_ANSWER if name == "malformed_tool_args" else ANSWER
            fault(name, answer, stream)


def test_answer_frames_are_those_before_response_completed() -> None:
    plan = stream_plan(ANSWER)
    count = P.faults.answer_frame_count(plan)
    assert count == len(plan.pieces) - 1
    assert events(plan)[count]["type"] == "response.completed"


@pytest.mark.parametrize(
    "kind", ["truncated_stream", "dropped_connection", "connection_reset", "stall", "garbage"]
)
def test_cuts_never_keep_response_completed(kind: str) -> None:
    plan, out = fault(kind, ANSWER, True, after_chunks=1000)
    kept = [p for p in out.pieces if p.data.startswith(b"event:")]
    assert len(kept) == len(plan.pieces) - 1
    assert not P.codec.stream_complete([p.data.decode() for p in kept])
    _, out = fault(kind, ANSWER, True, after_chunks=3)
    assert [e["type"] for e in events(out.with_(pieces=out.pieces[:3]))] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
    ]
    if kind == "dropped_connection":
        assert out.ending is Ending.CLOSE
    if kind == "connection_reset":
        assert out.ending is Ending.RESET


def test_error_in_200_stream_ends_with_an_error_event() -> None:
    _, out = fault("error_in_200", ANSWER, True, after_chunks=4)
    got = events(out)
    assert len(got) == 5 and got[-1]["type"] == "error"
    assert got[-1]["code"] == "server_error" and got[-1]["param"] is None
    EVENTS.validate_python(got[-1])
    assert out.status == 200


def test_error_in_200_json_is_the_error_envelope() -> None:
    _, out = fault("error_in_200", ANSWER, False)
    assert out.status == 200 and json.loads(out.body())["error"]["type"] == "server_error"


@pytest.mark.parametrize(
    ("kind", "params", "status", "type_"),
    [
        ("http_503", {}, 503, "server_error"),
        ("http_429", {"retry_after": 2}, 429, "requests"),
        ("http_error", {"status": 401}, 401, "invalid_request_error"),
        ("http_error", {"status": 500}, 500, "server_error"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_http_errors_carry_the_envelope(
    kind: str, params: dict[str, Any], status: int, type_: str, stream: bool
) -> None:
    _, out = fault(kind, ANSWER, stream, **params)
    assert out.status == status
    assert json.loads(out.body())["error"]["type"] == type_


@pytest.mark.parametrize("stream", [False, True])
def test_empty_response(stream: bool) -> None:
    answer = response(REASONING, message("Paris."), call("{}"))
    _, out = fault("empty_response", answer, stream)
    body = json.loads(out.body()) if not stream else P.assemble(piece_texts(out))
    parsed = Response.model_validate(body)
    assert parsed.output_text == "" and len(parsed.output) == 1
    assert parsed.output[0].type == "message" and parsed.output[0].content == []
    assert body["usage"]["output_tokens"] == 0
    if stream:
        assert "response.output_text.delta" not in [e["type"] for e in events(out)]


def test_malformed_tool_args_json() -> None:
    _, out = fault("malformed_tool_args", TOOL_ANSWER, False)
    for item in json.loads(out.body())["output"]:
        with pytest.raises(json.JSONDecodeError):
            json.loads(item["arguments"])


def test_malformed_tool_args_in_the_argument_deltas() -> None:
    _, out = fault("malformed_tool_args", TOOL_ANSWER, True)
    got = events(out)
    deltas = "".join(
        e["delta"]
        for e in got
        if e["type"] == "response.function_call_arguments.delta" and e["item_id"] == "fc_1"
    )
    with pytest.raises(json.JSONDecodeError):
        json.loads(deltas)
    done = next(e for e in got if e["type"] == "response.function_call_arguments.done")
    assert done["arguments"] == deltas


def test_malformed_tool_args_does_not_apply_without_function_calls() -> None:
    plan, ctx = context(ANSWER, True)
    assert P.faults.break_tool_arguments(ANSWER) is None
    assert apply_fault(parse_fault_spec({"type": "malformed_tool_args"}), plan, ctx) is None
