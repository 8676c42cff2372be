"""Session faults on a relayed (proxied) session, in memory (`chaosllm.core.live.relay`):
fed a recorded turn's server events one at a time, as an upstream sends them, the relay
gives the client what the replay's transformation of the whole turn gives; the rest of
a broken turn is dropped up to its end, a fault that needs the whole answer holds the
turn back, and a fault the protocol cannot word is not consumed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings

from chaosllm.core.live.relay import Relay, take_fault
from chaosllm.faults import FaultBoard, parse_fault_spec
from chaosllm.faults.board import RequestInfo
from chaosllm.faults.session import CLOSE, EVENT, TEXT, Step
from chaosllm.providers.gemini_live import GEMINI_LIVE
from chaosllm.providers.live import SessionProtocol
from chaosllm.providers.realtime_openai import REALTIME
from chaosllm.strategies import SESSION_FAULTS, faults
from tests.helpers import RECORDINGS

pytestmark = pytest.mark.timeout(30)

CASES = [
    (REALTIME, "realtime-text"),
    (REALTIME, "realtime-tools"),
    (REALTIME, "realtime-audio"),
    (GEMINI_LIVE, "gemini-live-text"),
    (GEMINI_LIVE, "gemini-live-tools"),
]


def first_turn(protocol: SessionProtocol, name: str) -> tuple[list[str], list[str]]:
    """The recording's client events up to the first turn's end, and the server events
    of that turn's answer up to its end (`answer_done`), as JSON text."""
    events = json.loads((RECORDINGS / name / "0001.json").read_text("utf-8"))["session"]
    client: list[str] = []
    answer: list[str] = []
    ended = False
    for item in events["events"]:
        if item["from"] == "client":
            if ended:
                break
            client.append(json.dumps(item["event"]))
            ended = protocol.ends_turn(item["event"])
        elif ended:
            answer.append(json.dumps(item["event"]))
            if protocol.answer_done(item["event"]):
                break
    return client, answer


def relay(protocol: SessionProtocol, *armed: dict[str, Any]) -> Relay:
    board = FaultBoard(seed=0)
    if armed:
        board.arm([parse_fault_spec(f) for f in armed])
    return Relay(board, protocol, protocol.paths[0], "m", None)


def relayed(r: Relay, client: list[str], answer: list[str]) -> tuple[Step, ...]:
    out: list[Step] = []
    for text in client:
        out += r.client(text)
    for text in answer:
        out += r.server(text)
    out += r.upstream_closed()
    return tuple(out)


def replayed(protocol: SessionProtocol, spec: dict[str, Any], answer: list[str]) -> Any:
    board = FaultBoard(seed=0)
    board.arm([parse_fault_spec(spec)])
    steps = tuple(Step(EVENT, 0.0, json.loads(t)) for t in answer)
    request = RequestInfo(path=protocol.paths[0], model="m", session=None, stream=True, turn=1)
    out, fault = take_fault(board, request, steps, protocol)
    return out, fault


def shown(steps: tuple[Step, ...]) -> list[tuple[Any, ...]]:
    """What the client gets, in the order it gets it (a delayed close last)."""
    ordered = sorted(steps, key=lambda s: s.at_s)
    return [(s.kind, s.event, s.text, s.code, s.reason) for s in ordered]


def test_with_no_fault_every_event_passes_as_it_came() -> None:
    client, answer = first_turn(REALTIME, "realtime-text")
    steps = relayed(relay(REALTIME), client, answer)
    assert [s.event for s in steps] == [json.loads(t) for t in answer]


@pytest.mark.parametrize(("protocol", "name"), CASES)
@settings(max_examples=15, deadline=None)
@given(spec=faults(types=SESSION_FAULTS))
def test_a_relayed_turn_is_broken_as_the_replayed_turn_is(
    protocol: SessionProtocol, name: str, spec: Any
) -> None:
    data = {**(spec if isinstance(spec, dict) else spec.to_json()), "probability": 1.0}
    data.pop("times", None)
    client, answer = first_turn(protocol, name)
    expected, fault = replayed(protocol, data, answer)
    r = relay(protocol, data)
    got = relayed(r, client, answer)
    assert shown(got) == shown(expected)
    assert (fault is None) == (not r.fired)  # consumed exactly when the replay's is


def test_the_rest_of_a_broken_turn_is_dropped_up_to_its_end() -> None:
    client, answer = first_turn(REALTIME, "realtime-text")
    r = relay(REALTIME, {"type": "session_error", "after_events": 2})
    got = relayed(r, client, answer)
    assert [s.event["type"] for s in got if s.event] == [
        "response.created",
        "response.output_item.added",
        "error",
    ]
    trailer = r.server(json.dumps({"type": "rate_limits.updated", "rate_limits": []}))
    assert [s.event for s in trailer] == [{"type": "rate_limits.updated", "rate_limits": []}]


def test_go_aways_close_comes_time_left_later_while_events_pass() -> None:
    client, answer = first_turn(GEMINI_LIVE, "gemini-live-text")
    r = relay(GEMINI_LIVE, {"type": "go_away", "after_events": 1, "time_left_ms": 250})
    for text in client:
        assert r.client(text) == ()
    first = r.server(answer[0])
    assert [s.event for s in first] == [json.loads(answer[0])]
    at_go_away = r.server(answer[1])
    assert at_go_away[0].event == {"goAway": {"timeLeft": "0.250s"}}
    assert at_go_away[1].event == json.loads(answer[1])
    assert at_go_away[2].kind == CLOSE and at_go_away[2].at_s == 0.25
    assert [s.event for s in r.server(answer[2])] == [json.loads(answer[2])]


def test_a_fault_past_the_turns_events_fires_when_the_next_turn_begins() -> None:
    client, answer = first_turn(REALTIME, "realtime-text")
    r = relay(REALTIME, {"type": "malformed_event", "after_events": 99, "text": "{"})
    for text in client:
        r.client(text)
    for text in answer:
        assert len(r.server(text)) == 1
    before = r.client(json.dumps({"type": "response.create"}))
    assert [(s.kind, s.text) for s in before] == [(TEXT, "{")]


def test_malformed_tool_args_holds_the_turn_to_its_end() -> None:
    client, answer = first_turn(REALTIME, "realtime-tools")
    r = relay(REALTIME, {"type": "malformed_tool_args"})
    for text in client:
        r.client(text)
    held = [r.server(text) for text in answer]
    assert all(steps == () for steps in held[:-1])
    expected, _ = replayed(REALTIME, {"type": "malformed_tool_args"}, answer)
    assert held[-1] == expected
    deltas = "".join(
        s.event["delta"]
        for s in held[-1]
        if s.event and s.event["type"] == "response.function_call_arguments.delta"
    )
    with pytest.raises(ValueError):
        json.loads(deltas)


def test_a_fault_the_protocol_cannot_word_is_not_consumed() -> None:
    client, answer = first_turn(REALTIME, "realtime-text")
    r = relay(REALTIME, {"type": "go_away"})
    assert [s.event for s in relayed(r, client, answer)] == [json.loads(t) for t in answer]
    assert not r.fired and r.board.armed()


def test_the_sessions_log_says_what_the_client_got_for_the_verdicts() -> None:
    from chaosllm.core.live.verdict import SessionLog, session_findings

    client, answer = first_turn(GEMINI_LIVE, "gemini-live-text")
    setup = json.loads(client[0])
    setup["setup"]["sessionResumption"] = {}
    logs = []
    for n, armed in enumerate(({}, {"type": "go_away", "after_events": 1}), start=1):
        log = SessionLog(n, GEMINI_LIVE.name, None)
        r = relay(GEMINI_LIVE, *([armed] if armed else []))
        r.log = log
        r.client(json.dumps(setup))
        for text in client[1:]:
            r.client(text)
        offer = {"sessionResumptionUpdate": {"newHandle": f"h{n}", "resumable": True}}
        for text in [*answer, json.dumps(offer)]:
            r.server(text)
        logs.append(log)
    first, second = logs
    assert first.offered == ["h1"] and first.turns[0][1] is True and not first.went_away
    assert second.turns[0][1] is False and second.went_away
    assert first.turns[0][0] == second.turns[0][0]  # the same turn's digest
    names = [f.name for f in session_findings(logs)]
    # (the second session asks again the turn the first was answered whole)
    assert names == [
        "reconnected_without_resumption",
        "resent_after_done",
        "no_reconnect_after_going_away",
    ]
