"""The verdicts about stored responses, in memory (`chaosllm.core.resumption`): a broken
background stream asked again instead of resumed, a resume from the wrong cursor, polls
too close together; a careful client gets none."""

from __future__ import annotations

import pytest

from chaosllm.core.verdict import Finding, findings
from tests.engine.test_background import RID, create, events, pair, poll, resume
from tests.memory import EnginePair

pytestmark = pytest.mark.timeout(60)

S = "careless"


def found(p: EnginePair) -> list[Finding]:
    return findings(p.engine.journal.entries(), p.engine.board.history())


def names(p: EnginePair) -> list[str]:
    return [f.name for f in found(p)]


def broken(p: EnginePair, after_chunks: int = 7) -> int:
    """A background stream cut after `after_chunks` events: the last sequence number."""
    p.arm({"type": "dropped_connection", "after_chunks": after_chunks})
    cut = events(create(p, stream=True))
    return int(cut[-1]["sequence_number"])


def test_a_careful_client_resumes_from_its_last_event_and_gets_no_finding() -> None:
    p = pair()
    last = broken(p)
    resume(p, RID, after=last)
    assert "re_asked_instead_of_resumed" not in names(p)
    assert "resumed_from_wrong_cursor" not in names(p)


def test_asking_again_after_a_broken_background_stream_is_re_asked_instead_of_resumed() -> None:
    p = pair()
    broken(p)
    create(p, stream=True)
    [finding] = [f for f in found(p) if f.name == "re_asked_instead_of_resumed"]
    assert finding.seqs == (1, 2)
    assert "starting_after=6" in finding.explanation


def test_asking_again_after_the_response_expired_is_right() -> None:
    p = pair()
    last = broken(p)
    p.arm({"type": "response_expired"})
    assert resume(p, RID, after=last).status == 404
    create(p, stream=True)
    assert "re_asked_instead_of_resumed" not in names(p)


@pytest.mark.parametrize(("after", "what"), [(3, "already had"), (9, "skipped")])
def test_a_resume_from_another_cursor_is_resumed_from_wrong_cursor(after: int, what: str) -> None:
    p = pair()
    broken(p)  # the client got events 0..6
    resume(p, RID, after=after)
    [finding] = [f for f in found(p) if f.name == "resumed_from_wrong_cursor"]
    assert what in finding.explanation and "starting_after=" + str(after) in finding.explanation


def test_a_second_resume_continues_from_what_the_first_delivered() -> None:
    p = pair()
    broken(p, after_chunks=4)  # events 0..3
    p.arm({"type": "dropped_connection", "after_chunks": 5})
    resume(p, RID, after=3)  # events 4..8
    resume(p, RID, after=8)
    assert names(p) == []


def test_polls_closer_than_the_documented_interval_are_polled_too_fast() -> None:
    p = pair()
    rid = create(p).json()["id"]
    poll(p, rid)
    p.clock.advance(0.1)
    poll(p, rid)
    p.clock.advance(2.0)
    poll(p, rid)
    [finding] = found(p)
    assert finding.name == "polled_too_fast" and finding.seqs == (2, 3)


def test_polls_are_no_duplicates_of_each_other() -> None:
    p = pair()
    rid = create(p).json()["id"]
    for _ in range(4):
        p.clock.advance(2.0)
        poll(p, rid)
    assert names(p) == []
