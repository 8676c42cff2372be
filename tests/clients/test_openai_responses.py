"""The official `openai` SDK's Responses client against a real chaosllm server.

Every shipped ``responses-*`` recording comes back as the `Response` it encodes,
through ``responses.create`` (JSON and ``stream=True``) and ``responses.stream``
(``get_final_response``), sync and async. Then, per fault, what the SDK does: the
attempts the server saw (retries) and which exception reached the caller from
where (``create``, iterating the stream, or ``get_final_response``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.responses import (
    Response,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseStreamEvent,
)
from pydantic import TypeAdapter

from chaosllm import ChaosServer
from chaosllm.providers.openai_responses import iter_events
from tests.helpers import (
    all_recordings,
    async_openai_client,
    openai_client,
    recording,
    recording_proxy,
    run_within,
    sdk_arguments,
)

pytestmark = pytest.mark.timeout(60)

NAMES = all_recordings("openai.responses")
STREAMED = "responses-streaming/0001"
"""Recorded from a stream: 22 events, the last one response.completed."""
TOOLS = "responses-tools/0001"
EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def request(name: str, *, stream: bool = False) -> dict[str, Any]:
    return sdk_arguments(name, stream=True) if stream else sdk_arguments(name)


def expected(name: str) -> Response:
    return Response.model_validate(recording(name)["response"]["body"])


# -- replay ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_create_json(sdk: openai.OpenAI, name: str) -> None:
    assert sdk.responses.create(**request(name)) == expected(name)


@pytest.mark.parametrize("name", NAMES)
def test_create_stream(sdk: openai.OpenAI, name: str) -> None:
    with sdk.responses.create(**request(name, stream=True)) as stream:
        events = list(stream)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert events[-1].response == expected(name)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == expected(name).output_text
    frames = recording(name)["response"].get("chunks")
    if frames:  # recorded from a stream: the very events that were recorded
        assert events == [
            EVENTS.validate_json(data) for _, data in iter_events([f["data"] for f in frames])
        ]


@pytest.mark.parametrize("name", NAMES)
def test_stream_helper_final_response(sdk: openai.OpenAI, name: str) -> None:
    with sdk.responses.stream(**request(name)) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    assert types[-1] == "response.completed"
    assert final.id == expected(name).id and final.output_text == expected(name).output_text
    assert final.usage == expected(name).usage


def test_function_call_and_its_output(sdk: openai.OpenAI) -> None:
    first = sdk.responses.create(**request(TOOLS))
    [call] = first.output
    assert isinstance(call, ResponseFunctionToolCall) and call.name == "get_weather"
    assert json.loads(call.arguments) == {"location": "Paris, France", "unit": "celsius"}
    follow = request("responses-tools/0002")
    assert follow["input"][1]["call_id"] == call.call_id
    assert follow["input"][2] == {
        "type": "function_call_output",
        "call_id": call.call_id,
        "output": follow["input"][2]["output"],
    }
    answer = sdk.responses.create(**follow)
    assert "18 °C" in answer.output_text


def test_function_call_streamed_argument_deltas(sdk: openai.OpenAI) -> None:
    with sdk.responses.create(**request(TOOLS, stream=True)) as stream:
        events = list(stream)
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > 1
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert "".join(deltas) == done.arguments == expected(TOOLS).output[0].arguments  # type: ignore[union-attr]


def test_reasoning_summary_streamed(sdk: openai.OpenAI) -> None:
    name = "responses-reasoning/0001"
    with sdk.responses.stream(**request(name)) as stream:
        summary = "".join(
            e.delta for e in stream if e.type == "response.reasoning_summary_text.delta"
        )
        final = stream.get_final_response()
    assert summary.startswith("**Checking divisibility**")
    assert final.output[0].type == "reasoning" and final.output_text.startswith("No.")


@pytest.mark.parametrize("name", [STREAMED, TOOLS, "responses-reasoning/0001"])
def test_async_create_and_stream(shared_server: ChaosServer, name: str) -> None:
    async def exercise() -> None:
        async with async_openai_client(shared_server) as client:
            assert await client.responses.create(**request(name)) == expected(name)
            stream = await client.responses.create(**request(name, stream=True))
            async with stream:
                events = [event async for event in stream]
            assert events[-1].type == "response.completed"
            assert events[-1].response == expected(name)
            async with client.responses.stream(**request(name)) as helper:
                final = await helper.get_final_response()
            assert final.output_text == expected(name).output_text

    run_within(20, exercise)


def test_miss_is_a_not_found_error(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        sdk.responses.create(model="gpt-4.1-mini", input="Something never recorded")
    assert "no_recording" in str(info.value.body)


def test_bad_request_is_a_bad_request_error(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        bad: dict[str, Any] = {
            "model": "gpt-4.1-mini",
            "input": [{"role": "robot", "content": "x"}],
        }
        sdk.responses.create(**bad)
    assert info.value.param == "input[0].role"


def test_record_then_replay_through_the_proxy(tmp_path: Path) -> None:
    record_dir = tmp_path / "recorded"
    with (
        recording_proxy(record_dir=record_dir) as (_, proxy),
        openai_client(proxy) as client,
    ):
        json_answer = client.responses.create(**request(TOOLS))
        with client.responses.create(**request(STREAMED, stream=True)) as stream:
            events = list(stream)
    assert json_answer == expected(TOOLS) and events[-1].response == expected(STREAMED)
    files = sorted(record_dir.rglob("*.json"))
    assert len(files) == 2
    stored = [json.loads(f.read_text("utf-8")) for f in files]
    assert {s["provider"] for s in stored} == {"openai.responses"}
    assert {s["request"]["path"] for s in stored} == {"/v1/responses"}
    with ChaosServer(recordings=record_dir) as replay, openai_client(replay) as client:
        assert client.responses.create(**request(TOOLS)) == expected(TOOLS)
        assert client.responses.create(**request(STREAMED)) == expected(STREAMED)
        with client.responses.stream(**request(STREAMED)) as helper:
            assert helper.get_final_response().output_text == expected(STREAMED).output_text
        assert [r["match"] for r in replay.requests()] == ["exact"] * 3


# -- faults: what the SDK does ---------------------------------------------------------


@dataclass
class Outcome:
    attempts: list[str | None]
    """The fault applied on each attempt the server saw (None: served normally)."""
    error: Exception | None
    raised_in: str | None
    """``create``, ``iterate`` or ``final`` (``get_final_response``)."""
    response: Response | None = None
    events: list[Any] = field(default_factory=list)
    elapsed: float = 0.0


def run(
    server: ChaosServer,
    how: str,
    *,
    name: str = STREAMED,
    max_retries: int = 2,
    timeout: float = 5.0,
) -> Outcome:
    """One SDK call: ``json`` (create), ``stream`` (create stream=True) or ``helper``
    (responses.stream + get_final_response)."""
    started = time.monotonic()
    error: Exception | None = None
    raised_in: str | None = "create"
    result: Response | None = None
    events: list[Any] = []
    with openai_client(server, max_retries=max_retries, timeout=timeout) as client:
        try:
            if how == "json":
                result = client.responses.create(**request(name))
            elif how == "stream":
                with client.responses.create(**request(name, stream=True)) as stream:
                    raised_in = "iterate"
                    events.extend(stream)
            else:
                with client.responses.stream(**request(name)) as helper:
                    raised_in = "iterate"
                    events.extend(helper)
                    raised_in = "final"
                    result = helper.get_final_response()
        except Exception as exc:  # what reaches the caller is the point of the test
            error = exc
        else:
            raised_in = None
    return Outcome(
        attempts=[e["fault"]["type"] if e["fault"] else None for e in server.requests()],
        error=error,
        raised_in=raised_in,
        response=result,
        events=events,
        elapsed=time.monotonic() - started,
    )


def assert_raised(out: Outcome, cls: type[Exception], where: str) -> None:
    assert type(out.error) is cls, repr(out.error)
    assert out.raised_in == where


@pytest.mark.parametrize("how", ["json", "stream", "helper"])
def test_http_503_is_retried_then_answered(server: ChaosServer, how: str) -> None:
    server.arm("http_503", retry_after=0.1)
    out = run(server, how)
    assert out.attempts == ["http_503", None] and out.error is None


@pytest.mark.parametrize("how", ["json", "stream", "helper"])
def test_http_503_beyond_the_retries_is_an_internal_server_error(
    server: ChaosServer, how: str
) -> None:
    server.arm("http_503", retry_after=0.05, remaining=3)
    out = run(server, how)
    assert out.attempts == ["http_503"] * 3
    assert_raised(out, openai.InternalServerError, "create")


def test_http_429_is_a_rate_limit_error_without_retries(server: ChaosServer) -> None:
    server.arm("http_429", retry_after=0.1)
    out = run(server, "json", max_retries=0)
    assert_raised(out, openai.RateLimitError, "create")


def test_error_in_200_mid_stream_is_an_error_event_not_an_exception(server: ChaosServer) -> None:
    server.arm("error_in_200", after_chunks=4)
    out = run(server, "stream")
    assert out.attempts == ["error_in_200"] and out.error is None
    assert len(out.events) == 5 and out.events[-1].type == "error"
    assert out.events[-1].code == "server_error"


def test_error_in_200_mid_stream_fails_get_final_response(server: ChaosServer) -> None:
    server.arm("error_in_200", after_chunks=4)
    out = run(server, "helper")
    assert_raised(out, RuntimeError, "final")
    assert "response.completed" in str(out.error) and out.events[-1].type == "error"


def test_error_in_200_json_is_a_response_without_output(server: ChaosServer) -> None:
    server.arm("error_in_200")
    out = run(server, "json")
    assert out.error is None and out.response is not None
    assert out.response.output is None and out.response.id is None


def test_truncated_stream_ends_silently_without_response_completed(server: ChaosServer) -> None:
    server.arm("truncated_stream", after_chunks=5)
    out = run(server, "stream")
    assert out.attempts == ["truncated_stream"] and out.error is None
    assert len(out.events) == 5 and out.events[-1].type == "response.output_text.delta"


def test_truncated_stream_fails_get_final_response(server: ChaosServer) -> None:
    server.arm("truncated_stream", after_chunks=1000)  # every item done, no completed
    out = run(server, "helper")
    assert_raised(out, RuntimeError, "final")
    assert out.events[-1].type == "response.output_item.done"


def test_truncated_json_is_a_bare_json_decode_error(server: ChaosServer) -> None:
    server.arm("truncated_stream")
    out = run(server, "json")
    assert_raised(out, json.JSONDecodeError, "create")


@pytest.mark.parametrize("how", ["stream", "helper"])
@pytest.mark.parametrize("kind", ["dropped_connection", "connection_reset"])
def test_broken_connection_mid_stream_is_a_connection_error(
    server: ChaosServer, how: str, kind: str
) -> None:
    server.arm(kind, after_chunks=5)
    out = run(server, how)
    assert out.attempts == [kind]  # a stream that started is never retried
    assert_raised(out, openai.APIConnectionError, "iterate")
    assert len(out.events) == 5


@pytest.mark.parametrize("kind", ["dropped_connection", "connection_reset"])
def test_broken_connection_json_is_retried(server: ChaosServer, kind: str) -> None:
    server.arm(kind)
    out = run(server, "json")
    assert out.attempts == [kind, None] and out.error is None
    assert out.response == expected(STREAMED)


def test_malformed_tool_args_json_and_stream_pass_through(server: ChaosServer) -> None:
    server.arm("malformed_tool_args")
    out = run(server, "json", name=TOOLS)
    assert out.error is None and out.response is not None
    call = out.response.output[0]
    assert isinstance(call, ResponseFunctionToolCall)
    with pytest.raises(json.JSONDecodeError):
        json.loads(call.arguments)
    server.arm("malformed_tool_args")
    out = run(server, "stream", name=TOOLS)
    assert out.error is None and out.events[-1].type == "response.completed"
    deltas = "".join(
        e.delta for e in out.events if e.type == "response.function_call_arguments.delta"
    )
    with pytest.raises(json.JSONDecodeError):
        json.loads(deltas)


def test_malformed_tool_args_breaks_the_helper_parsing_strict_tools(server: ChaosServer) -> None:
    # The helper parses a strict function tool's arguments: the bad JSON surfaces there.
    server.arm("malformed_tool_args")
    out = run(server, "helper", name=TOOLS)
    assert type(out.error) is json.JSONDecodeError and out.raised_in in ("iterate", "final")


@pytest.mark.parametrize("how", ["json", "stream", "helper"])
def test_empty_response_is_accepted_as_an_empty_answer(server: ChaosServer, how: str) -> None:
    server.arm("empty_response")
    out = run(server, how)
    assert out.error is None
    final = out.response if how != "stream" else out.events[-1].response
    assert final is not None and final.output_text == ""
    message = final.output[0]
    assert isinstance(message, ResponseOutputMessage) and message.content == []


def test_stall_mid_stream_is_a_timeout(server: ChaosServer) -> None:
    server.arm("stall", after_chunks=2, max_ms=3000)
    out = run(server, "stream", timeout=0.5)
    assert_raised(out, openai.APITimeoutError, "iterate")
    assert len(out.events) == 2
