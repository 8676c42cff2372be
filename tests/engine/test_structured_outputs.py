"""Structured outputs: a recorded answer is re-validated against the request's json_schema
on replay; a mismatch is an error that says to re-record, never a wrong-shaped answer."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import openai
import pytest

from chaosllm import ChaosServer
from chaosllm.core.structured import answer_schema_problem, request_schema
from tests.helpers import openai_client, recording, request_body

NAME = "structured-output/0001"


def answer_with(content: str | None, **message: Any) -> dict[str, Any]:
    return {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content, **message}}]
    }


def test_request_schema() -> None:
    body = request_body(NAME, stream=False)
    name, schema = request_schema(body) or ("", {})
    assert name == "CalendarEvent" and "participants" in schema["properties"]
    assert request_schema({"response_format": {"type": "json_object"}}) is None
    assert request_schema({"messages": []}) is None


def test_answer_checks() -> None:
    body = request_body(NAME, stream=False)
    recorded = recording(NAME)["response"]["body"]
    assert answer_schema_problem(body, recorded) is None
    problem = answer_schema_problem(body, answer_with(json.dumps({"name": "Offsite"})))
    assert problem is not None and "'date' is a required property" in problem
    problem = answer_schema_problem(
        body,
        answer_with(
            json.dumps(
                {
                    "name": "Offsite",
                    "date": "2026-03-12",
                    "start_time": "09:30",
                    "location": "Lisbon",
                    "participants": "Priya",
                }
            )
        ),
    )
    assert problem is not None and "at $.participants" in problem
    problem = answer_schema_problem(body, answer_with("Sure! Here it is: {"))
    assert problem is not None and "not JSON" in problem
    assert answer_schema_problem(body, answer_with(None, refusal="I can't help.")) is None
    assert answer_schema_problem({"messages": []}, answer_with("not json")) is None
    broken = copy.deepcopy(body)
    broken["response_format"]["json_schema"]["schema"]["type"] = "no-such-type"
    problem = answer_schema_problem(broken, recorded)
    assert problem is not None and "not a valid JSON Schema" in problem


def test_a_matching_answer_replays(sdk: openai.OpenAI) -> None:
    completion = sdk.chat.completions.create(**request_body(NAME, stream=False))
    event = json.loads(completion.choices[0].message.content or "")
    assert event["location"].startswith("Lisbon")


def test_a_schema_changed_under_a_recording_is_an_error(server: ChaosServer) -> None:
    changed = request_body(NAME, stream=False)
    schema = changed["response_format"]["json_schema"]["schema"]
    schema["properties"]["priority"] = {"type": "integer"}
    schema["required"].append("priority")
    # served in order to this session, whatever the request says
    server.use_scenario("structured-output", "schema")
    with (
        openai_client(server, default_headers={"X-Chaosllm-Session": "schema"}) as sdk,
        pytest.raises(openai.UnprocessableEntityError) as caught,
    ):
        sdk.chat.completions.create(**changed)
    message = str(caught.value)
    assert "'priority' is a required property" in message and "re-record it" in message
    assert NAME in message
    [entry] = server.requests("schema")
    assert entry["status"] == 422 and entry["findings"][0]["check"] == "schema_mismatch"
    assert NAME in server.unused()  # refused, so not consumed


def test_a_stale_recorded_answer_is_refused_as_json_and_stream(tmp_path: Path) -> None:
    rec = recording(NAME)
    rec["response"]["body"]["choices"][0]["message"]["content"] = json.dumps({"title": "Offsite"})
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "0001.json").write_text(json.dumps(rec), "utf-8")
    with (
        ChaosServer(tmp_path) as server,
        openai.OpenAI(
            base_url=server.base_url, api_key="sk-test", max_retries=0, timeout=10
        ) as sdk,
    ):
        for stream in (False, True):
            with pytest.raises(openai.UnprocessableEntityError) as caught:
                sdk.chat.completions.create(**request_body(NAME, stream=stream))
            assert caught.value.code == "recording_schema_mismatch"
            assert "re-record it" in str(caught.value)
