"""The request-validator oracle (seeds/completion-test-api.md): each defect caught, well-formed
conversations passed, findings journaled and listed, ``--strict`` refusing with a 400 shaped
like OpenAI's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from chaosllm import ChaosServer
from chaosllm.providers.conversation import Finding, has_system_prompt, validate_conversation
from tests.helpers import all_recordings, recording

SYSTEM = {"role": "system", "content": "You are a helpful agent."}
USER = {"role": "user", "content": "What is the weather in Paris and Rome?"}


def call(call_id: str, city: str = "Paris") -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
    }


def calls(*ids: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [call(i) for i in ids]}


def result(call_id: str, content: Any = "18°C, sunny") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def body(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "messages": list(messages), **extra}


def checks(found: list[Finding]) -> list[str]:
    return [f.check for f in found]


WELL_FORMED = {
    "single turn": body(SYSTEM, USER),
    "no system prompt": body(USER),
    "developer prompt": body({"role": "developer", "content": "Be brief."}, USER),
    "tool round trip": body(
        SYSTEM, USER, calls("call_1"), result("call_1"), {"role": "assistant", "content": "Sunny."}
    ),
    "parallel tool calls": body(
        SYSTEM,
        USER,
        calls("call_1", "call_2"),
        result("call_2"),
        result("call_1"),
        {"role": "assistant", "content": "Both."},
        {"role": "user", "content": "Thanks! And Berlin?"},
    ),
    "multi-turn": body(
        SYSTEM,
        USER,
        {"role": "assistant", "content": "Which one first?"},
        {"role": "user", "content": "Paris."},
    ),
    "content parts": body({"role": "user", "content": [{"type": "text", "text": "hi"}]}),
    "two different user messages": body(USER, {"role": "user", "content": "Also Rome."}),
    "empty tool content": body(USER, calls("call_1"), result("call_1", "")),
}


@pytest.mark.parametrize("name", list(WELL_FORMED))
def test_well_formed_conversations_pass(name: str) -> None:
    assert validate_conversation(WELL_FORMED[name], expects_system=False) == []


@pytest.mark.parametrize("name", all_recordings())
def test_every_shipped_recorded_conversation_passes(name: str) -> None:
    request = recording(name)["request"]["body"]
    assert validate_conversation(request, expects_system=has_system_prompt(request)) == []


def test_system_prompt_present_passes_when_expected() -> None:
    assert validate_conversation(body(SYSTEM, USER), expects_system=True) == []


def test_orphan_tool_call() -> None:
    found = validate_conversation(
        body(
            SYSTEM,
            USER,
            calls("call_1", "call_2"),
            result("call_1"),
            {"role": "user", "content": "?"},
        )
    )
    assert checks(found) == ["orphan_tool_call"]
    assert found[0].index == 2 and found[0].param == "messages.[2].role"
    assert "did not have response messages: call_2" in found[0].message
    # ...and a conversation that ends on an unanswered call
    assert checks(validate_conversation(body(USER, calls("call_9")))) == ["orphan_tool_call"]


def test_orphan_tool_result() -> None:
    found = validate_conversation(body(SYSTEM, USER, result("call_1")))
    assert checks(found) == ["orphan_tool_result"]
    assert found[0].param == "messages.[2].role"
    assert "must be a response to a preceeding message with 'tool_calls'" in found[0].message
    # a result for a call the assistant message did not make
    assert checks(
        validate_conversation(body(USER, calls("call_1"), result("call_1"), result("call_7")))
    ) == ["orphan_tool_result"]


def test_null_tool_content() -> None:
    found = validate_conversation(body(USER, calls("call_1"), result("call_1", None)))
    assert checks(found) == ["null_tool_content"]
    assert found[0].message == "Invalid value for 'content': expected a string, got null."
    assert found[0].param == "messages.[2].content"


def test_role_order() -> None:
    starts_with_assistant = validate_conversation(
        body(SYSTEM, {"role": "assistant", "content": "Hello!"}, USER)
    )
    assert checks(starts_with_assistant) == ["role_order"]
    assert starts_with_assistant[0].index == 1
    assistant_twice = validate_conversation(
        body(
            USER, {"role": "assistant", "content": "One."}, {"role": "assistant", "content": "Two."}
        )
    )
    assert checks(assistant_twice) == ["role_order"] and assistant_twice[0].index == 2


def test_doubled_user_message() -> None:
    found = validate_conversation(body(SYSTEM, USER, dict(USER)))
    assert checks(found) == ["doubled_user_message"] and found[0].index == 2


def test_missing_system_prompt_when_the_recording_expects_one() -> None:
    assert validate_conversation(body(USER), expects_system=False) == []
    found = validate_conversation(body(USER), expects_system=True)
    assert checks(found) == ["missing_system_prompt"]


def test_top_level_cache_control() -> None:
    found = validate_conversation(body(USER, cache_control={"type": "ephemeral"}))
    assert checks(found) == ["top_level_cache_control"]


# -- in the server ----------------------------------------------------------------------

ORPHAN = body(SYSTEM, USER, result("call_1"))


@pytest.fixture
def strict_server() -> Iterator[ChaosServer]:
    with ChaosServer(strict=True) as server:
        yield server


def test_findings_are_journaled_and_listed(server: ChaosServer) -> None:
    good = recording("simple-chat/0001")["request"]["body"]
    with httpx.Client(base_url=server.url, timeout=10) as client:
        assert client.post("/v1/chat/completions", json=good).status_code == 200
        r = client.post("/v1/chat/completions", json=ORPHAN, headers={"x-chaosllm-session": "s1"})
        assert r.status_code == 404  # not refused: no recording answers it
        listed = client.get("/__findings").json()["findings"]
        assert client.get("/__findings", params={"session": "other"}).json() == {"findings": []}
    journal = server.requests()
    assert journal[0]["findings"] == []
    assert [f["check"] for f in journal[1]["findings"]] == ["orphan_tool_result"]
    [finding] = listed
    assert finding["seq"] == journal[1]["seq"] and finding["session"] == "s1"
    assert finding["oracle"] == "request-validator" and finding["severity"] == "error"
    assert server.findings() == listed


def test_strict_refuses_with_the_providers_400(strict_server: ChaosServer) -> None:
    with openai.OpenAI(
        base_url=strict_server.base_url, api_key="sk-test", max_retries=0, timeout=10
    ) as sdk:
        with pytest.raises(openai.BadRequestError) as caught:
            sdk.chat.completions.create(**ORPHAN)
        error = caught.value
        assert error.status_code == 400
        assert isinstance(error.body, dict)
        assert error.body["type"] == "invalid_request_error"
        assert error.body["param"] == "messages.[2].role"
        assert error.body["code"] is None
        assert "must be a response to a preceeding message" in error.body["message"]
        # a well-formed request is served as usual
        good = recording("simple-chat/0001")["request"]["body"]
        assert sdk.chat.completions.create(**good).choices[0].message.content
    entry = strict_server.requests()[0]
    assert entry["status"] == 400 and entry["error"] == "refused by --strict: orphan_tool_result"


def test_strict_refusal_consumes_nothing(tmp_path: Path) -> None:
    rec = recording("simple-chat/0001")
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "0001.json").write_text(json.dumps(rec), "utf-8")
    with (
        ChaosServer(tmp_path, strict=True) as server,
        httpx.Client(base_url=server.url, timeout=10) as client,
    ):
        server.use_scenario("s")
        bad = dict(rec["request"]["body"])
        bad["messages"] = [*bad["messages"], dict(bad["messages"][-1])]  # doubled user
        assert client.post("/v1/chat/completions", json=bad).status_code == 400
        assert server.unused() == ["s/0001"]
        assert client.post("/v1/chat/completions", json=rec["request"]["body"]).status_code == 200


def test_missing_system_prompt_is_found_against_the_served_recording(server: ChaosServer) -> None:
    server.use_scenario("knowledge", "nosys")
    recorded = recording("knowledge/0001")["request"]["body"]
    assert recorded["messages"][0]["role"] == "system"
    without = {**recorded, "messages": recorded["messages"][1:]}
    with httpx.Client(base_url=server.url, timeout=10) as client:
        r = client.post(
            "/v1/chat/completions", json=without, headers={"x-chaosllm-session": "nosys"}
        )
    assert r.status_code == 200
    [finding] = server.requests("nosys")[0]["findings"]
    assert finding["check"] == "missing_system_prompt"


def test_serve_has_a_strict_flag() -> None:
    from chaosllm.cli import _parser

    assert _parser().parse_args(["serve", "--strict"]).strict is True
    assert _parser().parse_args(["serve"]).strict is False
