"""`chaosllm probe` on live clients (the ``session`` variant): a plain openai realtime
program and a google-genai live program, each run against a server serving TLS that it
trusts through ``SSL_CERT_FILE``, once per session fault; the matrix says what each
fault does to it."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

from chaosllm.testing.probe import (
    SESSION,
    compare_reports,
    default_faults,
    probe,
    render_junit,
    render_matrix,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

REALTIME_PROGRAM = """
import openai

client = openai.OpenAI()
with client.realtime.connect(model="gpt-realtime") as conn:
    conn.recv()
    conn.conversation.item.create(
        item={
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "What is the capital of France?"}],
        }
    )
    conn.response.create()
    text = ""
    for event in conn:
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type == "response.done":
            break
print(text)
"""

LIVE_PROGRAM = """
import asyncio

from google import genai
from google.genai import types


async def main():
    client = genai.Client()
    config = {"response_modalities": ["TEXT"]}
    async with client.aio.live.connect(
        model="gemini-live-2.5-flash-preview", config=config
    ) as session:
        await session.send_client_content(
            turns=types.Content(
                role="user", parts=[types.Part(text="What is the capital of France?")]
            )
        )
        text = ""
        async for message in session.receive():
            text += message.text or ""
        print(text)


asyncio.run(main())
"""

# What the naive realtime program does with each session fault.
REALTIME = {
    "ws_close": "failed cleanly",  # ConnectionClosedError out of the loop
    "ws_drop": "failed cleanly",
    "session_error": "hung",  # the error event is handed over; the turn never ends
    "session_expired": "wrong answer",  # the SDK ends its iteration on the 1001 close
    "go_away": "not fired",  # Gemini Live's, not Realtime's
    "session_stall": "hung",
    "rate_limits_exhausted": "hung",
    "malformed_event": "failed cleanly",  # json.JSONDecodeError
    "malformed_tool_args": "not fired",  # no tool call in this turn
}


def program(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "client.py"
    path.write_text(text, encoding="utf-8")
    return [sys.executable, str(path)]


def test_the_session_variant_runs_the_session_faults() -> None:
    names = [f["type"] for f in default_faults(stall_ms=1000, sessions=True)]
    assert sorted(names) == sorted(REALTIME)
    stall = next(f for f in default_faults(stall_ms=1000, sessions=True) if "max_ms" in f)
    assert stall == {"type": "session_stall", "max_ms": 1000}


def test_probe_matrix_of_an_openai_realtime_program(tmp_path: Path) -> None:
    report = probe(program(tmp_path, REALTIME_PROGRAM), variants=[SESSION], timeout=6.0, jobs=2)
    assert report.baseline.stdout == "The capital of France is Paris.\n"
    got = {fault: row[SESSION] for fault, row in report.matrix().items()}
    assert got == REALTIME, render_matrix(report)
    [closed] = [r for r in report.runs if r.label == "ws_close"]
    assert closed.timeline and closed.timeline[0]["fault"] == "ws_close"
    # the gate: the same report is no regression; a cell that recovered before is
    junit = render_junit(report)
    assert 'name="ws_close[session]"' in junit and " session status=101 " in junit
    assert not compare_reports(report.to_json(), report).regressed
    before = copy.deepcopy(report.to_json())
    for run in before["runs"]:
        if run["fault"]["type"] == "ws_close":
            run["verdict"] = "recovered"
    comparison = compare_reports(before, report)
    assert [c.cell for c in comparison.worse] == ["ws_close/session"]


def test_probe_runs_a_google_genai_live_program_over_tls(tmp_path: Path) -> None:
    report = probe(
        program(tmp_path, LIVE_PROGRAM),
        faults=[{"type": "go_away", "after_events": 1, "time_left_ms": 100}, {"type": "ws_drop"}],
        variants=[SESSION],
        timeout=10.0,
    )
    assert "The capital of France is Paris." in report.baseline.stdout
    got = {fault: row[SESSION] for fault, row in report.matrix().items()}
    # the turn completes within the time goAway left (the SDK's receive() ends at
    # turnComplete); a drop is an APIError out of receive()
    assert got == {"go_away": "recovered", "ws_drop": "failed cleanly"}, render_matrix(report)
