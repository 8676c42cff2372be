"""The resilience checks fail when a property is broken (and pass when it holds)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from chaosllm.resilience import (
    Hung,
    ResilienceViolation,
    assert_attempts,
    assert_no_duplicate_tool_execution,
    assert_no_silent_truncation,
    assert_recovered,
    assert_retry_after_honoured,
    attempts,
    call_within,
    format_journal,
)


def entry(
    seq: int, t: float, session: str | None = None, fault: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "seq": seq,
        "monotonic": t,
        "session": session,
        "status": 200,
        "fault": fault,
        "recording": "r",
        "frames_sent": 0,
        "outcome": "complete",
    }


def retry(seconds: float) -> dict[str, Any]:
    return {"type": "http_429", "params": {"retry_after": seconds, "message": None}}


def test_attempts_and_format() -> None:
    journal = [entry(1, 0.0, "a", retry(1)), entry(2, 1.5, "a"), entry(3, 2.0, "b")]
    assert attempts(journal) == 3 and attempts(journal, session="a") == 2
    assert_attempts(journal, 2, session="a")
    with pytest.raises(ResilienceViolation, match="saw 3 attempts, expected 2"):
        assert_attempts(journal, 2)
    assert "fault=http_429" in format_journal(journal)


def test_retry_after_honoured_per_session() -> None:
    assert_retry_after_honoured(
        [entry(1, 0.0, "a", retry(1)), entry(2, 5.0, "b"), entry(3, 1.2, "a")]
    )
    with pytest.raises(ResilienceViolation, match=r"0\.400 s after #1"):
        assert_retry_after_honoured([entry(1, 0.0, "a", retry(1)), entry(2, 0.4, "a")])


def test_recovered() -> None:
    assert_recovered("Paris", "Paris")
    with pytest.raises(ResilienceViolation, match="did not recover"):
        assert_recovered("Par", "Paris")


def test_silent_truncation() -> None:
    finished = [{"choices": [{"finish_reason": None}]}, {"choices": [{"finish_reason": "stop"}]}]
    assert_no_silent_truncation(finished)
    with pytest.raises(ResilienceViolation, match="without a finish reason"):
        assert_no_silent_truncation(finished[:1])
    assert_no_silent_truncation(finished[:1], accepted=False)


def test_duplicate_tool_execution() -> None:
    assert_no_duplicate_tool_execution(["a", "b"])
    with pytest.raises(ResilienceViolation, match="'a': 2"):
        assert_no_duplicate_tool_execution(["a", "b", "a"])


def test_call_within() -> None:
    assert call_within(5, lambda x: x * 2, 21) == 42
    with pytest.raises(KeyError):
        call_within(5, {}.__getitem__, "missing")
    release = threading.Event()
    try:
        with pytest.raises(Hung, match=r"within 0\.1 s"):
            call_within(0.1, release.wait, 10)
    finally:
        release.set()
