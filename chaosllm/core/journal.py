"""The journal: one entry per provider request, for tests and people to inspect."""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from chaosllm.model import PlanReport

__all__ = ["Journal", "JournalEntry"]


@dataclass
class JournalEntry:
    seq: int
    time: float
    monotonic: float
    session: str | None
    method: str
    path: str
    model: str | None
    stream: bool
    digest: str | None
    status: int
    recording: str | None = None
    match: str | None = None
    score: float | None = None
    miss: bool = False
    error: str | None = None
    fault: dict[str, Any] | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)
    """What the oracles found about this request (`chaosllm.core.oracle`): request-validator
    defects, trace hint mismatches and changed tool results, schema mismatches."""
    report: PlanReport = field(default_factory=PlanReport)

    def to_json(self) -> dict[str, Any]:
        outcome = self.report.outcome
        return {
            "seq": self.seq,
            "time": self.time,
            "monotonic": self.monotonic,
            "session": self.session,
            "method": self.method,
            "path": self.path,
            "model": self.model,
            "stream": self.stream,
            "digest": self.digest,
            "status": self.status,
            "recording": self.recording,
            "match": self.match,
            "score": self.score,
            "miss": self.miss,
            "error": self.error,
            "fault": self.fault,
            "findings": self.findings,
            "frames_sent": self.report.frames_sent,
            "bytes_sent": self.report.bytes_sent,
            "outcome": outcome.value if outcome is not None else "pending",
            "degraded": self.report.degraded,
        }


class Journal:
    """A bounded, thread-safe list of entries with increasing sequence numbers."""

    def __init__(self, maxlen: int = 10_000) -> None:
        # Bounded: a long-running server keeps the newest entries. Every entry is a few
        # objects the garbage collector walks; at 100k entries full collections paused
        # the server for up to half a second (benchmarks/).
        self._entries: deque[JournalEntry] = deque(maxlen=maxlen)
        self._counter = itertools.count(1)
        self._lock = threading.Lock()

    def add(self, **fields: Any) -> JournalEntry:
        with self._lock:
            entry = JournalEntry(
                seq=next(self._counter), time=time.time(), monotonic=time.monotonic(), **fields
            )
            self._entries.append(entry)
            return entry

    def entries(self, session: str | None = None, *, settle: float = 0.0) -> list[JournalEntry]:
        """The entries (of one session); with `settle`, first wait up to that many seconds
        for requests still being answered to finish."""
        with self._lock:
            found = [e for e in self._entries if session is None or e.session == session]
        if settle > 0:
            deadline = time.monotonic() + settle
            for entry in found:
                if not entry.report.wait(max(0.0, deadline - time.monotonic())):
                    break
        return found

    def clear(self, session: str | None = None) -> int:
        """Forget every entry (numbering restarts), or only one session's; how many."""
        with self._lock:
            before = len(self._entries)
            if session is None:
                self._entries.clear()
                self._counter = itertools.count(1)
            else:
                kept = [e for e in self._entries if e.session != session]
                self._entries = deque(kept, maxlen=self._entries.maxlen)
            return before - len(self._entries)
