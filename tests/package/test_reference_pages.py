"""The docs' reference pages are generated from the code (`chaosllm.reference`, written by
the docs hook ``docs/hooks.py``): every command and flag of the parser, every control route
with what it does, every fault type. A flag, route or type added without its reference
fails here."""

from __future__ import annotations

import argparse
import importlib.util

import pytest

from chaosllm.cli import _parser
from chaosllm.faults import CATALOGUE
from chaosllm.reference import (
    CONTROL_CALLS,
    cli_page,
    control_plane_page,
    control_routes_table,
    fault_catalogue_page,
)
from tests.helpers import ROOT


def parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += parsers(sub)
    return found


def test_the_cli_page_has_every_command_and_flag() -> None:
    page = cli_page(_parser())
    for parser in parsers(_parser()):
        section = page.split(f"`{parser.prog}`\n", 1)
        assert len(section) == 2, f"no section for {parser.prog}"
        body = section[1].split("\n#", 1)[0]
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}`" in body, f"{parser.prog} {option}"


def test_the_cli_page_states_the_exit_statuses() -> None:
    page = cli_page(_parser())
    assert "| 0 | the command did what it was asked |" in page
    assert "| 1 | a failure at run time" in page and "| 2 | a wrong command line" in page


def test_every_control_route_is_described_and_every_description_is_a_route() -> None:
    routes = {(method, path) for method, path, _ in control_routes_table()}
    assert routes - set(CONTROL_CALLS) == set(), "routes without a description"
    assert set(CONTROL_CALLS) - routes == set(), "descriptions of routes that do not exist"
    page = control_plane_page()
    for method, path in routes:
        assert f"| `{method} {path}` | {CONTROL_CALLS[(method, path)][:20]}" in page


def test_the_fault_page_has_every_type_in_order() -> None:
    page = fault_catalogue_page()
    positions = [page.index(f"| `{entry.name}` |") for entry in CATALOGUE]
    assert positions == sorted(positions)


def test_the_docs_hook_generates_the_reference_pages() -> None:
    pytest.importorskip("mkdocs")  # the docs extra
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    pages = hooks.generated_pages()
    assert set(pages) == {
        "reference/faults.md",
        "reference/cli.md",
        "reference/control-plane.md",
        "changelog.md",
    }
    assert pages["reference/faults.md"] == fault_catalogue_page()
    nav = (ROOT / "mkdocs.yml").read_text("utf-8")
    assert all(path in nav for path in pages)
