"""Public home of `chaosllm.testing.resilience` (SPEC §7): the implementation lives there."""

from chaosllm.testing.resilience import (
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
    retry_after_of,
)

__all__ = [
    "Hung",
    "ResilienceViolation",
    "assert_attempts",
    "assert_no_duplicate_tool_execution",
    "assert_no_silent_truncation",
    "assert_recovered",
    "assert_retry_after_honoured",
    "attempts",
    "call_within",
    "format_journal",
    "retry_after_of",
]
