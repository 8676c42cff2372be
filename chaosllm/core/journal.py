"""The journal: one entry per provider request, for tests and people to inspect.

An entry pairs what the engine decided about a request (a `JournalRecord`: frozen, and
replaced whole by `Journal.amend` when a proxied answer says more) with what the wire
did with the answer (a `PlanReport`, filled in as the plan executes). Only the engine
writes records; the JSON shape (`JournalEntry.to_json`) is the one the README documents.
"""

from __future__ import annotations

import itertools
import json
import math
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any, NamedTuple

from chaosllm.core.clock import Clock, SystemClock
from chaosllm.core.report import PlanReport
from chaosllm.model import Ending, Framing, ResponsePlan

__all__ = [
    "Journal",
    "JournalEntry",
    "JournalRecord",
    "answer_facts",
    "ending_of",
    "head_status",
]


def head_status(plan: ResponsePlan) -> int | None:
    """The status the client sees: None when no HTTP head is sent at all."""
    return plan.status if plan.send_head else None


def ending_of(plan: ResponsePlan) -> str:
    """How a plan ends the connection, as the journal's ``ending`` names it:
    ``complete`` (a whole HTTP message), ``closed`` (FIN before the message was complete,
    or after bytes that are not HTTP), ``reset`` (RST), ``stalled`` (silence, then FIN),
    ``empty`` (closed without a single byte)."""
    ending = plan.ending
    if ending is Ending.RESET:
        return "reset"
    if ending is Ending.STALL:
        return "stalled"
    if not plan.send_head:
        return "closed" if plan.pieces else "empty"
    if ending is Ending.CLOSE and (
        plan.framing is Framing.CHUNKED or plan.body_length < plan.declared_length
    ):
        return "closed"
    return "complete"


_ERROR_BODY_LIMIT = 64 << 10
"""The largest error body whose ``code`` the journal reads."""


def _seconds(value: str, scale: float) -> float | None:
    try:
        seconds = float(value) / scale
    except ValueError:
        return None  # an HTTP date: not a delay the journal can state
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def answer_facts(plan: ResponsePlan, stream: bool) -> dict[str, Any]:
    """What a journal record says about an answer that is not a plain success (a faulted
    one, an error status): the delay its head asks for (``retry_after``: seconds, from
    ``retry-after-ms`` or ``Retry-After``), the ``code`` of its error envelope
    (``error.code``, else ``error.type``, else ``error.status``) and, for a streaming
    request, how many SSE ``frames`` it holds."""
    facts: dict[str, Any] = {}
    if stream:
        facts["frames"] = plan.frame_count
    if not plan.send_head or plan.status < 400:
        return facts
    headers = {name.lower(): value for name, value in plan.headers}
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        if name in headers:
            seconds = _seconds(headers[name], scale)
            if seconds is not None:
                facts["retry_after"] = seconds
                break
    if plan.body_length <= _ERROR_BODY_LIMIT:
        try:
            body = json.loads(plan.body())
        except ValueError:
            body = None
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):
            for key in ("code", "type", "status"):
                if isinstance(error.get(key), str):
                    facts["code"] = error[key]
                    break
    return facts


class JournalRecord(NamedTuple):
    """What the server decided about one provider request.

    Immutable (a named tuple: building one costs a quarter of a frozen dataclass's, and
    one is built per request); `Journal.amend` replaces it whole."""

    seq: int
    time: float
    monotonic: float
    session: str | None
    method: str
    path: str
    model: str | None
    stream: bool
    digest: str | None
    status: int | None
    """The status of the answer's head; None when no head was sent (an empty reply, a
    reset before any byte, garbage); 0 while a proxied answer is awaited."""
    recording: str | None = None
    match: str | None = None
    score: float | None = None
    miss: bool = False
    error: str | None = None
    fault: Mapping[str, Any] | None = None
    findings: tuple[Mapping[str, Any], ...] = ()
    """What the oracles found about this request (`chaosllm.core.oracle`): request-validator
    defects, trace hint mismatches and changed tool results, schema mismatches."""
    ending: str | None = None
    """How the answer ends the connection (`ending_of`); None while a proxied answer is
    awaited."""
    estimated: tuple[str, ...] = ()
    """Fields of the answer the recording lacked and chaosllm estimated (``usage``)."""
    retry_after: float | None = None
    """The delay (seconds) the answer's head asked for (``retry-after-ms``,
    ``Retry-After``): set for error answers (`answer_facts`)."""
    code: str | None = None
    """The ``code`` of an error answer's envelope (``insufficient_quota``...)."""
    frames: int | None = None
    """How many SSE frames a faulted answer to a streaming request holds (what the client
    gets of it, unless it leaves first: the report's ``frames_sent`` says what was sent)."""
    rate_limited: bool = False
    """The live rate limit (``--rate-limit``) answered: the caller's buckets were empty."""
    tool: str | None = None
    """The tool an MCP ``tools/call`` calls (its ``method`` is the JSON-RPC method)."""
    rpc_id: str | int | None = None
    """The JSON-RPC id of an MCP request (what a ``notifications/cancelled`` names)."""
    cancels: int | None = None
    """A ``notifications/cancelled``: the ``seq`` of the MCP request it cancelled (0: none
    of the session's requests in flight had its ``requestId``)."""
    background: Mapping[str, Any] | None = None
    """A stored response's creation or an operation on it (`chaosllm.core.background`):
    its id, the ``operation`` and the sequence numbers of the events it sent."""

    def to_json(self) -> dict[str, Any]:
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
            "ending": self.ending,
            "recording": self.recording,
            "match": self.match,
            "score": self.score,
            "miss": self.miss,
            "error": self.error,
            "fault": dict(self.fault) if self.fault is not None else None,
            "findings": [dict(f) for f in self.findings],
            "estimated": list(self.estimated),
            "retry_after": self.retry_after,
            "code": self.code,
            "rate_limited": self.rate_limited,
            **({"tool": self.tool} if self.tool is not None else {}),
            **({"rpc_id": self.rpc_id} if self.rpc_id is not None else {}),
            **({"cancels": self.cancels} if self.cancels is not None else {}),
            "background": dict(self.background) if self.background is not None else None,
        }


class JournalEntry:
    """A record and the live report of its answer."""

    __slots__ = ("record", "report")

    def __init__(self, record: JournalRecord, report: PlanReport | None = None) -> None:
        self.record = record
        self.report = report if report is not None else PlanReport()

    @property
    def seq(self) -> int:
        return self.record.seq

    @property
    def session(self) -> str | None:
        return self.record.session

    @property
    def status(self) -> int | None:
        return self.record.status

    @property
    def error(self) -> str | None:
        return self.record.error

    @property
    def fault(self) -> Mapping[str, Any] | None:
        return self.record.fault

    def to_json(self) -> dict[str, Any]:
        report = self.report
        outcome = report.outcome
        return {
            **self.record.to_json(),
            "frames_sent": report.frames_sent,
            "bytes_sent": report.bytes_sent,
            "outcome": outcome.value if outcome is not None else "pending",
            "degraded": report.degraded,
        }

    def __repr__(self) -> str:
        return f"JournalEntry({self.record!r}, {self.report!r})"


class Journal:
    """A bounded, thread-safe list of entries with increasing sequence numbers."""

    def __init__(self, maxlen: int = 10_000, *, clock: Clock | None = None) -> None:
        # Bounded: a long-running server keeps the newest entries. Every entry is a few
        # objects the garbage collector walks; at 100k entries full collections paused
        # the server for up to half a second (benchmarks/).
        self._entries: deque[JournalEntry] = deque(maxlen=maxlen)
        self._counter = itertools.count(1)
        self._lock = threading.Lock()
        self.clock: Clock = clock if clock is not None else SystemClock()

    def add(self, **fields: Any) -> JournalEntry:
        """A new entry with the next sequence number, stamped with the clock's time."""
        findings = fields.pop("findings", ())
        clock = self.clock
        with self._lock:
            record = JournalRecord(
                seq=next(self._counter),
                time=clock.wall(),
                monotonic=clock.monotonic(),
                findings=tuple(findings),
                **fields,
            )
            entry = JournalEntry(record)
            self._entries.append(entry)
            return entry

    def add_like(self, rest: tuple[Any, ...]) -> JournalEntry:
        """A new entry whose record has the next sequence number, the clock's time and
        `rest`, the fields after ``monotonic`` of a `JournalRecord` (another record's
        ``[3:]``): the engine's memo journals a replay repeated as it is."""
        clock = self.clock
        with self._lock:
            record = tuple.__new__(
                JournalRecord, (next(self._counter), clock.wall(), clock.monotonic(), *rest)
            )
            entry = JournalEntry(record)
            self._entries.append(entry)
            return entry

    def amend(self, entry: JournalEntry, **changes: Any) -> None:
        """Replace the entry's record by one with `changes` (a proxied answer arrived)."""
        with self._lock:
            entry.record = entry.record._replace(**changes)

    def entries(self, session: str | None = None, *, settle: float = 0.0) -> list[JournalEntry]:
        """The entries (of one session); with `settle`, first wait up to that many seconds
        for requests still being answered to finish."""
        with self._lock:
            found = [e for e in self._entries if session is None or e.record.session == session]
        if settle > 0:
            deadline = time.monotonic() + settle
            for entry in found:
                if not entry.report.wait(max(0.0, deadline - time.monotonic())):
                    break
        return found

    def last(self, session: str | None, *, within: int = 256) -> JournalEntry | None:
        """The newest entry of `session` among the newest `within` entries, if any."""
        with self._lock:
            for i, entry in enumerate(reversed(self._entries)):
                if i >= within:
                    break
                if entry.record.session == session:
                    return entry
        return None

    def clear(self, session: str | None = None) -> int:
        """Forget every entry (numbering restarts), or only one session's; how many."""
        with self._lock:
            before = len(self._entries)
            if session is None:
                self._entries.clear()
                self._counter = itertools.count(1)
            else:
                kept = [e for e in self._entries if e.record.session != session]
                self._entries = deque(kept, maxlen=self._entries.maxlen)
            return before - len(self._entries)
