"""The public surface, pinned (as httpx's ``test_exported_members``): every module a user
imports from says in `__all__` exactly what it offers. A name added to or dropped from the
public API is a decision, so it must change this file too."""

from __future__ import annotations
import __future__

import importlib
import types

import pytest

PINNED: dict[str, list[str]] = {
    "chaosllm": [
        "FAULT_TYPES",
        "ChaosLLMError",
        "ChaosServer",
        "ConfigError",
        "Exchange",
        "FaultSpec",
        "Finding",
        "Hung",
        "InvalidFaultSpec",
        "InvalidRequest",
        "Mode",
        "NoMatch",
        "OnMiss",
        "RecordingError",
        "RecordingStore",
        "ResilienceViolation",
        "ResponsePlan",
        "ServerConfig",
        "ServerError",
        "Tolerances",
        "UnknownFormat",
        "UnknownScenario",
        "UnsafePath",
        "__version__",
        "parse_fault_spec",
    ],
    "chaosllm.errors": [
        "BadBaseline",
        "ChaosLLMError",
        "ClosedBeforeAnswer",
        "ConfigError",
        "ConnectFailed",
        "DroppedMidAnswer",
        "EventStreamError",
        "Hung",
        "InvalidFaultSpec",
        "InvalidRequest",
        "NoMatch",
        "NotRecordable",
        "PlanAborted",
        "RecordingError",
        "ResetBeforeAnswer",
        "ResilienceViolation",
        "ServerError",
        "TooManyFaults",
        "UnknownFormat",
        "UnknownScenario",
        "UnsafePath",
        "UpstreamError",
        "UpstreamTimeout",
        "UpstreamTooLarge",
    ],
    "chaosllm.strategies": [
        "MCP_FAULTS",
        "RECOVERABLE",
        "SESSION_FAULTS",
        "SIMPLEST_FIRST",
        "fault_schedules",
        "faults",
        "joint_fault_schedules",
        "mcp_faults",
        "resilience_settings",
    ],
    "chaosllm.resilience": [
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
    ],
    "chaosllm.stateful": ["AgentMachine"],
    "chaosllm.pytest_plugin": [
        "ChaosHandle",
        "chaosllm",
        "chaosllm_server",
        "pytest_addoption",
        "pytest_configure",
        "pytest_pyfunc_call",
        "pytest_terminal_summary",
    ],
}

INCLUDED_PRIVATE = {"__version__"}
"""Dunder names that are API all the same."""


def _public_attributes(module: types.ModuleType) -> set[str]:
    """What ``from module import ...`` could reasonably take: the module's own public
    names, without submodules (``chaosllm.server`` once loaded) and ``from __future__``
    directives (compiler flags, not API)."""
    return {
        name
        for name, value in vars(module).items()
        if (not name.startswith("_") or name in INCLUDED_PRIVATE)
        and not isinstance(value, (types.ModuleType, __future__._Feature))
    }


@pytest.mark.parametrize("name", sorted(PINNED))
def test_all_is_pinned(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert len(exported) == len(set(exported)), f"{name}.__all__ lists a name twice"
    assert sorted(exported) == sorted(PINNED[name])


@pytest.mark.parametrize("name", sorted(PINNED))
def test_every_name_in_all_exists(name: str) -> None:
    module = importlib.import_module(name)
    missing = [member for member in module.__all__ if not hasattr(module, member)]
    assert missing == []


@pytest.mark.parametrize("name", sorted(PINNED))
def test_every_public_attribute_is_in_all(name: str) -> None:
    module = importlib.import_module(name)
    for member in module.__all__:  # load the lazy ones, so they are in vars() too
        getattr(module, member)
    assert _public_attributes(module) - set(module.__all__) == set()


def test_the_lazy_names_are_real_attributes() -> None:
    """`ChaosServer` is loaded on first use, yet is the class itself, in `dir()`, and is
    what ``from chaosllm import ChaosServer`` gives."""
    import chaosllm
    import chaosllm.server
    from chaosllm import ChaosServer

    assert chaosllm.ChaosServer is ChaosServer is chaosllm.server.ChaosServer
    assert set(chaosllm.__all__) <= set(dir(chaosllm))


def test_an_unknown_attribute_is_an_attribute_error() -> None:
    import chaosllm

    with pytest.raises(AttributeError, match="has no attribute 'NoSuchThing'"):
        chaosllm.NoSuchThing  # noqa: B018
    assert not hasattr(chaosllm, "server_but_not_a_name")


@pytest.mark.parametrize(
    ("shim", "home"),
    [
        ("chaosllm.pytest_plugin", "chaosllm.testing.pytest_plugin"),
        ("chaosllm.strategies", "chaosllm.testing.strategies"),
        ("chaosllm.resilience", "chaosllm.testing.resilience"),
        ("chaosllm.stateful", "chaosllm.testing.stateful"),
    ],
)
def test_a_shim_offers_the_objects_of_its_home(shim: str, home: str) -> None:
    public, implementation = importlib.import_module(shim), importlib.import_module(home)
    for member in public.__all__:
        assert getattr(public, member) is getattr(implementation, member), member
