"""`chaosllm probe -- CMD`: a resilience matrix for a client program.

The program runs once without faults (the baseline), then once per fault and
per variant (the fault armed on the first JSON request, or on the first
streaming request), each time against a fresh server, with `OPENAI_BASE_URL`, `OPENAI_API_KEY`,
`ANTHROPIC_BASE_URL` and `ANTHROPIC_API_KEY`, `GOOGLE_GEMINI_BASE_URL` and
`GEMINI_API_KEY` (google-genai), `AWS_ENDPOINT_URL_BEDROCK_RUNTIME` with dummy AWS
credentials and `AWS_REGION`/`AWS_DEFAULT_REGION` (boto3) pointing at it (any protocol
chaosllm speaks). Each run is classified:

- **recovered**: exit status 0 and the same output as the baseline;
- **wrong answer**: exit status 0 and other output (a truncated or empty answer
  taken for a real one, a duplicated tool call...);
- **failed cleanly**: a non-zero exit status within the time limit;
- **hung**: still running at the time limit (then killed);
- **not fired**: the program made no request the fault applies to.
"""

from __future__ import annotations

import enum
import html
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaosllm.errors import ChaosLLMError
from chaosllm.faults.spec import FAULT_TYPES, parse_fault_spec
from chaosllm.server import ChaosServer
from chaosllm.store.profiles import load_profile

__all__ = [
    "BaselineFailed",
    "ProbeReport",
    "ProbeRun",
    "Verdict",
    "default_faults",
    "probe",
    "render_html",
    "render_matrix",
]

VARIANTS = ("json", "stream")


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


def default_faults(*, stall_ms: float, types: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """One fault of each of `types` (default: every catalogue type) with its default
    parameters, except that a fault which leaves the client with nothing arriving (a
    stall: `FaultType.silence_param`) lasts `stall_ms`, longer than the run's time limit:
    a client without a timeout hangs."""
    faults: list[dict[str, Any]] = []
    for name in FAULT_TYPES if types is None else types:
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
            spec["match"] = {**(spec.get("match") or {}), "stream": variant == "stream"}
            server.arm(spec)
        child_env = {
            **os.environ,
            **(env or {}),
            "OPENAI_BASE_URL": server.base_url,
            "OPENAI_API_KEY": "sk-chaosllm-probe",
            "ANTHROPIC_BASE_URL": server.url,
            "ANTHROPIC_API_KEY": "sk-ant-chaosllm-probe",
            "GOOGLE_GEMINI_BASE_URL": server.url,
            "GOOGLE_VERTEX_BASE_URL": server.url,
            "GEMINI_API_KEY": "chaosllm-gemini-probe",
            "AZURE_OPENAI_ENDPOINT": server.url,
            "AZURE_OPENAI_API_KEY": "chaosllm-azure-probe",
            "OPENAI_API_VERSION": "2024-10-21",
            "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": server.url,
            "AWS_ACCESS_KEY_ID": "chaosllm-aws-probe",
            "AWS_SECRET_ACCESS_KEY": "chaosllm-aws-probe",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "PYTHONUNBUFFERED": "1",
        }
        started = time.monotonic()
        proc = subprocess.Popen(
            list(command),
            env=child_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
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
    )


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
    """Run `command` without faults, then once per fault and variant; classify each run."""
    if not command:
        raise ValueError("no command to probe")
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        raise ValueError(f"unknown variant {bad[0] if bad else None!r}; use json, stream")
    if profile is not None:
        specs = [s.to_json() for s in load_profile(profile).specs]
    elif faults is not None:
        specs = [parse_fault_spec(dict(f)).to_json() for f in faults]
    else:
        specs = default_faults(stall_ms=timeout * 2000)
    options: dict[str, Any] = {"seed": seed}
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

    work = [(spec, variant) for spec in specs for variant in variants]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        report.runs = list(pool.map(one, work))
    return report


def render_matrix(report: ProbeReport) -> str:
    """The matrix for a terminal: one row per fault, one column per variant."""
    matrix = report.matrix()
    variants = [v for v in VARIANTS if any(v in row for row in matrix.values())]
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


_COLOURS = {
    "recovered": "#1a7f37",
    "failed cleanly": "#9a6700",
    "hung": "#cf222e",
    "wrong answer": "#cf222e",
    "not fired": "#6e7781",
}


def render_html(report: ProbeReport) -> str:
    """A self-contained HTML report (no external resources)."""
    matrix = report.matrix()
    variants = [v for v in VARIANTS if any(v in row for row in matrix.values())]
    rows = []
    for fault, row in matrix.items():
        cells = "".join(
            f'<td style="color:{_COLOURS.get(row.get(v, ""), "#000")}">'
            f"{html.escape(row.get(v, ''))}</td>"
            for v in variants
        )
        rows.append(f"<tr><th>{html.escape(fault)}</th>{cells}</tr>")
    details = "".join(
        f"<details><summary>{html.escape(r.label)} / {html.escape(r.variant or '')}: "
        f"{html.escape(r.verdict.value if r.verdict else '')} (exit {r.exit_code}, "
        f"{r.attempts} requests, {r.seconds:.2f} s)</summary><pre>"
        f"{html.escape(r.stdout)}\n{html.escape(r.stderr[-2000:])}</pre></details>"
        for r in report.runs
    )
    command = html.escape(" ".join(report.command))
    data = html.escape(json.dumps(report.to_json()))
    head = "".join(f"<th>{html.escape(v)}</th>" for v in variants)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>chaosllm probe: {command}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #d0d7de;padding:4px 10px;text-align:left}}
pre{{background:#f6f8fa;padding:8px;white-space:pre-wrap}}</style></head>
<body><h1>chaosllm probe</h1><p><code>{command}</code></p>
<table><thead><tr><th>fault</th>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>
<h2>Runs</h2>{details}
<script type="application/json" id="report">{data}</script></body></html>
"""
