"""Background responses end to end with the official `openai` SDK on a real socket: a
create answered ``queued``, polled with ``responses.retrieve`` until it completes; a
background stream dropped mid-answer and resumed with ``retrieve(..., stream=True,
starting_after=<the last sequence_number>)``, its text identical to an uninterrupted
replay; a careless client that asks again instead gets ``re_asked_instead_of_resumed``.
The engine's clock is a `ManualClock` the test moves (never a sleep)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from chaosllm import ChaosServer
from chaosllm.core.clock import ManualClock
from tests.helpers import session_client

pytestmark = pytest.mark.timeout(60)

HAIKU: dict[str, Any] = {
    "model": "gpt-4.1-mini",
    "input": [{"role": "user", "content": "Write a haiku about the sea."}],
}


@pytest.fixture(scope="module")
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(scope="module")
def server(clock: ManualClock) -> Iterator[ChaosServer]:
    with ChaosServer(timing="recorded", clock=clock) as running:
        yield running


def text(events: list[Any]) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


def test_create_in_the_background_then_poll_until_completed() -> None:
    clock = ManualClock()
    with ChaosServer(timing=5, clock=clock) as server:  # the recorded 0.64 s made 3.2 s
        with session_client(server, "poll") as client:
            created = client.responses.create(**HAIKU, background=True)
            assert created.status == "queued" and created.output == []
            seen = [client.responses.retrieve(created.id).status]
            while seen[-1] in ("queued", "in_progress"):
                clock.advance(1.0)  # a careful client waits between polls
                seen.append(client.responses.retrieve(created.id).status)
                assert len(seen) < 10
            done = client.responses.retrieve(created.id)
        assert seen == ["queued", "in_progress", "in_progress", "in_progress", "completed"]
        assert done.output_text.startswith("Waves")
        assert [f.name for f in server.verdict("poll")] == []


def test_polling_without_waiting_is_polled_too_fast(
    server: ChaosServer, clock: ManualClock
) -> None:
    with session_client(server, "eager") as client:
        created = client.responses.create(**HAIKU, background=True)
        for _ in range(3):
            clock.advance(0.1)
            client.responses.retrieve(created.id)
    assert [f.name for f in server.verdict("eager")] == ["polled_too_fast"] * 2


@pytest.mark.parametrize("cut", ["dropped_connection", "connection_reset"])
def test_a_dropped_background_stream_resumed_from_the_last_sequence_number(
    server: ChaosServer, cut: str
) -> None:
    with session_client(server, "whole") as client:
        whole = list(client.responses.create(**HAIKU, background=True, stream=True))
    server.arm({"type": cut, "after_chunks": 8, "match": {"session": cut}})
    got: list[Any] = []
    with session_client(server, cut) as client:
        with pytest.raises(openai.APIConnectionError):
            for event in client.responses.create(**HAIKU, background=True, stream=True):
                got.append(event)
        assert len(got) == 8
        response_id = got[0].response.id
        rest = list(
            client.responses.retrieve(
                response_id, stream=True, starting_after=got[-1].sequence_number
            )
        )
    assert [e.sequence_number for e in rest] == list(range(8, len(whole)))
    assert text(got + rest) == text(whole) and text(whole).startswith("Waves")
    assert rest[-1].type == "response.completed"
    assert server.verdict(cut) == []


def test_a_client_that_asks_again_after_the_drop_is_told_to_resume(server: ChaosServer) -> None:
    server.arm({"type": "dropped_connection", "after_chunks": 5, "match": {"session": "careless"}})
    with session_client(server, "careless") as client:
        with pytest.raises(openai.APIConnectionError):
            for _ in client.responses.create(**HAIKU, background=True, stream=True):
                pass
        again = list(client.responses.create(**HAIKU, background=True, stream=True))
    assert again[-1].type == "response.completed"
    url = f"{server.url}/__verdict?session=careless"
    with urllib.request.urlopen(url, timeout=10) as answer:
        verdict = json.load(answer)
    names = [f["name"] for f in verdict["findings"]]
    assert "re_asked_instead_of_resumed" in names


def test_the_sdk_raises_the_apis_errors(server: ChaosServer) -> None:
    with session_client(server, "errors") as client:
        with pytest.raises(openai.NotFoundError, match="Response with id 'resp_nope' not found"):
            client.responses.retrieve("resp_nope")
        created = client.responses.create(**HAIKU, background=True)
        with pytest.raises(openai.BadRequestError, match="cannot be streamed"):
            list(client.responses.retrieve(created.id, stream=True, starting_after=0))
        server.arm({"type": "response_expired", "match": {"session": "errors"}})
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(created.id)
        assert client.responses.create(**HAIKU, background=True).status == "queued"


def test_cancel_and_a_background_failure_through_the_sdk(
    server: ChaosServer, clock: ManualClock
) -> None:
    with session_client(server, "cancel") as client:
        created = client.responses.create(**HAIKU, background=True)
        assert client.responses.cancel(created.id).status == "cancelled"
        clock.advance(5)
        assert client.responses.retrieve(created.id).status == "cancelled"
        other = client.responses.create(**HAIKU, background=True)
        server.arm({"type": "background_failed", "match": {"session": "cancel"}})
        failed = client.responses.retrieve(other.id)
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.code == "server_error"
