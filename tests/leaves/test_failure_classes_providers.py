"""The failure-class hooks of every provider (`Errors.failure`, `FaultHooks.failure_frame`,
`FaultHooks.filtered_answer`), called directly: each protocol's status and envelope, its error event
mid-stream, and how its content filter cuts a shipped answer. The same through the engine
and the catalogue's fault types: tests/engine/test_failure_classes.py."""

from __future__ import annotations

from typing import Any

import pytest

from chaosllm.providers import MODEL_PROVIDERS, PROVIDERS
from chaosllm.providers.base import FAILURE_STATUSES, Failure, FailureReply, filtered_text
from tests.helpers import recording

pytestmark = pytest.mark.timeout(30)

STATUSES: dict[str, dict[Failure, int]] = {name: dict(FAILURE_STATUSES) for name in MODEL_PROVIDERS}
STATUSES["anthropic.messages"].update({Failure.QUOTA_EXHAUSTED: 400, Failure.OVERLOADED: 529})
STATUSES["gemini.generate_content"][Failure.KEY_REFUSED] = 400
STATUSES["bedrock.converse"][Failure.KEY_REFUSED] = 403

ANSWERS = {
    "anthropic.messages": "anthropic-text/0001",
    "openai.chat": "simple-chat/0001",
    "openai.responses": "responses-simple/0001",
    "azure.chat": "azure-chat/0001",
    "azure.responses": "azure-responses/0001",
    "ollama.chat": "ollama-chat/0001",
    "ollama.generate": "ollama-generate/0001",
    "bedrock.converse": "bedrock-text/0001",
    "gemini.generate_content": "gemini-text/0001",
}
REASON_KEYS: dict[str, Any] = {
    "anthropic.messages": ("stop_reason", "refusal"),
    "openai.chat": ("finish_reason", "content_filter"),
    "azure.chat": ("finish_reason", "content_filter"),
    "openai.responses": ("incomplete_details", {"reason": "content_filter"}),
    "azure.responses": ("incomplete_details", {"reason": "content_filter"}),
    "ollama.chat": ("done_reason", "stop"),
    "ollama.generate": ("done_reason", "stop"),
    "bedrock.converse": ("stopReason", "content_filtered"),
    "gemini.generate_content": ("finishReason", "SAFETY"),
}


def find(value: Any, key: str) -> Any:
    """The first value of `key` anywhere in `value` (depth first)."""
    if isinstance(value, dict):
        if key in value:
            return value[key]
        value = list(value.values())
    if isinstance(value, list):
        for item in value:
            found = find(item, key)
            if found is not None:
                return found
    return None


@pytest.mark.parametrize("name", sorted(MODEL_PROVIDERS))
@pytest.mark.parametrize("failure", list(Failure), ids=[f.name for f in Failure])
def test_each_failure_has_the_protocols_status_and_envelope(name: str, failure: Failure) -> None:
    provider = PROVIDERS[name]
    request = recording(ANSWERS[name])["request"]["body"]
    reply = provider.errors.failure(failure, request)
    assert isinstance(reply, FailureReply)
    assert reply.status == STATUSES[name][failure]
    generic = provider.errors.error_answer("x", status=reply.status)
    assert isinstance(reply.body, dict) and isinstance(generic, dict)
    assert set(reply.body) == set(generic)  # the protocol's own envelope
    assert provider.errors.failure(failure, request, "said so").body != reply.body


@pytest.mark.parametrize("name", sorted(MODEL_PROVIDERS))
def test_an_overload_frame_is_one_of_the_protocols_frames(name: str) -> None:
    provider = PROVIDERS[name]
    frame = provider.faults.failure_frame(Failure.OVERLOADED, {})
    text = provider.codec.frame_text(frame)
    assert provider.faults.frame_finishes(text)  # it ends the answer, as an error event does


@pytest.mark.parametrize("name", sorted(MODEL_PROVIDERS))
def test_the_content_filter_cuts_a_shipped_answer(name: str) -> None:
    provider = PROVIDERS[name]
    answer = recording(ANSWERS[name])["response"]["body"]
    filtered = provider.faults.filtered_answer(answer)
    key, value = REASON_KEYS[name]
    assert find(filtered, key) == value
    assert provider.faults.filtered_answer({"no": "answer"}) is None


def test_filtered_text_keeps_the_first_half_in_words() -> None:
    assert filtered_text("one two three four") == "one two"
    assert filtered_text("one") == ""
