"""The exception tree: every exception chaosllm defines is a `ChaosLLMError` that keeps the
builtin it refines, the tree drawn in `chaosllm.errors` is the real one, and configuration
that is refused raises `ConfigError` (still a `ValueError`)."""

from __future__ import annotations

import builtins
import importlib
import inspect
import pkgutil
import re
from collections.abc import Callable
from pathlib import Path

import pytest

import chaosllm
import chaosllm.errors
from chaosllm.config import Mode, OnMiss, ServerConfig, Strategy, parse_timing, proxy_dirs
from chaosllm.errors import ChaosLLMError, ConfigError, ServerError

OUTSIDE_THE_TREE = {
    "chaosllm.wire.h11_server._Gone": "private: H11WireServer raises and catches it when the "
    "client leaves; it never reaches a caller, and a ChaosLLMError base would let a broad "
    "`except ChaosLLMError` swallow that signal",
    "chaosllm.http.guards._TooLarge": "private: the body-limit middleware raises it out of its "
    "own receive wrapper and catches it around the app to answer 413; it never reaches a caller",
    "chaosllm.wire.executor._Stopped": "private: the awaiting executor raises it out of a wait "
    "the engine stopped (a cancelled MCP request) and catches it in `execute` to close the "
    "connection; it never reaches a caller",
}


def _exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined in the package (all modules imported), by qualified name."""
    found: dict[str, type[BaseException]] = {}
    modules = [chaosllm] + [
        importlib.import_module(info.name)
        for info in pkgutil.walk_packages(chaosllm.__path__, "chaosllm.")
        if not info.name.endswith("__main__")
    ]
    for module in modules:
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__.startswith("chaosllm"):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


def test_every_exception_is_a_chaosllm_error() -> None:
    classes = _exception_classes()
    outside = {name for name, cls in classes.items() if not issubclass(cls, ChaosLLMError)}
    assert outside == set(OUTSIDE_THE_TREE)
    # Private exemptions only: nothing a caller can catch is outside the tree.
    assert all(name.rpartition(".")[2].startswith("_") for name in OUTSIDE_THE_TREE)


def _drawn_tree() -> dict[str, tuple[str, str | None]]:
    """The tree of the `chaosllm.errors` docstring: class -> (drawn parent, drawn builtin)."""
    doc = chaosllm.errors.__doc__ or ""
    drawn: dict[str, tuple[str, str | None]] = {}
    parents = ["ChaosLLMError"]
    pattern = re.compile(r"^ {4}(?P<indent>(?:[│ ] {3})*)[├└]── (?P<name>\w+)(?: \((?P<b>\w+)\))?")
    for line in doc.splitlines():
        match = pattern.match(line)
        if match is None:
            continue
        depth = len(match["indent"]) // 4
        del parents[depth + 1 :]
        drawn[match["name"]] = (parents[depth], match["b"])
        parents.append(match["name"])
    return drawn


def test_the_drawn_tree_is_the_real_one() -> None:
    drawn = _drawn_tree()
    public = {
        cls.__name__: cls
        for name, cls in _exception_classes().items()
        if name not in OUTSIDE_THE_TREE and cls is not ChaosLLMError
    }
    assert set(drawn) == set(public), "the tree in errors.py does not list every exception"
    for name, (parent, builtin) in drawn.items():
        cls = public[name]
        assert cls.__bases__[0].__name__ == parent, name
        if builtin is not None:
            assert issubclass(cls, getattr(builtins, builtin)), name


def test_every_exception_of_errors_is_exported() -> None:
    defined = {
        name
        for name, value in vars(chaosllm.errors).items()
        if isinstance(value, type) and issubclass(value, BaseException)
    }
    assert defined == set(chaosllm.errors.__all__)


@pytest.mark.parametrize(
    ("name", "builtin"),
    [
        ("ConfigError", ValueError),
        ("RecordingError", ValueError),
        ("UnknownFormat", ValueError),
        ("InvalidRequest", ValueError),
        ("NoMatch", LookupError),
        ("UnknownScenario", LookupError),
        ("InvalidFaultSpec", ValueError),
        ("UnsafePath", ValueError),
        ("ServerError", RuntimeError),
        ("ResilienceViolation", AssertionError),
        ("Hung", AssertionError),
    ],
)
def test_an_error_keeps_the_builtin_it_refines(name: str, builtin: type[Exception]) -> None:
    cls = getattr(chaosllm.errors, name)
    assert issubclass(cls, ChaosLLMError)
    assert issubclass(cls, builtin)


def test_the_moved_exceptions_are_the_same_objects_in_their_old_homes() -> None:
    from chaosllm.record import client, proxy
    from chaosllm.testing import probe, resilience
    from chaosllm.wire import asgi

    errors = chaosllm.errors
    assert client.UpstreamError is errors.UpstreamError
    assert client.DroppedMidAnswer is errors.DroppedMidAnswer
    assert proxy.NotRecordable is errors.NotRecordable
    assert asgi.PlanAborted is errors.PlanAborted
    assert resilience.ResilienceViolation is errors.ResilienceViolation
    assert resilience.Hung is errors.Hung
    assert issubclass(probe.BaselineFailed, ChaosLLMError)
    assert issubclass(probe.BaselineFailed, RuntimeError)


def test_the_upstream_errors_are_not_os_errors() -> None:
    """The transports catch OSError and TimeoutError around the code that raises these."""
    for cls in (chaosllm.errors.UpstreamError, chaosllm.errors.UpstreamTimeout):
        assert not issubclass(cls, (OSError, TimeoutError))


# -- configuration that is refused ---------------------------------------------------------


@pytest.mark.parametrize(
    ("refuse", "message"),
    [
        (lambda: Mode.parse("replai"), r"invalid mode 'replai'; valid values: replay, record"),
        (lambda: OnMiss.parse("ignore"), r"invalid onmiss 'ignore'; valid values: error"),
        (lambda: Strategy.parse_order(" , "), r"empty match order"),
        (lambda: Strategy.parse_order("exact,fuzzy"), r"unknown matcher 'fuzzy'"),
        (lambda: Strategy.parse_order("exact,exact"), r"matcher listed twice"),
        (lambda: parse_timing("slow"), r"invalid timing 'slow'; use fast, recorded"),
        (lambda: parse_timing(-1.0), r"the scale must be a finite number >= 0"),
        (lambda: parse_timing("inf"), r"the scale must be a finite number >= 0"),
    ],
)
def test_a_bad_setting_is_a_config_error(refuse: Callable[[], object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        refuse()
    assert isinstance(caught.value, ValueError)  # `except ValueError` still catches it


def test_a_mode_without_what_it_needs_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs --upstream URL"):
        proxy_dirs(Mode.RECORD, upstream=None, recordings=None, record_dir=None)
    with pytest.raises(ConfigError, match="give --record-dir DIR"):
        proxy_dirs(Mode.RECORD, upstream="http://127.0.0.1:9", recordings=None, record_dir=None)
    assert proxy_dirs(
        Mode.RECORD, upstream="http://127.0.0.1:9", recordings=None, record_dir=tmp_path
    ) == ([tmp_path], tmp_path)
    servers = {"search": "http://127.0.0.1:9/mcp"}  # --mcp-upstream alone is an upstream
    assert proxy_dirs(
        Mode.RECORD, upstream=None, recordings=None, record_dir=tmp_path, servers=servers
    ) == ([tmp_path], tmp_path)


def test_the_state_refuses_a_mode_without_its_upstream_or_directory() -> None:
    from chaosllm.http.state import ChaosState

    with pytest.raises(ConfigError, match="--mode passthrough needs an upstream URL"):
        ChaosState.from_config(ServerConfig(mode=Mode.PASSTHROUGH))
    with pytest.raises(ConfigError, match="--mode record needs a directory to record to"):
        ChaosState.from_config(ServerConfig(mode=Mode.RECORD, upstream="http://127.0.0.1:9"))


def test_chaos_server_still_reports_a_refused_configuration_as_server_error() -> None:
    with pytest.raises(ServerError, match="needs --upstream URL"):
        chaosllm.ChaosServer(mode="record")
