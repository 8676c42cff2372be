"""Every code block of the docs (``docs/**/*.md``) and of the README runs here, so none can
go stale:

- ``python`` blocks that hold a test (``def test_`` or a state machine's ``TestCase``) are
  saved as a test module and run by pytest in a subprocess, with the chaosllm plugin and
  ``examples/`` importable; other ``python`` blocks run as scripts, with a server on the
  address they name (``127.0.0.1:8000`` is the running test server).
- ``sh`` blocks run in bash against a server (``$CHAOSLLM_URL``, and ``127.0.0.1:8000`` /
  ``localhost:8000`` rewritten to it), except for the commands that would not return or
  belong to CI: ``chaosllm serve`` and ``chaosllm probe`` are parsed by the real parser
  (a flag that does not exist fails), ``pip install`` names only extras that pyproject
  declares, ``pytest`` is the suite itself.
- ``json`` blocks parse; a fault spec is validated, a recording loads.
- ``text`` blocks are output and synopses, not code.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from chaosllm import ChaosServer, parse_fault_spec
from chaosllm.cli import _parser
from chaosllm.faults import parse_fault_specs
from chaosllm.store.recordings import RecordingStore
from tests.helpers import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LANGUAGES = {"python", "sh", "json", "text"}
FENCE = re.compile(r"^```(\S*)")
PLACEHOLDER = re.compile(r"(https?://)?(127\.0\.0\.1|localhost):8000")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks() -> list[Block]:
    found: list[Block] = []
    for page in PAGES:
        lines = page.read_text("utf-8").splitlines()
        i = 0
        while i < len(lines):
            opening = FENCE.match(lines[i])
            if opening is None:
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            found.append(Block(page, i + 1, opening[1], "\n".join(lines[i + 1 : end]) + "\n"))
            i = end + 1
    return found


BLOCKS = blocks()
CODE = [b for b in BLOCKS if b.language != "text" and b.page.name != "architecture.md"]


def of(language: str) -> list[Block]:
    return [b for b in CODE if b.language == language]


@pytest.fixture(scope="module")
def module_server() -> Iterator[ChaosServer]:
    with ChaosServer() as server:
        yield server


@pytest.fixture
def server(module_server: ChaosServer) -> ChaosServer:
    module_server.reset()
    return module_server


def localised(code: str, server: ChaosServer) -> str:
    """`code` with the documented default address replaced by the test server's."""
    host = server.url.removeprefix("http://")
    return PLACEHOLDER.sub(lambda m: (m[1] or "") + host, code)


def environment(server: ChaosServer) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAOSLLM_")}
    env["CHAOSLLM_URL"] = server.url
    env["OPENAI_BASE_URL"] = server.base_url
    env["OPENAI_API_KEY"] = "test"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "examples"), str(ROOT)])
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def test_every_block_has_a_known_language() -> None:
    # docs/architecture.md (maintained with the engine) draws its diagram in a bare block.
    unknown = [
        b.id for b in BLOCKS if b.language not in LANGUAGES and b.page.name != "architecture.md"
    ]
    assert unknown == [], f"blocks without one of {sorted(LANGUAGES)}: {unknown}"


def test_the_docs_have_snippets_of_every_kind() -> None:
    counts = {language: len(of(language)) for language in ("python", "sh", "json")}
    assert counts["python"] >= 15 and counts["sh"] >= 10 and counts["json"] >= 1, counts


# -- python ------------------------------------------------------------------------------


def is_test_module(code: str) -> bool:
    return "def test_" in code or ".TestCase" in code


TEST_MODULES = [b for b in of("python") if is_test_module(b.code)]
SCRIPTS = [b for b in of("python") if not is_test_module(b.code)]


def module_name(block: Block) -> str:
    return "test_" + re.sub(r"\W", "_", block.id)


@pytest.fixture(scope="module")
def test_module_outcomes(
    module_server: ChaosServer, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """Every test-module snippet, each its own module, run in one pytest process (the
    plugin's start-up is most of what one costs): module name -> "passed" or the report
    of what failed."""
    where = tmp_path_factory.mktemp("snippets")
    for block in TEST_MODULES:
        (where / f"{module_name(block)}.py").write_text(block.code, "utf-8")
    report = where / "report.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error"]
    command += ["-n", "0", "--timeout", "120", f"--junitxml={report}", "."]
    result = subprocess.run(
        command,
        cwd=where,
        env=environment(module_server),
        capture_output=True,
        text=True,
        timeout=600,
    )
    outcomes: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")[0]
        failed = [child for child in case if child.tag in ("failure", "error", "skipped")]
        text = "; ".join(f"{c.tag}: {c.get('message', '')}\n{c.text or ''}" for c in failed)
        if failed or module not in outcomes:
            outcomes[module] = text or "passed"
    outcomes["__output__"] = result.stdout[-4000:] + result.stderr[-2000:]
    return outcomes


@pytest.mark.timeout(700)
@pytest.mark.parametrize("block", TEST_MODULES, ids=lambda b: b.id)
def test_python_test_block_passes(block: Block, test_module_outcomes: dict[str, str]) -> None:
    outcome = test_module_outcomes.get(module_name(block), "not collected")
    assert outcome == "passed", f"{block.id}: {outcome}\n{test_module_outcomes['__output__']}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("block", SCRIPTS, ids=lambda b: b.id)
def test_python_script_block_runs(block: Block, server: ChaosServer, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", localised(block.code, server)],
        cwd=tmp_path,
        env=environment(server),
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert result.returncode == 0, f"{block.id}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


# -- sh ----------------------------------------------------------------------------------


def commands(code: str) -> list[str]:
    """The block's command lines, continuations joined, comments and blanks dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    lines = []
    for line in joined.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            lines.append(stripped)
    return lines


def declared_extras() -> set[str]:
    """The names under ``[project.optional-dependencies]`` (no tomllib on Python 3.10)."""
    text = (ROOT / "pyproject.toml").read_text("utf-8")
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([\w-]+) = \[", section, re.MULTILINE))


EXTRAS = declared_extras()


def checked_only(command: str) -> bool:
    """Check a command that the test does not run; whether it was one."""
    words = shlex.split(command, comments=True)
    if words[:2] == ["pip", "install"]:
        for word in words[2:]:
            named = re.fullmatch(r"(?:\.|chaosllm)\[([\w,-]+)\]", word)
            if named:
                unknown = set(named[1].split(",")) - EXTRAS
                assert not unknown, f"pip install names extras pyproject lacks: {unknown}"
        return True
    if words[:1] == ["pytest"]:
        return True  # the suite itself: CI runs it
    if words[:1] == ["chaosllm"] and words[1:2] in (["serve"], ["probe"]):
        try:
            _parser().parse_args(words[1:])
        except SystemExit as exc:
            raise AssertionError(f"the parser refuses {command!r}") from exc
        return True
    return False


@pytest.mark.timeout(120)
@pytest.mark.parametrize("block", of("sh"), ids=lambda b: b.id)
def test_sh_block_runs(block: Block, server: ChaosServer, tmp_path: Path) -> None:
    script = ["set -euo pipefail"]
    for command in commands(localised(block.code, server)):
        parts = [p.strip() for p in command.split("&&")]
        runnable = [p for p in parts if not checked_only(p)]
        if runnable:
            script.append(" && ".join(runnable))
    result = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=ROOT,
        env=environment(server),
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert result.returncode == 0, f"{block.id}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


# -- json --------------------------------------------------------------------------------


@pytest.mark.parametrize("block", of("json"), ids=lambda b: b.id)
def test_json_block_is_valid(block: Block, tmp_path: Path) -> None:
    data = json.loads(block.code)
    if isinstance(data, dict) and "chaosllm" in data:
        (tmp_path / "docs").mkdir()
        (tmp_path / "docs" / "0001.json").write_text(block.code, "utf-8")
        store = RecordingStore.load([tmp_path])
        assert store.errors == [] and len(store.exchanges) == 1
    elif isinstance(data, dict) and "type" in data:
        parse_fault_spec(data)
    elif isinstance(data, list):
        parse_fault_specs(data)
