"""The named failure classes through the official SDKs on real sockets: what the `openai`
SDK does with ``insufficient_quota`` next to a plain rate-limit 429, and what the
`anthropic` SDK does with an overload, before the answer and in the middle of a stream.
Observed behaviour, stated as assertions (the README's SDK tables say the same)."""

from __future__ import annotations

import time
from typing import Any

import anthropic
import openai
import pytest

from chaosllm import ChaosServer
from tests.helpers import openai_client, recording, request_body, sdk_arguments

pytestmark = pytest.mark.timeout(30)

NAME = "knowledge/0004"
ANTHROPIC = "anthropic-text/0001"


def attempts(server: ChaosServer) -> list[int]:
    """The status of each provider request the server saw."""
    return [entry["status"] for entry in server.requests()]


def anthropic_client(server: ChaosServer, **options: Any) -> anthropic.Anthropic:
    options = {"api_key": "sk-ant-test", "max_retries": 0, "timeout": 10, **options}
    return anthropic.Anthropic(base_url=server.url, **options)


def anthropic_request() -> dict[str, Any]:
    return sdk_arguments(ANTHROPIC)


# -- openai: insufficient_quota next to a rate limit -----------------------------------------


def test_openai_sdk_retries_insufficient_quota_like_any_429(server: ChaosServer) -> None:
    """The SDK decides on the status (and ``x-should-retry``, which OpenAI's quota answer
    does not carry): a spent quota is retried like a rate limit, with the SDK's own backoff
    (no Retry-After), and ends as a RateLimitError whose code says why."""
    server.arm("insufficient_quota", remaining=5)
    started = time.monotonic()
    with (
        openai_client(server, max_retries=1) as client,
        pytest.raises(openai.RateLimitError) as info,
    ):
        client.chat.completions.create(**request_body(NAME, stream=False))
    assert attempts(server) == [429, 429]  # retried once: the SDK cannot tell it apart
    assert time.monotonic() - started >= 0.3  # its own backoff: 0.5 s less up to 25 %
    assert info.value.code == "insufficient_quota" and info.value.type == "insufficient_quota"
    assert "retry-after" not in info.value.response.headers


@pytest.mark.parametrize(
    ("type_", "retries", "status"),
    [("http_429", 2, 429), ("overloaded", 1, 503)],
    ids=["rate_limit", "overload"],
)
def test_openai_sdk_retries_a_transient_failure_and_recovers(
    server: ChaosServer, type_: str, retries: int, status: int
) -> None:
    server.arm(type_, retry_after=0.05)
    with openai_client(server, max_retries=retries) as client:
        completion = client.chat.completions.create(**request_body(NAME, stream=False))
    assert completion.choices[0].message.content
    assert attempts(server) == [status, 200]


@pytest.mark.parametrize(
    ("type_", "error", "code"),
    [
        ("context_length_exceeded", openai.BadRequestError, "context_length_exceeded"),
        ("invalid_api_key", openai.AuthenticationError, "invalid_api_key"),
        ("model_not_found", openai.NotFoundError, "model_not_found"),
    ],
)
def test_openai_sdk_does_not_retry_the_4xx_classes(
    server: ChaosServer, type_: str, error: type[openai.APIStatusError], code: str
) -> None:
    server.arm(type_, remaining=3)
    with openai_client(server, max_retries=2) as client, pytest.raises(error) as info:
        client.chat.completions.create(**request_body(NAME, stream=False))
    assert info.value.code == code and len(attempts(server)) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_openai_sdk_takes_a_filtered_answer_without_error(
    server: ChaosServer, stream: bool
) -> None:
    whole = recording(NAME)["response"]["body"]["choices"][0]["message"]["content"]
    server.arm("content_filter")
    with openai_client(server) as client:
        if stream:
            chunks = list(client.chat.completions.create(**request_body(NAME, stream=True)))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
            reason = next(r for r in reasons if r is not None)
        else:
            completion = client.chat.completions.create(**request_body(NAME, stream=False))
            text = completion.choices[0].message.content or ""
            reason = completion.choices[0].finish_reason
    assert reason == "content_filter"
    assert whole.startswith(text) and len(text) < len(whole)
    assert attempts(server) == [200]


def test_openai_sdk_raises_an_overload_mid_stream(server: ChaosServer) -> None:
    server.arm("overloaded", after_chunks=2)
    got = []
    with openai_client(server, max_retries=2) as client, pytest.raises(openai.APIError) as info:
        for chunk in client.chat.completions.create(**request_body(NAME, stream=True)):
            got.append(chunk)
    assert len(got) == 2 and "overloaded" in info.value.message
    assert attempts(server) == [200]  # a started stream is never retried


# -- anthropic: overloaded -------------------------------------------------------------------


def test_anthropic_sdk_retries_a_529_and_recovers(server: ChaosServer) -> None:
    server.arm("overloaded")
    with anthropic_client(server, max_retries=1) as client:
        message = client.messages.create(**anthropic_request())
    assert message.content and message.stop_reason == "end_turn"
    assert attempts(server) == [529, 200]


def test_anthropic_sdk_raises_overloaded_error_without_retries(server: ChaosServer) -> None:
    server.arm("overloaded")
    with anthropic_client(server) as client, pytest.raises(anthropic.OverloadedError) as info:
        client.messages.create(**anthropic_request())
    assert info.value.status_code == 529
    assert info.value.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
        "request_id": info.value.request_id,  # the request-id header's, as the API's
    }


def test_anthropic_sdk_raises_a_mid_stream_overload_while_iterating(server: ChaosServer) -> None:
    server.arm("overloaded", after_chunks=3)
    events = []
    with (
        anthropic_client(server, max_retries=2) as client,
        client.messages.stream(**anthropic_request()) as stream,
        pytest.raises(anthropic.APIStatusError) as info,
    ):
        for event in stream:
            events.append(event.type)
    assert events and "message_stop" not in events
    assert info.value.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
    }
    assert attempts(server) == [200]  # the stream began: not retried


def test_anthropic_sdk_does_not_retry_a_spent_credit_balance(server: ChaosServer) -> None:
    server.arm("insufficient_quota", remaining=3)
    with (
        anthropic_client(server, max_retries=2) as client,
        pytest.raises(anthropic.BadRequestError) as info,
    ):
        client.messages.create(**anthropic_request())
    assert "credit balance is too low" in info.value.message
    assert attempts(server) == [400]


def test_anthropic_sdk_takes_a_refusal(server: ChaosServer) -> None:
    server.arm("content_filter")
    with (
        anthropic_client(server) as client,
        client.messages.stream(**anthropic_request()) as stream,
    ):
        final = stream.get_final_message()
    assert final.stop_reason == "refusal"
