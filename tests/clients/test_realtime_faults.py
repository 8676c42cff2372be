"""Every session fault on a real WebSocket: what a plain ``websockets`` client receives
(frames, close code, no close frame, unanswered pings), and what the ``openai`` SDK's
realtime client raises (the table in docs/providers/realtime.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from websockets.exceptions import ConnectionClosed, ConnectionClosedError
from websockets.sync.client import ClientConnection, connect

from chaosllm import ChaosServer
from tests.realtime import QUESTION, WEATHER, item

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings(
        "ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"
    ),
]


@pytest.fixture(scope="module")
def server() -> Iterator[ChaosServer]:
    with ChaosServer() as srv:
        yield srv


@pytest.fixture
def armed(server: ChaosServer) -> Iterator[ChaosServer]:
    server.reset()
    yield server
    server.reset()


def raw_turn(server: ChaosServer, text: str = QUESTION) -> tuple[ClientConnection, list[Any]]:
    """A plain client's session up to the turn's answer: the connection and what arrived
    (parsed events, raw text that is not JSON, then the close or ConnectionClosed)."""
    ws = connect(
        server.url.replace("http://", "ws://") + "/v1/realtime?model=gpt-realtime",
        compression=None,
        open_timeout=5,
    )
    ws.recv(timeout=5)
    ws.send(json.dumps(item(text)))
    ws.recv(timeout=5)
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
            if event["type"] in ("response.done", "error"):
                break
    except ConnectionClosed as exc:
        got.append(exc)
    return ws, got


def closed_with(got: list[Any]) -> int | None:
    last = got[-1]
    assert isinstance(last, ConnectionClosed), got
    return None if last.rcvd is None else last.rcvd.code


@pytest.mark.parametrize("code", [1000, 1001, 1011, 4000])
def test_ws_close_on_a_raw_socket(armed: ChaosServer, code: int) -> None:
    armed.arm({"type": "ws_close", "after_events": 3, "code": code, "reason": "bye"})
    _, got = raw_turn(armed)
    assert got[:3] == [
        "response.created",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert closed_with(got) == code
    assert got[-1].rcvd.reason == "bye"


def test_ws_drop_ends_tcp_without_a_close_frame(armed: ChaosServer) -> None:
    armed.arm({"type": "ws_drop", "after_events": 2})
    _, got = raw_turn(armed)
    assert got[:2] == ["response.created", "response.output_item.added"]
    assert closed_with(got) is None  # no close frame: the TCP connection ended


@pytest.mark.parametrize("kind", ["h11", "uvicorn"])
def test_ws_drop_ends_tcp_without_a_close_frame_on_the_other_servers(kind: str) -> None:
    with ChaosServer(server=kind) as other:
        other.arm({"type": "ws_drop", "after_events": 2})
        _, got = raw_turn(other)
        assert got[:2] == ["response.created", "response.output_item.added"]
        assert closed_with(got) is None  # no close frame: the TCP connection ended
        # and the server goes on serving sessions
        _, again = raw_turn(other)
        assert again[-1] == "response.done"


def test_session_error_arrives_mid_response(armed: ChaosServer) -> None:
    armed.arm({"type": "session_error", "error_type": "rate_limit_exceeded"})
    ws, got = raw_turn(armed)
    assert got == ["response.created", "response.output_item.added", "error"]
    ws.close()


def test_session_expired_then_close(armed: ChaosServer) -> None:
    armed.arm({"type": "session_expired"})
    ws, got = raw_turn(armed)
    assert got == ["error"]
    with pytest.raises(ConnectionClosed) as caught:
        ws.recv(timeout=5)
    assert caught.value.rcvd is not None and caught.value.rcvd.code == 1001


def test_session_stall_leaves_pings_unanswered(armed: ChaosServer) -> None:
    armed.arm({"type": "session_stall", "after_events": 1, "max_ms": 3000})
    ws = connect(
        armed.url.replace("http://", "ws://") + "/v1/realtime?model=gpt-realtime",
        compression=None,
        open_timeout=5,
    )
    ws.recv(timeout=5)
    ws.send(json.dumps(item(QUESTION)))
    ws.recv(timeout=5)
    ws.send(json.dumps({"type": "response.create"}))
    assert json.loads(ws.recv(timeout=5))["type"] == "response.created"
    with pytest.raises(TimeoutError):
        ws.recv(timeout=0.5)
    assert not ws.ping().wait(timeout=0.5)
    with pytest.raises(ConnectionClosedError) as caught:
        ws.recv(timeout=10)
    assert caught.value.rcvd is None  # dropped once max_ms passed


def test_rate_limits_exhausted_then_the_error(armed: ChaosServer) -> None:
    armed.arm({"type": "rate_limits_exhausted"})
    ws, got = raw_turn(armed)
    assert got == ["rate_limits.updated", "error"]
    ws.close()


def test_malformed_event_is_a_frame_that_is_not_json(armed: ChaosServer) -> None:
    armed.arm({"type": "malformed_event", "after_events": 1})
    ws, got = raw_turn(armed)
    assert got[0] == "response.created"
    assert got[1][0] == "not json"
    assert got[-1] == "response.done"  # the rest of the turn follows
    ws.close()


# -- through the SDK ------------------------------------------------------------------------


def sdk_turn(server: ChaosServer, text: str = QUESTION) -> tuple[list[str], BaseException | None]:
    client = openai.OpenAI(base_url=server.base_url, api_key="sk-test")
    got: list[str] = []
    try:
        with client.realtime.connect(model="gpt-realtime") as conn:
            conn.recv()
            conn.send(item(text))  # type: ignore[arg-type]
            conn.recv()
            conn.response.create()
            while True:
                event = conn.recv()
                got.append(event.type)
                if event.type == "error":
                    got.append(str(event.error.code or event.error.type))
                    break
                if event.type == "response.done":
                    break
    except Exception as exc:
        return got, exc
    return got, None


SDK: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"type": "ws_close", "code": 1011}, ConnectionClosedError, "received 1011"),
    ({"type": "ws_close", "code": 4000, "reason": "x"}, ConnectionClosedError, "received 4000"),
    ({"type": "ws_drop"}, ConnectionClosedError, "no close frame received or sent"),
    ({"type": "session_stall", "max_ms": 1000}, ConnectionClosedError, "no close frame"),
    ({"type": "malformed_event"}, json.JSONDecodeError, "Expecting value"),
]


@pytest.mark.parametrize(("fault", "raised", "says"), SDK, ids=[f[0]["type"] for f in SDK])
def test_what_the_sdk_raises(
    armed: ChaosServer, fault: dict[str, Any], raised: type[Exception], says: str
) -> None:
    armed.arm(fault)
    got, exc = sdk_turn(armed)
    assert isinstance(exc, raised), (got, exc)
    assert says in str(exc)


@pytest.mark.parametrize(
    ("fault", "events"),
    [
        (
            {"type": "session_error"},
            ["response.created", "response.output_item.added", "error", "server_error"],
        ),
        ({"type": "session_expired"}, ["error", "session_expired"]),
        (
            {"type": "rate_limits_exhausted"},
            ["rate_limits.updated", "error", "rate_limit_exceeded"],
        ),
    ],
)
def test_the_sdk_hands_error_events_to_the_caller(
    armed: ChaosServer, fault: dict[str, Any], events: list[str]
) -> None:
    armed.arm(fault)
    assert sdk_turn(armed) == (events, None)


def test_the_sdk_passes_malformed_tool_args_through(armed: ChaosServer) -> None:
    armed.arm({"type": "malformed_tool_args"})
    client = openai.OpenAI(base_url=armed.base_url, api_key="sk-test")
    with client.realtime.connect(model="gpt-realtime") as conn:
        conn.recv()
        conn.send(item(WEATHER))  # type: ignore[arg-type]
        conn.recv()
        conn.response.create()
        while True:
            event = conn.recv()
            if event.type == "response.function_call_arguments.done":
                with pytest.raises(ValueError):
                    json.loads(event.arguments)
                break


def test_the_journal_holds_each_session_turn(armed: ChaosServer) -> None:
    armed.arm({"type": "ws_close", "after_events": 1})
    raw_turn(armed)
    ws, _ = raw_turn(armed, "What is the capital of Spain?")
    ws.close()
    first, second = armed.requests()[-2:]
    assert (first["path"], first["status"], first["recording"]) == (
        "/v1/realtime",
        101,
        "realtime-text/0001",
    )
    assert first["fault"]["type"] == "ws_close" and first["ending"] == "close"
    assert second["miss"] is True and "no recorded session turn" in second["error"]
