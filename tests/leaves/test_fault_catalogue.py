"""The fault catalogue is the one description of a fault type: everything that lists
types or parameters (the CLI, the control plane's query typing, the strategies, the
docs' tables: the generated reference and the hand-written "Breaking things") is derived
from it or checked against it here, so an entry that lacks something fails one of these
tests."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chaosllm
from chaosllm import ChaosServer
from chaosllm.cli import _arm_spec, _parser
from chaosllm.faults import (
    CATALOGUE,
    FAULT_TYPES,
    Draw,
    FaultType,
    Param,
    apply_fault,
    fault_applies,
    parse_fault_spec,
    spec_from_query,
)
from chaosllm.faults import transform as t
from chaosllm.faults.spec import COMMON_FIELDS, MATCH_FIELDS
from chaosllm.providers.openai_chat import OpenAIChat
from chaosllm.reference import fault_catalogue_page
from chaosllm.strategies import SIMPLEST_FIRST, faults
from chaosllm.testing.probe import default_faults
from tests.helpers import FAILURE_CLASSES
from tests.leaves.test_fault_transform import ANSWER, TOOL_ANSWER, context

PACKAGE = Path(chaosllm.__file__).parent
BREAKING_THINGS = PACKAGE.parent / "docs" / "faults.md"
PARAMS = [(t.name, name, p) for t in CATALOGUE for name, p in t.params.items()]


def sample(param: Param) -> tuple[str, Any]:
    """A valid value for `param`, as typed on a command line or in a query string, and as
    the spec must hold it (text that looks like a number stays text)."""
    if param.choices:
        return param.choices[-1], param.choices[-1]
    if param.kind is str:
        return "42", "42"
    low = param.minimum or 0
    value = low + 1 if param.kind is int else low + 1.5
    if param.maximum is not None:
        value = min(value, param.maximum)
    return str(value), param.kind(value)


# -- the entries themselves ---------------------------------------------------------------------


def test_entries_are_complete_and_consistent() -> None:
    assert len(FAULT_TYPES) == len(CATALOGUE), "two entries share a name"
    kinds: dict[str, type] = {}
    reserved = {*COMMON_FIELDS, *MATCH_FIELDS, "id", "url", "token"}
    for entry in CATALOGUE:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", entry.name), entry.name
        assert entry.summary and callable(entry.transform) and callable(entry.applies)
        assert entry.silence_param is None or entry.silence_param in entry.params
        for name, param in entry.params.items():
            assert re.fullmatch(r"[a-z][a-z0-9_]*", name), (entry.name, name)
            assert name not in reserved, f"{entry.name}.{name} would shadow a common field"
            assert param.kind in (int, float, str), (entry.name, name)
            assert param.doc, (entry.name, name)
            # one CLI flag and one query typing per name: every type must agree on its kind,
            # but SPEC's background_failed `status` (failed, incomplete) is http_error's name
            mixed = (entry.name, name) == ("background_failed", "status")
            assert kinds.setdefault(name, param.kind) is param.kind or mixed, (entry.name, name)
        defaults = {k: p.default for k, p in entry.params.items() if p.default is not None}
        spec = parse_fault_spec({"type": entry.name, **defaults})  # defaults are valid
        assert spec.effective_params() == parse_fault_spec({"type": entry.name}).effective_params()


def test_the_shrink_order_is_total_and_covers_the_catalogue() -> None:
    ranks = [entry.simplicity for entry in CATALOGUE]
    assert len(set(ranks)) == len(ranks), "two entries share a simplicity rank"
    assert sorted(SIMPLEST_FIRST) == sorted(FAULT_TYPES)
    assert [FAULT_TYPES[n].simplicity for n in SIMPLEST_FIRST] == sorted(ranks)


def test_the_entry_is_what_specs_and_dispatch_use() -> None:
    for entry in CATALOGUE:
        assert parse_fault_spec({"type": entry.name}).entry is entry
    assert isinstance(FAULT_TYPES["stall"], FaultType)


def test_where_a_fault_applies() -> None:
    provider = OpenAIChat()

    def applies(name: str, answer: Any) -> bool:
        return fault_applies(parse_fault_spec({"type": name}), provider, answer)

    assert applies("malformed_tool_args", TOOL_ANSWER)
    assert not applies("malformed_tool_args", ANSWER)  # no tool calls to break
    assert not applies("malformed_tool_args", "text") and not applies("empty_response", "text")
    assert applies("empty_response", ANSWER)
    assert applies("content_filter", ANSWER) and not applies("content_filter", "text")
    answers_only: tuple[str, ...] = ("malformed_tool_args", "empty_response", "content_filter")
    # quirks that need something of the answer: a tool call, text beyond ASCII, chat's shape
    assert applies("restated_tool_args", TOOL_ANSWER) and not applies("restated_tool_args", ANSWER)
    assert not applies("split_utf8", ANSWER) and applies("split_utf8", {"content": "é"})
    assert applies("filter_frames", ANSWER) and not applies("filter_frames", "text")
    assert applies("usage_only_frame", ANSWER) and not applies("usage_only_frame", "text")
    answers_only += ("restated_tool_args", "split_utf8", "filter_frames", "usage_only_frame")
    structured = {"result": {"structuredContent": {"hits": 1}}}  # an MCP tool's result
    assert applies("bad_tool_output", structured) and not applies("bad_tool_output", ANSWER)
    answers_only += ("bad_tool_output",)
    # the gateways' failures need a Chat Completions answer; a stored response's apply to
    # the operations on one (another provider) only
    gateway: tuple[str, ...] = ("openrouter_credits", "openrouter_midstream_error")
    gateway += ("vllm_stream_error",)
    gateway += ("reasoning_preamble",)
    assert all(applies(n, ANSWER) and not applies(n, "text") for n in gateway)
    stored = ("background_failed", "resume_refused", "cancel_ignored", "response_expired")
    assert not any(applies(n, ANSWER) for n in stored)
    answers_only += gateway + stored
    always = [e.name for e in CATALOGUE if e.name not in answers_only]
    assert all(applies(name, "text") and applies(name, ANSWER) for name in always)


def test_apply_fault_returns_none_where_the_fault_does_not_apply() -> None:
    plan, ctx = context(ANSWER, False)
    assert apply_fault(parse_fault_spec({"type": "malformed_tool_args"}), plan, ctx) is None
    out = apply_fault(parse_fault_spec({"type": "http_503"}), plan, ctx)
    assert out is not None and out.status == 503


def test_the_probe_outlasts_its_time_limit_with_every_silent_fault() -> None:
    specs = default_faults(stall_ms=4000)
    # every type that fires on any model request: not a WebSocket session's, an MCP
    # server's, a stored response's or a gateway's, which fire only on their own
    assert [spec["type"] for spec in specs] == [
        name
        for name in FAULT_TYPES
        if FAULT_TYPES[name].on_request in (t.any_request, t.sse_stream)
    ]
    named = {spec["type"] for spec in specs}
    assert {"stall", "http_503", "crlf_frames", "malformed_tool_args"} <= named
    assert not named & {"ws_close", "mcp_error", "background_failed", "openrouter_credits"}
    for spec in specs:
        silence = FAULT_TYPES[spec["type"]].silence_param
        assert spec == {"type": spec["type"], **({silence: 4000} if silence else {})}
    assert default_faults(stall_ms=10, types=["stall", "http_503"]) == [
        {"type": "stall", "max_ms": 10},
        {"type": "http_503"},
    ]


# -- the CLI ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("type_", "name", "param"), PARAMS, ids=[f"{t}.{n}" for t, n, _ in PARAMS])
def test_every_parameter_has_a_cli_flag(type_: str, name: str, param: Param) -> None:
    text, value = sample(param)
    argv = ["fault", "arm", type_, "--" + name.replace("_", "-"), text]
    spec = parse_fault_spec(_arm_spec(_parser().parse_args(argv)))
    assert spec.param(name) == value and type(spec.param(name)) is param.kind


def subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    (actions,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    found: argparse.ArgumentParser = actions.choices[name]
    return found


def test_cli_flags_are_exactly_the_catalogue_parameters() -> None:
    arm = subcommand(subcommand(_parser(), "fault"), "arm")
    flags = {o for action in arm._actions for o in action.option_strings if o.startswith("--")}
    expected = {"--" + name.replace("_", "-") for _, name, _ in PARAMS}
    common = {"--remaining", "--probability", "--reask", "--session", "--model", "--path", "--url"}
    common |= {"--contains", "--tool", "--turn", "--after-requests", "--every", "--ttl-ms"}
    common |= {"--server"}
    assert flags - {"--help", "--token", "--json"} == expected | common


# -- the control plane's query typing -----------------------------------------------------------


@pytest.mark.parametrize(("type_", "name", "param"), PARAMS, ids=[f"{t}.{n}" for t, n, _ in PARAMS])
def test_every_parameter_has_query_typing(type_: str, name: str, param: Param) -> None:
    text, value = sample(param)
    spec = parse_fault_spec(spec_from_query(type_, [(name, text)]))
    assert spec.param(name) == value and type(spec.param(name)) is param.kind


def test_query_typing_of_common_and_match_fields() -> None:
    query = [("remaining", "2"), ("probability", "0.5"), ("session", "7"), ("match.stream", "true")]
    assert spec_from_query("http_503", query) == {
        "type": "http_503",
        "remaining": 2,
        "probability": 0.5,
        "match": {"session": "7", "stream": True},
    }
    # what fits no kind is passed on, for validation to refuse with its usual message
    assert spec_from_query("stall", [("max_ms", "soon")])["max_ms"] == "soon"
    assert spec_from_query("truncated_stream", [("afterChunks", "1.5")])["afterChunks"] == 1.5
    assert spec_from_query("nope", [("after_chunks", "3")])["after_chunks"] == 3


def test_text_parameters_stay_text_over_http() -> None:
    with ChaosServer() as server, httpx.Client(base_url=server.url, timeout=10) as http:
        for type_, name in (("error_in_200", "message"), ("garbage", "data")):
            response = http.post(f"/__fault/{type_}", params={name: "404"})
            assert response.status_code == 201, response.text
            assert response.json()["faults"][0][name] == "404"
        response = http.post("/__fault/http_error", params={"status": "502", "message": "1e3"})
        (fault,) = response.json()["faults"]
        assert (fault["status"], fault["message"]) == (502, "1e3")


# -- the strategies -----------------------------------------------------------------------------


@pytest.mark.parametrize("type_", list(FAULT_TYPES))
@settings(max_examples=10, database=None)
@given(data=st.data())
def test_every_type_has_a_strategy(type_: str, data: st.DataObject) -> None:
    drawn = data.draw(faults(types=[type_]))
    spec = parse_fault_spec(drawn)
    assert spec.type == type_
    params = FAULT_TYPES[type_].params
    assert set(spec.params) == {name for name, p in params.items() if p.draw is not None}


def test_every_draw_is_used_by_some_parameter() -> None:
    used = {p.draw for _, _, p in PARAMS}
    assert used >= set(Draw)


# -- the docs' tables: the generated reference and "Breaking things" ------------------------


def catalogue_rows(text: str) -> dict[str, list[tuple[str, str | None]]]:
    """type -> [(parameter, the default the table states, or None)] from a markdown table
    whose rows start with the type and whose second column names its parameters."""
    rows: dict[str, list[tuple[str, str | None]]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        found = re.fullmatch(r"`(\w+)`", cells[0]) if line.startswith("| `") else None
        if found:
            params = re.findall(r"`(\w+)`(?: \(([^)]*)\))?", cells[1])
            rows[found[1]] = [(name, default or None) for name, default in params]
    return rows


def hand_written_catalogue() -> dict[str, list[tuple[str, str | None]]]:
    """The table under "## The catalogue" of docs/faults.md (what each type does to each
    kind of request, written by hand)."""
    section = BREAKING_THINGS.read_text("utf-8").split("## The catalogue", 1)[1]
    return catalogue_rows(section.split("\n#", 1)[0])


def generated_catalogue() -> dict[str, list[tuple[str, str | None]]]:
    """The reference page the docs build generates (`chaosllm.reference`), its table
    read with the parameters' descriptions left out."""
    table = fault_catalogue_page().split("## Fields every fault takes", 1)[0]
    rows: dict[str, list[tuple[str, str | None]]] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        found = re.fullmatch(r"`(\w+)`", cells[0]) if line.startswith("| `") else None
        if found:
            params = re.findall(r"(?:^|<br>)`(\w+)`(?: \(([^)]*)\))?:", cells[2])
            rows[found[1]] = [(name, default or None) for name, default in params]
    return rows


def check_table(rows: dict[str, list[tuple[str, str | None]]], where: str) -> None:
    missing = [name for name in FAULT_TYPES if name not in rows]
    assert missing == [], f"{where} has no row for {missing}"
    assert list(rows) == list(FAULT_TYPES), f"{where}: rows in another order than the catalogue"
    for entry in CATALOGUE:
        assert [name for name, _ in rows[entry.name]] == list(entry.params), entry.name
        for name, stated in rows[entry.name]:
            default = entry.params[name].default
            if stated is None or not re.fullmatch(r"[\d.]+", stated):
                # no default stated, or a description of what None does ("half")
                assert default is None, f"{where}: {entry.name}.{name} omits default {default}"
            else:
                assert default == float(stated), f"{where}: {entry.name}.{name} says {stated}"


def test_the_generated_reference_has_a_row_per_type_with_its_parameters() -> None:
    check_table(generated_catalogue(), "the generated fault reference")


def test_the_hand_written_table_has_a_row_per_type_with_its_parameters() -> None:
    check_table(hand_written_catalogue(), "docs/faults.md's catalogue table")


# -- no fault name outside the catalogue --------------------------------------------------------

EXEMPT = {
    ("model.py", "stall"): "Ending.STALL: the wire's name for how a plan ends",
    **{
        ("providers/openai_common.py", word): "OpenAI's own error code (or finish reason), "
        "after which the failure class is named"
        for word in FAILURE_CLASSES
    },
    ("providers/realtime_openai.py", "session_expired"): "OpenAI Realtime's own error code",
}
"""The same word with another meaning."""


def string_literals(path: Path) -> set[str]:
    """The string constants of a module, docstrings (and bare string statements) aside."""
    tree = ast.parse(path.read_text("utf-8"))
    docs = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
    }


def test_no_module_outside_the_faults_names_a_fault_type() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        if where.startswith("faults/"):
            continue
        for name in sorted(string_literals(path) & set(FAULT_TYPES)):
            if (where, name) not in EXEMPT:
                found.append(f"{where}: {name!r}")
    assert found == [], "fault types named outside chaosllm/faults/: " + ", ".join(found)


def test_the_exemptions_are_still_needed() -> None:
    for where, name in EXEMPT:
        assert name in string_literals(PACKAGE / where), f"drop the exemption of {where}"
