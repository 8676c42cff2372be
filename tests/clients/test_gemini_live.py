"""google-genai's live client (``client.aio.live.connect()``, which always dials
``wss://``) against chaosllm served with TLS (``tls=True``, ``ChaosServer.live()``):
each shipped Gemini Live session replayed exactly, session resumption, a miss, the
go_away fault, and what comes before ``setup``; TLS on every server."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from google.genai import errors, types
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from chaosllm import ChaosServer
from chaosllm.wire.tls import client_context
from tests.helpers import RECORDINGS

pytestmark = pytest.mark.timeout(60)

MODEL = "gemini-live-2.5-flash-preview"
PATH = "/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent"


@pytest.fixture(scope="module", params=["builtin", "h11", "uvicorn"])
def server(request: pytest.FixtureRequest) -> Iterator[ChaosServer]:
    with ChaosServer(tls=True, server=request.param) as srv:
        yield srv


@pytest.fixture
def fresh(server: ChaosServer) -> Iterator[ChaosServer]:
    server.reset()
    yield server
    server.reset()


def answers(name: str) -> list[list[dict[str, Any]]]:
    """Each turn's recorded server messages."""
    events = json.loads((RECORDINGS / name / "0001.json").read_text("utf-8"))["session"]["events"]
    out: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] | None = None
    for item in events:
        if item["from"] == "client":
            body = next(iter(item["event"].values()))
            ends = (
                body.get("turnComplete")
                or "functionResponses" in body
                or body.get("audioStreamEnd")
            )
            current = [] if ends else None
            if current is not None:
                out.append(current)
        elif current is not None:
            current.append(item["event"])
    return out


def parsed(message: dict[str, Any]) -> types.LiveServerMessage:
    return types.LiveServerMessage._from_response(response=message, kwargs={})


async def received(session: Any, count: int) -> list[types.LiveServerMessage]:
    got: list[types.LiveServerMessage] = []
    while len(got) < count:
        got.append(await session._receive())
    return got


def test_tls_serves_http_too(server: ChaosServer) -> None:
    assert server.url.startswith("https://")
    assert server.certfile is not None
    verify = client_context(server.certfile)
    assert httpx.get(server.url + "/health", verify=verify, timeout=5).status_code == 200


def test_a_text_session_replays_exactly(fresh: ChaosServer) -> None:
    async def main() -> None:
        client = fresh.live()
        config = {"response_modalities": ["TEXT"]}
        async with client.aio.live.connect(model=MODEL, config=config) as session:
            await session.send_client_content(
                turns=types.Content(
                    role="user", parts=[types.Part(text="What is the capital of France?")]
                )
            )
            [turn] = answers("gemini-live-text")
            assert await received(session, len(turn)) == [parsed(m) for m in turn]

    anyio.run(main)


def test_an_audio_session_replays_exactly(fresh: ChaosServer) -> None:
    events = json.loads((RECORDINGS / "gemini-live-audio/0001.json").read_text("utf-8"))
    audio = [
        e["event"]["realtime_input"]["audio"]["data"]
        for e in events["session"]["events"]
        if "realtime_input" in e["event"] and "audio" in e["event"]["realtime_input"]
    ]

    async def main() -> None:
        client = fresh.live()
        config = {
            "response_modalities": ["AUDIO"],
            "input_audio_transcription": {},
            "output_audio_transcription": {},
        }
        async with client.aio.live.connect(model=MODEL, config=config) as session:
            for data in audio:
                await session.send_realtime_input(
                    audio=types.Blob(data=base64.b64decode(data), mime_type="audio/pcm;rate=16000")
                )
            await session.send_realtime_input(audio_stream_end=True)
            [turn] = answers("gemini-live-audio")
            got = await received(session, len(turn))
            assert got == [parsed(m) for m in turn]
            assert any(m.data for m in got)  # PCM audio, decoded by the SDK

    anyio.run(main)


def test_a_tool_session_replays_exactly(fresh: ChaosServer) -> None:
    async def main() -> None:
        client = fresh.live()
        async with client.aio.live.connect(
            model=MODEL, config={"response_modalities": ["TEXT"]}
        ) as session:
            await session.send_client_content(
                turns=types.Content(
                    role="user", parts=[types.Part(text="What is the weather in Paris?")]
                )
            )
            first, second = answers("gemini-live-tools")
            got = await received(session, len(first))
            assert got == [parsed(m) for m in first]
            assert got[0].tool_call is not None and got[0].tool_call.function_calls is not None
            call = got[0].tool_call.function_calls[0]
            await session.send_tool_response(
                function_responses=[
                    types.FunctionResponse(
                        id=call.id, name=call.name, response={"temperature_c": 18, "sky": "cloudy"}
                    )
                ]
            )
            assert await received(session, len(second)) == [parsed(m) for m in second]

    anyio.run(main)


def test_a_handle_offered_resumes_the_session_where_it_was(fresh: ChaosServer) -> None:
    async def main() -> None:
        client = fresh.live()
        config: Any = {"response_modalities": ["TEXT"], "session_resumption": {}}
        async with client.aio.live.connect(model=MODEL, config=config) as session:
            await session.send_client_content(
                turns=types.Content(
                    role="user", parts=[types.Part(text="What is the weather in Paris?")]
                )
            )
            first, _ = answers("gemini-live-tools")
            got = await received(session, len(first) + 1)
            update = got[-1].session_resumption_update
            assert update is not None and update.resumable and update.new_handle
        config = {
            "response_modalities": ["TEXT"],
            "session_resumption": {"handle": update.new_handle},
        }
        async with client.aio.live.connect(model=MODEL, config=config) as session:
            # A different tool response: only the session it resumes says what comes next.
            await session.send_tool_response(
                function_responses=[types.FunctionResponse(id="x", name="get_weather", response={})]
            )
            _, second = answers("gemini-live-tools")
            got = await received(session, len(second) + 1)
            assert got[:-1] == [parsed(m) for m in second]

    anyio.run(main)


def test_a_miss_closes_with_1008_naming_the_nearest(fresh: ChaosServer) -> None:
    async def main() -> None:
        client = fresh.live()
        async with client.aio.live.connect(
            model=MODEL, config={"response_modalities": ["TEXT"]}
        ) as session:
            await session.send_client_content(
                turns=types.Content(role="user", parts=[types.Part(text="Tell me a long story")])
            )
            with pytest.raises(errors.APIError) as caught:
                await session._receive()
            assert caught.value.code == 1008
            assert "no recorded turn matches; nearest gemini-live-" in str(caught.value)

    anyio.run(main)


def test_go_away_then_close(fresh: ChaosServer) -> None:
    fresh.arm({"type": "go_away", "after_events": 1, "time_left_ms": 50})

    async def main() -> None:
        client = fresh.live()
        async with client.aio.live.connect(
            model=MODEL, config={"response_modalities": ["TEXT"]}
        ) as session:
            await session.send_client_content(
                turns=types.Content(
                    role="user", parts=[types.Part(text="What is the capital of France?")]
                )
            )
            first = await session._receive()
            assert first.server_content is not None
            going = await session._receive()
            assert going.go_away is not None and going.go_away.time_left == "0.050s"
            with pytest.raises(errors.APIError) as caught:
                while True:
                    await session._receive()
            assert caught.value.code == 1001

    anyio.run(main)


def test_messages_before_setup_close_with_1008(server: ChaosServer) -> None:
    assert server.certfile is not None
    url = server.url.replace("https://", "wss://") + PATH
    with connect(url, ssl=client_context(server.certfile), open_timeout=5) as ws:
        ws.send(json.dumps({"client_content": {"turns": [], "turnComplete": True}}))
        with pytest.raises(ConnectionClosed) as caught:
            ws.recv(timeout=5)
        assert caught.value.rcvd is not None and caught.value.rcvd.code == 1008
        assert "setup must come first" in caught.value.rcvd.reason


def test_the_verdict_names_a_reconnect_without_resumption(fresh: ChaosServer) -> None:
    async def main() -> None:
        client = fresh.live()
        config: Any = {"response_modalities": ["TEXT"], "session_resumption": {}}
        question = types.Content(
            role="user", parts=[types.Part(text="What is the weather in Paris?")]
        )
        async with client.aio.live.connect(model=MODEL, config=config) as session:
            await session.send_client_content(turns=question)
            await received(session, 2)
        async with client.aio.live.connect(model=MODEL, config=config) as session:
            await session.send_client_content(turns=question)
            await received(session, 1)

    anyio.run(main)
    names = [f.name for f in fresh.verdict()]
    assert "reconnected_without_resumption" in names
    over_http = httpx.get(fresh.url + "/__verdict", timeout=10, verify=False).json()
    assert "reconnected_without_resumption" in [f["name"] for f in over_http["findings"]]


async def _faulted_turn(server: ChaosServer) -> tuple[list[types.LiveServerMessage], Exception]:
    """A text turn through google-genai's live client under a fault: the messages it
    handed over, and what it raised (every fault here ends the turn in a raise)."""
    client = server.live()
    got: list[types.LiveServerMessage] = []
    async with client.aio.live.connect(
        model=MODEL, config={"response_modalities": ["TEXT"]}
    ) as session:
        await session.send_client_content(
            turns=types.Content(
                role="user", parts=[types.Part(text="What is the capital of France?")]
            )
        )
        try:
            with anyio.fail_after(10):
                while True:
                    got.append(await session._receive())
        except Exception as exc:  # what the SDK raised is the finding
            return got, exc
    raise AssertionError("unreachable")


@pytest.mark.parametrize(
    ("fault", "raised", "says"),
    [
        ({"type": "ws_close", "code": 4000, "reason": "bye"}, errors.APIError, "4000"),
        ({"type": "ws_close", "code": 1011}, errors.APIError, "1011"),
        ({"type": "ws_drop"}, errors.APIError, "1006"),
        ({"type": "session_stall", "max_ms": 300}, errors.APIError, "1006"),
        ({"type": "malformed_event", "text": "{oops"}, ValueError, "Failed to parse response"),
    ],
)
def test_what_google_genai_raises(
    fresh: ChaosServer, fault: dict[str, Any], raised: type[Exception], says: str
) -> None:
    fresh.arm({**fault, "after_events": 1})
    got, exc = anyio.run(_faulted_turn, fresh)
    assert len(got) == 1 and got[0].server_content is not None
    assert isinstance(exc, raised), repr(exc)
    assert says in str(exc)


@pytest.mark.parametrize("kind", ["session_error", "session_expired", "rate_limits_exhausted"])
def test_the_realtime_only_faults_are_not_consumed_by_a_live_session(
    fresh: ChaosServer, kind: str
) -> None:
    fresh.arm({"type": kind})

    async def main() -> None:
        client = fresh.live()
        async with client.aio.live.connect(
            model=MODEL, config={"response_modalities": ["TEXT"]}
        ) as session:
            await session.send_client_content(
                turns=types.Content(
                    role="user", parts=[types.Part(text="What is the capital of France?")]
                )
            )
            [turn] = answers("gemini-live-text")
            assert await received(session, len(turn)) == [parsed(m) for m in turn]

    anyio.run(main)
    assert fresh.state.board.armed() and not fresh.state.board.history()


@pytest.mark.parametrize("version", ["v1alpha", "v1"])
def test_the_other_api_versions_replay_too(fresh: ChaosServer, version: str) -> None:
    from google import genai

    assert fresh.certfile is not None
    context = client_context(fresh.certfile)

    async def main() -> None:
        client = genai.Client(
            api_key="chaosllm",
            http_options=types.HttpOptions(
                base_url=fresh.url, api_version=version, async_client_args={"ssl": context}
            ),
        )
        config = types.LiveConnectConfig(response_modalities=[types.Modality.TEXT])
        async with client.aio.live.connect(model=MODEL, config=config) as session:
            await session.send_client_content(
                turns=types.Content(
                    role="user", parts=[types.Part(text="What is the capital of France?")]
                )
            )
            [turn] = answers("gemini-live-text")
            assert await received(session, len(turn)) == [parsed(m) for m in turn]

    anyio.run(main)
    [entry] = fresh.requests()
    assert entry["path"] == PATH.replace("v1beta", version)
