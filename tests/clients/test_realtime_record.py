"""Record mode proxies a real upstream WebSocket: the openai SDK's realtime client and
google-genai's live client through a recording chaosllm to a loopback upstream that
speaks the protocol (another chaosllm, replaying), one session recording written (no
credential in it), which then replays exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import openai
import pytest
from google.genai import types

from chaosllm import ChaosServer

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings(
        "ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"
    ),
]

KEY = "sk-proj-recordmeneverAAAAAAAAAAAAAAAA"


def one_turn(server: ChaosServer) -> list[dict[str, object]]:
    client = openai.OpenAI(base_url=server.base_url, api_key=KEY)
    got: list[dict[str, object]] = []
    with client.realtime.connect(model="gpt-realtime") as conn:
        assert conn.recv().type == "session.created"
        conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "What is the capital of France?"}],
            }
        )
        assert conn.recv().type == "conversation.item.added"
        conn.response.create()
        while True:
            event = json.loads(conn.recv_bytes())
            got.append(event)
            if event["type"] == "rate_limits.updated":
                break
    return got


def test_a_session_is_recorded_through_the_proxy_and_replays(tmp_path: Path) -> None:
    with (
        ChaosServer() as upstream,
        ChaosServer(mode="record", upstream=upstream.url, record_dir=tmp_path) as proxy,
    ):
        relayed = one_turn(proxy)
    [written] = tmp_path.rglob("*.json")
    text = written.read_text("utf-8")
    assert KEY not in text and "Authorization" not in text
    data = json.loads(text)
    assert data["provider"] == "openai.realtime"
    assert data["session"]["model"] == "gpt-realtime"
    sources = [e["from"] for e in data["session"]["events"]]
    assert sources[0] == "server" and "client" in sources
    with ChaosServer(recordings=tmp_path) as replay:
        assert one_turn(replay) == relayed


def test_no_audio_records_a_digest_of_each_audio_delta(tmp_path: Path) -> None:
    events = json.loads(
        (Path(__file__).resolve().parents[2] / "recordings/realtime-audio/0001.json").read_text(
            "utf-8"
        )
    )["session"]["events"]
    with (
        ChaosServer() as upstream,
        ChaosServer(
            mode="record", upstream=upstream.url, record_dir=tmp_path, no_audio=True
        ) as proxy,
    ):
        client = openai.OpenAI(base_url=proxy.base_url, api_key=KEY)
        with client.realtime.connect(model="gpt-realtime") as conn:
            conn.recv()
            for item in events:
                if item["from"] == "client":
                    conn.send(item["event"])
            while conn.recv().type != "response.done":
                pass
    [written] = tmp_path.rglob("*.json")
    recorded = json.loads(written.read_text("utf-8"))["session"]["events"]
    deltas = [
        e["event"]["delta"] for e in recorded if e["event"]["type"] == "response.output_audio.delta"
    ]
    assert len(deltas) == 3 and all(d.startswith("sha256:") for d in deltas)
    transcript = [
        e for e in recorded if e["event"]["type"] == "response.output_audio_transcript.delta"
    ]
    assert transcript[0]["event"]["delta"] == "Hello "  # only the audio is hashed


GEMINI_KEY = "AIzaSyRecordMeNeverBBBBBBBBBBBBBBBBBBBBB"
LIVE_MODEL = "gemini-live-2.5-flash-preview"


def live_tool_session(server: ChaosServer) -> list[dict[str, Any]]:
    """google-genai's live client through a tool-call session (two turns): every server
    message after ``setupComplete``, as the SDK parsed it."""
    got: list[dict[str, Any]] = []

    async def main() -> None:
        client = server.live(api_key=GEMINI_KEY)
        config = {"response_modalities": ["TEXT"]}
        async with client.aio.live.connect(model=LIVE_MODEL, config=config) as session:
            await session.send_client_content(
                turns=types.Content(
                    role="user", parts=[types.Part(text="What is the weather in Paris?")]
                )
            )
            call = await session._receive()
            got.append(call.model_dump(exclude_none=True))
            assert call.tool_call is not None and call.tool_call.function_calls
            first = call.tool_call.function_calls[0]
            await session.send_tool_response(
                function_responses=[
                    types.FunctionResponse(
                        id=first.id,
                        name=first.name,
                        response={"temperature_c": 18, "sky": "cloudy"},
                    )
                ]
            )
            while True:
                message = await session._receive()
                got.append(message.model_dump(exclude_none=True))
                if message.usage_metadata is not None:
                    break

    anyio.run(main)
    return got


def test_a_gemini_live_session_is_recorded_through_the_proxy_and_replays(
    tmp_path: Path,
) -> None:
    # The SDK dials wss://: the recording proxy serves TLS; its upstream is plain ws://.
    with (
        ChaosServer() as upstream,
        ChaosServer(mode="record", upstream=upstream.url, record_dir=tmp_path, tls=True) as proxy,
    ):
        relayed = live_tool_session(proxy)
    assert relayed[0]["tool_call"]["function_calls"][0]["name"] == "get_weather"
    assert relayed[-2]["server_content"] == {"turn_complete": True}
    [written] = tmp_path.rglob("*.json")
    text = written.read_text("utf-8")
    assert GEMINI_KEY not in text and "x-goog-api-key" not in text.lower()
    data = json.loads(text)
    assert data["provider"] == "gemini.live"
    events = data["session"]["events"]
    assert [next(iter(e["event"])) for e in events if e["from"] == "client"] == [
        "setup",
        "client_content",
        "tool_response",
    ]
    assert next(iter(events[1]["event"])) == "setupComplete"  # the upstream's, as relayed
    with ChaosServer(recordings=tmp_path, tls=True) as replay:
        assert live_tool_session(replay) == relayed
        [turn, response] = [e for e in replay.requests() if e["path"].startswith("/ws/")]
        assert turn["match"] == response["match"] == "exact"
