"""The frameworks' flows on the wire, through the official SDKs: one test per behaviour on
top of the in-memory ones (tests/engine/test_framework_flows.py). The upstream of the proxy
modes is a second chaosllm replaying the shipped recordings, speaking the protocol."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from chaosllm import ChaosServer
from chaosllm.store.recordings import RecordingStore
from tests.helpers import openai_client, recording, request_body, serving, session_client, write

pytestmark = pytest.mark.timeout(60)

SHORT = "knowledge/0004"
"""Recorded from a stream: 16 answer frames, finish, usage, [DONE]."""
TOOL = "tool-call/0001"
SESSION = "X-Chaosllm-Session"


def files(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*.json")) if directory.exists() else []


# -- 1 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        {"type": "http_503"},
        {"type": "http_429", "retry_after": 0.01},
        {"type": "connection_reset"},
        {"type": "empty_reply"},
    ],
    ids=lambda spec: spec["type"],
)
def test_a_faulted_record_run_makes_one_upstream_call_and_one_file(
    upstream: ChaosServer, tmp_path: Path, spec: dict[str, Any]
) -> None:
    record_dir = tmp_path / "rec"
    with (
        ChaosServer(mode="record", upstream=upstream.url, record_dir=record_dir) as proxy,
        openai_client(proxy, max_retries=2) as client,
    ):
        proxy.arm(spec)
        answer = client.chat.completions.create(**request_body(SHORT, stream=False))
        journal = proxy.requests()
    assert (
        answer.choices[0].message.content
        == recording(SHORT)["response"]["body"]["choices"][0]["message"]["content"]
    )
    assert len(upstream.requests()) == 1  # the faulted attempt was no (paid) call
    assert len(files(record_dir)) == 1
    assert [e["fault"] and e["fault"]["type"] for e in journal] == [spec["type"], None]
    assert [e["recording"] for e in journal] == [None, "recorded/0001"]


# -- 2 -----------------------------------------------------------------------------------------


def test_a_stream_after_a_json_request_gets_the_recorded_frames(tmp_path: Path) -> None:
    streamed = recording(SHORT)
    as_json = copy.deepcopy(streamed)
    as_json["response"].pop("chunks")
    as_json["response"]["stream"] = False
    write(tmp_path / "agents" / "0001.json", as_json)  # Runner.run
    write(tmp_path / "agents" / "0002.json", streamed)  # Runner.run_streamed, same body
    expected = "".join(c["data"] for c in streamed["response"]["chunks"]).encode()
    with ChaosServer(tmp_path) as server, openai_client(server) as client:
        for _ in range(2):  # and again after a reset
            client.chat.completions.create(**request_body(SHORT, stream=False))
            raw = httpx.post(
                server.base_url + "/chat/completions",
                json=request_body(SHORT, stream=True),
                timeout=10,
            )
            assert raw.content == expected
            chunks = list(client.chat.completions.create(**request_body(SHORT, stream=True)))
            assert chunks[0].id == streamed["response"]["body"]["id"]
            server.reset()


# -- 3 -----------------------------------------------------------------------------------------


def responses_followup(previous: str, text: str) -> Any:
    response = copy.deepcopy(recording("responses-simple/0001")["response"])
    response.pop("chunks", None)
    response["stream"] = False
    response["body"]["output"][0]["content"][0]["text"] = text
    return {
        "chaosllm": 1,
        "provider": "openai.responses",
        "request": {
            "method": "POST",
            "path": "/v1/responses",
            "body": {
                "model": "gpt-4.1-mini",
                "input": "And tomorrow?",
                "previous_response_id": previous,
            },
        },
        "response": response,
    }


def test_two_responses_conversations_each_get_their_own_follow_up(tmp_path: Path) -> None:
    write(tmp_path / "weather" / "0001.json", responses_followup("resp_paris0001", "Rain"))
    write(tmp_path / "weather" / "0002.json", responses_followup("resp_tokyo0002", "Sun"))
    with ChaosServer(tmp_path) as server, openai_client(server) as client:
        for _ in range(2):
            for previous, text in (("resp_tokyo0002", "Sun"), ("resp_paris0001", "Rain")):
                answer = client.responses.create(
                    model="gpt-4.1-mini", input="And tomorrow?", previous_response_id=previous
                )
                assert answer.output_text == text
        with pytest.raises(openai.NotFoundError):
            client.responses.create(
                model="gpt-4.1-mini", input="And tomorrow?", previous_response_id="resp_other"
            )


# -- 4 -----------------------------------------------------------------------------------------


def test_the_usage_chunk_arrives_iff_asked_for(server: ChaosServer) -> None:
    unasked = {k: v for k, v in request_body(SHORT, stream=True).items() if k != "stream_options"}
    with openai_client(server) as client:
        naive = "".join(
            chunk.choices[0].delta.content or ""  # a real provider never breaks this loop
            for chunk in client.chat.completions.create(**unasked)
        )
        asked = list(client.chat.completions.create(**request_body(SHORT, stream=True)))
    body = recording(SHORT)["response"]["body"]
    assert naive == body["choices"][0]["message"]["content"]
    assert asked[-1].choices == [] and asked[-1].usage is not None
    assert asked[-1].usage.total_tokens == body["usage"]["total_tokens"]


# -- 5 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "ending"),
    [("empty_reply", "empty"), ("connection_reset", "reset"), ("garbage", "closed")],
)
def test_the_journal_of_a_request_that_got_no_http_response(
    server: ChaosServer, fault: str, ending: str
) -> None:
    server.arm(fault)
    with openai_client(server) as client, pytest.raises(openai.APIConnectionError):
        client.chat.completions.create(**request_body(SHORT, stream=False))
    [entry] = server.requests(settle=5)
    assert (entry["status"], entry["ending"], entry["outcome"]) == (None, ending, "complete")
    assert (entry["bytes_sent"] > 0) is (fault == "garbage")  # noise, but no HTTP head


# -- 6 -----------------------------------------------------------------------------------------


def test_a_second_serve_in_a_session_gets_fresh_ids(server: ChaosServer) -> None:
    recorded = recording(TOOL)["response"]["body"]
    with session_client(server, "agents-run") as client, openai_client(server) as anonymous:
        first = client.chat.completions.create(**request_body(TOOL, stream=False))
        second = client.chat.completions.create(**request_body(TOOL, stream=False))
        again = anonymous.chat.completions.create(**request_body(TOOL, stream=False))
    assert first.model_dump(exclude_unset=True) == recorded  # byte-identical first serve
    assert again.model_dump(exclude_unset=True) == recorded
    old_call = recorded["choices"][0]["message"]["tool_calls"][0]["id"]
    assert first.choices[0].message.tool_calls is not None
    assert second.choices[0].message.tool_calls is not None
    new_call = second.choices[0].message.tool_calls[0].id
    assert second.id != first.id and new_call != old_call
    assert second.id.startswith("chatcmpl-") and new_call.startswith("call_")
    assert len(new_call) == len(old_call)
    # The rest of the answer is the recording.
    dumped = json.dumps(second.model_dump(exclude_unset=True))
    assert json.loads(dumped.replace(new_call, old_call).replace(second.id, first.id)) == recorded


def test_fresh_ids_through_the_anthropic_sdk(server: ChaosServer) -> None:
    body = recording("anthropic-tools/0001")["request"]["body"]
    with anthropic.Anthropic(
        base_url=server.url, api_key="k", max_retries=0, default_headers={SESSION: "s"}
    ) as client:
        first = client.messages.create(**body)
        with client.messages.stream(**body) as stream:
            second = stream.get_final_message()
    assert first.id == recording("anthropic-tools/0001")["response"]["body"]["id"]
    assert second.id != first.id and second.id.startswith("msg_")
    tools = [b for b in second.content if b.type == "tool_use"]
    assert (
        tools
        and tools[0].id.startswith("toolu_")
        and tools[0].id != next(b for b in first.content if b.type == "tool_use").id
    )


# -- 7 -----------------------------------------------------------------------------------------


def test_a_json_answer_from_a_stream_recorded_without_usage(tmp_path: Path) -> None:
    rec = copy.deepcopy(recording(SHORT))
    rec["response"]["chunks"] = [
        c for c in rec["response"]["chunks"] if '"choices":[]' not in c["data"]
    ]
    rec["response"]["body"]["usage"] = None
    rec["response"]["body"]["choices"][0]["message"].pop("refusal")
    write(tmp_path / "bare" / "0001.json", rec)
    with ChaosServer(tmp_path) as server, openai_client(server) as client:
        completion = client.chat.completions.create(**request_body(SHORT, stream=False))
        [entry] = server.requests()
    assert completion.usage is not None and completion.usage.completion_tokens > 0
    assert completion.usage.total_tokens == (
        completion.usage.prompt_tokens + completion.usage.completion_tokens
    )
    assert "refusal" in completion.choices[0].message.model_fields_set
    assert entry["estimated"] == ["usage"]


# -- re-asks and a scenario per session ----------------------------------------------------------


def test_a_reask_after_a_fault_is_a_miss_that_says_why(server: ChaosServer) -> None:
    server.arm("malformed_tool_args")
    with session_client(server, "instructor") as client:
        broken = client.chat.completions.create(**request_body(TOOL, stream=False))
        assert broken.choices[0].message.tool_calls is not None
        reask = request_body(TOOL, stream=False)
        reask["messages"] = [*reask["messages"], {"role": "user", "content": "Fix the JSON."}]
        with pytest.raises(openai.NotFoundError) as info:
            client.chat.completions.create(**reask)
    error = info.value.body
    assert isinstance(error, dict) and error["code"] == "no_recording"
    assert "got the fault 'malformed_tool_args'" in error["message"]


def test_recordings_per_session_then_replayed_per_session(
    upstream: ChaosServer, tmp_path: Path
) -> None:
    record_dir = tmp_path / "rec"
    sessions = {"tests/test_a.py::test_paris#1": SHORT, "tests/test_b.py::test_tool#1": TOOL}
    with ChaosServer(
        mode="record", upstream=upstream.url, record_dir=record_dir, scenario_from_session=True
    ) as proxy:
        for session, name in sessions.items():
            with session_client(proxy, session) as client:
                client.chat.completions.create(**request_body(name, stream=False))
    assert [p.relative_to(record_dir).as_posix() for p in files(record_dir)] == [
        "tests-test_a.py-test_paris-1/0001.json",
        "tests-test_b.py-test_tool-1/0001.json",
    ]
    # Replayed: sequence matching answers each session from its own scenario.
    with ChaosServer(record_dir, scenario_from_session=True, match="sequence") as replay:
        for session, name in reversed(sessions.items()):
            with session_client(replay, session) as client:
                got = client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "next"}]
                )
            assert got.id == recording(name)["response"]["body"]["id"]
    assert len(RecordingStore.load([record_dir]).exchanges) == 2


def test_serve_takes_the_scenario_from_session_flag(upstream: ChaosServer, tmp_path: Path) -> None:
    with (
        serving(
            "--mode",
            "record",
            "--upstream",
            upstream.url,
            "--record-dir",
            str(tmp_path),
            "--scenario-from-session",
        ) as (url, _),
        httpx.Client(timeout=10) as client,
    ):
        response = client.post(
            url + "/v1/chat/completions",
            json=request_body(SHORT, stream=False),
            headers={SESSION: "flow one"},
        )
        assert response.status_code == 200
    assert [p.relative_to(tmp_path).as_posix() for p in files(tmp_path)] == ["flow-one/0001.json"]


@pytest.mark.slow
def test_the_fixtures_sessions_are_the_same_in_every_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        def test_one(chaosllm):
            assert chaosllm.session == "test_it.py::test_one#1"
            chaosllm.reset()
            assert chaosllm.session == "test_it.py::test_one#2"

        def test_two(chaosllm):
            assert chaosllm.session == "test_it.py::test_two#1"
            assert chaosllm.server.config.scenario_from_session
    """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--chaosllm-shared")
    result.assert_outcomes(passed=2)
