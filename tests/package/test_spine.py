"""The shape of the spine (SPEC §8), checked statically: `Engine.handle` is the list of
its named stages, the journal is written in one module, the engine names no
compatibility mode and no provider, and no cache anywhere is keyed by an object's
identity (``id()``)."""

from __future__ import annotations

import ast
from pathlib import Path

from chaosllm.providers import PROVIDERS
from tests.helpers import ROOT

PACKAGE = ROOT / "chaosllm"
ENGINE = PACKAGE / "core" / "engine.py"
STAGES = ["prepare", "match", "review", "render", "limit", "mint", "fault", "shape", "finish"]


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text("utf-8"))


def _method(name: str) -> ast.FunctionDef:
    [engine] = [n for n in _tree(ENGINE).body if isinstance(n, ast.ClassDef) and n.name == "Engine"]
    [found] = [n for n in engine.body if isinstance(n, ast.FunctionDef) and n.name == name]
    return found


def _stage_calls(function: ast.FunctionDef) -> list[str]:
    """The stage modules `function` calls into, in the order it calls them."""
    called = []
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in STAGES
        ):
            called.append((node.lineno, node.func.value.id))
    return [name for _, name in sorted(called)]


def test_handle_and_answer_are_the_stage_list_in_order() -> None:
    assert _stage_calls(_method("handle")) == [
        "mint",  # the session's fresh ids turned back into the recorded ones
        "finish",  # a kept answer: a lookup
        "prepare",
        "match",
        "review",
    ]
    assert _stage_calls(_method("answer")) == [
        "render",
        "limit",
        "fault",  # may one fire?
        "mint",
        "fault",
        "shape",
        "finish",
    ]


def test_the_engine_is_small() -> None:
    lines = ENGINE.read_text("utf-8").count("\n")
    assert lines < 400, f"core/engine.py has {lines} lines"


def test_the_engine_names_no_compatibility_mode_and_no_provider() -> None:
    source = ENGINE.read_text("utf-8")
    for name in ("mock_llm", "docsgpt", "ironclaw", "structured", "compat", "DocsGPT"):
        assert name not in source, name
    for provider in PROVIDERS:
        assert f'"{provider}"' not in source and f"'{provider}'" not in source, provider
    assert "provider.name ==" not in source


def test_only_finish_writes_journal_records() -> None:
    writers = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(_tree(path)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("add", "add_like", "amend")
                and isinstance(node.func.value, ast.Attribute)
                and node.func.value.attr == "journal"
            ):
                writers.add(path.relative_to(PACKAGE).as_posix())
    assert writers == {"core/stages/finish.py"}


def test_no_cache_is_keyed_by_identity() -> None:
    """Keys are values: no ``id()`` call anywhere in the package."""
    calls = [
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "id"
    ]
    assert calls == []
