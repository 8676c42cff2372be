"""Re-ask flows served offline (issue #13): a fault armed with ``reask: true`` leaves the
recording it broke waiting for the session's next miss (the framework's re-ask: a retry
prompt, the validation error, the tool error), which gets it unfaulted, journaled as
match ``reask``. In memory (`tests.memory.EnginePair`), then once through the openai SDK."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from chaosllm import ChaosServer
from chaosllm.cli import _arm_spec, _parser
from chaosllm.errors import InvalidFaultSpec
from chaosllm.faults import parse_fault_spec
from chaosllm.faults.spec import spec_from_query
from tests.helpers import openai_client, recording, request_body
from tests.memory import EnginePair

TOOL = "tool-call/0001"
SHORT = "knowledge/0004"


def reask_of(name: str, *, stream: bool = False) -> dict[str, Any]:
    """The recorded request with a re-ask appended, as instructor sends it."""
    body = request_body(name, stream=stream)
    body["messages"] = [
        *body["messages"],
        {"role": "user", "content": "The tool arguments were not valid JSON. Try again."},
    ]
    return body


def arguments(answer: Any) -> str:
    call = answer["choices"][0]["message"]["tool_calls"][0]
    text: str = call["function"]["arguments"]
    return text


# -- the spec -----------------------------------------------------------------------------------


def test_reask_is_a_common_field_of_every_type() -> None:
    spec = parse_fault_spec({"type": "malformed_tool_args", "reask": True})
    assert spec.reask and spec.to_json()["reask"] is True
    assert "reask" not in parse_fault_spec({"type": "http_503"}).to_json()
    assert parse_fault_spec({"type": "stall", "reask": False}).reask is False
    with pytest.raises(InvalidFaultSpec, match="reask must be true or false"):
        parse_fault_spec({"type": "http_503", "reask": "yes"})


def test_reask_over_a_query_string_and_the_cli() -> None:
    assert spec_from_query("error_in_200", [("reask", "true")]) == {
        "type": "error_in_200",
        "reask": True,
    }
    assert parse_fault_spec(spec_from_query("http_503", [("reask", "false")])).reask is False
    args = _parser().parse_args(["fault", "arm", "malformed_tool_args", "--reask"])
    assert _arm_spec(args) == {"type": "malformed_tool_args", "reask": True}
    plain = _parser().parse_args(["fault", "arm", "malformed_tool_args"])
    assert _arm_spec(plain) == {"type": "malformed_tool_args"}


# -- the engine ---------------------------------------------------------------------------------


def test_the_reask_gets_the_recording_the_fault_broke(pair: EnginePair) -> None:
    (armed,) = pair.arm({"type": "malformed_tool_args", "reask": True})
    broken = pair.send(request_body(TOOL, stream=False), session="s")
    with pytest.raises(json.JSONDecodeError):
        json.loads(arguments(broken.json()))
    assert not broken.reply.consumed
    answer = pair.send(reask_of(TOOL), session="s")
    assert answer.status == 200
    assert answer.json() == recording(TOOL)["response"]["body"]  # unfaulted, byte for byte
    assert answer.headers["x-chaosllm-match"] == "reask"
    assert answer.headers["x-chaosllm-recording"] == TOOL
    assert answer.reply.recording == TOOL and answer.reply.consumed
    assert answer.reply.fired is None
    record = answer.record
    assert record["match"] == "reask" and record["recording"] == TOOL
    assert record["fault"] is None and record["status"] == 200 and not record["miss"]
    assert [e["match"] for e in pair.journal("s")] == ["exact", "reask"]
    assert pair.journal("s")[0]["fault"]["id"] == armed.id


def test_a_reask_is_answered_once(pair: EnginePair) -> None:
    pair.arm({"type": "malformed_tool_args", "reask": True})
    pair.send(request_body(TOOL, stream=False), session="s")
    assert pair.send(reask_of(TOOL), session="s").status == 200
    again = pair.send(reask_of(TOOL), session="s")
    assert again.status == 404 and again.error["code"] == "no_recording"


def test_without_reask_the_reask_is_a_miss(pair: EnginePair) -> None:
    pair.arm({"type": "malformed_tool_args"})
    pair.send(request_body(TOOL, stream=False), session="s")
    miss = pair.send(reask_of(TOOL), session="s")
    assert miss.status == 404 and miss.error["code"] == "no_recording"
    assert "got the fault 'malformed_tool_args'" in miss.error["message"]


def test_reasks_are_per_session(pair: EnginePair) -> None:
    pair.arm({"type": "error_in_200", "reask": True})
    broken = pair.send(request_body(SHORT, stream=False), session="alice")
    assert "error" in broken.json()
    other = pair.send(reask_of(SHORT), session="bob")
    assert other.status == 404
    anonymous = pair.send(reask_of(SHORT))
    assert anonymous.status == 404
    mine = pair.send(reask_of(SHORT), session="alice")
    assert mine.status == 200 and mine.record["match"] == "reask"
    assert mine.json() == recording(SHORT)["response"]["body"]


def test_an_answer_in_between_means_no_reask(pair: EnginePair) -> None:
    # The client retried the same request and got the recording: a later miss is no re-ask.
    pair.arm({"type": "http_503", "reask": True})
    assert pair.send(request_body(SHORT, stream=False), session="s").status == 503
    assert pair.send(request_body(SHORT, stream=False), session="s").status == 200
    assert pair.send(reask_of(SHORT), session="s").status == 404


def test_a_fault_that_delivers_the_answer_leaves_no_reask(pair: EnginePair) -> None:
    pair.arm({"type": "latency", "delay_ms": 1, "reask": True})
    assert pair.send(request_body(SHORT, stream=False), session="s").status == 200
    assert pair.send(reask_of(SHORT), session="s").status == 404


def test_a_streaming_reask_gets_the_recording_as_a_stream(pair: EnginePair) -> None:
    pair.arm({"type": "truncated_stream", "reask": True})
    broken = pair.send(request_body(SHORT, stream=True), session="s")
    assert broken.frames()[-1] != "data: [DONE]"
    answer = pair.send(reask_of(SHORT, stream=True), session="s")
    assert answer.record["match"] == "reask" and answer.record["stream"] is True
    assert answer.frames() == [c["data"] for c in recording(SHORT)["response"]["chunks"]]


def test_the_reask_answer_is_not_faulted_again(pair: EnginePair) -> None:
    pair.arm({"type": "malformed_tool_args", "reask": True, "remaining": 2})
    pair.send(request_body(TOOL, stream=False), session="s")
    answer = pair.send(reask_of(TOOL), session="s")
    assert json.loads(arguments(answer.json())) == {"location": "Paris, France"}
    (left,) = pair.engine.board.armed()
    assert left["remaining"] == 1  # the re-ask did not use it up


def test_reset_forgets_a_waiting_reask(pair: EnginePair) -> None:
    pair.arm({"type": "malformed_tool_args", "reask": True})
    pair.send(request_body(TOOL, stream=False), session="s")
    pair.engine.reset()
    assert pair.send(reask_of(TOOL), session="s").status == 404


def test_reasks_are_deterministic() -> None:
    def run() -> list[bytes]:
        pair = EnginePair.of(seed=7)
        pair.arm({"type": "malformed_tool_args", "reask": True, "probability": 0.5, "remaining": 9})
        bodies = []
        for _ in range(6):
            bodies.append(pair.send(request_body(TOOL, stream=False), session="s").body)
            bodies.append(pair.send(reask_of(TOOL), session="s").body)
        return bodies

    assert run() == run()


def test_waiting_reasks_are_bounded_by_max_sessions() -> None:
    pair = EnginePair.of(max_sessions=2)
    pair.arm({"type": "error_in_200", "reask": True, "remaining": 3})
    for session in ("a", "b", "c"):
        pair.send(request_body(SHORT, stream=False), session=session)
    # One bound over every session's state, the least recently used forgotten first.
    assert pair.send(reask_of(SHORT), session="b").status == 200
    assert pair.send(reask_of(SHORT), session="c").status == 200
    assert pair.send(reask_of(SHORT), session="a").status == 404  # the oldest, forgotten


# -- through the openai SDK ---------------------------------------------------------------------


def test_an_instructor_style_reask_runs_offline(server: ChaosServer) -> None:
    server.arm("malformed_tool_args", reask=True)
    headers = {"X-Chaosllm-Session": "reask-sdk"}
    with openai_client(server, default_headers=headers) as client:
        broken = client.chat.completions.create(**request_body(TOOL, stream=False))
        calls = broken.choices[0].message.tool_calls
        assert calls is not None
        with pytest.raises(json.JSONDecodeError):
            json.loads(calls[0].function.arguments)
        raw = client.chat.completions.with_raw_response.create(**reask_of(TOOL))
        assert raw.headers["x-chaosllm-match"] == "reask"
        fixed = raw.parse().choices[0].message.tool_calls
        assert fixed is not None
        assert json.loads(fixed[0].function.arguments) == {"location": "Paris, France"}
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(**reask_of(TOOL))
    assert [e["match"] for e in server.requests("reask-sdk")] == ["exact", "reask", None]
