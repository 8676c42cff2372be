"""The ``openai`` SDK's realtime client (``client.realtime.connect()``, sync and async)
replays each shipped Realtime session exactly: every server event of each turn, as
recorded, byte for byte once parsed; on the builtin server and under uvicorn."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import openai
import pytest

from chaosllm import ChaosServer
from tests.helpers import RECORDINGS

pytestmark = [
    pytest.mark.timeout(60),
    # The SDK's sync client calls websockets' connect() without a with block (websockets
    # 17.1 deprecates that); it is the SDK's, not ours.
    pytest.mark.filterwarnings(
        "ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"
    ),
]

SESSIONS = ("realtime-text", "realtime-audio", "realtime-tools")
ACKED = {
    "session.update": "session.updated",
    "conversation.item.create": "conversation.item.added",
    "input_audio_buffer.commit": "input_audio_buffer.committed",
}


def session_events(name: str) -> list[dict[str, Any]]:
    data = json.loads((RECORDINGS / name / "0001.json").read_text("utf-8"))
    events: list[dict[str, Any]] = data["session"]["events"]
    return events


def turns(name: str) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """Each turn's client events and the server events recorded after its end."""
    out: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []
    client: list[dict[str, Any]] = []
    for item in session_events(name):
        if item["from"] == "client":
            client.append(item["event"])
            if item["event"]["type"] == "response.create":
                out.append((client, []))
                client = []
        elif out and not client:
            out[-1][1].append(item["event"])
    return out


@pytest.fixture(scope="module", params=["builtin", "h11", "uvicorn"])
def server(request: pytest.FixtureRequest) -> Iterator[ChaosServer]:
    with ChaosServer(server=request.param) as srv:
        yield srv


@pytest.mark.parametrize("name", SESSIONS)
def test_the_sync_client_replays_each_session_exactly(server: ChaosServer, name: str) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="sk-test")
    with client.realtime.connect(model="gpt-realtime") as conn:
        assert conn.recv().type == "session.created"
        for sent, recorded in turns(name):
            for event in sent:
                conn.send(event)  # type: ignore[arg-type]
                if event["type"] in ACKED:
                    assert conn.recv().type == ACKED[event["type"]]
            got = [json.loads(conn.recv_bytes()) for _ in recorded]
            assert got == recorded
            assert conn.parse_event(json.dumps(got[-1]).encode()).type in (
                "response.done",
                "rate_limits.updated",
            )


@pytest.mark.parametrize("name", SESSIONS)
def test_the_async_client_replays_each_session_exactly(server: ChaosServer, name: str) -> None:
    async def main() -> None:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="sk-test")
        async with client.realtime.connect(model="gpt-realtime") as conn:
            assert (await conn.recv()).type == "session.created"
            for sent, recorded in turns(name):
                for event in sent:
                    await conn.send(event)  # type: ignore[arg-type]
                    if event["type"] in ACKED:
                        assert (await conn.recv()).type == ACKED[event["type"]]
                got = [json.loads(await conn.recv_bytes()) for _ in recorded]
                assert got == recorded
        await client.close()

    anyio.run(main)


def test_a_miss_is_an_error_event_naming_the_nearest(server: ChaosServer) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="sk-test")
    with client.realtime.connect(model="gpt-realtime") as conn:
        conn.recv()
        conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "What is the capital of Spain?"}],
            }
        )
        conn.recv()
        conn.response.create()
        error = conn.recv()
        assert error.type == "error"
        message = error.error.message
        assert "no recorded session turn matches" in message
        assert "realtime-text/0001 turn 1" in message
        assert "--mode record-missing" in message


def test_the_fixture_gives_a_realtime_client(chaosllm: Any) -> None:
    with chaosllm.realtime().realtime.connect(model="gpt-realtime") as conn:
        assert conn.recv().type == "session.created"


def test_the_azure_client_replays_a_session_at_openai_realtime(server: ChaosServer) -> None:
    server.reset()
    client = openai.AzureOpenAI(
        azure_endpoint=server.url,
        api_key="azure-test-key",
        api_version="2025-04-01-preview",
        websocket_base_url=server.url.replace("http://", "ws://") + "/openai",
    )
    [(sent, recorded)] = turns("realtime-text")
    with client.realtime.connect(model="my-realtime-deployment") as conn:
        assert conn.recv().type == "session.created"
        for event in sent:
            conn.send(event)  # type: ignore[arg-type]
            if event["type"] in ACKED:
                assert conn.recv().type == ACKED[event["type"]]
        assert [json.loads(conn.recv_bytes()) for _ in recorded] == recorded
    [turn] = server.requests()
    assert turn["path"] == "/openai/realtime" and turn["model"] == "my-realtime-deployment"
    server.reset()
