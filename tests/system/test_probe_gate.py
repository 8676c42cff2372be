"""`chaosllm probe` as a CI gate: each cell's findings and attempts in the JSON report
(a real probe of a client that ignores Retry-After and retries a 400 names both findings,
a careful one earns none), ``--baseline`` (exit 1 when a cell got worse - a new finding
is worse -, 0 when the same, 2 for a file that is not a report), ``--junit`` (one test
case per cell, well-formed whatever the program printed) and the HTML report's findings
and timelines (escaped, no external resources)."""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from chaosllm.cli import main
from chaosllm.errors import BadBaseline, ConfigError
from chaosllm.testing.probe import (
    ProbeReport,
    Verdict,
    compare_reports,
    load_baseline,
    probe,
    render_html,
    render_junit,
)

pytestmark = pytest.mark.slow

# A client whose retries come from a file: `retries` in MODE_FILE (the SDK's max_retries).
# It prints the answer between characters a report must escape (and XML cannot carry).
CLIENT = """\
import os, sys
from pathlib import Path
import openai

retries = int(Path(sys.argv[1]).read_text())
client = openai.OpenAI(max_retries=retries, timeout=5)
reply = client.chat.completions.create(
    model="gpt-4o-mini",
    messages=[
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
)
print(f"\\x1b[1m<answer & \\"{reply.choices[0].message.content}\\">\\x00\\x07")
"""


@pytest.fixture
def client(tmp_path: Path) -> tuple[list[str], Path]:
    script, mode = tmp_path / "client.py", tmp_path / "retries"
    script.write_text(CLIENT)
    mode.write_text("2")
    return [sys.executable, str(script), str(mode)], mode


def _probe(
    capsys: pytest.CaptureFixture[str], *args: str, command: list[str]
) -> tuple[int, str, str]:
    code = main(["probe", "--timeout", "10", "--variants", "json", *args, "--", *command])
    out, err = capsys.readouterr()
    return code, out, err


def _run(
    verdict: str, *, findings: tuple[str, ...] = (), type_: str = "http_503"
) -> dict[str, Any]:
    return {
        "fault": {"type": type_},
        "variant": "json",
        "verdict": verdict,
        "findings": [{"name": n, "seqs": [1], "explanation": "..."} for n in findings],
    }


def _report(*runs: dict[str, Any]) -> dict[str, Any]:
    return {"command": ["x"], "runs": list(runs)}


# -- --baseline --------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_baseline_exits_1_on_a_regression_and_0_on_the_same_report(
    client: tuple[list[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    command, mode = client
    first = tmp_path / "first.json"
    code, out, _ = _probe(capsys, "--types", "http_503", "--json", str(first), command=command)
    assert code == 0
    assert json.loads(first.read_text())["runs"][0]["verdict"] == "recovered"

    code, out, _ = _probe(capsys, "--types", "http_503", "--baseline", str(first), command=command)
    assert code == 0, out
    assert "against the baseline: 0 worse, 0 better, 0 other changes, 1 the same" in out

    mode.write_text("0")  # the client no longer retries: the 503 now fails it
    code, out, _ = _probe(capsys, "--types", "http_503", "--baseline", str(first), command=command)
    assert code == 1, out
    assert "1 worse" in out
    assert "worse   http_503/json: recovered -> failed cleanly" in out


# A client with its own retry loop (the SDK's off), careful or not as MODE_FILE says:
# careful, it waits for the Retry-After it was given and does not retry a 4xx that no
# retry cures; careless, it asks again at once, whatever the answer was.
RETRYING_CLIENT = """\
import sys, time
from pathlib import Path
import openai

careful = Path(sys.argv[1]).read_text() == "careful"
client = openai.OpenAI(max_retries=0, timeout=5)
request = dict(
    model="gpt-4o-mini",
    messages=[
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
)
for attempt in range(3):
    try:
        reply = client.chat.completions.create(**request)
        break
    except openai.APIStatusError as exc:
        if attempt == 2:
            raise
        if careful:
            if exc.status_code < 500 and exc.status_code not in (408, 409, 429):
                raise
            time.sleep(float(exc.response.headers.get("retry-after") or 0.2))
print(reply.choices[0].message.content)
"""

GATE_FAULTS = {
    "description": "a 429 that asks for 0.3 s, and a 400 no retry cures",
    "faults": [{"type": "http_429", "retry_after": 0.3}, {"type": "http_error", "status": 400}],
}


@pytest.mark.timeout(120)
def test_a_real_probe_names_the_findings_and_the_baseline_gate_catches_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script, mode, faults = tmp_path / "client.py", tmp_path / "mode", tmp_path / "faults.json"
    script.write_text(RETRYING_CLIENT)
    faults.write_text(json.dumps(GATE_FAULTS))
    command = [sys.executable, str(script), str(mode)]
    careful, careless = tmp_path / "careful.json", tmp_path / "careless.json"

    mode.write_text("careful")
    code, out, _ = _probe(capsys, "--profile", str(faults), "--json", str(careful), command=command)
    assert code == 0, out
    runs = json.loads(careful.read_text())["runs"]
    assert [(r["fault"]["type"], r["verdict"], r["findings"]) for r in runs] == [
        ("http_429", "recovered", []),
        ("http_error", "failed cleanly", []),
    ]
    waited = runs[0]["timeline"]
    assert [a["status"] for a in waited] == [429, 200]
    assert waited[1]["at"] - waited[0]["at"] >= 0.3 - 0.02  # it honoured the Retry-After

    mode.write_text("careless")
    code, out, _ = _probe(
        capsys,
        "--profile",
        str(faults),
        "--json",
        str(careless),
        "--baseline",
        str(careful),
        command=command,
    )
    assert code == 1, out
    runs = json.loads(careless.read_text())["runs"]
    assert [(r["fault"]["type"], r["verdict"]) for r in runs] == [
        ("http_429", "recovered"),
        ("http_error", "recovered"),  # the fault is one-shot: the retry got the answer
    ]
    ignored, non_retryable = (r["findings"] for r in runs)
    assert [(f["name"], f["seqs"]) for f in ignored] == [("retry_after_ignored", [1, 2])]
    assert "Retry-After" in ignored[0]["explanation"]
    assert [(f["name"], f["seqs"]) for f in non_retryable] == [("retried_non_retryable", [1, 2])]
    assert "400" in non_retryable[0]["explanation"]
    assert [a["status"] for a in runs[1]["timeline"]] == [400, 200]
    assert "against the baseline: 2 worse, 0 better, 0 other changes, 0 the same" in out
    assert "worse   http_429/json: new findings: retry_after_ignored" in out
    assert (
        "worse   http_error/json: failed cleanly -> recovered; new findings: "
        "retried_non_retryable" in out
    )

    # The careless report is its own baseline: the same cells, the same findings.
    code, out, _ = _probe(
        capsys, "--profile", str(faults), "--baseline", str(careless), command=command
    )
    assert code == 0, out
    assert "against the baseline: 0 worse, 0 better, 0 other changes, 2 the same" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read the baseline"),
        ("{not json", "not JSON"),
        ('{"runs": "none"}', "no list of runs"),
        ('[{"runs": []}]', "no list of runs"),
        ('{"runs": [{"fault": {"type": "http_503"}, "variant": "json"}]}', "no known verdict"),
        ('{"runs": [{"variant": "json", "verdict": "recovered"}]}', "names no fault type"),
    ],
)
def test_a_baseline_that_is_not_a_report_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    path = tmp_path / "baseline.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(BadBaseline, match=message) as info:
        load_baseline(path)
    assert isinstance(info.value, ConfigError) and str(path) in str(info.value)
    # The CLI refuses it before running anything: exit 2 and the same message.
    code, out, err = _probe(
        capsys, "--baseline", str(path), command=[sys.executable, "-c", "raise SystemExit(9)"]
    )
    assert code == 2 and out == ""
    assert message in err and err.startswith("chaosllm: ")


def test_what_counts_as_worse() -> None:
    before = _report(
        _run("recovered"),
        _run("failed cleanly", type_="http_429"),
        _run("recovered", type_="stall"),
        _run("not fired", type_="garbage"),
        _run("hung", type_="latency"),
    )
    same = compare_reports(before, before)
    assert (same.regressed, same.changes, same.same) == (False, (), 5)

    after = _report(
        _run("recovered", findings=("no_backoff",)),  # a new finding
        _run("recovered", type_="http_429"),  # better
        _run("recovered", type_="stall"),
        _run("failed cleanly", type_="garbage"),  # not fired -> failed cleanly: worse
        _run("wrong answer", type_="latency"),  # as bad as a hang: a change, not worse
        _run("hung", type_="empty_reply"),  # a cell the baseline did not have
    )
    comparison = compare_reports(before, after)
    assert comparison.regressed
    assert [c.cell for c in comparison.worse] == ["http_503/json", "garbage/json"]
    assert comparison.worse[0].describe() == "http_503/json: new findings: no_backoff"
    assert [c.cell for c in comparison.better] == ["http_429/json"]
    assert comparison.same == 1
    text = comparison.render()
    assert "against the baseline: 2 worse, 1 better, 2 other changes, 1 the same" in text
    assert "change  latency/json: hung -> wrong answer" in text
    assert "change  empty_reply/json: new cell, hung" in text

    gone = compare_reports(after, before)
    assert "findings gone: no_backoff" in gone.render()
    assert [c.cell for c in gone.worse] == ["http_429/json"]
    # A report without findings (written before they existed) counts as having none.
    old = _report({k: v for k, v in _run("recovered").items() if k != "findings"})
    assert not compare_reports(old, _report(_run("recovered"))).changes


def test_a_type_listed_twice_is_two_cells() -> None:
    runs = _report(_run("recovered"), _run("failed cleanly"))
    worse = _report(_run("recovered"), _run("hung"))
    assert [c.describe() for c in compare_reports(runs, worse).worse] == [
        "http_503/json#2: failed cleanly -> hung"
    ]


# -- the reports ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> ProbeReport:
    """One probe of the client: recovered (503), wrong answer (an empty answer printed as
    an answer) and not fired (no tool calls to break)."""
    folder = tmp_path_factory.mktemp("probe")
    script, mode = folder / "client.py", folder / "retries"
    script.write_text(CLIENT)
    mode.write_text("2")
    return probe(
        [sys.executable, str(script), str(mode)],
        faults=[{"type": "http_503"}, {"type": "empty_response"}, {"type": "malformed_tool_args"}],
        variants=["json"],
        timeout=10,
    )


@pytest.mark.timeout(120)
def test_each_cell_lists_its_findings_and_attempts(report: ProbeReport) -> None:
    assert report.matrix() == {
        "http_503": {"json": "recovered"},
        "empty_response": {"json": "wrong answer"},
        "malformed_tool_args": {"json": "not fired"},
    }
    data = report.to_json()
    for run in data["runs"]:
        assert isinstance(run["findings"], list)
        assert all(set(f) >= {"name", "seqs", "explanation"} for f in run["findings"])
    retried = data["runs"][0]["timeline"]
    assert [(a["seq"], a["status"], a["fault"]) for a in retried] == [
        (1, 503, "http_503"),
        (2, 200, None),
    ]
    assert 0 <= retried[0]["at"] <= retried[1]["at"] <= data["runs"][0]["seconds"]
    assert retried[1]["outcome"] == "complete" and retried[1]["stream"] is False


@pytest.mark.timeout(120)
def test_junit_has_one_case_per_cell_and_parses(report: ProbeReport, tmp_path: Path) -> None:
    path = tmp_path / "probe.xml"
    path.write_text(render_junit(report), encoding="utf-8")
    root = ET.parse(path).getroot()  # the program's NUL and escape bytes did not break it
    suite = root.find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [
        "http_503[json]",
        "empty_response[json]",
        "malformed_tool_args[json]",
    ]
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("3", "1", "1")
    recovered, wrong, not_fired = cases
    assert recovered.find("failure") is None and recovered.find("skipped") is None
    failure = wrong.find("failure")
    assert failure is not None and failure.get("type") == Verdict.WRONG_ANSWER.value
    assert '<answer & "None">\\x00\\x07' in (failure.text or "")  # escaped, read back
    assert not_fired.find("skipped") is not None
    out = recovered.findtext("system-out") or ""
    assert "verdict: recovered" in out and "findings: " in out
    assert "#1 " in out and "status=503 fault=http_503" in out
    assert '\\x1b[1m<answer & "The capital of France is Paris.">' in out


@pytest.mark.timeout(120)
def test_html_shows_findings_and_a_timeline_per_cell(report: ProbeReport) -> None:
    page = render_html(report)
    body, _, script = page.partition('<script type="application/json" id="report">')
    assert body.count("<svg ") == len(report.runs)
    assert body.count("<rect ") == sum(len(r.timeline) for r in report.runs)
    assert "<h3>Findings</h3>" in body
    # The program's output is escaped; nothing is loaded from elsewhere.
    assert "<answer" not in body and "&lt;answer &amp; &quot;" in body
    assert not re.search(r"""(src|href)=["']?https?:""", page)
    assert json.loads(script.removesuffix("</script></body></html>\n")) == report.to_json()
