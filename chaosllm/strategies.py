"""Public home of `chaosllm.testing.strategies` (SPEC §7): the implementation lives there."""

from chaosllm.testing.strategies import (
    RECOVERABLE,
    SESSION_FAULTS,
    SIMPLEST_FIRST,
    fault_schedules,
    faults,
    resilience_settings,
)

__all__ = [
    "RECOVERABLE",
    "SESSION_FAULTS",
    "SIMPLEST_FIRST",
    "fault_schedules",
    "faults",
    "resilience_settings",
]
