"""Background responses recorded through chaosllm from a loopback upstream that speaks
the protocol (a chaosllm replaying the shipped recordings at twice their gaps, on a clock
the test moves), then replayed: the polls come back as recorded, in order, and the
resumed stream with its recorded sequence numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chaosllm import ChaosServer
from chaosllm.core.clock import ManualClock
from tests.helpers import openai_client

pytestmark = pytest.mark.timeout(60)

HAIKU: dict[str, Any] = {
    "model": "gpt-4.1-mini",
    "input": [{"role": "user", "content": "Write a haiku about the sea."}],
}


def test_polls_and_a_resumed_stream_record_and_replay_as_recorded(tmp_path: Path) -> None:
    clock = ManualClock()
    with (
        ChaosServer(timing=2, clock=clock) as upstream,
        ChaosServer(mode="record", upstream=upstream.url, record_dir=tmp_path) as proxy,
        openai_client(proxy) as client,
    ):
        created = client.responses.create(**HAIKU, background=True)
        recorded = [created.status]
        while recorded[-1] in ("queued", "in_progress"):
            clock.advance(0.5)
            recorded.append(client.responses.retrieve(created.id).status)
        stream = list(client.responses.create(**HAIKU, background=True, stream=True))
        after = stream[15].sequence_number
        resumed = list(client.responses.retrieve(created.id, stream=True, starting_after=after))
    files = sorted(tmp_path.rglob("*.json"))
    kinds = [
        (json.loads(f.read_text())["provider"], json.loads(f.read_text())["request"]["method"])
        for f in files
    ]
    polls = len(recorded) - 1
    assert kinds == [
        ("openai.responses", "POST"),
        *[("openai.responses.stored", "GET")] * polls,
        ("openai.responses", "POST"),
        ("openai.responses.stored", "GET"),
    ]
    assert recorded[0] == "queued" and recorded[-1] == "completed"

    with ChaosServer(recordings=[tmp_path]) as replay, openai_client(replay) as client:
        again = client.responses.create(**HAIKU, background=True)
        replayed = [again.status] + [
            client.responses.retrieve(again.id).status for _ in range(polls)
        ]
        stream_again = list(client.responses.create(**HAIKU, background=True, stream=True))
        resumed_again = list(client.responses.retrieve(again.id, stream=True, starting_after=after))
    assert replayed == recorded
    assert [e.model_dump() for e in stream_again] == [e.model_dump() for e in stream]
    assert [e.model_dump() for e in resumed_again] == [e.model_dump() for e in resumed]
    assert [e.sequence_number for e in resumed] == list(range(after + 1, len(stream)))
