"""Public home of `chaosllm.testing.strategies` (SPEC §7): the implementation lives there."""

from chaosllm.testing.strategies import (
    MCP_FAULTS,
    RECOVERABLE,
    SESSION_FAULTS,
    SIMPLEST_FIRST,
    fault_schedules,
    faults,
    joint_fault_schedules,
    mcp_faults,
    resilience_settings,
)

__all__ = [
    "MCP_FAULTS",
    "RECOVERABLE",
    "SESSION_FAULTS",
    "SIMPLEST_FIRST",
    "fault_schedules",
    "faults",
    "joint_fault_schedules",
    "mcp_faults",
    "resilience_settings",
]
