"""The package's folders are its layers (SPEC §8), and imports only go down.

    base (errors, model, config, paths, lazy, suggest)
      <- providers <- faults <- store <- core     the sans-IO spine
      <- wire <- record <- http                    the I/O edges

record sits above core, and core above faults, so record may import faults: the proxy
drives the live-fault machines (`chaosllm.faults.live`) with their own types, not copies.
      <- server, cli, doctor, testing              what people run

Checked statically over every import statement of every module, including the ones
inside functions (a lazy import is still a dependency), as trio checks its own layering;
and no two modules import each other at module level, directly or through others.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ROOT

PACKAGE = ROOT / "chaosllm"

BASE = {"errors", "model", "config", "paths", "lazy", "suggest"}
SPINE = ["base", "providers", "faults", "store", "core"]
ALLOWED: dict[str, set[str]] = {
    "base": {"base"},
    "providers": {"base", "providers"},
    "faults": {"base", "providers", "faults"},
    "store": {"base", "providers", "faults", "store"},
    "core": {"base", "providers", "faults", "store", "core"},
    "wire": {"base", "providers", "core", "wire"},
    "record": {"base", "providers", "faults", "store", "core", "wire", "record"},
    "http": {*SPINE, "wire", "record", "http"},
}
"""For each layer, the layers its modules may import. Anything not listed (server, cli,
doctor, testing, the package itself and its public re-export modules) may import all."""


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "edge"  # the package itself
    head = parts[1]
    if head in BASE:
        return "base"
    return head if head in ALLOWED else "edge"


def modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def imports(module: str, path: Path, *, top_level_only: bool = False) -> Iterator[str]:
    """The chaosllm modules that `module` imports (`from X import name` counts as X.name
    when that is a module, else X)."""
    tree = ast.parse(path.read_text("utf-8"))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.If) and top_level_only:
            continue  # `if TYPE_CHECKING:` blocks are for the type checker only
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "chaosllm":
                    yield alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "chaosllm":
                continue
            for alias in node.names:
                yield _resolve(f"{node.module}.{alias.name}") or node.module


_KNOWN = {name for name, _ in modules()}


def _resolve(name: str) -> str | None:
    return name if name in _KNOWN else None


def _type_checking_only(path: Path) -> set[str]:
    tree = ast.parse(path.read_text("utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and inner.module:
                    found.update(
                        _resolve(f"{inner.module}.{a.name}") or inner.module for a in inner.names
                    )
    return found


@pytest.mark.parametrize(("module", "path"), list(modules()), ids=lambda v: str(v))
def test_imports_only_go_down(module: str, path: Path) -> None:
    layer = layer_of(module)
    if layer not in ALLOWED:
        return
    typing_only = _type_checking_only(path)
    wrong = sorted(
        f"{target} ({layer_of(target)})"
        for target in set(imports(module, path))
        if target not in typing_only and layer_of(target) not in ALLOWED[layer]
    )
    assert wrong == [], f"{module} ({layer}) imports from above its layer: {wrong}"


def test_no_import_cycles_at_module_level() -> None:
    graph: dict[str, set[str]] = {}
    for module, path in modules():
        targets = set(imports(module, path, top_level_only=True)) & _KNOWN
        # Importing a.b.c runs a and a.b first: a package's __init__ is a dependency too.
        graph[module] = {t for t in targets if t != module}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_model_is_plain_data() -> None:
    """`chaosllm.model` holds values, not machinery: no locks, threads or I/O."""
    source = (PACKAGE / "model.py").read_text("utf-8")
    tree = ast.parse(source)
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (
            node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")]
        )
    }
    assert imported.isdisjoint({"threading", "asyncio", "socket", "os", "io"}), imported


def test_record_drives_the_live_fault_machines_by_their_own_types() -> None:
    """The proxy imports `chaosllm.faults.live` (its layer may): no Protocol copies."""
    from chaosllm.faults import live
    from chaosllm.record import proxy

    for name in ("LiveChoice", "LiveEnd", "LiveFault"):
        assert getattr(proxy, name) is getattr(live, name)
    assert "faults" in ALLOWED["record"]
