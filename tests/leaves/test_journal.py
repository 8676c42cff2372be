"""The journal keeps the newest entries, per session on demand."""

from __future__ import annotations

from chaosllm.core.journal import Journal
from chaosllm.core.report import Outcome


def add(journal: Journal, session: str | None = None) -> int:
    entry = journal.add(
        session=session,
        method="POST",
        path="/v1/chat/completions",
        model="m",
        stream=False,
        digest="d",
        status=200,
    )
    return entry.seq


def test_bounded_to_the_newest_entries() -> None:
    journal = Journal(maxlen=3)
    seqs = [add(journal) for _ in range(5)]
    assert seqs == [1, 2, 3, 4, 5]
    assert [e.seq for e in journal.entries()] == [3, 4, 5]


def test_clear_one_session_keeps_the_bound() -> None:
    journal = Journal(maxlen=3)
    add(journal, "a")
    add(journal, "b")
    assert journal.clear("a") == 1
    for _ in range(4):
        add(journal, "b")
    assert [e.session for e in journal.entries()] == ["b", "b", "b"]


def test_settle_waits_only_for_pending_reports() -> None:
    journal = Journal()
    add(journal)
    entry = journal.entries()[0]
    entry.report.outcome = Outcome.COMPLETE
    assert journal.entries(settle=5.0)[0].to_json()["outcome"] == "complete"
    add(journal)
    pending = journal.entries(settle=0.05)[-1]
    assert pending.to_json()["outcome"] == "pending"
