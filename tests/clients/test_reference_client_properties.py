"""The reference resilient client (examples/resilient_client.py) under every fault
schedule hypothesis can think of: within its budget it returns exactly the
fault-free answer; beyond it, it fails with a typed error; it never hangs and
never executes a tool call twice."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from hypothesis import HealthCheck, given, note, settings

from chaosllm import ChaosServer
from chaosllm.faults import FAULT_TYPES
from chaosllm.resilience import (
    assert_attempts,
    assert_no_duplicate_tool_execution,
    assert_recovered,
    assert_retry_after_honoured,
    call_within,
    format_journal,
)
from chaosllm.strategies import RECOVERABLE, fault_schedules
from tests.helpers import EXAMPLES, recording, request_body

sys.path.insert(0, str(EXAMPLES))
import agent_flow
from resilient_client import ResilientClient, RetryBudgetExceeded

pytestmark = pytest.mark.slow

MAX_ATTEMPTS = 4
PROPERTY = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
# Small values keep the suite fast: a stall lasts longer than one attempt may.
SCHEDULE_OPTIONS: dict[str, Any] = {"max_retry_after": 0.05, "max_delay_ms": 20, "stall_ms": 5000}
DESTROYING = [t for t in RECOVERABLE if not FAULT_TYPES[t].delivers_answer]
"""The faults a retry cures that destroy the answer (a failure class no retry cures, such
as ``insufficient_quota``, ends the call: the reference client does not retry it)."""

TOOL_REQUEST = request_body("tool-call/0001", stream=False)
TOOL_ANSWER = recording("tool-call/0001")["response"]["body"]["choices"][0]["message"]
STREAM_REQUEST = request_body("knowledge/0006", stream=False)
STREAM_ANSWER = recording("knowledge/0006")["response"]["body"]["choices"][0]["message"]["content"]


@pytest.fixture
def sdk(server: ChaosServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0) as client:
        yield client


def resilient(sdk: openai.OpenAI) -> ResilientClient:
    return ResilientClient(
        sdk, max_attempts=MAX_ATTEMPTS, attempt_timeout=0.5, total_timeout=15, backoff=0.001
    )


def expected_attempts(schedule: list[dict[str, Any]]) -> int:
    """Faults fire in order, one per request: every fault that destroys the answer costs
    an attempt, and the first that only slows it (latency, slow_stream) ends the call."""
    attempts = 1
    for fault in schedule:
        if fault["type"] not in DESTROYING:
            break
        attempts += 1
    return attempts


@PROPERTY
@given(schedule=fault_schedules(max_faults=MAX_ATTEMPTS - 1, **SCHEDULE_OPTIONS))
def test_json_within_budget_returns_the_fault_free_answer(
    server: ChaosServer, sdk: openai.OpenAI, schedule: list[dict[str, Any]]
) -> None:
    server.reset()
    server.arm(schedule)
    client = resilient(sdk)
    message = call_within(20, client.chat, TOOL_REQUEST)
    journal = server.requests()
    note(format_journal(journal))
    assert_recovered(message, {"tool_calls": TOOL_ANSWER["tool_calls"]})
    assert_attempts(journal, expected_attempts(schedule))
    assert_retry_after_honoured(journal)


@PROPERTY
@given(
    schedule=fault_schedules(
        max_faults=MAX_ATTEMPTS - 1,
        types=[t for t in RECOVERABLE if t != "malformed_tool_args"],
        **SCHEDULE_OPTIONS,
    )
)
def test_stream_within_budget_returns_the_fault_free_text(
    server: ChaosServer, sdk: openai.OpenAI, schedule: list[dict[str, Any]]
) -> None:
    server.reset()
    server.arm(schedule)
    text = call_within(20, resilient(sdk).stream_text, STREAM_REQUEST)
    journal = server.requests()
    note(format_journal(journal))
    assert_recovered(text, STREAM_ANSWER)
    assert_attempts(journal, expected_attempts(schedule))
    assert_retry_after_honoured(journal)


@PROPERTY
@given(
    schedule=fault_schedules(
        min_faults=MAX_ATTEMPTS,
        max_faults=MAX_ATTEMPTS + 1,
        types=[t for t in DESTROYING if t != "malformed_tool_args"],
        **SCHEDULE_OPTIONS,
    )
)
def test_beyond_budget_fails_cleanly(
    server: ChaosServer, sdk: openai.OpenAI, schedule: list[dict[str, Any]]
) -> None:
    server.reset()
    server.arm(schedule)
    with pytest.raises(RetryBudgetExceeded) as info:
        call_within(20, resilient(sdk).stream_text, STREAM_REQUEST)
    note(format_journal(server.requests()))
    assert len(info.value.failures) >= MAX_ATTEMPTS
    assert_attempts(server.requests(), MAX_ATTEMPTS)


@PROPERTY
@given(schedule=fault_schedules(max_faults=MAX_ATTEMPTS - 1, **SCHEDULE_OPTIONS))
def test_agent_loop_never_executes_a_tool_call_twice(
    server: ChaosServer,
    sdk: openai.OpenAI,
    schedule: list[dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    server.reset()
    server.arm(schedule)
    agent_flow.executed_tool_calls.clear()
    client = resilient(sdk)
    call_within(30, agent_flow.run, client.chat, client.stream_text)
    note(format_journal(server.requests()))
    assert_no_duplicate_tool_execution(agent_flow.executed_tool_calls)
    assert agent_flow.executed_tool_calls == [TOOL_ANSWER["tool_calls"][0]["id"]]
    assert "weather: It's currently 18" in capsys.readouterr().out


def test_non_retryable_status_fails_at_once(server: ChaosServer, sdk: openai.OpenAI) -> None:
    server.arm("http_error", status=400)
    with pytest.raises(RetryBudgetExceeded, match="HTTP 400"):
        call_within(10, resilient(sdk).chat, TOOL_REQUEST)
    assert_attempts(server.requests(), 1)


def test_a_retry_after_past_the_deadline_fails_at_once(
    server: ChaosServer, sdk: openai.OpenAI
) -> None:
    server.arm("http_429", retry_after=60)
    client = ResilientClient(sdk, max_attempts=4, total_timeout=2)
    with pytest.raises(RetryBudgetExceeded, match="would pass the deadline"):
        call_within(5, client.chat, TOOL_REQUEST)
    assert_attempts(server.requests(), 1)
