"""Each protocol's conversation checks (`Provider.conversation_findings`): Anthropic's
``tool_use``/``tool_result`` pairing and the Responses API's ``call_id`` pairing, with the
messages and params the real APIs answer with; every shipped recording passes its own."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chaosllm.paths import shipped_dir
from chaosllm.providers import PROVIDERS
from chaosllm.providers.conversation import (
    Finding,
    has_system_prompt,
    validate_anthropic_conversation,
    validate_conversation,
    validate_responses_conversation,
)
from chaosllm.store.formats.session import is_session

ANTHROPIC = PROVIDERS["anthropic.messages"]
RESPONSES = PROVIDERS["openai.responses"]
CHAT = PROVIDERS["openai.chat"]
RECORDINGS = shipped_dir("recordings")


def checks(found: list[Finding]) -> list[str]:
    return [f.check for f in found]


# -- Anthropic Messages ---------------------------------------------------------------

USER = {"role": "user", "content": "Weather in Paris and Rome?"}


def tool_use(*ids: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [{"type": "text", "text": "Checking."}]
        + [{"type": "tool_use", "id": i, "name": "weather", "input": {}} for i in ids],
    }


def tool_result(*ids: str) -> dict[str, Any]:
    return {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": i, "content": "sunny"} for i in ids],
    }


def messages(*turns: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-6", "max_tokens": 64, "messages": list(turns), **extra}


def test_anthropic_well_formed_conversations_pass() -> None:
    answered = messages(
        USER,
        tool_use("toolu_1", "toolu_2"),
        tool_result("toolu_2", "toolu_1"),
        {"role": "assistant", "content": "Both sunny."},
        {"role": "user", "content": "Thanks."},
    )
    assert ANTHROPIC.conversation_findings(answered) == []
    assert (
        ANTHROPIC.conversation_findings(messages(USER, system="Be brief."), expects_system=True)
        == []
    )
    assert (
        ANTHROPIC.conversation_findings(
            messages(USER, system=[{"type": "text", "text": "Be brief."}]), expects_system=True
        )
        == []
    )


def test_anthropic_tool_use_without_a_result_in_the_next_message() -> None:
    found = ANTHROPIC.conversation_findings(
        messages(USER, tool_use("toolu_1", "toolu_2"), tool_result("toolu_1"))
    )
    assert checks(found) == ["orphan_tool_call"]
    assert found[0].index == 1 and found[0].param == "messages.1"
    assert found[0].message == (
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: "
        "toolu_2. Each `tool_use` block must have a corresponding `tool_result` block in the "
        "next message."
    )
    # The result must be in the very next message, and a conversation cannot end on a call.
    later = messages(USER, tool_use("toolu_1"), {"role": "user", "content": "?"})
    assert checks(ANTHROPIC.conversation_findings(later)) == ["orphan_tool_call"]
    assert checks(ANTHROPIC.conversation_findings(messages(USER, tool_use("toolu_9")))) == [
        "orphan_tool_call"
    ]


def test_anthropic_tool_result_without_its_tool_use() -> None:
    found = ANTHROPIC.conversation_findings(messages(USER, tool_result("toolu_7")))
    assert "orphan_tool_result" in checks(found)
    orphan = next(f for f in found if f.check == "orphan_tool_result")
    assert orphan.index == 1 and orphan.param == "messages.1.content.0"
    assert orphan.message.startswith(
        "messages.1.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_7."
    )
    # answering a call of an earlier message, or the same call twice
    stale = messages(
        USER,
        tool_use("toolu_1"),
        tool_result("toolu_1"),
        {"role": "assistant", "content": "Sunny."},
        tool_result("toolu_1"),
    )
    assert checks(ANTHROPIC.conversation_findings(stale)) == ["orphan_tool_result"]
    twice = messages(USER, tool_use("toolu_1"), tool_result("toolu_1", "toolu_1"))
    found = ANTHROPIC.conversation_findings(twice)
    assert checks(found) == ["orphan_tool_result"] and found[0].param == "messages.2.content.1"


def test_anthropic_role_order_doubled_user_and_system() -> None:
    found = ANTHROPIC.conversation_findings(
        messages({"role": "assistant", "content": "Hello!"}, USER)
    )
    assert checks(found) == ["role_order"]
    assert found[0].message == 'messages: first message must use the "user" role'
    doubled = ANTHROPIC.conversation_findings(messages(USER, dict(USER)))
    assert checks(doubled) == ["doubled_user_message"] and doubled[0].index == 1
    # two different user messages in a row are fine (the API joins them)
    assert (
        ANTHROPIC.conversation_findings(messages(USER, {"role": "user", "content": "Rome?"})) == []
    )
    assert checks(ANTHROPIC.conversation_findings(messages(USER), expects_system=True)) == [
        "missing_system_prompt"
    ]
    assert not ANTHROPIC.has_system_prompt(messages(USER, system=""))
    assert ANTHROPIC.has_system_prompt(messages(USER, system="Be brief."))


# -- the Responses API ----------------------------------------------------------------


def call(call_id: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": "weather", "arguments": "{}"}


def output(call_id: str, value: Any = "sunny") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": value}


def responses(*items: Any, **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4.1-mini", "input": list(items), **extra}


ASK = {"role": "user", "content": "Weather in Paris?"}


def test_responses_well_formed_inputs_pass() -> None:
    assert RESPONSES.conversation_findings(responses(ASK)) == []
    assert RESPONSES.conversation_findings({"model": "m", "input": "Just text."}) == []
    assert (
        RESPONSES.conversation_findings(
            responses(ASK, call("call_1"), call("call_2"), output("call_2"), output("call_1"))
        )
        == []
    )
    # answering a call of a stored response
    assert (
        RESPONSES.conversation_findings(responses(output("call_1"), previous_response_id="r")) == []
    )


def test_responses_call_without_output() -> None:
    found = RESPONSES.conversation_findings(
        responses(ASK, call("call_1"), call("call_2"), output("call_1"))
    )
    assert checks(found) == ["orphan_tool_call"]
    assert found[0].message == "No tool output found for function call call_2."
    assert found[0].index == 2 and found[0].param == "input"
    custom = responses(ASK, {"type": "custom_tool_call", "call_id": "c", "name": "x", "input": ""})
    assert RESPONSES.conversation_findings(custom)[0].message == (
        "No tool output found for custom tool call c."
    )


def test_responses_output_without_call() -> None:
    found = RESPONSES.conversation_findings(responses(ASK, output("call_7")))
    assert checks(found) == ["orphan_tool_result"]
    assert found[0].message == "No tool call found for function call output with call_id call_7."
    assert found[0].index == 1 and found[0].param == "input"
    twice = RESPONSES.conversation_findings(
        responses(ASK, call("call_1"), output("call_1"), output("call_1"))
    )
    assert checks(twice) == ["orphan_tool_result"] and twice[0].index == 3


def test_responses_null_output_doubled_user_and_system() -> None:
    found = RESPONSES.conversation_findings(responses(ASK, call("call_1"), output("call_1", None)))
    assert checks(found) == ["null_tool_content"] and found[0].param == "input[2].output"
    doubled = RESPONSES.conversation_findings(responses(ASK, dict(ASK)))
    assert checks(doubled) == ["doubled_user_message"] and doubled[0].param == "input[1].content"
    assert checks(RESPONSES.conversation_findings(responses(ASK), expects_system=True)) == [
        "missing_system_prompt"
    ]
    assert RESPONSES.has_system_prompt(responses(ASK, instructions="Be brief."))
    assert RESPONSES.has_system_prompt(responses({"role": "developer", "content": "Brief."}, ASK))
    assert not RESPONSES.has_system_prompt(responses(ASK, instructions=" "))


# -- every protocol -------------------------------------------------------------------


def test_chat_hooks_are_the_chat_validator() -> None:
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "x"}],
    }
    assert CHAT.conversation_findings(body) == validate_conversation(body)
    assert checks(CHAT.conversation_findings(body)) == ["null_tool_content", "orphan_tool_result"]
    assert CHAT.has_system_prompt(body) is has_system_prompt(body) is False


def test_each_validator_ignores_other_protocols_bodies() -> None:
    chat = {"model": "m", "messages": [{"role": "tool", "tool_call_id": "x", "content": "r"}]}
    assert validate_responses_conversation(chat) == []
    assert validate_anthropic_conversation(responses(output("call_1"))) == []
    assert validate_anthropic_conversation("not an object") == []


HTTP_RECORDINGS = sorted(
    path
    for path in RECORDINGS.glob("*/*.json")
    if not is_session(json.loads(path.read_bytes()))  # WebSocket sessions: no conversation
)


@pytest.mark.parametrize("path", HTTP_RECORDINGS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_shipped_conversation_passes_its_own_checks(path: Any) -> None:
    data = json.loads(path.read_bytes())
    provider = PROVIDERS[data.get("provider", "openai.chat")]
    request = data["request"]["body"]
    assert (
        provider.conversation_findings(request, expects_system=provider.has_system_prompt(request))
        == []
    )
