"""Public home of `chaosllm.testing.pytest_plugin` (SPEC §7): the implementation lives there."""

from chaosllm.testing.pytest_plugin import (
    ChaosHandle,
    chaosllm,
    chaosllm_server,
    pytest_addoption,
    pytest_configure,
    pytest_pyfunc_call,
    pytest_terminal_summary,
)

__all__ = [
    "ChaosHandle",
    "chaosllm",
    "chaosllm_server",
    "pytest_addoption",
    "pytest_configure",
    "pytest_pyfunc_call",
    "pytest_terminal_summary",
]
