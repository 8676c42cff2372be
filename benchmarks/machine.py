"""How much of the machine something else used while we measured.

On a shared machine (other test suites, CI neighbours) a figure can be off
because another process took CPU time. `Interference` reads the machine-wide
busy time (``/proc/stat``) around a measurement and subtracts what this
process, its reaped children (wrk, subprocesses) and the given live processes
(the servers) used: what is left is someone else's. Linux only; elsewhere it
reports nothing.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

__all__ = ["NOISY_PCT", "Interference", "process_cpu_seconds", "wait_idle"]

NOISY_PCT = 25.0
"""Other processes using more than this (% of one core) make a figure suspect."""

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a live process so far, None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _machine_busy_seconds() -> float | None:
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = fh.readline().split()
    except OSError:
        return None
    # user nice system idle iowait irq softirq steal ...
    values = [int(v) for v in fields[1:9]]
    busy = values[0] + values[1] + values[2] + values[5] + values[6] + values[7]
    return busy / _TICK


def _own_seconds() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


class Interference:
    """``with Interference(pids) as probe: ...``; then ``probe.other_pct`` (% of one
    core used by processes that are not ours) and ``probe.pid_pct`` (the live pids)."""

    def __init__(self, pids: Iterable[int] = ()) -> None:
        self.pids = list(pids)
        self.other_pct: float | None = None
        self.pid_pct: float | None = None
        self._start = 0.0
        self._machine: float | None = None
        self._own = 0.0
        self._pid_cpu: list[float | None] = []

    def __enter__(self) -> Interference:
        self._pid_cpu = [process_cpu_seconds(pid) for pid in self.pids]
        self._own = _own_seconds()
        self._machine = _machine_busy_seconds()
        self._start = time.perf_counter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        elapsed = time.perf_counter() - self._start
        machine = _machine_busy_seconds()
        own = _own_seconds() - self._own
        pid_used = 0.0
        known = True
        for pid, before in zip(self.pids, self._pid_cpu, strict=True):
            after = process_cpu_seconds(pid)
            if before is None or after is None:
                known = False
                continue
            pid_used += after - before
        if elapsed <= 0:
            return
        if self.pids and known:
            self.pid_pct = round(100 * pid_used / elapsed, 1)
        if machine is not None and self._machine is not None and known:
            other = (machine - self._machine) - own - pid_used
            self.other_pct = round(max(0.0, 100 * other / elapsed), 1)

    @property
    def noisy(self) -> bool:
        return self.other_pct is not None and self.other_pct > NOISY_PCT


def wait_idle(budget_s: float, window_s: float = 2.0) -> tuple[float, float | None]:
    """Wait (at most `budget_s`) until other processes leave the CPUs alone for one
    `window_s` window; (seconds waited, others' % of a core in the last window)."""
    start = time.monotonic()
    while True:
        with Interference() as probe:
            time.sleep(window_s)
        waited = time.monotonic() - start
        if not probe.noisy or waited >= budget_s:
            return waited, probe.other_pct
