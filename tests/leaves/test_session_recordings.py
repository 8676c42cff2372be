"""Session recordings written from relayed frames (`chaosllm.store.sessions`): a last
turn whose answer never ended is left out (a recording never replays a cut answer as
the whole one), and what is kept cuts into the same turns."""

from __future__ import annotations

import json
from typing import Any

from chaosllm.providers.gemini_live import GEMINI_LIVE
from chaosllm.providers.realtime_openai import REALTIME
from chaosllm.store.sessions import session_from_events, whole_turns
from tests.helpers import RECORDINGS


def frames(name: str) -> list[tuple[str, float, str]]:
    data = json.loads((RECORDINGS / name / "0001.json").read_text("utf-8"))
    return [(e["from"], e["t_ms"], json.dumps(e["event"])) for e in data["session"]["events"]]


def kinds(events: list[tuple[str, float, str]]) -> list[Any]:
    return [json.loads(text).get("type") or next(iter(json.loads(text))) for _, _, text in events]


def test_a_session_whose_turns_all_ended_is_kept_whole() -> None:
    for protocol, name in [(REALTIME, "realtime-tools"), (GEMINI_LIVE, "gemini-live-tools")]:
        assert whole_turns(protocol, frames(name)) == frames(name)


def test_a_last_turn_cut_mid_answer_is_left_out_from_its_first_client_event() -> None:
    events = frames("realtime-tools")
    ends = [i for i, (_, _, t) in enumerate(events) if json.loads(t)["type"] == "response.create"]
    cut = events[: ends[1] + 3]  # turn 2's answer stops after two events
    kept = whole_turns(REALTIME, cut)
    assert kept == events[: ends[0] + 9]  # turn 1 and its answer, up to response.done
    assert kinds(kept)[-1] == "response.done"
    recording = session_from_events(REALTIME, "/v1/realtime", "m", kept, lambda body: body)
    assert recording is not None and len(recording.turns) == 1


def test_a_session_whose_only_turn_was_cut_keeps_no_turn() -> None:
    events = frames("gemini-live-text")
    end = next(i for i, (s, _, t) in enumerate(events) if s == "client" and "setup" not in t)
    kept = whole_turns(GEMINI_LIVE, events[: end + 2])
    assert kinds(kept) == ["setup", "setupComplete"]
    recording = session_from_events(GEMINI_LIVE, "/ws/x", None, kept, lambda body: body)
    assert recording is not None and recording.turns == ()
