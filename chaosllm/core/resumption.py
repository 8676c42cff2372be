"""Verdicts about stored responses (OpenAI Responses' background mode): what a client did
after a background stream broke, and how it polled. Pure: journal entries in, findings
out (`chaosllm.core.verdict` adds them to its own).

Each create, poll, resume and cancel of a stored response carries its ``background``
record (`chaosllm.core.background`): the response id, the operation, the sequence numbers
of the events it sent. What the client holds of a response is the events the wire
delivered (the report's ``frames_sent``, else the record's ``frames``): the last
sequence number it got is the cursor a correct resume sends.

``re_asked_instead_of_resumed``
    a background stream that broke (fewer events delivered than it had), then the same
    request sent again (same digest) before any resume of it, while it could be resumed
    (no 404 or refusal of it in between): the client paid for the answer twice.
``resumed_from_wrong_cursor``
    a resume whose ``starting_after`` is not the last sequence number the client got:
    below it, events it had are asked again (duplicated text); above, a gap.
``polled_too_fast``
    a poll of a response less than `Tolerances.min_poll_interval` after a poll that found
    it still ``queued`` or ``in_progress`` (OpenAI's background guide polls every 2 s), or
    sooner than the Retry-After that poll's answer carried.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from chaosllm.core.journal import JournalEntry, JournalRecord

if TYPE_CHECKING:
    from chaosllm.core.verdict import Finding, Tolerances

__all__ = [
    "POLLED_TOO_FAST",
    "RESUMED_FROM_WRONG_CURSOR",
    "RE_ASKED_INSTEAD_OF_RESUMED",
    "findings",
    "recovered",
]

RE_ASKED_INSTEAD_OF_RESUMED = "re_asked_instead_of_resumed"
RESUMED_FROM_WRONG_CURSOR = "resumed_from_wrong_cursor"
POLLED_TOO_FAST = "polled_too_fast"
_WAITING = frozenset({"queued", "in_progress"})


def _delivered(item: JournalEntry | JournalRecord) -> tuple[JournalRecord, int | None]:
    """The record, and how many frames its answer delivered (None: unknown)."""
    if isinstance(item, JournalEntry):
        record, report = item.record, item.report
        if report.outcome is not None:
            return record, report.frames_sent
        return record, record.frames
    return item, item.frames


def findings(
    records: Iterable[JournalEntry | JournalRecord], tolerances: Tolerances
) -> list[Finding]:
    """The findings about stored responses in one session's `records` (in seq order)."""
    from chaosllm.core.verdict import Finding

    found: list[Finding] = []
    had: dict[str, int] = {}
    """Response id -> the last sequence number the client got of it."""
    broken: dict[str, tuple[str, int]] = {}
    """Request digest -> (the response id, the seq of its create) of a broken stream."""
    polled: dict[str, tuple[float, int, float | None]] = {}
    for item in records:
        record, frames = _delivered(item)
        bg: Mapping[str, Any] | None = record.background
        session = record.session
        asks = bg is None or bg.get("operation") == "create"
        if record.method == "POST" and record.digest in broken and asks:
            rid, seq = broken.pop(record.digest)
            found.append(
                Finding(
                    RE_ASKED_INSTEAD_OF_RESUMED,
                    (seq, record.seq),
                    f"the background stream of {rid} broke after {had.get(rid, -1) + 1} "
                    f"events and the request was sent again instead of resuming it "
                    f"(GET /v1/responses/{rid}?stream=true&starting_after="
                    f"{had.get(rid, -1)})",
                    session,
                )
            )
        if bg is None:
            continue
        rid, operation = str(bg.get("id")), bg.get("operation")
        first, last = bg.get("first"), bg.get("last")
        whole = last - first + 1 if isinstance(first, int) and isinstance(last, int) else 0
        # Not faulted and not sent yet: what the plan holds.
        sent = (whole if record.ending == "complete" else 0) if frames is None else frames
        if operation == "create" and isinstance(first, int) and isinstance(last, int):
            if sent:
                had[rid] = first + sent - 1
            if sent < whole and record.digest is not None:
                broken[record.digest] = (rid, record.seq)
        elif operation == "resume":
            after = bg.get("after")
            cursor = after if isinstance(after, int) else -1
            if record.status == 200 and rid in had and cursor != had[rid]:
                got = had[rid]
                what = (
                    f"events {cursor + 1}..{got} it already had asked again"
                    if cursor < got
                    else f"events {got + 1}..{cursor} skipped"
                )
                found.append(
                    Finding(
                        RESUMED_FROM_WRONG_CURSOR,
                        (record.seq,),
                        f"{rid} resumed with starting_after={cursor} after receiving up to "
                        f"sequence_number {got}: {what}",
                        session,
                    )
                )
            if record.status == 200 and isinstance(first, int) and sent:
                had[rid] = max(had.get(rid, -1), first + sent - 1)
            _forget(broken, rid)
        elif operation == "poll":
            before = polled.get(rid)
            if before is not None:
                at, seq, retry_after = before
                gap = record.monotonic - at
                floor = max(tolerances.min_poll_interval, retry_after or 0.0)
                if gap < floor:
                    found.append(
                        Finding(
                            POLLED_TOO_FAST,
                            (seq, record.seq),
                            f"{rid} polled again after {gap:.3f} s (at least {floor:g} s: "
                            + ("the Retry-After" if retry_after else "the documented 2 s poll")
                            + ")",
                            session,
                        )
                    )
            if bg.get("status") in _WAITING:
                polled[rid] = (record.monotonic, record.seq, record.retry_after)
            else:
                polled.pop(rid, None)  # it was done: the next poll waits on nothing
        if record.status in (400, 404) and operation in ("resume", "poll"):
            _forget(broken, rid)  # it cannot be resumed: asking again is right
    return found


def recovered(records: Iterable[JournalEntry | JournalRecord]) -> set[int]:
    """The seqs of the creates whose response the client went on with (resumed, polled
    or cancelled it): their stream's break is no failure the client gave up on."""
    created: dict[str, int] = {}
    found: set[int] = set()
    for item in records:
        record = item.record if isinstance(item, JournalEntry) else item
        bg = record.background
        if bg is None:
            continue
        rid = str(bg.get("id"))
        if bg.get("operation") == "create":
            created[rid] = record.seq
        elif rid in created:
            found.add(created[rid])
    return found


def _forget(broken: dict[str, tuple[str, int]], rid: str) -> None:
    for digest, (held, _) in list(broken.items()):
        if held == rid:
            del broken[digest]
