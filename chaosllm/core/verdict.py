"""Verdicts: what the server saw a client do about the failures it was given.

Pure: journal entries (or bare records) and the fault board's history of firings in, a
list of `Finding` out, no I/O, no clock of its own (every time is the journal's, which
the engine's `Clock` stamped: in-memory tests move a `ManualClock` and never sleep).

Theory of operation. The attempts of one **logical call** are the requests of one
session with the same request digest (a retry sends the same body: the SDKs' own
retries, a client's loop, a stream asked for again), in journal order; a complete
success ends a call, and the same request after it is a duplicate that starts the next
one. Each attempt's answer is classed, from what the journal says the server did:

- **success**: a 2xx head and a complete message, unfaulted (or faulted by a fault that
  still delivers the answer: ``latency``, ``slow_stream``), the client not gone first;
- **retryable**: a fault whose catalogue entry says ``retryable`` (a 503, a 429, a drop, a
  reset, an empty reply, garbage, a clean truncation, a stall), else a 429, 5xx or 529,
  else an answer whose connection did not end complete;
- **non-retryable**: a 400, 401, 403, 404 or 422, or an error whose code (or fault type)
  is one of the catalogue's `NON_RETRYABLE_CLASSES` (``insufficient_quota`` is one,
  although a 429);
- **neither**: an answer that came, damaged (an error in a 200, an empty answer, tool
  arguments that are not JSON: asking again and failing cleanly are both fine), another
  status (408, 409...), an answer the client left before it ended, one still awaited.

The findings (`FINDING_NAMES`), each with the ``seq`` numbers of the journal entries it
rests on and a one-line explanation:

``retry_after_ignored``
    a retry sooner than the Retry-After its previous attempt was given (the fault's
    ``retry_after`` or the header the answer carried), by more than
    `Tolerances.retry_after_tolerance`.
``no_backoff``
    two retries in a row after retryable failures that gave no Retry-After, both gaps
    under `Tolerances.no_backoff_floor` and the second no longer than the first (within
    `Tolerances.timing_noise`).
``retry_storm``
    more than `Tolerances.storm_max_attempts` attempts of one logical call, or more than
    `Tolerances.storm_max_per_second` retries of one session within one second.
``retried_non_retryable``
    a retry after a non-retryable failure.
``gave_up_early``
    a call whose last attempt failed retryably after fewer than `Tolerances.min_attempts`
    attempts (unless its Retry-After was beyond `Tolerances.max_retry_after`).
``duplicate_after_success``
    the same request again after a complete success.
``stream_restarted_mid_answer``
    an attempt after a streaming attempt that delivered frames and did not succeed
    (whether the client then deduplicated what it had shown is its own business; the
    restart is stated).

MCP requests (``/mcp/{server}``) are no model calls: the findings above leave them out,
and these are about them (`_mcp_findings`):

``tool_executed_twice_after_retry``
    a ``tools/call`` with the same arguments (the same digest) again, in the same
    session, after one had been answered with a result: the agent ran the tool twice
    (typically after retrying the model call that asked for it).
``no_reinitialize_after_session_lost``
    a request to an MCP server whose session was lost (a 404 on its session id), and the
    session's next request to that server is not ``initialize``.
``tool_error_hidden_from_model``
    a tool error (an ``isError`` result), then a model request of the session that does
    not carry its text (the engine's MCP hooks note it as the request's finding).
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from chaosllm.core.journal import JournalEntry, JournalRecord
from chaosllm.core.report import Outcome
from chaosllm.core.resumption import (
    POLLED_TOO_FAST,
    RE_ASKED_INSTEAD_OF_RESUMED,
    RESUMED_FROM_WRONG_CURSOR,
    recovered,
)
from chaosllm.core.resumption import findings as resumption_findings
from chaosllm.errors import ConfigError
from chaosllm.faults.board import Fired
from chaosllm.faults.catalogue import FAULT_TYPES, NON_RETRYABLE_CLASSES, retryable_type

__all__ = ["FINDING_NAMES", "Finding", "Tolerances", "findings", "format_findings"]

RETRY_AFTER_IGNORED = "retry_after_ignored"
NO_BACKOFF = "no_backoff"
RETRY_STORM = "retry_storm"
RETRIED_NON_RETRYABLE = "retried_non_retryable"
GAVE_UP_EARLY = "gave_up_early"
DUPLICATE_AFTER_SUCCESS = "duplicate_after_success"
STREAM_RESTARTED_MID_ANSWER = "stream_restarted_mid_answer"
TOOL_EXECUTED_TWICE_AFTER_RETRY = "tool_executed_twice_after_retry"
NO_REINITIALIZE_AFTER_SESSION_LOST = "no_reinitialize_after_session_lost"
TOOL_ERROR_HIDDEN_FROM_MODEL = "tool_error_hidden_from_model"

FINDING_NAMES = (
    RETRY_AFTER_IGNORED,
    NO_BACKOFF,
    RETRY_STORM,
    RETRIED_NON_RETRYABLE,
    GAVE_UP_EARLY,
    DUPLICATE_AFTER_SUCCESS,
    STREAM_RESTARTED_MID_ANSWER,
    TOOL_EXECUTED_TWICE_AFTER_RETRY,
    NO_REINITIALIZE_AFTER_SESSION_LOST,
    TOOL_ERROR_HIDDEN_FROM_MODEL,
    *(RE_ASKED_INSTEAD_OF_RESUMED, RESUMED_FROM_WRONG_CURSOR, POLLED_TOO_FAST),
)
"""Every finding's name, in the spec's order."""

NON_RETRYABLE_STATUSES = frozenset({400, 401, 403, 404, 422})
"""Statuses no retry cures: the request itself is wrong (or not allowed)."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing the client did about a failure that it should not have."""

    name: str
    """One of `FINDING_NAMES`."""
    seqs: tuple[int, ...]
    """The journal entries (their ``seq``) it rests on, in order."""
    explanation: str
    """One line saying what was seen."""
    session: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "seqs": list(self.seqs),
            "explanation": self.explanation,
            "session": self.session,
        }

    def __str__(self) -> str:
        where = f" [session {self.session}]" if self.session is not None else ""
        return f"{self.name}{where}: {self.explanation}"


@dataclass(frozen=True, slots=True)
class Tolerances:
    """How much slack a client gets before a finding is stated (seconds, counts)."""

    retry_after_tolerance: float = 0.02
    """How much sooner than Retry-After a retry may come (clock granularity, a client's
    rounding); the server measures the gap from its own answer, so an honouring client is
    never early."""
    no_backoff_floor: float = 0.25
    """Retry gaps under this are too short to be a backoff unless they grow."""
    timing_noise: float = 0.01
    """How much longer a gap may be than the one before it and still count as no
    longer (scheduling noise)."""
    storm_max_attempts: int = 10
    """The most attempts of one logical call that are not a storm."""
    storm_max_per_second: float = 10.0
    """The most retries of one session within any one second that are not a storm."""
    min_attempts: int = 2
    """A call whose last attempt failed retryably, with fewer attempts than this, gave
    up early (2: at least one retry is expected)."""
    max_retry_after: float = 60.0
    """A Retry-After longer than this excuses giving up (the ``openai`` SDK ignores
    longer ones too)."""
    min_poll_interval: float = 1.0
    """Polls of one stored response closer than this are ``polled_too_fast`` (half the
    2 s of OpenAI's background guide)."""

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            whole = item.type in ("int", int)
            if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
                kind = "an integer" if whole else "a number"
                raise ConfigError(f"tolerance {item.name} must be {kind}, got {value!r}")
            if whole and value < 1:
                raise ConfigError(f"tolerance {item.name} must be >= 1, got {value!r}")
            if not whole and not (math.isfinite(value) and value >= 0):
                raise ConfigError(
                    f"tolerance {item.name} must be a finite number >= 0, got {value!r}"
                )

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(item.name for item in fields(cls))

    def with_(self, **changes: Any) -> Tolerances:
        """These tolerances with some changed; `ConfigError` for an unknown name or a bad
        value."""
        unknown = sorted(set(changes) - set(self.names()))
        if unknown:
            raise ConfigError(f"no tolerance {unknown[0]!r}; valid: {', '.join(self.names())}")
        return replace(self, **changes)

    def with_text(self, items: Iterable[tuple[str, str]]) -> Tolerances:
        """These tolerances with some set from text (query parameters: ``name=value``);
        `ConfigError` for an unknown name or a value that is not a number of the kind."""
        changes: dict[str, Any] = {}
        kinds = {item.name: item.type for item in fields(self)}
        for name, text in items:
            if name not in kinds:
                raise ConfigError(f"no tolerance {name!r}; valid: {', '.join(self.names())}")
            whole = kinds[name] in ("int", int)
            try:
                changes[name] = int(text) if whole else float(text)
            except ValueError:
                kind = "an integer" if whole else "a number"
                raise ConfigError(f"tolerance {name} must be {kind}, got {text!r}") from None
        return self.with_(**changes)

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.names()}


class _Kind(enum.Enum):
    SUCCESS = "success"
    RETRYABLE = "retryable"
    NON_RETRYABLE = "non-retryable"
    NEITHER = "neither"


@dataclass(frozen=True, slots=True)
class _Attempt:
    seq: int
    session: str | None
    digest: str
    time: float
    stream: bool
    kind: _Kind
    what: str
    """What the answer was, for explanations (``503``, ``http_429 (429)``...)."""
    retry_after: float | None
    frames: int


def _retry_after(record: JournalRecord, fault: Mapping[str, Any] | None) -> float | None:
    if record.retry_after is not None:
        return record.retry_after
    params = fault.get("params") if fault is not None else None
    value = params.get("retry_after") if isinstance(params, Mapping) else None
    if value is None and fault is not None:
        value = fault.get("retry_after")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return None


def _by_status(status: int) -> _Kind:
    if 200 <= status < 300:
        return _Kind.SUCCESS
    if status == 429 or 500 <= status <= 599:
        return _Kind.RETRYABLE
    if status in NON_RETRYABLE_STATUSES:
        return _Kind.NON_RETRYABLE
    return _Kind.NEITHER


def _kind(
    record: JournalRecord, fault_type: str | None, outcome: Outcome | None
) -> tuple[_Kind, str]:
    status, ending = record.status, record.ending
    shown = str(status) if status is not None else f"no head ({ending})"
    if record.code is not None and record.code in NON_RETRYABLE_CLASSES:
        return _Kind.NON_RETRYABLE, f"{shown} {record.code}"
    entry = FAULT_TYPES.get(fault_type) if fault_type is not None else None
    if fault_type is not None and not (entry is not None and entry.delivers_answer):
        shown = f"{fault_type} ({shown})"
        retryable = retryable_type(fault_type)
        if retryable is not None:
            return (_Kind.RETRYABLE if retryable else _Kind.NON_RETRYABLE), shown
        if status is not None and status >= 300:
            return _by_status(status), shown
        if status is None or ending not in (None, "complete"):
            return _Kind.RETRYABLE, shown
        return _Kind.NEITHER, shown
    if status == 0 or ending is None or outcome is Outcome.CLIENT_GONE:
        return _Kind.NEITHER, shown  # still awaited, or the client left first
    if status is None or ending != "complete":
        return _Kind.RETRYABLE, shown
    return _by_status(status), shown


def _attempt(item: JournalEntry | JournalRecord, fired: Mapping[int, Fired]) -> _Attempt | None:
    if isinstance(item, JournalEntry):
        record, report = item.record, item.report
    else:
        record, report = item, None
    if record.digest is None:
        return None  # a body that could not be read: no call to be the same as
    if record.background is not None and record.background.get("operation") != "create":
        return None  # polls and resumes repeat by design (`chaosllm.core.resumption`)
    fault = record.fault
    if fault is None and record.seq in fired:
        spec = fired[record.seq].spec
        fault = {**spec.to_json(), "params": spec.effective_params()}
    fault_type = fault.get("type") if fault is not None else None
    outcome = report.outcome if report is not None else None
    kind, what = _kind(record, fault_type if isinstance(fault_type, str) else None, outcome)
    if report is not None and outcome is not None:
        frames = report.frames_sent
    else:
        frames = record.frames or 0
    return _Attempt(
        seq=record.seq,
        session=record.session,
        digest=record.digest,
        time=record.monotonic,
        stream=record.stream,
        kind=kind,
        what=what,
        retry_after=_retry_after(record, fault),
        frames=frames if record.stream else 0,
    )


def _s(seconds: float) -> str:
    return f"{seconds:.3f} s"


def _calls(attempts: Sequence[_Attempt]) -> tuple[list[list[_Attempt]], list[Finding]]:
    """The logical calls of one session's attempts (in journal order), and the
    duplicates after a success that split them."""
    open_calls: dict[str, list[_Attempt]] = {}
    calls: list[list[_Attempt]] = []
    found: list[Finding] = []
    succeeded: dict[str, _Attempt] = {}
    for attempt in attempts:
        call = open_calls.get(attempt.digest)
        if call is None:
            before = succeeded.pop(attempt.digest, None)
            if before is not None:
                found.append(
                    Finding(
                        DUPLICATE_AFTER_SUCCESS,
                        (before.seq, attempt.seq),
                        f"#{attempt.seq} sent again the request #{before.seq} had been "
                        f"answered completely, {_s(attempt.time - before.time)} later",
                        attempt.session,
                    )
                )
            call = open_calls[attempt.digest] = []
            calls.append(call)
        call.append(attempt)
        if attempt.kind is _Kind.SUCCESS:
            del open_calls[attempt.digest]
            succeeded[attempt.digest] = attempt
    return calls, found


def _retries(call: Sequence[_Attempt], tolerances: Tolerances) -> list[Finding]:
    """The findings about each retry of one call, against the attempt before it."""
    found: list[Finding] = []
    session = call[0].session
    for before, retry in itertools.pairwise(call):
        gap = retry.time - before.time
        wait = before.retry_after
        if wait is not None and gap + tolerances.retry_after_tolerance < wait:
            found.append(
                Finding(
                    RETRY_AFTER_IGNORED,
                    (before.seq, retry.seq),
                    f"#{retry.seq} retried {_s(gap)} after #{before.seq}, whose answer "
                    f"({before.what}) said Retry-After {wait:g} s",
                    session,
                )
            )
        if before.kind is _Kind.NON_RETRYABLE:
            found.append(
                Finding(
                    RETRIED_NON_RETRYABLE,
                    (before.seq, retry.seq),
                    f"#{retry.seq} repeated #{before.seq}, whose answer ({before.what}) no "
                    "retry cures",
                    session,
                )
            )
        if before.stream and before.frames > 0 and before.kind is not _Kind.SUCCESS:
            frames = "frame" if before.frames == 1 else "frames"
            found.append(
                Finding(
                    STREAM_RESTARTED_MID_ANSWER,
                    (before.seq, retry.seq),
                    f"#{retry.seq} asked again for the stream #{before.seq} had delivered "
                    f"{before.frames} {frames} of ({before.what})",
                    session,
                )
            )
    return found


def _no_backoff(call: Sequence[_Attempt], tolerances: Tolerances) -> list[Finding]:
    floor, noise = tolerances.no_backoff_floor, tolerances.timing_noise
    for a, b, c in zip(call, call[1:], call[2:], strict=False):
        if not all(x.kind is _Kind.RETRYABLE and x.retry_after is None for x in (a, b)):
            continue  # b and c retry retryable failures that set no wait
        first, second = b.time - a.time, c.time - b.time
        if first < floor and second < floor and second <= first + noise:
            return [
                Finding(
                    NO_BACKOFF,
                    (a.seq, b.seq, c.seq),
                    f"#{b.seq} and #{c.seq} retried retryable failures ({a.what}, "
                    f"{b.what}) {_s(first)} and {_s(second)} after them: the gaps do not "
                    f"grow and stay under {floor:g} s",
                    a.session,
                )
            ]
    return []


def _storms(calls: Sequence[Sequence[_Attempt]], tolerances: Tolerances) -> list[Finding]:
    found: list[Finding] = []
    retries: list[_Attempt] = []
    for call in calls:
        retries.extend(call[1:])
        if len(call) > tolerances.storm_max_attempts:
            found.append(
                Finding(
                    RETRY_STORM,
                    tuple(a.seq for a in call),
                    f"{len(call)} attempts of one call (#{call[0].seq} to #{call[-1].seq}) "
                    f"in {_s(call[-1].time - call[0].time)}, more than "
                    f"{tolerances.storm_max_attempts}",
                    call[0].session,
                )
            )
    retries.sort(key=lambda a: a.seq)
    best: tuple[int, int] | None = None
    start = 0
    for end, retry in enumerate(retries):
        while retry.time - retries[start].time >= 1.0:
            start += 1
        if end - start + 1 > tolerances.storm_max_per_second and (
            best is None or end - start > best[1] - best[0]
        ):
            best = (start, end)
    if best is not None:
        window = retries[best[0] : best[1] + 1]
        found.append(
            Finding(
                RETRY_STORM,
                tuple(a.seq for a in window),
                f"{len(window)} retries within {_s(window[-1].time - window[0].time)} "
                f"(#{window[0].seq} to #{window[-1].seq}), more than "
                f"{tolerances.storm_max_per_second:g} per second",
                window[0].session,
            )
        )
    return found


def _gave_up(call: Sequence[_Attempt], tolerances: Tolerances) -> list[Finding]:
    last = call[-1]
    if last.kind is not _Kind.RETRYABLE or len(call) >= tolerances.min_attempts:
        return []
    if last.retry_after is not None and last.retry_after > tolerances.max_retry_after:
        return []
    tries = "attempt" if len(call) == 1 else "attempts"
    return [
        Finding(
            GAVE_UP_EARLY,
            tuple(a.seq for a in call),
            f"#{last.seq} failed ({last.what}), which a retry can cure, and the client "
            f"never sent it again ({len(call)} {tries})",
            last.session,
        )
    ]


def findings(
    records: Iterable[JournalEntry | JournalRecord],
    fired: Iterable[Fired] = (),
    tolerances: Tolerances = Tolerances(),
) -> list[Finding]:
    """The findings about the clients' behaviour in `records` (journal entries, whose
    reports say what the wire sent, or bare records), per session, ordered by the first
    entry each rests on. `fired` (the fault board's history) fills in the fault of an
    entry that does not name one."""
    by_seq = {f.request_seq: f for f in fired if f.request_seq is not None}
    sessions: dict[str | None, list[_Attempt]] = {}
    records = list(records)
    found: list[Finding] = _mcp_findings([_record_of(item) for item in records])
    stored: dict[str | None, list[JournalEntry | JournalRecord]] = {}
    resumed = recovered(records)  # a broken background stream the client went on with
    for item in records:
        if _record_of(item).path.startswith(_MCP_PREFIX):
            continue  # a tool server's request: `_mcp_findings`
        stored.setdefault(_record_of(item).session, []).append(item)
        attempt = _attempt(item, by_seq)
        if attempt is not None and attempt.seq not in resumed:
            sessions.setdefault(attempt.session, []).append(attempt)
    for attempts in sessions.values():
        attempts.sort(key=lambda a: a.seq)
        calls, duplicates = _calls(attempts)
        found.extend(duplicates)
        for call in calls:
            found.extend(_retries(call, tolerances))
            found.extend(_no_backoff(call, tolerances))
            found.extend(_gave_up(call, tolerances))
        found.extend(_storms(calls, tolerances))
    for items in stored.values():
        items.sort(key=lambda i: (i.record if isinstance(i, JournalEntry) else i).seq)
        found.extend(resumption_findings(items, tolerances))
    order = {name: i for i, name in enumerate(FINDING_NAMES)}
    found.sort(key=lambda f: (f.seqs[0], f.seqs[-1], order[f.name]))
    return found


def format_findings(found: Sequence[Finding]) -> str:
    """The findings as lines (name, session, the entries, the explanation)."""
    if not found:
        return "  (no findings)"
    return "\n".join(
        f"  {f.name}"
        + (f" [session {f.session}]" if f.session is not None else "")
        + f" #{', #'.join(str(s) for s in f.seqs)}: {f.explanation}"
        for f in found
    )


# -- MCP servers ------------------------------------------------------------------------

_MCP_PREFIX = "/mcp/"
_INITIALIZE = frozenset({"initialize", "server/discover"})


def _record_of(item: JournalEntry | JournalRecord) -> JournalRecord:
    return item.record if isinstance(item, JournalEntry) else item


def _delivered(fault: Mapping[str, Any] | None) -> bool:
    """Whether the client got the tool's answer (no fault, or one that delivers it)."""
    entry = FAULT_TYPES.get(str(fault.get("type"))) if fault is not None else None
    return fault is None or (entry is not None and entry.delivers_answer)


def _session_lost(record: JournalRecord) -> bool:
    entry = FAULT_TYPES.get(str((record.fault or {}).get("type")))
    return record.status == 404 or (entry is not None and entry.mcp_effect == "ends_session")


def _mcp_findings(records: Sequence[JournalRecord]) -> list[Finding]:
    """The MCP findings (see the module doc) in `records`, in journal order."""
    found: list[Finding] = []
    executed: dict[tuple[str | None, str], JournalRecord] = {}
    lost: dict[tuple[str | None, str], JournalRecord] = {}
    for record in sorted(records, key=lambda r: r.seq):
        for finding in record.findings:
            if finding.get("name") == TOOL_ERROR_HIDDEN_FROM_MODEL:
                seqs = (int(finding.get("tool_seq") or record.seq), record.seq)
                text = f"#{record.seq} asked the model without the tool error of #{seqs[0]}"
                found.append(Finding(TOOL_ERROR_HIDDEN_FROM_MODEL, seqs, text, record.session))
        if not record.path.startswith(_MCP_PREFIX):
            continue
        where = (record.session, record.path)
        before = lost.pop(where, None)
        if before is not None and record.method not in _INITIALIZE:
            found.append(
                Finding(
                    NO_REINITIALIZE_AFTER_SESSION_LOST,
                    (before.seq, record.seq),
                    f"#{before.seq} lost the session on {record.path}; #{record.seq} sent "
                    f"{record.method} instead of initialize",
                    record.session,
                )
            )
        if _session_lost(record):
            lost[where] = record
        if record.tool is None or record.digest is None:
            continue
        key = (record.session, record.digest)
        first = executed.get(key)
        if first is not None:
            found.append(
                Finding(
                    TOOL_EXECUTED_TWICE_AFTER_RETRY,
                    (first.seq, record.seq),
                    f"#{record.seq} called the tool {record.tool!r} again with the arguments "
                    f"#{first.seq} had already run with",
                    record.session,
                )
            )
        elif record.status == 200 and not record.miss and _delivered(record.fault):
            executed[key] = record
    return found
