"""Fault schedules in memory (tests/memory.py): ``after_requests``, ``every`` and ``ttl_ms``
alone and combined with ``remaining``, ``probability``, the FIFO and the match predicates;
``ttl_ms`` on a `ManualClock`; validation; listings, profiles and query strings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import find, given, settings
from hypothesis.errors import InvalidArgument

from chaosllm.config import Mode
from chaosllm.core.engine import Reply
from chaosllm.errors import InvalidFaultSpec
from chaosllm.faults import parse_fault_spec, spec_from_query
from chaosllm.faults.profiles import parse_profile
from chaosllm.store.profiles import load_profile
from chaosllm.testing.strategies import fault_schedules, faults
from tests.engine.test_fault_match import upstream_plan
from tests.helpers import recording, request_body
from tests.memory import EnginePair

pytestmark = pytest.mark.timeout(60)

NAME = "simple-chat/0001"


def statuses(pair: EnginePair, count: int, **kwargs: Any) -> list[int]:
    body = request_body(NAME, stream=False)
    return [pair.send(body, **kwargs).status for _ in range(count)]


def fired_on(pair: EnginePair) -> list[int]:
    """Which matching request each firing was (the history's ``seen``)."""
    return [f.to_json()["seen"] for f in pair.engine.board.history()]


# -- after_requests and every -----------------------------------------------------------------


def test_after_requests_lets_n_matching_requests_pass(pair: EnginePair) -> None:
    pair.arm({"type": "http_503", "after_requests": 3, "remaining": 2})
    assert statuses(pair, 7) == [200, 200, 200, 503, 503, 200, 200]
    assert fired_on(pair) == [4, 5]


def test_every_fires_on_the_nth_2nth_matching_request(pair: EnginePair) -> None:
    pair.arm({"type": "http_503", "every": 3, "remaining": 3})
    assert statuses(pair, 12) == [200, 200, 503] * 3 + [200] * 3
    assert fired_on(pair) == [3, 6, 9] and pair.engine.board.armed() == []


def test_every_counts_after_after_requests(pair: EnginePair) -> None:
    pair.arm({"type": "http_503", "after_requests": 2, "every": 2, "remaining": 3})
    got = statuses(pair, 9)
    assert [i + 1 for i, s in enumerate(got) if s == 503] == [4, 6, 8]


def test_only_matching_requests_count(pair: EnginePair) -> None:
    pair.arm({"type": "http_503", "every": 2, "remaining": 2, "match": {"session": "a"}})
    got = [(s, statuses(pair, 1, session=s)[0]) for s in ["b", "a", "b", "a", "b", "a", "a"]]
    assert [code for s, code in got if s == "a"] == [200, 503, 200, 503]
    assert all(code == 200 for s, code in got if s == "b")


def test_a_request_taken_by_an_earlier_fault_is_not_offered_to_later_ones(
    pair: EnginePair,
) -> None:
    pair.arm(
        [
            {"type": "http_429", "retry_after": 0, "every": 2, "remaining": 2},
            {"type": "http_503", "every": 2, "remaining": 2},
        ]
    )
    # 1: both see it; 2: the 429 takes it; 3: the 503's 2nd; 4: 429; 5: 503's 3rd; 6: 503's 4th
    assert statuses(pair, 7) == [200, 429, 503, 429, 200, 503, 200]


def test_a_fault_that_does_not_apply_does_not_count(pair: EnginePair) -> None:
    pair.arm({"type": "malformed_tool_args", "every": 2})
    assert statuses(pair, 3) == [200] * 3  # no tool calls: never offered
    assert pair.engine.board.armed()[0]["seen"] == 0
    tools = request_body("tool-call/0001", stream=False)
    calls = [pair.send(tools).json()["choices"][0]["message"]["tool_calls"] for _ in range(2)]
    args = [c[0]["function"]["arguments"] for c in calls]
    json.loads(args[0])
    with pytest.raises(json.JSONDecodeError):
        json.loads(args[1])


def test_probability_is_drawn_on_the_due_requests_only_and_is_seeded() -> None:
    def run(seed: int) -> list[int]:
        pair = EnginePair.of(seed=seed)
        pair.arm({"type": "http_503", "every": 2, "probability": 0.5, "remaining": 100})
        got = statuses(pair, 40)
        assert all(s == 200 for s in got[0::2])  # odd requests are never due
        return got

    first = run(7)
    assert first == run(7)
    assert 0 < first.count(503) < 20  # some due requests lost their draw


def test_the_schedule_shows_in_the_listing(pair: EnginePair) -> None:
    pair.arm({"type": "http_503", "after_requests": 1, "every": 2, "remaining": 5})
    statuses(pair, 2)
    listed = pair.engine.board.armed()[0]
    assert listed["after_requests"] == 1 and listed["every"] == 2 and listed["seen"] == 2
    plain = pair.arm({"type": "http_503"})[0].to_json()
    assert "seen" not in plain and "every" not in plain and "after_requests" not in plain


def test_in_passthrough_each_request_is_counted_once() -> None:
    """Before the upstream is asked and after it answers, a request is offered to each
    fault once: an answers-alone fault and one that needs the answer keep exact counts."""
    pair = EnginePair.of(mode=Mode.PASSTHROUGH, upstream="http://127.0.0.1:9")
    pair.arm(
        [
            {"type": "http_503", "every": 3, "remaining": 10},
            {"type": "empty_response", "every": 2, "remaining": 10},
        ]
    )
    body = request_body(NAME, stream=False)
    answer = recording(NAME)["response"]["body"]
    got = []
    for _ in range(9):
        decision = pair.decide(body)
        if isinstance(decision, Reply):
            got.append("503")
            continue
        plan = pair.engine.fault_upstream(decision, upstream_plan(answer), answer)
        content = json.loads(plan.body())["choices"][0]["message"]["content"]
        got.append("empty" if content is None else "ok")
    # the 503 counts 1..9 (fires on 3, 6, 9); the empty_response sees 1, 2, 4, 5, 7, 8
    assert got == ["ok", "empty", "503", "ok", "empty", "503", "ok", "empty", "503"]


# -- ttl_ms -----------------------------------------------------------------------------------


def test_ttl_disarms_on_the_engines_clock(pair: EnginePair) -> None:
    pair.arm({"type": "http_503", "ttl_ms": 1000, "remaining": 10})
    assert pair.engine.board.armed()[0]["expires_in_ms"] == 1000.0
    assert statuses(pair, 1) == [503]
    pair.clock.advance(0.999)
    assert pair.engine.board.armed()[0]["expires_in_ms"] == pytest.approx(1.0)
    assert statuses(pair, 1) == [503]
    pair.clock.advance(0.001)
    assert statuses(pair, 2) == [200, 200]
    assert pair.engine.board.armed() == [] and len(pair.engine.board) == 0


def test_ttl_expires_unfired_faults_and_leaves_others(pair: EnginePair) -> None:
    pair.arm(
        [
            {"type": "http_503", "ttl_ms": 50, "match": {"session": "never"}},
            {"type": "http_429", "retry_after": 0, "ttl_ms": 5000, "after_requests": 2},
            {"type": "http_error", "status": 500, "match": {"session": "later"}},
        ]
    )
    pair.clock.advance(0.05)
    assert [f["type"] for f in pair.engine.board.armed()] == ["http_429", "http_error"]
    assert statuses(pair, 3) == [200, 200, 429]
    assert statuses(pair, 1, session="later") == [500]
    pair.arm({"type": "http_503", "ttl_ms": 10})
    pair.clock.advance(1)
    assert pair.engine.board.disarm() == 0  # it had expired already


def test_ttl_in_passthrough_before_the_upstream_is_asked() -> None:
    pair = EnginePair.of(mode=Mode.PASSTHROUGH, upstream="http://127.0.0.1:9")
    pair.arm({"type": "http_503", "ttl_ms": 100})
    pair.clock.advance(0.1)
    assert not pair.proxy(request_body(NAME, stream=False)).faultable


# -- validation, query strings, profiles ------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"after_requests": -1}, "after_requests must be an integer >= 0"),
        ({"after_requests": 1.5}, "after_requests must be an integer >= 0"),
        ({"after_requests": "3"}, "after_requests must be an integer >= 0"),
        ({"after_requests": True}, "after_requests must be an integer >= 0"),
        ({"after_requests": 10**400}, "after_requests must be an integer >= 0 within float"),
        ({"every": 0}, "every must be an integer >= 1"),
        ({"every": -3}, "every must be an integer >= 1"),
        ({"every": None}, "every must be an integer >= 1"),
        ({"ttl_ms": 0}, "ttl_ms must be a number > 0"),
        ({"ttl_ms": -5}, "ttl_ms must be a number > 0"),
        ({"ttl_ms": float("nan")}, "ttl_ms must be a number > 0"),
        ({"ttl_ms": float("inf")}, "ttl_ms must be a number > 0"),
        ({"ttl_ms": "1s"}, "ttl_ms must be a number"),
        ({"ttl_ms": False}, "ttl_ms must be a number"),
        ({"afterRequests": 1, "after_requests": 2}, "both 'afterRequests' and 'after_requests'"),
        ({"every_n": 2}, "http_503 has no parameter 'every_n'"),
    ],
)
def test_bad_schedules_are_refused(fields: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidFaultSpec) as refused:
        parse_fault_spec({"type": "http_503", **fields})
    assert says in str(refused.value)
    assert "after_requests" in str(refused.value)  # the message lists the common fields


def test_schedules_round_trip_and_take_camel_case() -> None:
    spec = parse_fault_spec({"type": "http_503", "afterRequests": 2, "every": 3, "ttlMs": 50})
    assert (spec.after_requests, spec.every, spec.ttl_ms) == (2, 3, 50.0)
    assert spec.to_json() == {
        "type": "http_503",
        "remaining": 1,
        "probability": 1.0,
        "after_requests": 2,
        "every": 3,
        "ttl_ms": 50.0,
    }
    assert parse_fault_spec(spec.to_json()) == spec
    plain = parse_fault_spec({"type": "http_503"})
    assert (plain.after_requests, plain.every, plain.ttl_ms) == (0, 1, None)


def test_schedules_come_from_a_query_string() -> None:
    query = spec_from_query(
        "http_503", [("after_requests", "2"), ("every", "3"), ("ttl_ms", "1.5"), ("turn", "4")]
    )
    assert query == {
        "type": "http_503",
        "after_requests": 2,
        "every": 3,
        "ttl_ms": 1.5,
        "match": {"turn": 4},
    }
    assert parse_fault_spec(spec_from_query("http_503", [("afterRequests", "7")])).after_requests
    with pytest.raises(InvalidFaultSpec, match="every must be an integer"):
        parse_fault_spec(spec_from_query("http_503", [("every", "often")]))


def test_a_profile_holds_schedules_and_predicates(tmp_path: Path) -> None:
    data = {
        "description": "every third request of a long conversation fails for a minute",
        "faults": [
            {"type": "http_503", "every": 3, "remaining": 100, "ttl_ms": 60_000},
            {"type": "http_429", "after_requests": 5, "match": {"contains": "weather"}},
            {"type": "malformed_tool_args", "match": {"tool": "get_weather", "turn": 2}},
        ],
    }
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data))
    profile = load_profile(str(path))
    assert [s.every for s in profile.specs] == [3, 1, 1]
    assert profile.specs[1].after_requests == 5 and profile.specs[2].match.turn == 2
    assert (
        parse_profile(profile.to_json(), "again").to_json()["faults"] == profile.to_json()["faults"]
    )
    with pytest.raises(InvalidFaultSpec, match=r"profile bad: fault \[0\]: http_503: every"):
        parse_profile({"faults": [{"type": "http_503", "every": 0}]}, "bad")
    pair = EnginePair.of()
    pair.engine.board.arm(profile.specs)
    assert statuses(pair, 3) == [200, 200, 503]


# -- the hypothesis strategies ----------------------------------------------------------------


def test_the_strategies_draw_schedules_that_shrink_to_a_plain_fault() -> None:
    drawn = faults(types=["empty_reply", "latency"], max_after_requests=5, max_every=4)
    assert find(drawn, lambda spec: True) == {"type": "empty_reply", "remaining": 1}
    assert find(drawn, lambda spec: "every" in spec) == {
        "type": "empty_reply",
        "remaining": 1,
        "every": 2,
    }
    assert find(drawn, lambda spec: spec.get("after_requests", 0) > 2)["after_requests"] == 3
    plain = faults(types=["empty_reply"])
    assert find(plain, lambda spec: True) == {"type": "empty_reply", "remaining": 1}
    with pytest.raises(InvalidArgument, match="max_every"):
        faults(max_every=0).validate()
    with pytest.raises(InvalidArgument, match="max_after_requests"):
        fault_schedules(max_after_requests=-1).validate()


@given(schedule=fault_schedules(max_faults=3, max_after_requests=3, max_every=3))
@settings(max_examples=30, deadline=None)
def test_drawn_schedules_are_valid_specs(schedule: list[dict[str, Any]]) -> None:
    for spec in schedule:
        parsed = parse_fault_spec(spec)
        assert parsed.after_requests == spec.get("after_requests", 0)
        assert parsed.every == spec.get("every", 1)
