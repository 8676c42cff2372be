"""Verdicts (issue #17): the findings about a client's retry behaviour, from the journal
and the fault history, in memory (`tests.memory.EnginePair`, a `ManualClock` that the
test moves: no sleeps). Each test plays what a client would send, answer by answer."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaosllm.config import OnMiss
from chaosllm.core.journal import JournalRecord, answer_facts
from chaosllm.core.report import Outcome
from chaosllm.core.verdict import FINDING_NAMES, Finding, Tolerances, findings, format_findings
from chaosllm.errors import ConfigError
from chaosllm.faults import FAULT_TYPES, parse_fault_spec
from chaosllm.faults.board import Fired
from chaosllm.faults.catalogue import NON_RETRYABLE_CLASSES, retryable_type
from chaosllm.model import Piece, ResponsePlan
from chaosllm.strategies import fault_schedules
from tests.helpers import request_body
from tests.memory import EnginePair

CHAT = "simple-chat/0001"
OTHER = "knowledge/0004"


def ask(
    pair: EnginePair,
    *,
    after: float = 0.0,
    stream: bool = False,
    name: str = CHAT,
    session: str | None = "s1",
) -> int:
    """Move the clock by `after` seconds, send the request; the status the client got."""
    pair.clock.advance(after)
    return pair.send(request_body(name, stream=stream), session=session).status


def verdict(pair: EnginePair, **tolerances: Any) -> list[Finding]:
    engine = pair.engine
    return findings(
        engine.journal.entries(), engine.board.history(), Tolerances().with_(**tolerances)
    )


def names(found: list[Finding]) -> list[str]:
    return [f.name for f in found]


# -- the faults' classes ---------------------------------------------------------------


def test_the_catalogue_says_which_failures_a_retry_cures() -> None:
    retryable = {name for name, entry in FAULT_TYPES.items() if entry.retryable}
    assert retryable == {
        "truncated_stream",
        "dropped_connection",
        "http_503",
        "http_429",
        "connection_reset",
        "empty_reply",
        "stall",
        "garbage",
        "overloaded",
        "mcp_timeout",
        "mcp_stream_drop",
    }
    assert retryable_type("http_error") is None  # its status decides
    assert retryable_type("error_in_200") is None  # an answer came, damaged
    for name in NON_RETRYABLE_CLASSES:  # with an entry or not (yet)
        assert retryable_type(name) is False
    assert retryable_type("no_such_type") is None


# -- retry_after_ignored -----------------------------------------------------------------


def test_a_retry_sooner_than_retry_after_is_found(pair: EnginePair) -> None:
    pair.arm({"type": "http_429", "retry_after": 1.0})
    assert ask(pair) == 429
    assert ask(pair, after=0.3) == 200
    (found,) = verdict(pair)
    assert found.name == "retry_after_ignored"
    assert found.seqs == (1, 2)
    assert found.session == "s1"
    assert "0.300 s" in found.explanation and "Retry-After 1 s" in found.explanation


def test_a_retry_that_waits_retry_after_is_fine(pair: EnginePair) -> None:
    pair.arm({"type": "http_429", "retry_after": 1.0, "remaining": 2})
    assert ask(pair) == 429
    assert ask(pair, after=1.0) == 429
    assert ask(pair, after=0.99) == 200  # within the default tolerance (0.02 s)
    assert verdict(pair) == []
    assert names(verdict(pair, retry_after_tolerance=0.0)) == ["retry_after_ignored"]


def test_retry_after_from_the_header_the_answer_carried(pair: EnginePair) -> None:
    """An ``http_error`` 503 with ``retry_after``: the journal keeps the header's delay."""
    pair.arm({"type": "http_error", "status": 503, "retry_after": 2})
    ask(pair)
    record = pair.engine.journal.entries()[0].record
    assert record.retry_after == 2.0
    ask(pair, after=0.5)
    assert names(verdict(pair)) == ["retry_after_ignored"]


def test_answer_facts_read_the_head_and_the_error_envelope() -> None:
    body = json.dumps({"error": {"type": "insufficient_quota", "code": "insufficient_quota"}})
    plan = ResponsePlan(
        status=429,
        headers=(("Retry-After-Ms", "250"), ("Retry-After", "9")),
        pieces=(Piece(body.encode(), frame=False),),
    )
    assert answer_facts(plan, False) == {"retry_after": 0.25, "code": "insufficient_quota"}
    dated = plan.with_(headers=(("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT"),))
    assert "retry_after" not in answer_facts(dated, False)
    anthropic = json.dumps({"type": "error", "error": {"type": "overloaded_error"}})
    plan = ResponsePlan(status=529, headers=(), pieces=(Piece(anthropic.encode()),))
    assert answer_facts(plan, False) == {"code": "overloaded_error"}
    streamed = ResponsePlan(status=200, headers=(), pieces=(Piece(b"data: {}\n\n"),) * 3)
    assert answer_facts(streamed, True) == {"frames": 3}


# -- no_backoff --------------------------------------------------------------------------


def test_retries_without_backoff_are_found(pair: EnginePair) -> None:
    pair.arm({"type": "http_503", "remaining": 3})
    assert [ask(pair, after=0.002) for _ in range(4)] == [503, 503, 503, 200]
    (found,) = verdict(pair)
    assert found.name == "no_backoff"
    assert found.seqs == (1, 2, 3)
    assert "under 0.25 s" in found.explanation


def test_growing_gaps_are_a_backoff(pair: EnginePair) -> None:
    pair.arm({"type": "http_503", "remaining": 3})
    for gap in (0.0, 0.05, 0.1, 0.2):
        ask(pair, after=gap)
    assert verdict(pair) == []


def test_constant_gaps_above_the_floor_are_no_finding(pair: EnginePair) -> None:
    pair.arm({"type": "http_503", "remaining": 3})
    for gap in (0.0, 0.3, 0.3, 0.3):
        ask(pair, after=gap)
    assert verdict(pair) == []
    assert names(verdict(pair, no_backoff_floor=0.5)) == ["no_backoff"]


def test_constant_waits_that_retry_after_asked_for_are_no_finding(pair: EnginePair) -> None:
    pair.arm({"type": "http_503", "remaining": 3, "retry_after": 0.05})
    for gap in (0.0, 0.05, 0.05, 0.05):
        ask(pair, after=gap)
    assert verdict(pair) == []


def test_one_quick_retry_is_no_finding(pair: EnginePair) -> None:
    pair.arm({"type": "http_503"})
    ask(pair)
    ask(pair, after=0.001)
    assert verdict(pair) == []


# -- retried_non_retryable -----------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_a_retry_after_a_non_retryable_status_is_found(pair: EnginePair, status: int) -> None:
    pair.arm({"type": "http_error", "status": status})
    assert ask(pair) == status
    assert ask(pair, after=1.0) == 200
    (found,) = verdict(pair)
    assert found.name == "retried_non_retryable"
    assert found.seqs == (1, 2)
    assert str(status) in found.explanation


@pytest.mark.parametrize("status", [400, 404])
def test_no_retry_after_a_non_retryable_status_is_right(pair: EnginePair, status: int) -> None:
    pair.arm({"type": "http_error", "status": status})
    ask(pair)
    assert verdict(pair) == []


@pytest.mark.parametrize("status", [500, 502, 504, 529])
def test_a_retry_after_a_server_error_is_right(pair: EnginePair, status: int) -> None:
    pair.arm({"type": "http_error", "status": status})
    ask(pair)
    ask(pair, after=0.5)
    assert verdict(pair) == []


def record(seq: int, time: float, **fields: Any) -> JournalRecord:
    base: dict[str, Any] = {
        "seq": seq,
        "time": time,
        "monotonic": time,
        "session": "s1",
        "method": "POST",
        "path": "/v1/chat/completions",
        "model": "gpt-4o-mini",
        "stream": False,
        "digest": "d1",
        "status": 200,
        "ending": "complete",
    }
    return JournalRecord(**{**base, **fields})


@pytest.mark.parametrize("code", sorted(NON_RETRYABLE_CLASSES))
def test_the_named_classes_are_not_retryable_whatever_their_status(code: str) -> None:
    """``insufficient_quota`` is a 429, yet no retry cures it: the error code decides (a
    recorded answer's too, with no fault)."""
    failed = record(1, 0.0, status=429, retry_after=0.01, code=code)
    again = record(2, 1.0, status=429, retry_after=0.01, code=code)
    assert names(findings([failed, again])) == ["retried_non_retryable"]
    assert findings([failed]) == []  # not retrying is right: no gave_up_early


# -- retry_storm --------------------------------------------------------------------------


def test_too_many_attempts_of_one_call_are_a_storm(pair: EnginePair) -> None:
    pair.arm({"type": "http_503", "remaining": 11})
    for _ in range(12):
        ask(pair, after=0.5)
    (found,) = verdict(pair)
    assert found.name == "retry_storm"
    assert found.seqs == tuple(range(1, 13))
    assert "12 attempts of one call" in found.explanation
    assert verdict(pair, storm_max_attempts=12) == []


def test_too_many_retries_per_second_are_a_storm() -> None:
    """Six calls of a session, each retried twice within a second: 12 retries (each call
    alone is no storm)."""
    pair = EnginePair.of(on_miss=OnMiss.FALLBACK)
    pair.arm({"type": "http_503", "remaining": 12, "retry_after": 0.01})
    for round_ in range(3):
        for i in range(6):
            body = request_body(CHAT, stream=False)
            body["messages"][-1]["content"] += f" ({i})"
            pair.clock.advance(0.02)
            assert pair.send(body, session="s1").status == (503 if round_ < 2 else 200)
    (found,) = verdict(pair)
    assert found.name == "retry_storm"
    assert len(found.seqs) == 12
    assert "more than 10 per second" in found.explanation
    assert verdict(pair, storm_max_per_second=12) == []


# -- gave_up_early ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        {"type": "http_503"},
        {"type": "http_429", "retry_after": 1},
        {"type": "http_error", "status": 502},
        {"type": "empty_reply"},
        {"type": "connection_reset"},
    ],
)
def test_no_retry_after_a_retryable_failure_is_giving_up(pair: EnginePair, spec: Any) -> None:
    pair.arm(spec)
    ask(pair)
    (found,) = verdict(pair)
    assert found.name == "gave_up_early"
    assert found.seqs == (1,)
    assert "never sent it again (1 attempt)" in found.explanation


def test_streams_cut_short_are_retryable(pair: EnginePair) -> None:
    for kind in ("truncated_stream", "dropped_connection", "garbage", "stall"):
        pair.engine.reset()
        pair.arm({"type": kind, "after_chunks": 0})
        ask(pair, stream=True)
        assert names(verdict(pair)) == ["gave_up_early"], kind


def test_a_retry_that_recovers_is_not_giving_up(pair: EnginePair) -> None:
    pair.arm({"type": "http_503"})
    ask(pair)
    ask(pair, after=0.5)
    assert verdict(pair) == []


def test_a_retry_after_longer_than_the_limit_excuses_giving_up(pair: EnginePair) -> None:
    pair.arm({"type": "http_429", "retry_after": 3600})
    ask(pair)
    assert verdict(pair) == []
    assert names(verdict(pair, max_retry_after=7200)) == ["gave_up_early"]


def test_min_attempts_sets_how_soon_is_early(pair: EnginePair) -> None:
    pair.arm({"type": "http_503", "remaining": 2})
    ask(pair)
    ask(pair, after=0.5)
    assert verdict(pair) == []
    found = verdict(pair, min_attempts=3)
    assert names(found) == ["gave_up_early"]
    assert found[0].seqs == (1, 2)


@pytest.mark.parametrize("kind", ["error_in_200", "empty_response"])
def test_a_damaged_answer_may_be_retried_or_not(pair: EnginePair, kind: str) -> None:
    pair.arm({"type": kind})
    ask(pair)
    assert verdict(pair) == []  # failing cleanly is fine
    ask(pair, after=0.001)
    assert verdict(pair) == []  # and so is asking again


# -- duplicate_after_success ---------------------------------------------------------------


def test_the_same_request_after_a_success_is_a_duplicate(pair: EnginePair) -> None:
    assert ask(pair) == 200
    assert ask(pair, after=0.25) == 200
    (found,) = verdict(pair)
    assert found.name == "duplicate_after_success"
    assert found.seqs == (1, 2)
    assert "0.250 s later" in found.explanation


def test_a_success_delivered_slowly_is_a_success(pair: EnginePair) -> None:
    pair.arm({"type": "latency", "delay_ms": 10})
    ask(pair)
    ask(pair, after=1)
    assert names(verdict(pair)) == ["duplicate_after_success"]


def test_other_requests_and_other_sessions_are_other_calls(pair: EnginePair) -> None:
    ask(pair)
    ask(pair, name=OTHER)
    ask(pair, session="s2")
    ask(pair, session=None)
    assert verdict(pair) == []


def test_a_success_the_client_left_before_its_end_is_no_success(pair: EnginePair) -> None:
    ask(pair)
    ask(pair, after=1)
    pair.engine.journal.entries()[0].report.outcome = Outcome.CLIENT_GONE
    assert verdict(pair) == []


# -- stream_restarted_mid_answer -------------------------------------------------------------


def test_a_stream_asked_again_after_frames_is_a_restart(pair: EnginePair) -> None:
    pair.arm({"type": "dropped_connection", "after_chunks": 2})
    ask(pair, stream=True)
    ask(pair, after=0.5, stream=True)
    (found,) = verdict(pair)
    assert found.name == "stream_restarted_mid_answer"
    assert found.seqs == (1, 2)
    assert "delivered 2 frames" in found.explanation


def test_a_stream_asked_again_before_any_frame_is_a_plain_retry(pair: EnginePair) -> None:
    pair.arm({"type": "dropped_connection", "after_chunks": 0})
    ask(pair, stream=True)
    ask(pair, after=0.5, stream=True)
    assert verdict(pair) == []


def test_what_the_wire_sent_wins_over_the_plan(pair: EnginePair) -> None:
    """A settled report says what the client got: here nothing of the two frames."""
    pair.arm({"type": "dropped_connection", "after_chunks": 2})
    ask(pair, stream=True)
    ask(pair, after=0.5, stream=True)
    report = pair.engine.journal.entries()[0].report
    report.frames_sent, report.outcome = 0, Outcome.COMPLETE
    assert verdict(pair) == []


# -- the inputs -------------------------------------------------------------------------------


def test_the_fault_history_fills_in_a_record_without_a_fault() -> None:
    """A bare record that names no fault (a 200 stream, complete) and the firing that
    broke it: the fault decides the class."""
    broken = record(1, 0.0, stream=True, frames=0)
    spec = parse_fault_spec({"type": "truncated_stream", "after_chunks": 0})
    fired = Fired("flt_1", spec.type, spec, "s1", "/v1/chat/completions", 0.0, request_seq=1)
    assert findings([broken]) == []  # a complete success, for all the record says
    assert names(findings([broken], [fired])) == ["gave_up_early"]


def test_records_whose_body_could_not_be_read_are_no_calls(pair: EnginePair) -> None:
    for _ in range(3):
        assert pair.send(None, raw=b"{not json", session="s1").status == 400
    assert verdict(pair) == []


def test_findings_are_in_journal_order_across_sessions(pair: EnginePair) -> None:
    pair.arm({"type": "http_error", "status": 400, "match": {"session": "b"}})
    ask(pair, session="a")
    ask(pair, session="b")
    ask(pair, session="a")
    ask(pair, session="b")
    found = verdict(pair)
    assert [(f.name, f.session, f.seqs) for f in found] == [
        ("duplicate_after_success", "a", (1, 3)),
        ("retried_non_retryable", "b", (2, 4)),
    ]
    text = format_findings(found)
    assert "duplicate_after_success [session a] #1, #3:" in text
    assert format_findings([]) == "  (no findings)"


def test_a_finding_in_json() -> None:
    found = Finding("no_backoff", (1, 2, 3), "why", "s1")
    assert found.to_json() == {
        "name": "no_backoff",
        "seqs": [1, 2, 3],
        "explanation": "why",
        "session": "s1",
    }
    assert str(found) == "no_backoff [session s1]: why"
    assert FINDING_NAMES == (
        "retry_after_ignored",
        "no_backoff",
        "retry_storm",
        "retried_non_retryable",
        "gave_up_early",
        "duplicate_after_success",
        "stream_restarted_mid_answer",
        "tool_executed_twice_after_retry",
        "no_reinitialize_after_session_lost",
        "tool_error_hidden_from_model",
        "re_asked_instead_of_resumed",
        "resumed_from_wrong_cursor",
        "polled_too_fast",
    )


# -- tolerances ---------------------------------------------------------------------------


def test_tolerances_have_documented_defaults() -> None:
    assert Tolerances().to_json() == {
        "retry_after_tolerance": 0.02,
        "no_backoff_floor": 0.25,
        "timing_noise": 0.01,
        "storm_max_attempts": 10,
        "storm_max_per_second": 10.0,
        "min_attempts": 2,
        "max_retry_after": 60.0,
        "min_poll_interval": 1.0,
    }


def test_tolerances_from_text() -> None:
    tolerances = Tolerances().with_text([("no_backoff_floor", "0.5"), ("min_attempts", "3")])
    assert tolerances.no_backoff_floor == 0.5 and tolerances.min_attempts == 3


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([("no_such", "1")], "no tolerance 'no_such'; valid: retry_after_tolerance"),
        ([("min_attempts", "2.5")], "min_attempts must be an integer"),
        ([("no_backoff_floor", "soon")], "no_backoff_floor must be a number"),
        ([("no_backoff_floor", "-1")], "must be a finite number >= 0"),
        ([("max_retry_after", "inf")], "must be a finite number >= 0"),
        ([("storm_max_attempts", "0")], "storm_max_attempts must be >= 1"),
    ],
)
def test_bad_tolerances_are_refused(items: list[tuple[str, str]], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        Tolerances().with_text(items)


def test_bad_tolerance_values_are_refused() -> None:
    with pytest.raises(ConfigError, match="must be a number"):
        Tolerances(no_backoff_floor="1")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="must be an integer"):
        Tolerances().with_(min_attempts=True)
    with pytest.raises(ConfigError, match="no tolerance 'floor'"):
        Tolerances().with_(floor=1)


# -- a client that keeps the rules ----------------------------------------------------------

RULES_FAULTS = ["http_503", "http_429", "http_error", "empty_reply", "connection_reset"]


@settings(max_examples=60, deadline=None)
@given(
    schedule=fault_schedules(
        max_faults=4, types=RULES_FAULTS, statuses=[400, 404, 408, 429, 500, 503, 529]
    ),
    backoff=st.sampled_from([0.05, 0.3, 1.0]),
)
def test_a_client_that_keeps_the_rules_earns_no_finding(
    schedule: list[dict[str, Any]], backoff: float
) -> None:
    """In memory: it waits what Retry-After says or a doubling backoff, never retries
    a 4xx other than 408, 409 and 429, and stops at the first answer."""
    pair = EnginePair.of()
    if schedule:
        pair.arm(schedule)
    wait = backoff
    for _ in range(6):
        reply = pair.send(request_body(CHAT, stream=False), session="s1")
        plan = reply.reply.plan
        if plan.send_head and plan.status == 200:
            break
        if plan.send_head and 400 <= plan.status < 500 and plan.status not in (408, 409, 429):
            break
        headers = {k.lower(): v for k, v in plan.headers}
        delay = float(headers["retry-after"]) if "retry-after" in headers else wait
        wait *= 2
        pair.clock.advance(delay)
    assert verdict(pair) == [], pair.journal()
