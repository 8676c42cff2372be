"""`chaosllm probe -- CMD`: a resilience matrix for a client program.

The program runs once without faults (the baseline), then once per fault and
per variant (the fault armed on the first JSON request, or on the first
streaming request), each time against a fresh server, with `OPENAI_BASE_URL`, `OPENAI_API_KEY`,
`ANTHROPIC_BASE_URL` and `ANTHROPIC_API_KEY`, `GOOGLE_GEMINI_BASE_URL` and
`GEMINI_API_KEY` (google-genai), `OLLAMA_HOST`
(ollama), `AWS_ENDPOINT_URL_BEDROCK_RUNTIME` with dummy AWS
credentials and `AWS_REGION`/`AWS_DEFAULT_REGION` (boto3) pointing at it (any protocol
chaosllm speaks). Each run is classified:

- **recovered**: exit status 0 and the same output as the baseline;
- **wrong answer**: exit status 0 and other output (a truncated or empty answer
  taken for a real one, a duplicated tool call...);
- **failed cleanly**: a non-zero exit status within the time limit;
- **hung**: still running at the time limit (then killed);
- **not fired**: the program made no request the fault applies to.

Each run (a cell of the matrix) also lists its **findings**: what the server concluded
about the client's retries from the journal and the fault history
(`ChaosServer.verdict()`: ``retry_after_ignored``, ``no_backoff``...), and its
**timeline**: one entry per attempt the server saw, with its time since the program
started, status, fault and outcome.

As a CI gate: `compare_reports` compares a report with an earlier one (`load_baseline`
reads a ``--json`` file): a cell got **worse** when its outcome ranks lower (recovered or
not fired > failed cleanly > wrong answer or hung) or it has a finding (by name) the
baseline cell did not have. `render_junit` writes JUnit XML, one test case per cell: a
cell that hung or gave a wrong answer is a failure (what ``--strict`` refuses: a clean
failure is a good outcome, the client noticed), a cell whose fault never fired is
skipped, and the findings are in the case's ``system-out``.
"""

from __future__ import annotations

import enum
import html
import json
import os
import re
import signal
import subprocess
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaosllm.core.verdict import Tolerances
from chaosllm.errors import BadBaseline, ChaosLLMError
from chaosllm.faults.spec import FAULT_TYPES, parse_fault_spec
from chaosllm.faults.transform import any_request, sse_stream
from chaosllm.server import ChaosServer
from chaosllm.store.profiles import load_profile

__all__ = [
    "KNOWN_VARIANTS",
    "SESSION",
    "BadBaseline",
    "BaselineFailed",
    "CellChange",
    "Comparison",
    "ProbeReport",
    "ProbeRun",
    "Verdict",
    "compare_reports",
    "default_faults",
    "load_baseline",
    "probe",
    "render_html",
    "render_junit",
    "render_matrix",
]

VARIANTS = ("json", "stream")
"""The variants run by default: the fault armed on the first JSON request, or on the
first streaming request."""
SESSION = "session"
"""The variant for live clients (OpenAI Realtime, Gemini Live): the fault armed on the
program's WebSocket session turns; the server serves TLS (google-genai dials ``wss://``)
and the program trusts it through ``SSL_CERT_FILE``."""
KNOWN_VARIANTS = (*VARIANTS, SESSION)


class Verdict(str, enum.Enum):
    RECOVERED = "recovered"
    FAILED_CLEANLY = "failed cleanly"
    HUNG = "hung"
    WRONG_ANSWER = "wrong answer"
    NOT_FIRED = "not fired"


@dataclass
class ProbeRun:
    fault: dict[str, Any] | None
    variant: str | None
    verdict: Verdict | None
    exit_code: int | None
    seconds: float
    attempts: int
    fired: bool
    stdout: str
    stderr: str
    findings: list[dict[str, Any]] = field(default_factory=list)
    """The server's findings about the client's behaviour in this run (each a
    ``Finding.to_json()``: ``name``, ``seqs``, ``explanation``)."""
    timeline: list[dict[str, Any]] = field(default_factory=list)
    """One entry per attempt the server saw: ``seq``, ``at`` (seconds since the program
    started), ``stream``, ``status``, ``fault`` (its type or None), ``outcome``,
    ``frames``."""

    @property
    def label(self) -> str:
        return "(no fault)" if self.fault is None else str(self.fault["type"])

    def to_json(self) -> dict[str, Any]:
        return {
            "fault": self.fault,
            "variant": self.variant,
            "verdict": self.verdict.value if self.verdict else "baseline",
            "exit_code": self.exit_code,
            "seconds": round(self.seconds, 3),
            "attempts": self.attempts,
            "fired": self.fired,
            "stdout": self.stdout,
            "stderr": self.stderr[-2000:],
            "findings": self.findings,
            "timeline": self.timeline,
        }


@dataclass
class ProbeReport:
    command: list[str]
    baseline: ProbeRun
    runs: list[ProbeRun] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "baseline": self.baseline.to_json(),
            "runs": [r.to_json() for r in self.runs],
            "summary": {v.value: sum(1 for r in self.runs if r.verdict is v) for v in Verdict},
        }

    def matrix(self) -> dict[str, dict[str, str]]:
        """fault type -> variant -> verdict."""
        table: dict[str, dict[str, str]] = {}
        for run in self.runs:
            assert run.verdict is not None and run.variant is not None
            table.setdefault(run.label, {})[run.variant] = run.verdict.value
        return table


_MODEL_REQUESTS = (any_request, sse_stream)


def default_faults(
    *, stall_ms: float, types: Sequence[str] | None = None, sessions: bool = False
) -> list[dict[str, Any]]:
    """One fault of each of `types` (default: every catalogue type of model requests;
    with `sessions`, every type that fires on a WebSocket session's turns) with its
    default parameters, except that a fault which leaves the client with nothing
    arriving (a stall: `FaultType.silence_param`) lasts `stall_ms`, longer than the run's
    time limit: a client without a timeout hangs."""
    faults: list[dict[str, Any]] = []
    # By default the faults of any model request (the catalogue's own request tests): a
    # session's, an MCP server's, a stored response's or a gateway's fire only there, so
    # they are named (`types`), not run by default; the session variant's are a
    # session's.
    if sessions:
        names = [n for n in FAULT_TYPES if FAULT_TYPES[n].session is not None]
    else:
        names = [n for n in FAULT_TYPES if FAULT_TYPES[n].on_request in _MODEL_REQUESTS]
    for name in names if types is None else types:
        spec: dict[str, Any] = {"type": name}
        silence = FAULT_TYPES[name].silence_param
        if silence is not None:
            spec[silence] = stall_ms
        faults.append(spec)
    return faults


def _run_once(
    command: Sequence[str],
    fault: dict[str, Any] | None,
    variant: str | None,
    *,
    timeout: float,
    server_options: dict[str, Any],
    env: dict[str, str] | None,
) -> ProbeRun:
    with ChaosServer(**server_options) as server:
        if fault is not None:
            spec = dict(fault)
            if variant != SESSION:  # a session's turns are its own
                spec["match"] = {**(spec.get("match") or {}), "stream": variant == "stream"}
            server.arm(spec)
        trust = {"SSL_CERT_FILE": str(server.certfile)} if server.certfile is not None else {}
        child_env = {
            **os.environ,
            **(env or {}),
            "OPENAI_BASE_URL": server.base_url,
            "OPENAI_API_KEY": "sk-chaosllm-probe",
            "ANTHROPIC_BASE_URL": server.url,
            "ANTHROPIC_API_KEY": "sk-ant-chaosllm-probe",
            "AZURE_OPENAI_ENDPOINT": server.url,
            "AZURE_OPENAI_API_KEY": "chaosllm-azure-probe",
            "OPENAI_API_VERSION": "2024-10-21",
            "GOOGLE_GEMINI_BASE_URL": server.url,
            "GOOGLE_VERTEX_BASE_URL": server.url,
            "GEMINI_API_KEY": "chaosllm-gemini-probe",
            "OLLAMA_HOST": server.url,
            "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": server.url,
            "AWS_ACCESS_KEY_ID": "chaosllm-aws-probe",
            "AWS_SECRET_ACCESS_KEY": "chaosllm-aws-probe",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "PYTHONUNBUFFERED": "1",
            **trust,
        }
        started = time.monotonic()
        proc = subprocess.Popen(
            list(command),
            env=child_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        hung = False
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            hung = True
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
        seconds = time.monotonic() - started
        journal = server.requests(settle=1.0)
        found = _findings(server)
    fired = any(e.get("fault") for e in journal)
    return ProbeRun(
        fault=fault,
        variant=variant,
        verdict=Verdict.HUNG if hung else None,
        exit_code=None if hung else proc.returncode,
        seconds=seconds,
        attempts=len(journal),
        fired=fired,
        stdout=stdout,
        stderr=stderr,
        findings=found,
        timeline=[_attempt(e, started) for e in journal],
    )


def _findings(server: ChaosServer) -> list[dict[str, Any]]:
    """The server's findings about the client's behaviour (all sessions, default
    tolerances): `chaosllm.core.verdict.findings` over its journal and fault history,
    and its WebSocket sessions' (``reconnected_without_resumption``...)."""
    return [f.to_json() for f in server.state.findings(None, Tolerances())]


def _attempt(entry: Mapping[str, Any], started: float) -> dict[str, Any]:
    fault = entry.get("fault")
    return {
        "seq": entry["seq"],
        "at": round(max(0.0, float(entry["monotonic"]) - started), 4),
        "stream": bool(entry.get("stream")),
        "status": entry.get("status"),
        "fault": fault["type"] if fault else None,
        "outcome": entry.get("outcome"),
        "frames": entry.get("frames_sent"),
    }


def _classify(run: ProbeRun, baseline: ProbeRun) -> Verdict:
    if run.verdict is Verdict.HUNG:
        return Verdict.HUNG
    if not run.fired:
        return Verdict.NOT_FIRED
    if run.exit_code != 0:
        return Verdict.FAILED_CLEANLY
    return Verdict.RECOVERED if run.stdout == baseline.stdout else Verdict.WRONG_ANSWER


class BaselineFailed(ChaosLLMError, RuntimeError):
    """The probed program fails without any fault; `run` is that baseline run."""

    def __init__(self, run: ProbeRun) -> None:
        super().__init__(
            f"the program fails without any fault (exit {run.exit_code}"
            f"{', timed out' if run.verdict is Verdict.HUNG else ''}): "
            f"{run.stderr.strip()[-500:]}"
        )
        self.run = run


def probe(
    command: Sequence[str],
    *,
    faults: Sequence[dict[str, Any]] | None = None,
    profile: str | None = None,
    variants: Sequence[str] = VARIANTS,
    timeout: float = 20.0,
    jobs: int = 1,
    recordings: Sequence[Path] | None = None,
    seed: int = 0,
    env: dict[str, str] | None = None,
    progress: Callable[[ProbeRun], None] | None = None,
) -> ProbeReport:
    """Run `command` without faults, then once per fault and variant; classify each run.
    Without `faults` or `profile`, the json and stream variants run the faults of model
    requests and the session variant the session faults (`default_faults`)."""
    if not command:
        raise ValueError("no command to probe")
    bad = [v for v in variants if v not in KNOWN_VARIANTS]
    if bad or not variants:
        raise ValueError(
            f"unknown variant {bad[0] if bad else None!r}; use {', '.join(KNOWN_VARIANTS)}"
        )
    given: list[dict[str, Any]] | None = None
    if profile is not None:
        given = [s.to_json() for s in load_profile(profile).specs]
    elif faults is not None:
        given = [parse_fault_spec(dict(f)).to_json() for f in faults]

    def specs(variant: str) -> list[dict[str, Any]]:
        if given is not None:
            return given
        return default_faults(stall_ms=timeout * 2000, sessions=variant == SESSION)

    options: dict[str, Any] = {"seed": seed}
    if SESSION in variants:
        options["tls"] = True
    if recordings:
        options["recordings"] = list(recordings)
    baseline = _run_once(command, None, None, timeout=timeout, server_options=options, env=env)
    if baseline.verdict is Verdict.HUNG or baseline.exit_code != 0:
        raise BaselineFailed(baseline)
    report = ProbeReport(command=list(command), baseline=baseline)

    def one(item: tuple[dict[str, Any], str]) -> ProbeRun:
        run = _run_once(command, item[0], item[1], timeout=timeout, server_options=options, env=env)
        run.verdict = _classify(run, baseline)
        if progress is not None:
            progress(run)
        return run

    work = [(spec, variant) for variant in variants for spec in specs(variant)]
    if given is not None:  # the faults' order, each in every variant
        work = [(spec, variant) for spec in given for variant in variants]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        report.runs = list(pool.map(one, work))
    return report


def render_matrix(report: ProbeReport) -> str:
    """The matrix for a terminal: one row per fault, one column per variant."""
    matrix = report.matrix()
    variants = [v for v in KNOWN_VARIANTS if any(v in row for row in matrix.values())]
    width = max([len(k) for k in matrix] + [5])
    lines = [
        f"{'fault':<{width}}  " + "  ".join(f"{v:<15}" for v in variants),
        "-" * (width + 2 + 17 * len(variants)),
    ]
    for fault, row in matrix.items():
        lines.append(f"{fault:<{width}}  " + "  ".join(f"{row.get(v, ''):<15}" for v in variants))
    summary = report.to_json()["summary"]
    lines.append("")
    lines.append(", ".join(f"{n} {name}" for name, n in summary.items() if n))
    return "\n".join(lines)


# -- the baseline gate ---------------------------------------------------------------

_RANK = {
    Verdict.RECOVERED.value: 0,
    Verdict.NOT_FIRED.value: 0,
    Verdict.FAILED_CLEANLY.value: 1,
    Verdict.WRONG_ANSWER.value: 2,
    Verdict.HUNG.value: 2,
}
"""How good an outcome is (lower is better): a run whose fault did not fire did nothing
bad; a clean failure is worse than a recovery; a wrong answer and a hang are the worst."""


@dataclass(frozen=True, slots=True)
class CellChange:
    """A cell whose outcome or findings differ from the baseline's (or that only one of
    the two reports has: `before` or `after` is then None)."""

    cell: str
    """``fault type/variant`` (``#2``, ``#3``... for a type the faults list again)."""
    before: str | None
    after: str | None
    new_findings: tuple[str, ...] = ()
    gone_findings: tuple[str, ...] = ()

    @property
    def worse(self) -> bool:
        if self.before is None or self.after is None:
            return False
        return _RANK[self.after] > _RANK[self.before] or bool(self.new_findings)

    @property
    def better(self) -> bool:
        if self.before is None or self.after is None or self.worse:
            return False
        return _RANK[self.after] < _RANK[self.before] or bool(self.gone_findings)

    def describe(self) -> str:
        if self.before is None:
            return f"{self.cell}: new cell, {self.after}"
        if self.after is None:
            return f"{self.cell}: not in this report (was {self.before})"
        parts = []
        if self.before != self.after:
            parts.append(f"{self.before} -> {self.after}")
        if self.new_findings:
            parts.append("new findings: " + ", ".join(self.new_findings))
        if self.gone_findings:
            parts.append("findings gone: " + ", ".join(self.gone_findings))
        return f"{self.cell}: " + "; ".join(parts)


@dataclass(frozen=True, slots=True)
class Comparison:
    """A report against its baseline: the cells that changed, and how many did not."""

    changes: tuple[CellChange, ...]
    same: int

    @property
    def worse(self) -> list[CellChange]:
        return [c for c in self.changes if c.worse]

    @property
    def better(self) -> list[CellChange]:
        return [c for c in self.changes if c.better]

    @property
    def regressed(self) -> bool:
        """Whether any cell got worse (``chaosllm probe --baseline`` then exits 1)."""
        return any(c.worse for c in self.changes)

    def render(self) -> str:
        """The diff for a terminal: a count line, then one line per changed cell."""
        other = len(self.changes) - len(self.worse) - len(self.better)
        lines = [
            f"against the baseline: {len(self.worse)} worse, {len(self.better)} better, "
            f"{other} other changes, {self.same} the same"
        ]
        for change in self.changes:
            mark = "worse " if change.worse else "better" if change.better else "change"
            lines.append(f"  {mark}  {change.describe()}")
        return "\n".join(lines)


def _not_a_report(source: str, why: str) -> BadBaseline:
    return BadBaseline(f"{source} is not a chaosllm probe report (--json output): {why}")


def _cells(data: Any, source: str) -> dict[str, tuple[str, frozenset[str]]]:
    """A report's cells: ``type/variant`` -> (verdict, finding names). `BadBaseline` when
    `data` is not a probe report."""
    if not isinstance(data, Mapping) or not isinstance(data.get("runs"), list):
        raise _not_a_report(source, "no list of runs")
    cells: dict[str, tuple[str, frozenset[str]]] = {}
    seen: Counter[str] = Counter()
    for index, run in enumerate(data["runs"]):
        fault = run.get("fault") if isinstance(run, Mapping) else None
        if not isinstance(fault, Mapping) or not isinstance(fault.get("type"), str):
            raise _not_a_report(source, f"run {index} names no fault type")
        assert isinstance(run, Mapping)
        variant, verdict = run.get("variant"), run.get("verdict")
        if not isinstance(variant, str) or verdict not in _RANK:
            raise _not_a_report(source, f"run {index} has no variant or no known verdict")
        found = run.get("findings", [])
        if not isinstance(found, list) or not all(
            isinstance(f, Mapping) and isinstance(f.get("name"), str) for f in found
        ):
            raise _not_a_report(source, f"run {index} has findings without names")
        key = f"{fault['type']}/{variant}"
        seen[key] += 1
        if seen[key] > 1:
            key = f"{key}#{seen[key]}"
        cells[key] = (str(verdict), frozenset(str(f["name"]) for f in found))
    return cells


def load_baseline(path: str | Path) -> dict[str, Any]:
    """An earlier report (``chaosllm probe --json`` output), checked: `BadBaseline` when
    the file is missing or unreadable, not JSON, or not a probe report."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise BadBaseline(f"cannot read the baseline {source}: {reason}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _not_a_report(source, f"not JSON ({exc})") from None
    _cells(data, source)
    assert isinstance(data, dict)
    return data


def compare_reports(
    baseline: Mapping[str, Any], report: ProbeReport | Mapping[str, Any]
) -> Comparison:
    """`report` against `baseline` (both as ``--json`` writes them, or `report` as a
    `ProbeReport`), cell by cell (fault type and variant). `BadBaseline` when `baseline`
    is not a probe report."""
    before = _cells(baseline, "the baseline")
    after = _cells(report.to_json() if isinstance(report, ProbeReport) else report, "the report")
    changes: list[CellChange] = []
    same = 0
    for key in [*before, *(k for k in after if k not in before)]:
        old, new = before.get(key), after.get(key)
        if old is None or new is None:
            changes.append(CellChange(key, old[0] if old else None, new[0] if new else None))
            continue
        added, gone = tuple(sorted(new[1] - old[1])), tuple(sorted(old[1] - new[1]))
        if old[0] == new[0] and not added and not gone:
            same += 1
        else:
            changes.append(CellChange(key, old[0], new[0], added, gone))
    return Comparison(tuple(changes), same)


# -- JUnit XML ---------------------------------------------------------------------------

_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
"""Characters XML 1.0 cannot carry at all, even escaped (control characters, lone
surrogates): a program's output may hold them."""


def _xml_text(text: str) -> str:
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _finding_lines(findings: Sequence[Mapping[str, Any]]) -> list[str]:
    return [
        f"{f.get('name')} (requests {', '.join(f'#{s}' for s in f.get('seqs') or [])}): "
        f"{f.get('explanation', '')}"
        for f in findings
    ]


def render_junit(report: ProbeReport) -> str:
    """The report as JUnit XML: one ``testcase`` per cell (``http_503[stream]``, class
    ``chaosllm.probe``). A cell that hung or gave a wrong answer has a ``failure``; one
    whose fault never fired is ``skipped``; recovered and failed-cleanly cells pass. Each
    case's ``system-out`` has the cell's findings, its attempts and the program's output."""
    bad = {Verdict.HUNG, Verdict.WRONG_ANSWER}
    failures = sum(1 for r in report.runs if r.verdict in bad)
    skipped = sum(1 for r in report.runs if r.verdict is Verdict.NOT_FIRED)
    total = sum(r.seconds for r in report.runs)
    attributes = {
        "name": "chaosllm probe",
        "tests": str(len(report.runs)),
        "failures": str(failures),
        "errors": "0",
        "skipped": str(skipped),
        "time": f"{total:.3f}",
    }
    root = ET.Element("testsuites", attributes)
    suite = ET.SubElement(root, "testsuite", attributes)
    properties = ET.SubElement(suite, "properties")
    ET.SubElement(properties, "property", name="command", value=_xml_text(" ".join(report.command)))
    for run in report.runs:
        verdict = run.verdict.value if run.verdict else "baseline"
        case = ET.SubElement(
            suite,
            "testcase",
            classname="chaosllm.probe",
            name=_xml_text(f"{run.label}[{run.variant}]"),
            time=f"{run.seconds:.3f}",
        )
        if run.verdict in bad:
            failure = ET.SubElement(
                case,
                "failure",
                type=verdict,
                message=_xml_text(f"{run.label} on the {run.variant} request: {verdict}"),
            )
            failure.text = _xml_text(
                f"{verdict} (exit {run.exit_code}, {run.attempts} requests, "
                f"{run.seconds:.2f} s)\n--- output ---\n{run.stdout}\n"
                f"--- baseline output ---\n{report.baseline.stdout}"
            )
        elif run.verdict is Verdict.NOT_FIRED:
            ET.SubElement(
                case, "skipped", message="the program made no request the fault applies to"
            )
        lines = [f"verdict: {verdict}", f"findings: {len(run.findings)}"]
        lines += [f"  {line}" for line in _finding_lines(run.findings)]
        lines.append("attempts:")
        lines += [f"  {_attempt_line(a)}" for a in run.timeline] or ["  (none)"]
        lines += ["--- stdout ---", run.stdout]
        ET.SubElement(case, "system-out").text = _xml_text("\n".join(lines))
        ET.SubElement(case, "system-err").text = _xml_text(run.stderr[-2000:])
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _attempt_line(attempt: Mapping[str, Any]) -> str:
    kind = "stream" if attempt.get("stream") else "json"
    if attempt.get("status") == 101:
        kind = "session"  # a WebSocket session's turn
    return (
        f"#{attempt['seq']} +{attempt['at']:.3f}s {kind} status={attempt.get('status')} "
        f"fault={attempt.get('fault') or '-'} outcome={attempt.get('outcome')} "
        f"frames={attempt.get('frames')}"
    )


# -- HTML --------------------------------------------------------------------------------

_COLOURS = {
    "recovered": "#1a7f37",
    "failed cleanly": "#9a6700",
    "hung": "#cf222e",
    "wrong answer": "#cf222e",
    "not fired": "#6e7781",
}
_WIDTH, _HEIGHT = 640, 36


def _timeline_svg(run: ProbeRun) -> str:
    """The run's attempts on a time axis (inline SVG): one mark per attempt, red when a
    fault fired on it, green for a 2xx answer without fault, amber otherwise; hovering
    a mark shows the attempt."""
    span = max([run.seconds, *(a["at"] for a in run.timeline), 0.001])
    left, right = 8, _WIDTH - 8
    marks = []
    for attempt in run.timeline:
        x = left + (right - left) * attempt["at"] / span
        status = attempt.get("status")
        colour = (
            "#cf222e"
            if attempt.get("fault")
            else "#1a7f37"
            if isinstance(status, int) and 200 <= status < 300
            else "#9a6700"
        )
        marks.append(
            f'<rect x="{x - 3:.1f}" y="6" width="6" height="16" fill="{colour}">'
            f"<title>{html.escape(_attempt_line(attempt))}</title></rect>"
        )
    end = html.escape(f"{run.seconds:.2f} s")
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{_HEIGHT}" '
        f'viewBox="0 0 {_WIDTH} {_HEIGHT}" role="img" aria-label="attempts over time">'
        f'<line x1="{left}" y1="14" x2="{right}" y2="14" stroke="#d0d7de" stroke-width="2"/>'
        f"{''.join(marks)}"
        f'<text x="{left}" y="33" font-size="10" fill="#57606a">0 s</text>'
        f'<text x="{right}" y="33" font-size="10" fill="#57606a" text-anchor="end">{end}</text>'
        "</svg>"
    )


def _run_details(run: ProbeRun) -> str:
    verdict = run.verdict.value if run.verdict else ""
    findings = "".join(f"<li>{html.escape(line)}</li>" for line in _finding_lines(run.findings))
    attempts = "".join(f"<li>{html.escape(_attempt_line(a))}</li>" for a in run.timeline)
    return (
        f"<details><summary>{html.escape(run.label)} / {html.escape(run.variant or '')}: "
        f"{html.escape(verdict)} (exit {run.exit_code}, {run.attempts} requests, "
        f"{run.seconds:.2f} s, {len(run.findings)} findings)</summary>"
        f"{_timeline_svg(run)}"
        f'<h3>Findings</h3><ul class="findings">{findings or "<li>none</li>"}</ul>'
        f'<h3>Attempts</h3><ol class="attempts">{attempts or "<li>none</li>"}</ol>'
        f"<pre>{html.escape(run.stdout)}\n{html.escape(run.stderr[-2000:])}</pre></details>"
    )


def _script_json(value: Any) -> str:
    """JSON that a ``<script type="application/json">`` element holds as is: no ``<``,
    ``>`` or ``&`` that could end the element early (JSON.parse reads it back)."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_html(report: ProbeReport) -> str:
    """A self-contained HTML report (no external resources): the matrix (each cell with
    its count of findings), then each run with a timeline of its attempts, its findings,
    and the program's output."""
    matrix = report.matrix()
    variants = [v for v in KNOWN_VARIANTS if any(v in row for row in matrix.values())]
    counts = {(r.label, r.variant): len(r.findings) for r in report.runs}
    rows = []
    for fault, row in matrix.items():
        cells = "".join(
            f'<td style="color:{_COLOURS.get(row.get(v, ""), "#000")}">'
            f"{html.escape(row.get(v, ''))}"
            + (
                f' <span class="findings">({counts[fault, v]} findings)</span>'
                if counts.get((fault, v))
                else ""
            )
            + "</td>"
            for v in variants
        )
        rows.append(f"<tr><th>{html.escape(fault)}</th>{cells}</tr>")
    details = "".join(_run_details(r) for r in report.runs)
    command = html.escape(" ".join(report.command))
    data = _script_json(report.to_json())
    head = "".join(f"<th>{html.escape(v)}</th>" for v in variants)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>chaosllm probe: {command}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #d0d7de;padding:4px 10px;text-align:left}}
.findings{{color:#cf222e}}h3{{font-size:1em;margin:.5em 0 .2em}}
pre{{background:#f6f8fa;padding:8px;white-space:pre-wrap}}</style></head>
<body><h1>chaosllm probe</h1><p><code>{command}</code></p>
<table><thead><tr><th>fault</th>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>
<h2>Runs</h2>{details}
<script type="application/json" id="report">{data}</script></body></html>
"""
