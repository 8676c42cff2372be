"""chaosllm benchmarks: one command, one run, ratios against targets.

    python benchmarks/run.py            # full run (~4-5 min on 2 cores)
    python benchmarks/run.py --quick    # ~1 min: shorter cells, fewer samples

What it measures (see benchmarks/README.md for the method):

1. requests/s and p50/p99 latency of a JSON replay and of a 20-frame SSE replay
   through ``chaosllm serve`` on each server (builtin; uvicorn with uvloop and
   with plain asyncio), load from a separate `wrk` process;
2. the same bytes from a bare Starlette app on each same server: chaosllm/bare;
3. aimock (Node.js) serving the same answers, when npm is present: chaosllm/aimock;
4. start-up with 10k recordings (spawn -> "listening on") and `RecordingStore.load`;
5. nearest matching p99 at 100k (``bench_nearest.py``) and the miss path at 10k;
6. throughput with 100 armed non-matching faults vs none; arm+disarm round trip;
7. the full journal's GC pause and p99 while it fills (``journal``);
8. concurrent streams at ``--timing recorded`` (and aimock at the same per-chunk
   delay) and idle keep-alive connections (``concurrency``, ``concurrency.py``);
9. time to first byte through the passthrough proxy with a live fault (``live``);
10. ``chaosllm serve`` against the stack's ceiling (``ceiling.py``: uvloop + httptools
    writing chaosllm's captured bytes), the bare app and aimock, one load (``ceiling``);
11. the ``--server uvicorn`` path in process: DirectFront and the app (``asgi``).

Prints a table of figures, targets and met/not met, and writes
``benchmarks/results/latest.json``. Exit status 0 when it ran (whether or not
every target is met), 2 when it could not (e.g. wrk missing).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import importlib.util
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import aimock
import appcost
import ceiling
import concurrency
import faultbench
import hotpath
import inproc
import live_ttfb
import profiling
import sessions
import workloads
from load import LoadResult, LoadSettings, WrkMissing, require_wrk, run_wrk
from machine import NOISY_PCT, Interference, wait_idle
from servers import (
    BENCH_DIR,
    ServerError,
    ServerProcess,
    chaosllm_argv,
    pin,
    running,
    stop_all,
)

PAYLOADS = ("json", "sse")
ATTEMPTS = 3
_IDLE_BUDGET = [0.0]
"""Seconds the run may still spend waiting for other processes to leave the CPUs."""


def pause_for_idle(limit_s: float = 60.0) -> None:
    """Before re-measuring a disturbed cell: wait for quiet, within the run's budget."""
    budget = min(limit_s, _IDLE_BUDGET[0])
    if budget <= 0:
        return
    waited, others = wait_idle(budget)
    _IDLE_BUDGET[0] -= waited
    if waited > 2.5:
        say(f"      (waited {waited:.0f} s for other processes; now {_pct(others)})")


SESSION = {"X-Chaosllm-Session": "bench"}


# -- results -----------------------------------------------------------------------------


@dataclass
class Figure:
    """One line of the final table."""

    name: str
    value: float | None
    unit: str
    target: str = ""
    met: bool | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "target": self.target or None,
            "met": self.met,
            "note": self.note or None,
        }


@dataclass
class Results:
    meta: dict[str, Any]
    figures: list[Figure] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def add(
        self,
        name: str,
        value: float | None,
        unit: str,
        *,
        at_least: float | None = None,
        at_most: float | None = None,
        note: str = "",
    ) -> Figure:
        target, met = "", None
        if value is not None and at_least is not None:
            target, met = f">= {at_least:g}{unit}", value >= at_least
        elif value is not None and at_most is not None:
            target, met = f"<= {at_most:g}{unit}", value <= at_most
        elif at_least is not None:
            target = f">= {at_least:g}{unit}"
        elif at_most is not None:
            target = f"<= {at_most:g}{unit}"
        figure = Figure(name, value, unit, target, met, note)
        self.figures.append(figure)
        return figure

    def to_json(self) -> dict[str, Any]:
        data = {**self.data, **({"app_cost_us": dict(_COSTS)} if _COSTS else {})}
        return {"meta": self.meta, "figures": [f.to_json() for f in self.figures], **data}


def say(message: str) -> None:
    print(message, flush=True)


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == " req/s":
        return f"{value:,.0f} req/s"
    if unit == " ms" and value < 10:
        return f"{value:.3f} ms"
    if unit == " s":
        return f"{value:.3f} s"
    return f"{value:,.1f}{unit}"


def print_table(figures: Sequence[Figure]) -> None:
    rows = [
        (
            f.name,
            _fmt(f.value, f.unit),
            f.target or "-",
            "met" if f.met else ("NOT MET" if f.met is False else "-"),
            f.note,
        )
        for f in figures
    ]
    head = ("figure", "value", "target", "status", "note")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    line = "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=False)) + "  " + head[4]
    say("")
    say(line)
    say("-" * len(line))
    for row in rows:
        say("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[4])


# -- servers -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerKind:
    """One way of hosting the app: chaosllm's option and the bare app's matching one."""

    label: str
    chaos_args: tuple[str, ...]
    uvloop: bool
    bare_args: tuple[str, ...]


def server_kinds() -> list[ServerKind]:
    kinds = [
        ServerKind("builtin", ("--server", "builtin"), True, ("--server", "builtin")),
        # The pure-Python fallback, on the plain asyncio loop: the builtin server as it was.
        ServerKind("h11", ("--server", "h11"), False, ("--server", "h11", "--no-uvloop")),
    ]
    if importlib.util.find_spec("uvicorn") is None:
        return kinds
    if importlib.util.find_spec("uvloop") is not None:
        kinds.append(
            ServerKind("uvicorn+uvloop", ("--server", "uvicorn"), True, ("--server", "uvicorn"))
        )
    kinds.append(
        ServerKind(
            "uvicorn+asyncio",
            ("--server", "uvicorn"),
            False,
            ("--server", "uvicorn", "--no-uvloop"),
        )
    )
    return kinds


def start_chaosllm(
    kind: ServerKind, recordings: Path
) -> contextlib.AbstractContextManager[ServerProcess]:
    argv = chaosllm_argv(
        ["serve", *kind.chaos_args, "--port", "0", "--recordings", str(recordings)],
        uvloop=kind.uvloop,
    )
    return running(f"chaosllm[{kind.label}]", argv)


def start_bare(
    kind: ServerKind, payload_file: Path
) -> contextlib.AbstractContextManager[ServerProcess]:
    argv = [
        sys.executable,
        str(BENCH_DIR / "bare_app.py"),
        *kind.bare_args,
        "--payloads",
        str(payload_file),
    ]
    return running(f"bare[{kind.label}]", argv)


def write_bare_payloads(path: Path, bodies: dict[str, bytes]) -> None:
    """The bare app's payload file: chaosllm's JSON answer and its stream's frames."""
    frames = [f + "\n\n" for f in bodies["sse"].decode().split("\n\n") if f]
    path.write_text(
        json.dumps({"json": bodies["json"].decode(), "sse_frames": frames}), encoding="utf-8"
    )


@contextlib.contextmanager
def checked_bare(
    kind: ServerKind, payload_file: Path, payloads: workloads.Payloads
) -> Iterator[ServerProcess]:
    """The bare app running on `kind`, its answers checked against the payload file."""
    with start_bare(kind, payload_file) as bare:
        expected = json.loads(payload_file.read_text(encoding="utf-8"))
        check_answer(bare, payloads, "json", expected["json"].encode())
        check_answer(bare, payloads, "sse", "".join(expected["sse_frames"]).encode())
        yield bare


def chat_url(server: ServerProcess) -> str:
    return server.url + "/v1/chat/completions"


def check_answer(
    server: ServerProcess,
    payloads: workloads.Payloads,
    kind: str,
    expected: bytes | None,
    headers: dict[str, str] | None = None,
) -> bytes:
    """One request as wrk sends it: a 200 (a replay, for chaosllm) with 20 frames for SSE."""
    response = workloads.fetch(chat_url(server), payloads.request_file(kind), headers)
    if response.status_code != 200:
        raise ServerError(
            f"{server.name}: {kind} answered {response.status_code}: {response.text[:300]}"
        )
    match = response.headers.get("x-chaosllm-match")
    if server.name.startswith("chaosllm") and match != "exact":
        raise ServerError(f"{server.name}: {kind} was not an exact replay (match {match!r})")
    if kind == "sse":
        frames = workloads.count_frames(response.content)
        if frames != workloads.SSE_FRAMES:
            raise ServerError(
                f"{server.name}: the stream has {frames} frames, not {workloads.SSE_FRAMES}"
            )
    if expected is not None and response.content != expected:
        raise ServerError(f"{server.name}: {kind} body differs from chaosllm's")
    return response.content


def measure(
    server: ServerProcess,
    payloads: workloads.Payloads,
    kind: str,
    settings: LoadSettings,
    headers: dict[str, str] | None = None,
) -> LoadResult:
    """One cell. Re-measured (at most `ATTEMPTS` times in all) while other processes use
    more than `NOISY_PCT` % of a core meanwhile; the least disturbed attempt is kept."""
    best: LoadResult | None = None
    for attempt in range(ATTEMPTS):
        if attempt:
            pause_for_idle()
        if server.name.startswith("chaosllm"):
            faultbench.clear_journal(server.url)
        result = run_wrk(
            chat_url(server), payloads.request_file(kind), settings, headers, pid=server.pid
        )
        if not result.ok:
            raise ServerError(
                f"{server.name}: {kind} load had errors {result.errors}\n{server.tail()}"
            )
        say(
            f"    {server.name:<26} {kind:<4} {result.rps:>9,.0f} req/s  "
            f"p50 {result.p50_ms:7.3f} ms  p99 {result.p99_ms:7.3f} ms  "
            f"server CPU {_pct(result.server_cpu_pct)}  others {_pct(result.other_cpu_pct)}"
            + ("  (noisy" + (", again)" if attempt + 1 < ATTEMPTS else ")") if result.noisy else "")
        )
        if best is None or (result.other_cpu_pct or 0) < (best.other_cpu_pct or 0):
            best = result
        if not result.noisy:
            break
    assert best is not None
    return best


def _pct(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}%"


def _noise(*probes: Interference | LoadResult) -> str:
    """A note when other processes disturbed a figure."""
    worst = max(
        ((p.other_pct if isinstance(p, Interference) else p.other_cpu_pct) or 0.0 for p in probes),
        default=0.0,
    )
    return f"; NOISY: others used {worst:.0f}% CPU" if worst > NOISY_PCT else ""


# -- sections ----------------------------------------------------------------------------


_COSTS: dict[str, float] = {}
_COST_PROBES: list[Interference] = []


def app_costs(payloads: workloads.Payloads) -> dict[str, float]:
    """`appcost.app_costs`, measured once per run."""
    if not _COSTS:
        with Interference() as probe:
            _COSTS.update(appcost.app_costs(payloads))
        _COST_PROBES.append(probe)
        say(f"  in-process app cost, us per request: {_COSTS} (others {_pct(probe.other_pct)})")
    return _COSTS


ASGI_AT_MOST_US = 60.0
"""Issue #22: a JSON replay through the --server uvicorn path, in process (through
DirectFront, and through the whole app: the figure the issue's 108 us is)."""


def asgi_figures(results: Results, payloads: workloads.Payloads) -> None:
    """The in-process cost of the ``--server uvicorn`` path (`appcost`): a provider POST
    through `DirectFront` and through the whole Starlette app, beside the bare app.
    Added once a run (the throughput and asgi sections both ask)."""
    if any(f.name.startswith("in-process ASGI") for f in results.figures):
        return
    costs = app_costs(payloads)
    for p in PAYLOADS:
        front_us, chaos_us, bare_us = (costs[f"{k}/{p}"] for k in ("front", "chaosllm", "bare"))
        results.add(
            f"in-process ASGI (--server uvicorn), {p}: DirectFront us/request",
            front_us,
            " us",
            at_most=ASGI_AT_MOST_US if p == "json" else None,
            note="what uvicorn calls for a provider POST in replay mode (no server, "
            "no socket)" + _noise(*_COST_PROBES),
        )
        results.add(
            f"in-process ASGI (--server uvicorn), {p}: Starlette app us/request",
            chaos_us,
            " us",
            at_most=ASGI_AT_MOST_US if p == "json" else None,
            note=f"the whole app, as any other request; bare Starlette {bare_us:.1f} us: "
            f"chaosllm adds {chaos_us - bare_us:.1f} us" + _noise(*_COST_PROBES),
        )


def throughput(
    results: Results, payloads: workloads.Payloads, tmp: Path, settings: LoadSettings, profile: bool
) -> dict[str, dict[str, LoadResult]]:
    """Sections 1 and 2: chaosllm and the bare app on every server, JSON and SSE."""
    cells: dict[str, dict[str, LoadResult]] = {}
    baseline_file = tmp / "bare-payloads.json"
    profiles: dict[str, Any] = {}
    for kind in server_kinds():
        say(f"  server {kind.label}")
        with start_chaosllm(kind, payloads.recordings) as chaos:
            bodies = {p: check_answer(chaos, payloads, p, None) for p in PAYLOADS}
            if not baseline_file.exists():
                write_bare_payloads(baseline_file, bodies)
            cells[f"chaosllm/{kind.label}"] = {
                p: measure(chaos, payloads, p, settings) for p in PAYLOADS
            }
            if profile:
                for p in PAYLOADS:
                    prof = profiling.profile_server(
                        chaos.pid, chat_url(chaos), payloads.request_file(p), settings
                    )
                    profiles[f"chaosllm/{kind.label}/{p}"] = prof
        with checked_bare(kind, baseline_file, payloads) as bare:
            cells[f"bare/{kind.label}"] = {
                p: measure(bare, payloads, p, settings) for p in PAYLOADS
            }
    for kind in server_kinds():
        for p in PAYLOADS:
            chaos_cell = cells[f"chaosllm/{kind.label}"][p]
            bare_cell = cells[f"bare/{kind.label}"][p]
            results.add(
                f"{kind.label} {p}: chaosllm req/s",
                chaos_cell.rps,
                " req/s",
                note=f"p50 {chaos_cell.p50_ms:.2f} ms, p99 {chaos_cell.p99_ms:.2f} ms, "
                f"server CPU {_pct(chaos_cell.server_cpu_pct)}",
            )
            results.add(
                f"{kind.label} {p}: bare Starlette req/s",
                bare_cell.rps,
                " req/s",
                note=f"p50 {bare_cell.p50_ms:.2f} ms, p99 {bare_cell.p99_ms:.2f} ms, "
                f"server CPU {_pct(bare_cell.server_cpu_pct)}",
            )
            results.add(
                f"{kind.label} {p}: chaosllm / bare",
                chaos_cell.rps / bare_cell.rps,
                "x",
                at_least=0.8,
                note=_noise(chaos_cell, bare_cell).removeprefix("; "),
            )
    with Interference() as hot_probe:
        hot = hotpath.hot_path_costs(payloads)
    say(f"  in-process default server path, us per request: {hot}")
    results.add(
        "in-process, json: DirectHandler + engine us/request",
        hot["direct/json"],
        " us",
        at_most=15.0,
        note="what the default server runs per replayed request (no socket); "
        f"Engine.handle alone {hot['engine/json']:.1f} us" + _noise(hot_probe),
    )
    results.add(
        "in-process, json with a session: DirectHandler + engine us/request",
        hot["direct/json+session"],
        " us",
        note="the recording served again to one session: fresh ids" + _noise(hot_probe),
    )
    results.add(
        "in-process, sse: DirectHandler + engine us/request",
        hot["direct/sse"],
        " us",
        note="20 frames" + _noise(hot_probe),
    )
    results.data["hot_path_us"] = hot
    asgi_figures(results, payloads)
    results.data["throughput"] = {
        name: {p: r.to_json() for p, r in cell.items()} for name, cell in cells.items()
    }
    if profiles:
        results.data["profiles"] = {
            name: prof.to_json() if isinstance(prof, profiling.Profile) else prof
            for name, prof in profiles.items()
        }
        for name, prof in profiles.items():
            say(f"  profile {name}:")
            for line in prof.lines(12) if isinstance(prof, profiling.Profile) else [f"  {prof}"]:
                say(line)
    return cells


def _aimock(results: Results, figure: str, key: str) -> aimock.Aimock | None:
    """aimock ready to run, or None with why not said and recorded as `figure` (and
    under `key` in the results' data)."""
    found = aimock.install_aimock()
    if isinstance(found, str):
        say(f"  aimock skipped: {found}")
        results.add(figure, None, "", note=f"skipped: {found}")
        results.data[key] = {"skipped": found}
        return None
    return found


@contextlib.contextmanager
def checked_aimock(
    found: aimock.Aimock, payloads: workloads.Payloads, tmp: Path
) -> Iterator[tuple[ServerProcess, int]]:
    """aimock running with the benchmark's two answers (its stream cut into 20 frames),
    its answers checked; and its ``--chunk-size``."""
    chunk = aimock.chunk_size_for(workloads.STREAM_ANSWER, workloads.SSE_FRAMES - 3)
    fixtures = aimock.write_fixtures(
        tmp / "aimock-fixtures",
        {
            payloads.json_question: payloads.json_answer,
            workloads.STREAM_QUESTION: workloads.STREAM_ANSWER,
        },
    )
    say(f"  aimock {found.version} (node {found.node}, --chunk-size {chunk})")
    with running("aimock", found.argv(fixtures, chunk)) as server:
        for p in PAYLOADS:
            check_answer(server, payloads, p, None)
        yield server, chunk


def versus_aimock(
    results: Results,
    payloads: workloads.Payloads,
    tmp: Path,
    settings: LoadSettings,
    cells: dict[str, dict[str, LoadResult]],
) -> None:
    """Section 3: aimock serving the same answers; chaosllm's default server (and its
    fastest) against it."""
    found = _aimock(results, "aimock comparison", "aimock")
    if found is None:
        return
    with checked_aimock(found, payloads, tmp) as (server, chunk):
        aim = {p: measure(server, payloads, p, settings) for p in PAYLOADS}
    data: dict[str, Any] = {
        "version": found.version,
        "chunk_size": chunk,
        "cells": {p: r.to_json() for p, r in aim.items()},
    }
    for p in PAYLOADS:
        best_name, best = max(
            ((name, cell[p]) for name, cell in cells.items() if name.startswith("chaosllm/")),
            key=lambda item: item[1].rps,
        )
        results.add(
            f"{p}: aimock req/s",
            aim[p].rps,
            " req/s",
            note=f"p50 {aim[p].p50_ms:.2f} ms, p99 {aim[p].p99_ms:.2f} ms, "
            f"server CPU {_pct(aim[p].server_cpu_pct)}",
        )
        # The target is the default server's (`chaosllm serve` with no flags: builtin).
        default_name = f"chaosllm/{server_kinds()[0].label}"
        default = cells.get(default_name, {}).get(p)
        if default is not None:
            results.add(
                f"{p}: chaosllm serve (default server) / aimock",
                default.rps / aim[p].rps,
                "x",
                at_least=1.25,
                note=f"fastest chaosllm server: {best_name.split('/')[1]}, "
                f"{best.rps / aim[p].rps:.2f}x" + _noise(default, aim[p]),
            )
        data[f"ratio_{p}"] = {
            "chaosllm": default_name,
            "ratio": None if default is None else round(default.rps / aim[p].rps, 3),
            "fastest": best_name,
            "fastest_ratio": round(best.rps / aim[p].rps, 3),
        }
    results.data["aimock"] = data


CEILING_AT_LEAST = 0.4
"""Issue #22: chaosllm serve's share of the stack's capacity, JSON and 20-frame SSE."""


def ceiling_section(
    results: Results,
    payloads: workloads.Payloads,
    tmp: Path,
    settings: LoadSettings,
    rounds: int = 2,
) -> None:
    """Issue #22: the stack's ceiling (`ceiling.py`: uvloop + httptools writing the bytes
    chaosllm answered, captured from it first) beside ``chaosllm serve`` (the default
    server), the bare Starlette app on that server and aimock, in one run, the same
    load: chaosllm / ceiling, bare / ceiling and chaosllm / aimock, JSON and SSE."""
    kind = server_kinds()[0]  # builtin: what `chaosllm serve` runs with no flags
    out = tmp / "ceiling"
    out.mkdir(exist_ok=True)
    say(
        f"  chaosllm serve ({kind.label}), the ceiling, bare Starlette, aimock: "
        f"wrk -t{settings.threads} -c{settings.connections}"
    )
    responses = {p: out / f"{p}.http" for p in PAYLOADS}
    # Every server up at once (idle, they cost nothing), then loaded one at a time, round
    # after round: each ratio compares cells measured minutes apart at most, in
    # alternating order, and each server keeps its least disturbed cell.
    with contextlib.ExitStack() as up:
        chaos = up.enter_context(start_chaosllm(kind, payloads.recordings))
        bodies = {p: check_answer(chaos, payloads, p, None) for p in PAYLOADS}
        for p in PAYLOADS:
            responses[p].write_bytes(ceiling.capture(chat_url(chaos), payloads.request_file(p)))
        servers: dict[str, dict[str, ServerProcess]] = {
            "ceiling": {},
            "chaosllm": dict.fromkeys(PAYLOADS, chaos),
        }
        for p in PAYLOADS:
            argv = [sys.executable, str(BENCH_DIR / "ceiling.py"), "--response", str(responses[p])]
            servers["ceiling"][p] = up.enter_context(running(f"ceiling[{p}]", argv))
            check_answer(servers["ceiling"][p], payloads, p, bodies[p])
        write_bare_payloads(out / "bare-payloads.json", bodies)
        bare = up.enter_context(checked_bare(kind, out / "bare-payloads.json", payloads))
        servers["bare"] = dict.fromkeys(PAYLOADS, bare)
        found = _aimock(results, "ceiling: aimock", "ceiling_aimock")
        if found is not None:
            aim = up.enter_context(checked_aimock(found, payloads, tmp))[0]
            servers["aimock"] = dict.fromkeys(PAYLOADS, aim)
        cells: dict[str, dict[str, LoadResult]] = {name: {} for name in servers}
        for turn in range(rounds):
            say(f"  round {turn + 1} of {rounds}")
            for p in PAYLOADS:
                for name in list(servers)[:: -1 if turn % 2 else 1]:
                    cell = measure(servers[name][p], payloads, p, settings)
                    kept = cells[name].get(p)
                    if kept is None or (cell.other_cpu_pct or 0) < (kept.other_cpu_pct or 0):
                        cells[name][p] = cell
    labels = {
        "ceiling": "uvloop + httptools, fixed bytes",
        "chaosllm": f"chaosllm serve ({kind.label})",
        "bare": f"bare Starlette ({kind.label})",
        "aimock": "aimock",
    }
    ratio_names = {"chaosllm": "chaosllm serve", "bare": "bare Starlette"}
    ratios: dict[str, float] = {}
    for p in PAYLOADS:
        for name in (n for n in labels if n in cells):
            r = cells[name][p]
            note = (
                f"p50 {r.p50_ms:.2f} ms, p99 {r.p99_ms:.2f} ms, server CPU {_pct(r.server_cpu_pct)}"
            )
            if name == "ceiling" and not r.noisy and (r.server_cpu_pct or 100.0) < 90.0:
                note += " (below a core: the load generator may be the limit)"
            results.add(f"ceiling {p}: {labels[name]} req/s", r.rps, " req/s", note=note)
        # (numerator, denominator, target, note): the ratios of this payload's cells
        pairs = [
            ("chaosllm", "ceiling", CEILING_AT_LEAST, ""),
            ("bare", "ceiling", None, "what Starlette on the same server leaves"),
            ("chaosllm", "aimock", 1.25, ""),
        ]
        for over, under, target, why in pairs:
            if over not in cells or under not in cells:
                continue
            a, b = cells[over][p], cells[under][p]
            ratios[f"{over}/{under}/{p}"] = a.rps / b.rps
            results.add(
                f"ceiling {p}: {ratio_names[over]} / {under}",
                a.rps / b.rps,
                "x",
                at_least=target,
                note=(why + _noise(a, b)).removeprefix("; "),
            )
    results.data["ceiling"] = {
        "server": kind.label,
        "wrk": {"threads": settings.threads, "connections": settings.connections},
        "rounds": rounds,
        "response_bytes": {p: responses[p].stat().st_size for p in PAYLOADS},
        "cells": {name: {p: r.to_json() for p, r in cell.items()} for name, cell in cells.items()},
        "ratios": {name: round(value, 3) for name, value in ratios.items()},
    }


def startup(results: Results, tmp: Path, count: int, runs: int) -> Path:
    """Section 4: start-up with `count` synthetic recordings: the first start (every file
    parsed and digested; the load cache off) and a start again over the same files (the
    load cache, `chaosllm.store.cache`, filled by a first start), both with Python's
    bytecode cache on, as an installed chaosllm has it."""
    start = time.perf_counter()
    synthetic = workloads.synthetic_recordings(tmp, count)
    say(f"  wrote {count} synthetic recordings in {time.perf_counter() - start:.1f} s")
    cold_env = inproc.startup_env(tmp, cache=False)
    warm_env = inproc.startup_env(tmp, cache=True)
    shipped = workloads.SIMPLE_CHAT.parent.parent
    inproc.startup_times(shipped, 1, _shipped_count(), env=cold_env)  # compiles the bytecode
    with Interference() as spawn_probe:
        floor = inproc.startup_times(shipped, runs, _shipped_count(), env=cold_env)
        cold = inproc.startup_times(synthetic, runs, count, env=cold_env)
        inproc.startup_times(synthetic, 1, count, env=warm_env)  # fills the load cache
        warm = inproc.startup_times(synthetic, runs, count, env=warm_env)
    with Interference() as load_probe:
        load = inproc.store_load_times(synthetic, runs, count)
        cached = inproc.store_load_times(synthetic, runs, count, tmp / "load-cache-inproc")
    say(
        f"  spawn -> listening: shipped {_ms(floor)}, {count} recordings {_ms(cold)} "
        f"(load cache off), {_ms(warm)} (load cache filled); RecordingStore.load "
        f"{_ms(load)}, from the cache {_ms(cached)}"
    )
    label = f"{count // 1000}k" if count >= 1000 else str(count)
    results.add(
        f"start-up, {label} recordings: spawn -> listening, started before",
        inproc.median(warm),
        " s",
        at_most=0.5,
        note=f"median of {runs}; the load cache filled by an earlier start; with the "
        f"shipped recordings {inproc.median(floor):.3f} s" + _noise(spawn_probe),
    )
    results.add(
        f"start-up, {label} recordings: spawn -> listening, first start",
        inproc.median(cold),
        " s",
        note=f"median of {runs}; every file parsed and digested (CHAOSLLM_NO_CACHE=1)"
        + _noise(spawn_probe),
    )
    results.add(
        f"RecordingStore.load, {label} recordings",
        inproc.median(load),
        " s",
        note=f"fresh interpreter, median of {runs}, no load cache; from the load cache "
        f"{inproc.median(cached):.3f} s" + _noise(load_probe),
    )
    results.data["startup"] = {
        "recordings": count,
        "spawn_to_listening_cached_s": warm,
        "spawn_to_listening_first_s": cold,
        "shipped_spawn_to_listening_s": floor,
        "store_load_s": load,
        "store_load_cached_s": cached,
    }
    return synthetic


def _shipped_count() -> int:
    return sum(1 for _ in (workloads.SIMPLE_CHAT.parent.parent).rglob("*.json"))


def _ms(values: Sequence[float]) -> str:
    return "/".join(f"{v * 1000:.0f}" for v in values) + " ms"


def nearest(results: Results, synthetic: Path, n: int, queries: int, miss_queries: int) -> None:
    """Section 5: bench_nearest.py at `n`, and the matcher's miss path on the synthetic set."""
    with Interference() as probe:
        bench = inproc.run_bench_nearest(n, queries)
    for line in bench.lines:
        say(f"    | {line}")
    label = f"{n // 1000}k" if n >= 1000 else str(n)
    row = bench.rows["all"]
    results.add(
        f"nearest query p99 at {label} (bench_nearest.py, all)",
        row["p99_ms"],
        " ms",
        at_most=5.0,
        note=f"p50 {row['p50_ms']:.2f} ms, max {row['max_ms']:.2f} ms, "
        f"{int(row['n'])} queries" + _noise(probe),
    )
    worst = max((r for k, r in bench.rows.items() if k != "all"), key=lambda r: r["p99_ms"])
    worst_name = next(k for k, r in bench.rows.items() if r is worst)
    results.add(
        f"nearest query p99 at {label}, worst kind ({worst_name})",
        worst["p99_ms"],
        " ms",
        at_most=5.0,
        note=_noise(probe).removeprefix("; "),
    )
    with Interference() as miss_probe:
        miss = inproc.miss_path(synthetic, miss_queries)
    m = miss.to_json()
    say(
        f"  miss path at {miss.recordings}: index build {miss.index_build_s:.2f} s, "
        f"match->NoMatch p50 {m['match_miss']['p50_ms']} ms p99 {m['match_miss']['p99_ms']} ms, "
        f"explain_miss p50 {m['explain_miss']['p50_ms']} ms p99 {m['explain_miss']['p99_ms']} ms"
    )
    rlabel = f"{miss.recordings // 1000}k"
    results.add(
        f"miss path at {rlabel}: match() -> NoMatch p99",
        m["match_miss"]["p99_ms"],
        " ms",
        note=f"p50 {m['match_miss']['p50_ms']} ms; {miss.misses} misses" + _noise(miss_probe),
    )
    results.add(
        f"miss path at {rlabel}: explain_miss p99",
        m["explain_miss"]["p99_ms"],
        " ms",
        note=f"p50 {m['explain_miss']['p50_ms']} ms",
    )
    results.add(
        f"nearest index build at {rlabel} (first miss / Matcher.warm)",
        miss.index_build_s,
        " s",
        note="lazy: not part of start-up",
    )
    results.data["nearest"] = bench.to_json()
    results.data["miss_path"] = m


def faults(
    results: Results,
    payloads: workloads.Payloads,
    tmp: Path,
    settings: LoadSettings,
    rounds: int,
    iterations: int,
) -> None:
    """Section 6: the fault board under load, and arm/disarm round trips."""
    builtin = server_kinds()[0]
    runs: dict[str, list[LoadResult]] = {"empty": [], "session": [], "model": []}
    with start_chaosllm(builtin, payloads.recordings) as server:
        check_answer(server, payloads, "json", None, SESSION)
        for round_ in range(rounds):
            for by in list(runs) if round_ % 2 == 0 else list(reversed(runs)):
                if by != "empty":
                    faultbench.arm_non_matching(server.url, by, 100)
                runs[by].append(measure(server, payloads, "json", settings, SESSION))
                armed, fired = faultbench.board_state(server.url)
                if fired or armed != (0 if by == "empty" else 100):
                    raise ServerError(f"fault board: {armed} armed, {fired} fired after {by}")
                faultbench.disarm_all(server.url)
        with Interference([server.pid]) as trip_probe:
            trips = {"builtin": faultbench.round_trips(server.url, iterations)}
            raw = {"builtin": faultbench.raw_round_trips(server.url, iterations)}
    uvicorn_kinds = [k for k in server_kinds() if k.label.startswith("uvicorn")]
    if uvicorn_kinds:
        with start_chaosllm(uvicorn_kinds[0], payloads.recordings) as server:
            trips[uvicorn_kinds[0].label] = faultbench.round_trips(server.url, iterations)
            raw[uvicorn_kinds[0].label] = faultbench.raw_round_trips(server.url, iterations)
    floors: dict[str, list[float]] = {}
    raw_floors: dict[str, list[float]] = {}
    payload_file = tmp / "bare-payloads.json"
    if not payload_file.exists():
        payload_file.write_text(json.dumps({"json": "{}", "sse_frames": []}), encoding="utf-8")
    for kind in [builtin, *uvicorn_kinds[:1]]:
        with start_bare(kind, payload_file) as bare:
            floors[kind.label] = faultbench.round_trips(bare.url, iterations)
            raw_floors[kind.label] = faultbench.raw_round_trips(bare.url, iterations)
    take = faultbench.take_cost_us()
    say(f"  FaultBoard.take, request matching none of 100 armed faults: {take} us (in-process)")
    costs = app_costs(payloads)

    def mean_rps(cells: list[LoadResult]) -> float:
        return sum(c.rps for c in cells) / len(cells)

    empty = mean_rps(runs["empty"])
    per_request_us = 1e6 / empty
    for by in ("session", "model"):
        # Each round measures the three boards back to back: compare within rounds, and
        # leave out the rounds that other processes disturbed when there are clean ones.
        pairs = list(zip(runs["empty"], runs[by], strict=True))
        clean = [(e, f) for e, f in pairs if not e.noisy and not f.noisy] or pairs
        ratios = sorted(f.rps / e.rps for e, f in clean)
        ratio = ratios[len(ratios) // 2]
        delta = costs[f"chaosllm/json+100 faults ({by})"] - costs["chaosllm/json"]
        expected = per_request_us / (per_request_us + max(0.0, delta))
        results.add(
            f"builtin json: 100 non-matching faults (by {by}) / none",
            ratio,
            "x",
            at_least=0.95,
            note=f"median of {len(clean)} round(s) "
            f"({', '.join(f'{r:.2f}' for r in ratios)})"
            + _noise(*(c for pair in clean for c in pair)),
        )
        results.add(
            f"  same, predicted from the in-process app cost (by {by})",
            expected,
            "x",
            at_least=0.95,
            note=f"100 faults add {delta:.1f} us to the app's "
            f"{costs['chaosllm/json']:.1f} us per request (take() "
            f"{take[by]:.1f} us); at {empty:,.0f} req/s that is {expected:.3f}x"
            + _noise(*_COST_PROBES),
        )
    for label, times in trips.items():
        floor = floors.get(label)
        note = (
            f"floor (bare Starlette, same client) p50 {inproc.percentile(floor, 50):.3f} "
            f"p99 {inproc.percentile(floor, 99):.3f} ms"
            if floor
            else ""
        )
        results.add(
            f"{label}: arm + disarm round trip p50",
            inproc.percentile(times, 50),
            " ms",
            at_most=1.0,
            note=note,
        )
        results.add(
            f"{label}: arm + disarm round trip p99",
            inproc.percentile(times, 99),
            " ms",
            at_most=1.0,
            note=f"{iterations} iterations, httpx keep-alive"
            + (_noise(trip_probe) if label == "builtin" else ""),
        )
        raw_times, raw_floor = raw[label], raw_floors.get(label)
        results.add(
            f"{label}: arm + disarm, raw-socket client, p50",
            inproc.percentile(raw_times, 50),
            " ms",
            note=f"p99 {inproc.percentile(raw_times, 99):.3f} ms"
            + (f"; bare floor p50 {inproc.percentile(raw_floor, 50):.3f} ms" if raw_floor else ""),
        )

    def stats(t: list[float]) -> dict[str, float]:
        return {
            "p50": inproc.percentile(t, 50),
            "p90": inproc.percentile(t, 90),
            "p99": inproc.percentile(t, 99),
            "max": max(t),
            "n": len(t),
        }

    results.data["faults"] = {
        "throughput": {by: [c.to_json() for c in cells] for by, cells in runs.items()},
        "take_us_in_process": take,
        "round_trip_ms": {label: stats(t) for label, t in trips.items()},
        "round_trip_floor_ms": {label: stats(t) for label, t in floors.items()},
        "raw_round_trip_ms": {label: stats(t) for label, t in raw.items()},
        "raw_round_trip_floor_ms": {label: stats(t) for label, t in raw_floors.items()},
    }


def soak(results: Results, payloads: workloads.Payloads, settings: LoadSettings, fill: int) -> None:
    """The journal keeps the last 100k requests; every entry is ~8 GC-tracked objects, so
    a full collection (which stops the server) grows with it. Measure the collection
    in-process, and (unless `fill` is 0) p99 on builtin as the journal fills up."""
    gc_cost = inproc.journal_gc()
    say(
        f"  gc.collect() with the journal at {gc_cost.sizes}: "
        f"{[round(t, 1) for t in gc_cost.collect_ms]} ms "
        f"({gc_cost.objects_per_entry:.0f} tracked objects per entry)"
    )
    results.add(
        "full GC pause, journal at 100k entries (in-process)",
        gc_cost.collect_ms[-1],
        " ms",
        note=f"{gc_cost.collect_ms[0]:.1f} ms when empty; "
        f"{gc_cost.objects_per_entry:.0f} GC objects per entry",
    )
    data: dict[str, Any] = {"gc": gc_cost.to_json()}
    if fill:
        window = LoadSettings(
            duration_s=5, warmup_s=0, threads=settings.threads, connections=settings.connections
        )
        windows: list[dict[str, Any]] = []
        builtin = server_kinds()[0]
        argv = chaosllm_argv(
            ["serve", *builtin.chaos_args, "--port", "0", "--recordings", str(payloads.recordings)],
            gc_stats=True,
        )
        with running("chaosllm[builtin, gc stats]", argv) as server:
            check_answer(server, payloads, "json", None)
            sent = 0
            while sent < fill and len(windows) < 12:
                cell = run_wrk(chat_url(server), payloads.json_request, window)
                sent += cell.requests
                windows.append({"journal_after": min(sent, 100_000), **cell.to_json()})
                say(
                    f"    journal ~{min(sent, 100_000):>7,}: {cell.rps:7,.0f} req/s  "
                    f"p50 {cell.p50_ms:6.2f} ms  p99 {cell.p99_ms:7.2f} ms  "
                    f"max {cell.max_ms:7.1f} ms"
                )
        server.stop()
        gc_lines = [
            json.loads(line.removeprefix("GCSTATS "))
            for line in server.output
            if line.startswith("GCSTATS ")
        ]
        full = next((g for g in gc_lines if g["generation"] == 2), None)
        if full:
            say(
                f"    server: {full['collections']} full (gen 2) collections, "
                f"{full['total_ms']:.0f} ms in total, longest {full['max_ms']:.0f} ms"
            )
            results.add(
                "builtin soak: longest full GC pause in the server",
                full["max_ms"],
                " ms",
                note=f"{full['collections']} gen-2 collections, "
                f"{full['total_ms']:.0f} ms in {len(windows) * 5} s",
            )
        data["server_gc"] = gc_lines
        first, last = windows[0], windows[-1]
        results.add(
            "builtin json p99, journal filling (first 5 s)",
            first["p99_ms"],
            " ms",
            note=f"{first['rps']:,.0f} req/s",
        )
        results.add(
            "builtin json p99, journal full (100k, last 5 s)",
            last["p99_ms"],
            " ms",
            note=f"{last['rps']:,.0f} req/s; max {last['max_ms']:.0f} ms",
        )
        data["windows"] = windows
    results.data["journal"] = data


# -- main --------------------------------------------------------------------------------


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _host_port(url: str) -> tuple[str, int]:
    host, _, port = url.removeprefix("http://").rpartition(":")
    return host, int(port)


def _fresh_request_ms(host: str, port: int) -> float:
    start = time.perf_counter()
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        while sock.recv(65536):
            pass
    return (time.perf_counter() - start) * 1000


def concurrency_section(results: Results, tmp: Path, quick: bool) -> None:
    """Section 7: concurrent streams at recorded timing; idle keep-alive connections.
    The clients run in another process (`concurrency.py`)."""
    streams, idle = (200, 2000) if quick else (500, 5000)
    recordings = concurrency.timed_recording(tmp)
    argv = chaosllm_argv(
        ["serve", "--port", "0", "--recordings", str(recordings), "--timing", "recorded"]
    )
    client = [sys.executable, str(Path(__file__).with_name("concurrency.py"))]
    request_file = str(tmp / "timed-request.json")

    def measure_gaps(name: str, server_argv: list[str]) -> tuple[dict[str, Any], str]:
        with running(name, server_argv) as server:
            host, port = _host_port(server.url)
            with Interference([server.pid]) as probe:
                out = subprocess.run(
                    [*client, "gaps", host, str(port), str(streams), request_file],
                    capture_output=True,
                    text=True,
                    timeout=180,
                    check=True,
                )
        found: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
        say(f"  {name}: {streams} streams: {found} (others {_pct(probe.other_pct)})")
        return found, _noise(probe)

    gaps, noise = measure_gaps("chaosllm[timed]", argv)
    data_gaps = gaps["data_gaps"]
    results.add(
        f"{streams} concurrent {concurrency.FRAMES}-frame streams, --timing recorded "
        f"({concurrency.GAP_MS:g} ms gaps): p99 |observed - recorded gap|",
        gaps["p99_ms"],
        " ms",
        at_most=10.0,
        note=f"{gaps['complete']}/{streams} complete; p50 {gaps['p50_ms']} ms, "
        f"max {gaps['max_ms']} ms; over the {data_gaps['gaps_per_stream']} gaps before "
        f"[DONE] (as aimock is measured): p99 {data_gaps['p99_ms']} ms" + noise,
    )
    results.data["recorded_timing"] = gaps
    concurrency_versus_aimock(results, tmp, streams, data_gaps, measure_gaps)
    argv = chaosllm_argv(["serve", "--port", "0"])
    with running("chaosllm[idle]", argv) as server:
        host, port = _host_port(server.url)
        before = _rss_bytes(server.pid)
        holder = subprocess.Popen(
            [*client, "idle", host, str(port), str(idle)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None and holder.stdin is not None
            held = json.loads(holder.stdout.readline())["held"]
            after = _rss_bytes(server.pid)
            fresh = min(_fresh_request_ms(host, port) for _ in range(5))
            holder.stdin.write("\n")
            holder.stdin.flush()
        finally:
            try:
                holder.wait(timeout=60)
            except subprocess.TimeoutExpired:
                holder.kill()
    growth = (after - before) / 1e6
    say(f"  {held} idle keep-alive connections: RSS +{growth:.1f} MB; fresh request {fresh:.1f} ms")
    results.add(
        f"{idle} idle keep-alive connections: server RSS growth",
        round(growth, 1),
        " MB",
        at_most=100.0,
        note=f"{held} held",
    )
    results.add(
        f"a request on a fresh connection with {idle} idle ones held",
        round(fresh, 2),
        " ms",
        at_most=50.0,
        note="best of 5, GET /health",
    )
    results.data["idle_connections"] = {"held": held, "rss_growth_mb": growth, "fresh_ms": fresh}


def concurrency_versus_aimock(
    results: Results,
    tmp: Path,
    streams: int,
    chaos_gaps: dict[str, Any],
    measure_gaps: Callable[[str, list[str]], tuple[dict[str, Any], str]],
) -> None:
    """The concurrency section, aimock beside it: the same streams from aimock, 20 frames,
    its data chunks 50 ms apart, told in its two ways (``--latency 50``; a fixture's
    ``recordedTimings``). aimock writes ``[DONE]`` right after the finish chunk and has no
    setting to delay it, so both servers' figures here are over the gaps before it."""
    found = _aimock(results, "aimock at 50 ms per chunk", "recorded_timing_aimock")
    if found is None:
        return
    gap = concurrency.GAP_MS
    variants = {
        f"--latency {gap:g}": (False, ["--latency", f"{gap:g}"]),
        f"recordedTimings {gap:g} ms": (True, []),
    }
    data: dict[str, Any] = {"version": found.version}
    for label, (recorded, extra) in variants.items():
        fixtures = concurrency.aimock_fixtures(tmp, recorded_timings=recorded)
        argv = [*found.argv(fixtures, concurrency.AIMOCK_CHUNK), *extra]
        aim, noise = measure_gaps(f"aimock[{label}]", argv)
        data[label] = aim
        aim_gaps = aim["data_gaps"]
        results.add(
            f"aimock {found.version}, {label}: {streams} concurrent streams, p99 "
            f"|observed - expected gap| over the {aim_gaps['gaps_per_stream']} gaps before "
            "[DONE]",
            aim_gaps["p99_ms"],
            " ms",
            note=f"{aim['complete']}/{streams} complete; p50 {aim_gaps['p50_ms']} ms, max "
            f"{aim_gaps['max_ms']} ms; [DONE] follows the finish chunk at once (observed gap "
            f"p50 {aim['done_gap_p50_ms']} ms): aimock cannot delay it" + noise,
        )
        chaos_p99, aim_p99 = chaos_gaps["p99_ms"], aim_gaps["p99_ms"]
        results.add(
            f"  p99 gap error, chaosllm / aimock ({label})",
            chaos_p99 / aim_p99 if chaos_p99 is not None and aim_p99 else None,
            "x",
            note=f"lower is better: chaosllm {chaos_p99} ms, aimock {aim_p99} ms "
            "(the same gaps, the same client)",
        )
    results.data["recorded_timing_aimock"] = data


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str] = {}
    for name in (
        "chaosllm",
        "starlette",
        "anyio",
        "h11",
        "uvicorn",
        "httptools",
        "uvloop",
        "httpx",
    ):
        with contextlib.suppress(PackageNotFoundError):
            found[name] = version(name)
    return found


def _pinning(requested: bool) -> tuple[frozenset[int], frozenset[int]] | None:
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not requested or len(cpus) < 2:
        return None
    return frozenset(cpus[:1]), frozenset(cpus[1:])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="chaosllm benchmarks (see benchmarks/README.md)")
    parser.add_argument("--quick", action="store_true", help="~1 min: shorter cells, fewer runs")
    parser.add_argument("--duration", type=int, help="seconds measured per cell (default 5)")
    parser.add_argument("--warmup", type=int, help="seconds of warm-up per cell (default 2)")
    parser.add_argument(
        "--threads", type=int, help="wrk threads (default 1; 2 in the ceiling section)"
    )
    parser.add_argument("--connections", type=int, default=32, help="wrk connections (32)")
    parser.add_argument(
        "--no-pin", action="store_true", help="do not pin servers and load to separate CPUs"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also sample each chaosllm server with py-spy under load",
    )
    section_names = (
        "throughput",
        "aimock",
        "ceiling",
        "asgi",
        "startup",
        "nearest",
        "faults",
        "journal",
        "concurrency",
        "live",
        "sessions",
    )
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=section_names,
        help="skip a section (repeatable)",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        choices=section_names,
        help="run only this section (repeatable; aimock needs throughput too)",
    )
    parser.add_argument(
        "--wait-idle",
        type=int,
        default=0,
        metavar="SECONDS",
        help="seconds the run may spend waiting for other processes to leave "
        "the CPUs alone: before it starts, and before re-measuring a "
        "disturbed cell (at most 60 s each time); default 0",
    )
    parser.add_argument("--output", type=Path, default=BENCH_DIR / "results" / "latest.json")
    args = parser.parse_args(argv)
    try:
        require_wrk()
    except WrkMissing as exc:
        print(f"benchmarks/run.py: {exc}", file=sys.stderr)
        return 2
    quick = args.quick
    settings = LoadSettings(
        duration_s=args.duration or (2 if quick else 5),
        warmup_s=args.warmup if args.warmup is not None else (1 if quick else 2),
        threads=args.threads or 1,
        connections=args.connections,
    )
    pins = _pinning(not args.no_pin)
    if pins is not None:
        pin(*pins)
    meta = {
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "quick": quick,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "versions": _versions(),
        "load": {
            "tool": "wrk",
            "threads": settings.threads,
            "connections": settings.connections,
            "duration_s": settings.duration_s,
            "warmup_s": settings.warmup_s,
            "keep_alive": True,
        },
        "pinning": {"server_cpus": sorted(pins[0]), "load_cpus": sorted(pins[1])} if pins else None,
        "sse_answer": "rendered by the OpenAI provider from an assembled body (no recorded "
        "chunks): role + 17 content deltas + finish + [DONE] = 20 frames",
    }
    _IDLE_BUDGET[0] = float(args.wait_idle)
    waited, others = wait_idle(_IDLE_BUDGET[0])
    _IDLE_BUDGET[0] -= waited
    meta["others_cpu_pct_before"] = others
    meta["waited_for_idle_s"] = round(waited, 1)
    say(
        f"other processes used {_pct(others)} of a CPU just before the run"
        + (f" (after waiting {waited:.0f} s)" if waited > 2.5 else "")
        + (" -- the figures may be disturbed" if others and others > NOISY_PCT else "")
    )
    results = Results(meta=meta)
    began = time.perf_counter()
    sections: list[tuple[str, Callable[[], object]]] = []
    with tempfile.TemporaryDirectory(prefix="chaosllm-bench-") as tmp_name:
        tmp = Path(tmp_name)
        payloads = workloads.make_bench_recordings(tmp)
        cells: dict[str, dict[str, LoadResult]] = {}
        synthetic: list[Path] = []

        def run_throughput() -> None:
            cells.update(throughput(results, payloads, tmp, settings, args.profile))

        def run_aimock() -> None:
            if cells:
                versus_aimock(results, payloads, tmp, settings, cells)
            else:
                say("  aimock skipped: needs the throughput section")

        def run_ceiling() -> None:  # issue #22: chaosllm serve / the stack's ceiling
            ceiling_section(
                results,
                payloads,
                tmp,
                dataclasses.replace(settings, threads=args.threads or 2),
                1 if quick else 2,
            )

        def run_asgi() -> None:  # issue #22: the --server uvicorn path, in process
            asgi_figures(results, payloads)

        def run_startup() -> None:
            synthetic.append(startup(results, tmp, 10_000, 2 if quick else 3))

        def run_nearest() -> None:
            if not synthetic:
                synthetic.append(workloads.synthetic_recordings(tmp, 10_000))
            nearest(results, synthetic[0], 100_000, 300 if quick else 5000, 100 if quick else 400)

        def run_faults() -> None:
            faults(
                results,
                payloads,
                tmp,
                LoadSettings(
                    duration_s=settings.duration_s if quick else 3,
                    warmup_s=1,
                    threads=settings.threads,
                    connections=settings.connections,
                ),
                1 if quick else 3,
                300 if quick else 1000,
            )

        def run_concurrency() -> None:
            concurrency_section(results, tmp, quick)

        def run_live() -> None:  # issue #16: a live stream's fault does not move its first byte
            for label, ms in live_ttfb.measure(3 if quick else 9).items():
                results.add(f"passthrough TTFB, 20 frames 50 ms apart, {label}", ms, " ms")

        def run_sessions() -> None:  # issue #26: replayed WebSocket sessions, recorded timing
            argv = chaosllm_argv(["serve", "--port", "0", "--timing", "recorded"])
            with running("chaosllm sessions", argv) as server:
                found = sessions.measure(server.url.replace("http://", "ws://"), 200)
            say(f"  200 sessions: {found}")
            results.add(
                "200 concurrent replayed sessions, event gap error p99",
                found["p99_ms"],
                " ms",
                at_most=10.0,
            )

        def run_soak() -> None:
            soak(results, payloads, settings, 0 if quick else 100_000)

        sections = [
            ("throughput", run_throughput),
            ("aimock", run_aimock),
            ("ceiling", run_ceiling),
            ("asgi", run_asgi),
            ("startup", run_startup),
            ("nearest", run_nearest),
            ("faults", run_faults),
            ("journal", run_soak),
            ("concurrency", run_concurrency),
            ("live", run_live),
            ("sessions", run_sessions),
        ]
        try:
            for name, section in sections:
                if name in args.skip or (args.only and name not in args.only):
                    continue
                say(f"== {name} ({time.perf_counter() - began:.0f} s)")
                section()
        except KeyboardInterrupt:
            say("interrupted: stopping the servers")
            stop_all()
            return 130
        finally:
            stop_all()
    meta["seconds"] = round(time.perf_counter() - began, 1)
    print_table(results.figures)
    missed = [f for f in results.figures if f.met is False]
    say(
        f"\n{len([f for f in results.figures if f.met])} targets met, {len(missed)} not met; "
        f"{meta['seconds']:.0f} s"
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results.to_json(), indent=2) + "\n", encoding="utf-8")
    say(f"results written to {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
