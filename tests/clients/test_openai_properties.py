"""What the official `openai` SDK does under faults, stated as properties and checked
with hypothesis against a real server on real sockets.

Retry-After values are tens of milliseconds (sent as `retry-after-ms`, which the
SDK prefers) so that retries do not wait for the SDK's own backoff.
"""

from __future__ import annotations

from typing import Any

import anyio
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaosllm import ChaosServer
from chaosllm.resilience import (
    ResilienceViolation,
    assert_attempts,
    assert_no_silent_truncation,
    assert_retry_after_honoured,
    call_within,
    format_journal,
)
from tests.helpers import async_openai_client, recording, request_body

pytestmark = pytest.mark.slow

FAST = settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
RETRYABLE = [408, 409, 429, 500, 502, 503, 504]
NON_RETRYABLE = [400, 401, 403, 404, 422]
JSON_BODY = request_body("simple-chat/0001", stream=False)
STREAM_BODY = request_body("long-answer/0001", stream=True)
ANSWER = recording("simple-chat/0001")["response"]["body"]["choices"][0]["message"]["content"]


def client(server: ChaosServer, max_retries: int, **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.base_url, api_key="sk-test", max_retries=max_retries, timeout=5, **kwargs
    )


def arm_statuses(server: ChaosServer, status: int, k: int, retry_after: float = 0.01) -> None:
    if k:
        server.arm("http_error", status=status, remaining=k, retry_after=retry_after)


@FAST
@given(k=st.integers(0, 3), m=st.integers(0, 3), status=st.sampled_from(RETRYABLE))
def test_retryable_status_k_times_with_max_retries_m(
    server: ChaosServer, k: int, m: int, status: int
) -> None:
    """The server sees min(k, m) + 1 attempts; the call succeeds iff k <= m."""
    server.reset()
    arm_statuses(server, status, k)
    with client(server, m) as sdk:
        if k <= m:
            completion = call_within(10, sdk.chat.completions.create, **JSON_BODY)
            assert completion.choices[0].message.content == ANSWER
        else:
            with pytest.raises(openai.APIStatusError) as info:
                call_within(10, sdk.chat.completions.create, **JSON_BODY)
            assert info.value.status_code == status
    assert_attempts(server.requests(), min(k, m) + 1)


@FAST
@given(status=st.sampled_from(NON_RETRYABLE), m=st.integers(1, 3))
def test_non_retryable_statuses_are_not_retried(server: ChaosServer, status: int, m: int) -> None:
    server.reset()
    arm_statuses(server, status, 3)
    with client(server, m) as sdk, pytest.raises(openai.APIStatusError) as info:
        call_within(10, sdk.chat.completions.create, **JSON_BODY)
    assert info.value.status_code == status
    assert_attempts(server.requests(), 1)


@pytest.mark.parametrize("fault", ["http_429", "http_503"])
def test_retry_after_within_the_sdk_limit_is_honoured(server: ChaosServer, fault: str) -> None:
    server.arm(fault, retry_after=0.3, remaining=2)
    with client(server, 2) as sdk:
        call_within(10, sdk.chat.completions.create, **JSON_BODY)
    journal = server.requests()
    assert_attempts(journal, 3)
    assert_retry_after_honoured(journal)


def stream_until_error(server: ChaosServer) -> tuple[list[Any], BaseException | None]:
    """Stream with max_retries=2; the chunks received and the error that ended it."""
    chunks: list[Any] = []
    with client(server, 2) as sdk:
        try:
            with sdk.chat.completions.create(**STREAM_BODY) as stream:
                for chunk in stream:
                    chunks.append(chunk)
        except openai.APIError as exc:
            return chunks, exc
    return chunks, None


@FAST
@given(j=st.integers(0, 8), fault=st.sampled_from(["dropped_connection", "connection_reset"]))
def test_mid_stream_drop_after_j_frames(server: ChaosServer, j: int, fault: str) -> None:
    """One attempt, and an exception after exactly j chunks: the SDK does not retry a
    stream that already started (even with max_retries=2)."""
    server.reset()
    server.arm(fault, after_chunks=j)
    chunks, error = call_within(10, stream_until_error, server)
    assert len(chunks) == j
    assert isinstance(error, openai.APIConnectionError)
    assert_attempts(server.requests(), 1)


@FAST
@given(j=st.integers(0, 8))
def test_clean_truncation_is_accepted_silently(server: ChaosServer, j: int) -> None:
    """A stream that ends cleanly but early: the SDK raises nothing and the caller gets
    j chunks without a finish reason (silent truncation)."""
    server.reset()
    server.arm("truncated_stream", after_chunks=j)
    chunks, error = call_within(10, stream_until_error, server)
    assert error is None and len(chunks) == j
    with pytest.raises(ResilienceViolation, match="without a finish reason"):
        assert_no_silent_truncation(chunks)
    assert_attempts(server.requests(), 1)


@FAST
@given(j=st.integers(0, 8))
def test_error_in_200_stream_raises_after_j_chunks(server: ChaosServer, j: int) -> None:
    server.reset()
    server.arm("error_in_200", after_chunks=j)
    chunks, error = call_within(10, stream_until_error, server)
    assert len(chunks) == j and isinstance(error, openai.APIError)
    assert not isinstance(error, openai.APIStatusError)
    assert_attempts(server.requests(), 1)


def test_error_in_200_json_is_returned_as_a_hollow_completion(server: ChaosServer) -> None:
    """Not retried and not raised: the caller gets a ChatCompletion whose `choices` is
    None and whose extra `error` field holds the envelope."""
    server.arm("error_in_200", message="hidden failure")
    with client(server, 2) as sdk:
        completion = call_within(10, sdk.chat.completions.create, **JSON_BODY)
    assert completion.choices is None
    assert (completion.model_extra or {})["error"]["message"] == "hidden failure"
    assert_attempts(server.requests(), 1)


@FAST
@given(
    k=st.integers(0, 3),
    m=st.integers(0, 3),
    fault=st.sampled_from(["empty_reply", "connection_reset", "dropped_connection"]),
)
def test_connection_failures_before_an_answer_are_retried(
    server: ChaosServer, k: int, m: int, fault: str
) -> None:
    """Like a retryable status: min(k, m) + 1 attempts, success iff k <= m (JSON requests,
    where nothing reached the caller before the failure)."""
    server.reset()
    if k:
        server.arm(fault, remaining=k)
    with client(server, m) as sdk:
        if k <= m:
            assert (
                call_within(20, sdk.chat.completions.create, **JSON_BODY).choices[0].message.content
                == ANSWER
            )
        else:
            with pytest.raises(openai.APIConnectionError):
                call_within(20, sdk.chat.completions.create, **JSON_BODY)
    journal = server.requests()
    assert len(journal) == min(k, m) + 1, format_journal(journal)


def test_async_client_same_facts(shared_server: ChaosServer) -> None:
    shared_server.reset()

    async def main() -> None:
        with anyio.fail_after(20):
            async with async_openai_client(shared_server, max_retries=2, timeout=5) as sdk:
                shared_server.arm("http_503", remaining=2, retry_after=0.01)
                completion = await sdk.chat.completions.create(**JSON_BODY)
                assert completion.choices[0].message.content == ANSWER
                assert len(shared_server.requests(settle=0)) == 3
                shared_server.arm("dropped_connection", after_chunks=3)
                stream = await sdk.chat.completions.create(**STREAM_BODY)
                seen = []
                with pytest.raises(openai.APIConnectionError):
                    async with stream:
                        async for chunk in stream:
                            seen.append(chunk)
                assert len(seen) == 3

    anyio.run(main)
    shared_server.reset()
