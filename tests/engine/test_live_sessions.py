"""WebSocket sessions in memory (`chaosllm.core.live`): turns matched and answered at the
recorded timing, acknowledgements, bad input, misses, and every session fault as the
steps it leaves (no socket: the executor only sends these steps)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings

from chaosllm.core.live import LiveHub, LiveSession
from chaosllm.faults import FaultBoard, parse_fault_spec
from chaosllm.faults.session import CLOSE, DROP, EVENT, STALL, TEXT, Step
from chaosllm.providers.realtime_openai import REALTIME
from chaosllm.strategies import SESSION_FAULTS, faults
from tests.helpers import RECORDINGS

pytestmark = pytest.mark.timeout(30)


def recorded(name: str) -> list[dict[str, Any]]:
    data = json.loads((RECORDINGS / name / "0001.json").read_text("utf-8"))
    events: list[dict[str, Any]] = data["session"]["events"]
    return events


def session(*faults: dict[str, Any], timing: float = 0.0) -> LiveSession:
    board = FaultBoard(seed=0)
    if faults:
        board.arm([parse_fault_spec(f) for f in faults])
    hub = LiveHub([RECORDINGS], board, timing=timing)
    return hub.session(REALTIME, "/v1/realtime", {"model": "gpt-realtime"}, None)


def play(live: LiveSession, name: str, turn: int = 1) -> tuple[Step, ...]:
    """Send the recording's client events; the steps answering its `turn`-th turn end."""
    seen = 0
    for item in recorded(name):
        if item["from"] != "client":
            continue
        steps = live.receive(json.dumps(item["event"]))
        if item["event"]["type"] == "response.create":
            seen += 1
            if seen == turn:
                return steps
    raise AssertionError("no such turn")


def answer(name: str, turn: int = 1) -> list[dict[str, Any]]:
    events = recorded(name)
    ends = [i for i, e in enumerate(events) if e["event"]["type"] == "response.create"]
    start = ends[turn - 1] + 1
    out = []
    for item in events[start:]:
        if item["from"] == "client":
            break
        out.append(item["event"])
    return out


def kinds(steps: tuple[Step, ...]) -> list[str]:
    return [s.event["type"] if s.kind == EVENT and s.event else s.kind for s in steps]


def test_the_opening_is_session_created() -> None:
    [created] = session().open()
    assert created.event is not None and created.event["type"] == "session.created"
    assert created.event["session"]["model"] == "gpt-realtime"


@pytest.mark.parametrize("name", ["realtime-text", "realtime-audio", "realtime-tools"])
def test_a_turn_is_answered_with_its_recorded_events(name: str) -> None:
    steps = play(session(), name)
    assert [s.event for s in steps] == answer(name)
    assert all(s.at_s == 0.0 for s in steps)  # fast timing


def test_recorded_timing_keeps_the_gaps_after_the_turn_ended() -> None:
    steps = play(session(timing=1.0), "realtime-text")
    assert [round(s.at_s, 3) for s in steps[:3]] == [0.04, 0.06, 0.08]
    half = play(session(timing=0.5), "realtime-text")
    assert round(half[0].at_s, 3) == 0.02


def test_the_second_turn_of_a_tool_session_follows_the_first() -> None:
    live = session()
    assert kinds(play(live, "realtime-tools", 1))[-1] == "response.done"
    steps = play(live, "realtime-tools", 2)
    assert [s.event for s in steps] == answer("realtime-tools", 2)


def test_events_that_do_not_end_a_turn_are_acknowledged() -> None:
    live = session()
    [ack] = live.receive(json.dumps({"type": "session.update", "session": {"instructions": "x"}}))
    assert ack.event == {
        "type": "session.updated",
        "event_id": ack.event["event_id"] if ack.event else None,
        "session": {"instructions": "x"},
    }
    assert live.receive(json.dumps({"type": "input_audio_buffer.append", "audio": "AAAA"})) == ()


@pytest.mark.parametrize(
    ("frame", "says"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "a JSON object with a string 'type'"),
        ('{"type": "response.bogus"}', "Invalid value: 'response.bogus'"),
    ],
)
def test_a_bad_client_event_is_an_error_event(frame: str, says: str) -> None:
    [error] = session().receive(frame)
    assert error.event is not None and error.event["type"] == "error"
    assert error.event["error"]["type"] == "invalid_request_error"
    assert says in error.event["error"]["message"]


def test_a_binary_frame_closes_with_1008() -> None:
    [close] = session().receive_bytes(b"\x00")
    assert (close.kind, close.code) == (CLOSE, 1008)


def test_a_miss_names_the_nearest_turns() -> None:
    live = session()
    live.receive(
        json.dumps(
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "The capital of Spain?"}],
                },
            }
        )
    )
    [error] = live.receive(json.dumps({"type": "response.create"}))
    assert error.event is not None
    message = error.event["error"]["message"]
    assert error.event["error"]["code"] == "no_recording"
    assert "realtime-text/0001 turn 1" in message.split("nearest: ")[1]


# -- session faults -------------------------------------------------------------------------


def test_ws_close_after_k_events() -> None:
    steps = play(
        session({"type": "ws_close", "after_events": 3, "code": 4000, "reason": "x"}),
        "realtime-text",
    )
    assert kinds(steps) == [*kinds(play(session(), "realtime-text"))[:3], CLOSE]
    assert (steps[-1].code, steps[-1].reason) == (4000, "x")


def test_after_events_zero_fires_before_the_first_event() -> None:
    assert kinds(play(session({"type": "ws_drop", "after_events": 0}), "realtime-text")) == [DROP]


@pytest.mark.parametrize(
    "error_type", ["server_error", "rate_limit_exceeded", "invalid_request_error"]
)
def test_session_error_is_an_error_event_mid_response(error_type: str) -> None:
    steps = play(session({"type": "session_error", "error_type": error_type}), "realtime-text")
    assert kinds(steps) == ["response.created", "response.output_item.added", "error"]
    last = steps[-1].event
    assert last is not None and last["error"]["type"] == error_type


def test_session_expired_is_the_event_then_a_close() -> None:
    steps = play(session({"type": "session_expired"}), "realtime-text")
    assert kinds(steps) == ["error", CLOSE]
    assert steps[0].event is not None and steps[0].event["error"]["code"] == "session_expired"


def test_go_away_does_not_apply_to_realtime_and_is_not_consumed() -> None:
    live = session({"type": "go_away"})
    assert [s.event for s in play(live, "realtime-text")] == answer("realtime-text")
    assert len(live.hub.board) == 1


def test_session_stall_leaves_silence_then_a_drop() -> None:
    steps = play(
        session({"type": "session_stall", "after_events": 1, "max_ms": 250}), "realtime-text"
    )
    assert kinds(steps) == ["response.created", STALL]
    assert steps[-1].max_s == 0.25


def test_rate_limits_exhausted() -> None:
    steps = play(session({"type": "rate_limits_exhausted"}), "realtime-text")
    assert kinds(steps) == ["rate_limits.updated", "error"]
    assert steps[0].event is not None
    assert {r["remaining"] for r in steps[0].event["rate_limits"]} == {0}
    assert steps[1].event is not None and steps[1].event["error"]["code"] == "rate_limit_exceeded"


def test_malformed_event_inserts_a_frame_that_is_not_json() -> None:
    steps = play(session({"type": "malformed_event", "after_events": 2}), "realtime-text")
    assert steps[2].kind == TEXT
    with pytest.raises(ValueError):
        json.loads(steps[2].text)
    assert [s.event for s in steps if s.kind == EVENT] == answer("realtime-text")


def test_malformed_tool_args_cuts_the_argument_deltas() -> None:
    steps = play(session({"type": "malformed_tool_args"}), "realtime-tools")
    deltas = "".join(
        s.event["delta"]
        for s in steps
        if s.event and s.event["type"] == "response.function_call_arguments.delta"
    )
    [done] = [
        s.event
        for s in steps
        if s.event and s.event["type"] == "response.function_call_arguments.done"
    ]
    assert deltas == done["arguments"] == '{"city":'
    with pytest.raises(ValueError):
        json.loads(deltas)


def test_malformed_tool_args_does_not_fire_on_a_turn_without_a_tool_call() -> None:
    live = session({"type": "malformed_tool_args"})
    assert [s.event for s in play(live, "realtime-text")] == answer("realtime-text")
    assert len(live.hub.board) == 1


def test_a_session_fault_is_one_shot() -> None:
    live = session({"type": "ws_close", "after_events": 0})
    assert kinds(play(live, "realtime-tools", 1)) == [CLOSE]
    assert [s.event for s in play(live, "realtime-tools", 2)] == answer("realtime-tools", 2)


# -- verdicts -------------------------------------------------------------------------------


def gemini(hub: LiveHub, setup: dict[str, Any]) -> LiveSession:
    from chaosllm.providers.gemini_live import GEMINI_LIVE

    live = hub.session(GEMINI_LIVE, GEMINI_LIVE.paths[0], {}, "t")
    live.receive(json.dumps({"setup": {"model": "models/m", **setup}}))
    return live


def ask_weather(live: LiveSession) -> tuple[Step, ...]:
    question = {"role": "user", "parts": [{"text": "What is the weather in Paris?"}]}
    return live.receive(json.dumps({"client_content": {"turns": [question], "turnComplete": True}}))


def test_reconnecting_without_the_handle_offered_is_found() -> None:
    from chaosllm.core.live.verdict import session_findings

    hub = LiveHub([RECORDINGS], FaultBoard(seed=0))
    first = gemini(hub, {"sessionResumption": {}})
    steps = ask_weather(first)
    offer = steps[-1].event
    assert offer is not None and offer["sessionResumptionUpdate"]["resumable"] is True
    gemini(hub, {})
    [found] = session_findings(hub.logs)
    assert found.name == "reconnected_without_resumption" and found.seqs == (1, 2)
    handle = offer["sessionResumptionUpdate"]["newHandle"]
    hub.clear()
    first = gemini(hub, {"sessionResumption": {}})
    ask_weather(first)
    resumed = gemini(hub, {"sessionResumption": {"handle": first.log.offered[-1]}})
    assert resumed.resumed == first.log.offered[-1] != handle
    assert session_findings(hub.logs) == []


def test_no_reconnect_after_going_away_is_found() -> None:
    from chaosllm.core.live.verdict import session_findings

    board = FaultBoard(seed=0)
    board.arm([parse_fault_spec({"type": "go_away"})])
    hub = LiveHub([RECORDINGS], board)
    ask_weather(gemini(hub, {}))
    assert [f.name for f in session_findings(hub.logs)] == ["no_reconnect_after_going_away"]
    gemini(hub, {})
    assert session_findings(hub.logs) == []


def test_a_turn_asked_again_after_its_complete_answer_is_found() -> None:
    from chaosllm.core.live.verdict import session_findings

    hub = LiveHub([RECORDINGS], FaultBoard(seed=0))
    live = gemini(hub, {})
    ask_weather(live)
    ask_weather(live)
    assert [f.name for f in session_findings(hub.logs)] == ["resent_after_done"]


@settings(max_examples=25, deadline=None)
@given(faults(types=SESSION_FAULTS))
def test_every_drawn_session_fault_breaks_a_turn_or_leaves_it(spec: Any) -> None:
    data = spec if isinstance(spec, dict) else spec.to_json()
    data = {**data, "probability": 1.0}
    if data["type"] == "session_stall":
        data["max_ms"] = 10
    live = session(data)
    steps = play(live, "realtime-text")
    fired = bool(live.hub.board.history())
    if fired:
        assert data["type"] != "go_away"  # Realtime has no goAway: never consumed
        assert [(s.kind, s.event) for s in steps] != [(EVENT, e) for e in answer("realtime-text")]
    else:
        assert [s.event for s in steps] == answer("realtime-text")
