"""Proxied WebSocket sessions: session faults applied to a live upstream session (record
and passthrough) on a raw socket and through the openai SDK, and record-missing relaying
only the turns no recording has. The upstream is another chaosllm on loopback, replaying
the shipped sessions (it speaks the protocols)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import openai
import pytest
from google.genai import types
from websockets.exceptions import ConnectionClosed, ConnectionClosedError, ConnectionClosedOK
from websockets.sync.client import connect
from websockets.sync.connection import Connection

from chaosllm import ChaosServer
from tests.helpers import RECORDINGS
from tests.realtime import QUESTION, WEATHER, item

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings(
        "ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"
    ),
]

TEXT_ANSWER = [
    "response.created",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
]


@pytest.fixture(scope="module")
def upstream() -> Iterator[ChaosServer]:
    with ChaosServer() as srv:
        yield srv


@pytest.fixture(scope="module", params=["passthrough", "record"])
def proxy(
    request: pytest.FixtureRequest, upstream: ChaosServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ChaosServer]:
    record_dir = tmp_path_factory.mktemp("recorded")
    options: dict[str, Any] = {"record_dir": record_dir} if request.param == "record" else {}
    with ChaosServer(mode=request.param, upstream=upstream.url, **options) as srv:
        yield srv


@pytest.fixture
def armed(proxy: ChaosServer) -> Iterator[ChaosServer]:
    proxy.reset()
    yield proxy
    proxy.reset()


def ws_url(server: ChaosServer) -> str:
    return server.url.replace("http://", "ws://") + "/v1/realtime?model=gpt-realtime"


def turn(ws: Connection, text: str) -> list[Any]:
    """One turn on an open session: the event types (raw text that is not JSON as
    ``("not json", text)``) up to ``response.done``, or the ConnectionClosed last (the
    previous turn's trailing ``rate_limits.updated`` skipped)."""
    ws.send(json.dumps(item(text)))
    while (ack := json.loads(ws.recv(timeout=5))["type"]) == "rate_limits.updated":
        pass
    assert ack == "conversation.item.added"
    ws.send(json.dumps({"type": "response.create"}))
    got: list[Any] = []
    try:
        while True:
            frame = ws.recv(timeout=5)
            try:
                event = json.loads(frame)
            except ValueError:
                got.append(("not json", frame))
                continue
            got.append(event["type"])
            if event["type"] == "response.done":
                return got
    except ConnectionClosed as exc:
        got.append(exc)
    return got


def raw_session(server: ChaosServer, *texts: str) -> list[list[Any]]:
    with connect(ws_url(server), compression=None, open_timeout=5) as ws:
        assert json.loads(ws.recv(timeout=5))["type"] == "session.created"
        out = []
        for text in texts:
            out.append(turn(ws, text))
            if isinstance(out[-1][-1], ConnectionClosed):
                break
        return out


def test_with_no_fault_the_upstreams_session_passes(armed: ChaosServer) -> None:
    [got] = raw_session(armed, QUESTION)
    assert got[:4] == TEXT_ANSWER and got[-1] == "response.done"


@pytest.mark.parametrize("code", [1011, 4000])
def test_ws_close_on_a_proxied_session(armed: ChaosServer, code: int) -> None:
    armed.arm({"type": "ws_close", "after_events": 3, "code": code, "reason": "bye"})
    [got] = raw_session(armed, QUESTION)
    assert got[:3] == TEXT_ANSWER[:3]
    closed = got[-1]
    assert isinstance(closed, ConnectionClosed) and len(got) == 4
    assert closed.rcvd is not None and (closed.rcvd.code, closed.rcvd.reason) == (code, "bye")


def test_ws_drop_on_a_proxied_session(armed: ChaosServer) -> None:
    armed.arm({"type": "ws_drop", "after_events": 2})
    [got] = raw_session(armed, QUESTION)
    assert got[:2] == TEXT_ANSWER[:2] and len(got) == 3
    assert isinstance(got[-1], ConnectionClosed) and got[-1].rcvd is None  # no close frame


def test_session_error_drops_the_rest_of_the_turn_and_the_session_goes_on(
    armed: ChaosServer,
) -> None:
    armed.arm({"type": "session_error", "after_events": 2, "error_type": "server_error"})
    with connect(ws_url(armed), compression=None, open_timeout=5) as ws:
        ws.recv(timeout=5)
        ws.send(json.dumps(item(QUESTION)))
        ws.recv(timeout=5)
        ws.send(json.dumps({"type": "response.create"}))
        first = [json.loads(ws.recv(timeout=5)) for _ in range(3)]
        assert [e["type"] for e in first] == [*TEXT_ANSWER[:2], "error"]
        assert first[2]["error"]["type"] == "server_error"
        # the turn's remaining events never come; its trailer and the next turn do
        assert json.loads(ws.recv(timeout=5))["type"] == "rate_limits.updated"
        assert turn(ws, QUESTION)[-1] == "response.done"
    [entry] = [e for e in armed.requests() if e["fault"]]
    assert entry["match"] == "upstream" and entry["fault"]["type"] == "session_error"


def test_malformed_event_and_stall_on_a_proxied_session(armed: ChaosServer) -> None:
    armed.arm({"type": "malformed_event", "after_events": 1, "text": "{oops"})
    [got] = raw_session(armed, QUESTION)
    assert got[:3] == ["response.created", ("not json", "{oops"), "response.output_item.added"]
    assert got[-1] == "response.done"
    armed.arm({"type": "session_stall", "after_events": 1, "max_ms": 300})
    [got] = raw_session(armed, QUESTION)
    assert got[0] == "response.created" and isinstance(got[-1], ConnectionClosed)


def test_malformed_tool_args_on_a_proxied_tool_call(armed: ChaosServer) -> None:
    armed.arm({"type": "malformed_tool_args"})
    client = openai.OpenAI(base_url=armed.base_url, api_key="sk-test")
    with client.realtime.connect(model="gpt-realtime") as conn:
        conn.recv()
        conn.send(item(WEATHER))  # type: ignore[arg-type]
        conn.recv()
        conn.response.create()
        while (event := conn.recv()).type != "response.function_call_arguments.done":
            pass
        with pytest.raises(ValueError):
            json.loads(event.arguments)


@pytest.mark.parametrize(
    ("fault", "raised", "says"),
    [
        ({"type": "ws_close", "code": 1011}, ConnectionClosedError, "1011"),
        ({"type": "ws_drop"}, ConnectionClosedError, "no close frame received or sent"),
        ({"type": "session_expired"}, ConnectionClosedOK, "1001 (going away) session expired"),
    ],
)
def test_what_the_sdk_raises_on_a_proxied_session(
    armed: ChaosServer, fault: dict[str, Any], raised: type[Exception], says: str
) -> None:
    armed.arm({**fault, "after_events": 2})
    client = openai.OpenAI(base_url=armed.base_url, api_key="sk-test")
    with client.realtime.connect(model="gpt-realtime") as conn:
        conn.recv()
        conn.send(item(QUESTION))  # type: ignore[arg-type]
        conn.recv()
        conn.response.create()
        with pytest.raises(raised) as caught:
            while True:
                conn.recv()
        assert says in str(caught.value)


def test_a_recorded_session_keeps_the_upstreams_events_not_the_faults(
    upstream: ChaosServer, tmp_path: Path
) -> None:
    with ChaosServer(mode="record", upstream=upstream.url, record_dir=tmp_path) as proxy:
        proxy.arm({"type": "malformed_event", "after_events": 1, "text": "{oops"})
        [got] = raw_session(proxy, QUESTION)
        assert ("not json", "{oops") in got
    [written] = tmp_path.rglob("*.json")
    text = written.read_text("utf-8")
    assert "{oops" not in text
    events = json.loads(text)["session"]["events"]
    served = [e["event"]["type"] for e in events if e["from"] == "server"]
    assert [t for t in served if t.startswith("response.")] == [
        t for t in got if isinstance(t, str) and t.startswith("response.")
    ]


# -- record-missing ---------------------------------------------------------------


def known(tmp_path: Path, *names: str) -> Path:
    """A recordings directory holding copies of shipped sessions."""
    root = tmp_path / "recordings"
    for name in names:
        shutil.copytree(RECORDINGS / name, root / name)
    return root


def test_record_missing_relays_only_the_turn_no_recording_has(tmp_path: Path) -> None:
    root = known(tmp_path, "realtime-text")
    with (
        ChaosServer() as upstream,
        ChaosServer(
            mode="record-missing", upstream=upstream.url, recordings=root, record_dir=root
        ) as proxy,
    ):
        # Recorded whole: replayed, the upstream never dialled, nothing written.
        [again] = raw_session(proxy, QUESTION)
        assert again[-1] == "response.done"
        assert upstream.requests() == []
        assert len(list(root.rglob("*.json"))) == 1
        # Turn 1 is recorded, turn 2 is not: only turn 2 is relayed.
        first, second = raw_session(proxy, QUESTION, WEATHER)
        assert first == again
        assert "response.function_call_arguments.done" in second
        turns = [(e["match"], e["miss"]) for e in proxy.requests()]
        assert turns == [("exact", False), ("exact", False), ("upstream", True)]
        # The upstream was brought up to the session (turn 1, its answer dropped), then
        # answered turn 2.
        assert [e["match"] for e in upstream.requests()] == ["exact", "exact"]
    written = [p for p in root.rglob("*.json") if "realtime-text" not in str(p)]
    assert len(written) == 1
    # The session recorded: both turns replay, without the upstream.
    with ChaosServer(recordings=root) as replay:
        assert raw_session(replay, QUESTION, WEATHER) == [first, second]
        assert [e["match"] for e in replay.requests()] == ["exact", "exact"]


def test_record_missing_through_google_genai(tmp_path: Path) -> None:
    root = known(tmp_path, "gemini-live-text")

    async def two_turns(server: ChaosServer) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        client = server.live(api_key="AIzaSyNeverRecordedCCCCCCCCCCCCCCCCCCC")
        async with client.aio.live.connect(
            model="gemini-live-2.5-flash-preview", config={"response_modalities": ["TEXT"]}
        ) as session:
            for text in (QUESTION, WEATHER):
                await session.send_client_content(
                    turns=types.Content(role="user", parts=[types.Part(text=text)])
                )
                while True:
                    message = await session._receive()
                    got.append(message.model_dump(exclude_none=True))
                    done = message.server_content is not None and bool(
                        message.server_content.turn_complete
                    )
                    if done or message.tool_call is not None:
                        break
        return got

    with (
        ChaosServer() as upstream,
        ChaosServer(
            mode="record-missing",
            upstream=upstream.url,
            recordings=root,
            record_dir=root,
            tls=True,
        ) as proxy,
    ):
        relayed = anyio.run(two_turns, proxy)
        assert relayed[-1]["tool_call"]["function_calls"][0]["name"] == "get_weather"
        assert [(e["match"], e["miss"]) for e in proxy.requests()] == [
            ("exact", False),
            ("upstream", True),
        ]
    written = [p for p in root.rglob("*.json") if "gemini-live-text" not in str(p)]
    assert len(written) == 1 and "AIzaSy" not in written[0].read_text("utf-8")
    with ChaosServer(recordings=root, tls=True) as replay:
        assert anyio.run(two_turns, replay) == relayed


def test_go_away_on_a_proxied_gemini_session_through_google_genai(upstream: ChaosServer) -> None:
    from google.genai import errors

    async def main(server: ChaosServer) -> tuple[list[types.LiveServerMessage], Exception]:
        got: list[types.LiveServerMessage] = []
        client = server.live()
        async with client.aio.live.connect(
            model="gemini-live-2.5-flash-preview", config={"response_modalities": ["TEXT"]}
        ) as session:
            await session.send_client_content(
                turns=types.Content(role="user", parts=[types.Part(text=QUESTION)])
            )
            try:
                with anyio.fail_after(10):
                    while True:
                        got.append(await session._receive())
            except errors.APIError as exc:
                return got, exc
        raise AssertionError("unreachable")

    with ChaosServer(mode="passthrough", upstream=upstream.url, tls=True) as proxy:
        proxy.arm({"type": "go_away", "after_events": 1, "time_left_ms": 200})
        got, exc = anyio.run(main, proxy)
    assert got[0].server_content is not None
    assert got[1].go_away is not None and got[1].go_away.time_left == "0.200s"
    # the turn goes on during the time left, then the session closes with 1001
    assert any(m.server_content and m.server_content.turn_complete for m in got[2:])
    assert isinstance(exc, errors.APIError) and exc.code == 1001


def test_the_verdicts_judge_a_proxied_live_client(upstream: ChaosServer) -> None:
    async def ask(server: ChaosServer) -> None:
        client = server.live()
        config: Any = {"response_modalities": ["TEXT"], "session_resumption": {}}
        async with client.aio.live.connect(
            model="gemini-live-2.5-flash-preview", config=config
        ) as session:
            await session.send_client_content(
                turns=types.Content(role="user", parts=[types.Part(text=QUESTION)])
            )
            while (await session._receive()).session_resumption_update is None:
                pass

    with ChaosServer(mode="passthrough", upstream=upstream.url, tls=True) as proxy:
        anyio.run(ask, proxy)
        anyio.run(ask, proxy)  # a new session, not resuming from the handle offered
        names = [f.name for f in proxy.verdict()]
    assert "reconnected_without_resumption" in names


def test_an_https_upstream_is_dialled_over_wss(monkeypatch: pytest.MonkeyPatch) -> None:
    with ChaosServer(tls=True) as secure:
        assert secure.url.startswith("https://") and secure.certfile is not None
        # the proxy's upstream client trusts what the machine trusts: here, that certificate
        monkeypatch.setenv("SSL_CERT_FILE", str(secure.certfile))
        with ChaosServer(mode="passthrough", upstream=secure.url) as proxy:
            [got] = raw_session(proxy, QUESTION)
        assert got[:4] == TEXT_ANSWER and got[-1] == "response.done"
        [turn] = secure.requests()
        assert turn["path"] == "/v1/realtime" and turn["match"] == "exact"


@pytest.mark.parametrize("kind", ["h11", "uvicorn"])
def test_faults_on_a_proxied_session_under_the_other_servers(
    upstream: ChaosServer, kind: str
) -> None:
    with ChaosServer(mode="passthrough", upstream=upstream.url, server=kind) as proxy:
        proxy.arm({"type": "ws_close", "after_events": 2, "code": 4000, "reason": "bye"})
        [got] = raw_session(proxy, QUESTION)
        assert got[:2] == TEXT_ANSWER[:2] and len(got) == 3
        assert got[-1].rcvd is not None and got[-1].rcvd.code == 4000
        proxy.arm({"type": "ws_drop", "after_events": 1})
        [got] = raw_session(proxy, QUESTION)
        assert got[:1] == TEXT_ANSWER[:1] and len(got) == 2 and got[-1].rcvd is None
        [again] = raw_session(proxy, QUESTION)  # and the proxy goes on serving
        assert again[-1] == "response.done"


def test_a_turn_a_fault_cut_is_not_recorded(tmp_path: Path) -> None:
    # The upstream answers at the recorded pace (events 20 ms apart): the fault ends the
    # client's session long before the upstream's answer would have ended.
    with (
        ChaosServer(timing="recorded") as paced,
        ChaosServer(mode="record", upstream=paced.url, record_dir=tmp_path) as proxy,
    ):
        proxy.arm({"type": "ws_drop", "after_events": 1, "match": {"turn": 2}})
        first, second = raw_session(proxy, QUESTION, QUESTION)
        assert first[-1] == "response.done" and isinstance(second[-1], ConnectionClosed)
        proxy.arm({"type": "ws_close", "after_events": 1})
        [cut] = raw_session(proxy, QUESTION)  # a session whose only turn is cut
        assert isinstance(cut[-1], ConnectionClosed)
    [written] = tmp_path.rglob("*.json")  # the first session's; the second has no whole turn
    events = json.loads(written.read_text("utf-8"))["session"]["events"]
    sent = [e["event"]["type"] for e in events if e["from"] == "client"]
    assert sent == ["conversation.item.create", "response.create"]  # turn 2 left out
    assert "response.done" in [e["event"]["type"] for e in events]
    with ChaosServer(recordings=tmp_path) as replay:
        [again] = raw_session(replay, QUESTION)
        assert again == first
