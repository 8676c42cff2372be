"""No input gets a bare 500 (issue #12 item 3).

Six input classes used to raise out of the engine or the control plane: JSON nested
deeper than the interpreter recurses, integers over 4,300 digits, lone surrogates,
``role`` given as a list or object, numbers beyond float range, deep content blocks.
Each is now the protocol's 400 envelope saying what is wrong (in memory, through the
app, and on a kept-alive socket that then serves a correct request), nothing is
half-applied, and an exception nobody expected is a 500 envelope (``internal_error``)
whose error id the log line carries, with ``Connection: close``. Two hypothesis fuzzes,
of provider bodies and of control bodies, check that nothing answers 500.
"""

from __future__ import annotations

import json
import logging
import re
import socket
from collections.abc import Callable, Iterator
from typing import Any

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.responses import JSONResponse
from starlette.testclient import TestClient

from chaosllm import ChaosServer
from chaosllm.config import Mode, OnMiss, ServerConfig
from chaosllm.core.engine import MAX_DEPTH, Reply
from chaosllm.errors import InvalidFaultSpec
from chaosllm.faults import FAULT_TYPES, parse_fault_spec
from chaosllm.http.app import create_app
from chaosllm.paths import shipped_dir
from tests.helpers import all_recordings, recording, request_body
from tests.memory import CHAT, MESSAGES, RESPONSES, EnginePair

PATHS = (CHAT, MESSAGES, RESPONSES)
PROVIDER = {CHAT: "openai.chat", MESSAGES: "anthropic.messages", RESPONSES: "openai.responses"}
CONVERSATION = {CHAT: "messages", MESSAGES: "messages", RESPONSES: "input"}
GOOD = {
    CHAT: request_body("simple-chat/0001", stream=False),
    MESSAGES: request_body("anthropic-text/0001", stream=False),
    RESPONSES: request_body("responses-simple/0001", stream=False),
}
"""A request per protocol that replays a shipped recording (200)."""


def _body(path: str, **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "gpt-4o-mini", CONVERSATION[path]: [{"role": "user"}]}
    if path == MESSAGES:
        body.update(model="claude-sonnet-4-6", max_tokens=64)
    message = body[CONVERSATION[path]][0]
    message["content"] = changes.pop("content", "hi")
    if "role" in changes:
        message["role"] = changes.pop("role")
    body.update(changes)
    return body


_HOLE = "\x00hole\x00"


def _with_raw(body: dict[str, Any], raw: bytes) -> bytes:
    """`body` as JSON with `raw` spliced in where the value `_HOLE` is."""
    text = json.dumps(body).encode()
    hole = json.dumps(_HOLE).encode()
    assert text.count(hole) == 1
    return text.replace(hole, raw)


def _deep_content(path: str, depth: int) -> bytes:
    if path == MESSAGES:
        block = b'[{"type": "tool_result", "tool_use_id": "toolu_1", "content": '
        return block * depth + b'"hi"' + b"}]" * depth
    return b'[{"type": "text", "text": "hi", "parts": ' * depth + b"[]" + b"}]" * depth


BAD: dict[str, tuple[Callable[[str], bytes], str]] = {
    "deep_json": (
        lambda path: _with_raw(_body(path, metadata=_HOLE), b"[" * 1500 + b"]" * 1500),
        f"deeper than {MAX_DEPTH} levels",
    ),
    "huge_integer": (
        lambda path: _with_raw(_body(path, temperature=_HOLE), b"9" * 5000),
        "an integer of 5000 digits, beyond the range of a 64-bit float",
    ),
    "lone_surrogate": (
        lambda path: _with_raw(_body(path, content=_HOLE), b'"\\ud800"'),
        "lone UTF-16 surrogate (\\ud800)",
    ),
    "role_list": (
        lambda path: json.dumps(_body(path, role=["user"])).encode(),
        "role",
    ),
    "role_object": (
        lambda path: json.dumps(_body(path, role={"name": "user"})).encode(),
        "role",
    ),
    "beyond_float": (
        lambda path: _with_raw(_body(path, temperature=_HOLE), b"1e999"),
        "beyond the range of a 64-bit float",
    ),
    "deep_content": (
        lambda path: _with_raw(_body(path, content=_HOLE), _deep_content(path, 400)),
        f"deeper than {MAX_DEPTH} levels",
    ),
}
"""The six input classes of the issue (role in two shapes): raw body by path, and a
fragment of the message that says what is wrong ("role": see `said`)."""

ROLE_REFUSALS = {
    CHAT: "Supported values are: 'assistant', 'developer', 'function', 'system', 'tool', 'user'",
    RESPONSES: "Supported values are: 'assistant', 'developer', 'system', 'user'",
    MESSAGES: "messages.0.role: Input should be 'user' or 'assistant'",
}
"""How each API refuses a role that is not one of its roles (a list or object too)."""


def said(fragment: str, path: str) -> str:
    return ROLE_REFUSALS[path] if fragment == "role" else fragment


def error_message(path: str, body: Any) -> str:
    """The message of the protocol's 400 envelope (asserting its shape)."""
    if path == MESSAGES:
        assert body["type"] == "error", body
    error = body["error"]
    assert error["type"] == "invalid_request_error", body
    message: str = error["message"]
    return message


def _encodable(data: Any) -> None:
    """What the control plane does with a journal entry or a fault list: Starlette's
    JSONResponse (UTF-8, no NaN)."""
    JSONResponse(data)


# -- in memory, against the engine ---------------------------------------------------


@pytest.fixture(scope="module")
def pair() -> EnginePair:
    return EnginePair.of()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", sorted(BAD))
def test_each_class_gets_the_protocols_400_saying_what_is_wrong(
    pair: EnginePair, case: str, path: str
) -> None:
    make, fragment = BAD[case]
    answer = pair.send(None, path=path, raw=make(path))
    assert answer.status == 400
    assert said(fragment, path) in error_message(path, answer.json())
    record = answer.record
    assert record["status"] == 400 and record["path"] == path
    _encodable(record)


def test_the_depth_limit_is_exact(pair: EnginePair) -> None:
    def nested(depth: int) -> bytes:  # the body object is one level
        return _with_raw(_body(CHAT, metadata=_HOLE), b"[" * (depth - 1) + b"]" * (depth - 1))

    assert pair.send(None, raw=nested(MAX_DEPTH)).status == 404  # read, then no recording
    refused = pair.send(None, raw=nested(MAX_DEPTH + 1))
    assert refused.status == 400 and "deeper than" in refused.error["message"]


def test_valid_unicode_and_big_finite_numbers_are_read(pair: EnginePair) -> None:
    # A surrogate *pair* is one character (an emoji), and 1e308 is a float.
    raw = _with_raw(_body(CHAT, content=_HOLE, seed=10**300, top_p=1e308), b'"\\ud83d\\ude00"')
    answer = pair.send(None, raw=raw)
    assert answer.status == 404
    assert "\U0001f600" in answer.error["message"]
    _encodable(answer.record)


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"NaN", "NaN, which is not JSON"),
        (b"-Infinity", "-Infinity, which is not JSON"),
        (b"1" + b"0" * 400, "integer of 401 digits"),
        (b"2" + b"0" * 308, "integer of 309 digits"),  # 2e308: just beyond
        (b'"\xed\xa0\x80"', "lone UTF-16 surrogate (\\ud800)"),  # a surrogate as UTF-8
    ],
)
def test_non_finite_numbers_and_encoded_surrogates_are_refused(
    pair: EnginePair, raw: bytes, fragment: str
) -> None:
    body = _body(CHAT, temperature=_HOLE) if raw[:1] != b'"' else _body(CHAT, content=_HOLE)
    answer = pair.send(None, raw=_with_raw(body, raw))
    assert answer.status == 400
    assert fragment in answer.error["message"]


def test_a_surrogate_in_a_key_is_shown_escaped(pair: EnginePair) -> None:
    raw = b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "\\udc00x": 1}]}'
    answer = pair.send(None, raw=raw)
    assert answer.status == 400
    assert answer.error["param"] == "messages[0].\\udc00x"


def test_the_proxy_modes_forward_such_bodies_unrecorded() -> None:
    proxy = EnginePair(ServerConfig(mode=Mode.PASSTHROUGH, upstream="http://127.0.0.1:9"))
    for case in ("deep_json", "lone_surrogate", "huge_integer"):
        decision = proxy.proxy(None, raw=BAD[case][0](CHAT))
        assert decision.body is None and decision.digest is None and not decision.record
        _encodable(decision.entry.to_json())


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"type": "http_503", "message": "\ud800"}, "message holds a lone UTF-16 surrogate"),
        ({"type": "http_503", "match": {"model": "\udfff"}}, "match.model holds a lone"),
        ({"type": "latency", "delay_ms": 10**400}, "got an integer of 1329 bits"),
        ({"type": "stall", "after_chunks": 10**400}, "finite number within float range"),
        ({"type": "latency", "delay_ms": float("inf")}, "got inf"),
        ({"type": "stall", "max_ms": float("nan")}, "got nan"),
        ({"type": "http_503", "remaining": 10**5000}, "within float range"),
        ({"type": "http_503", "probability": -(10**5000)}, "an integer of 16610 bits"),
        ({"type": 10**5000}, "unknown fault type an integer of 16610 bits"),
    ],
)
def test_fault_specs_refuse_what_cannot_be_listed_or_rendered(
    spec: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(InvalidFaultSpec, match=re.escape(fragment)):
        parse_fault_spec(spec)


# -- the fuzz of provider bodies -----------------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
ANY_JSON = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
WORDS = st.sampled_from(
    [
        "user", "assistant", "system", "developer", "tool", "function", "text", "image",
        "image_url", "input_text", "output_text", "message", "tool_use", "tool_result",
        "function_call", "function_call_output", "thinking", "json_schema", "json_object",
        "auto", "required", "none",
    ]
)  # fmt: skip
KEYS = st.sampled_from(
    [
        "model", "messages", "input", "role", "content", "type", "text", "stream",
        "stream_options", "include_usage", "max_tokens", "max_output_tokens", "tools",
        "tool_choice", "tool_calls", "tool_call_id", "tool_use_id", "function", "name",
        "arguments", "parameters", "input_schema", "response_format", "json_schema",
        "schema", "strict", "system", "instructions", "temperature", "n", "id", "call_id",
        "output", "source", "image_url", "thinking", "reasoning", "metadata", "format",
    ]
)  # fmt: skip
EVIL = st.sampled_from(
    [
        b'"\\ud800"',
        b'"a\\udfffb"',
        b'"\xed\xb0\x80"',
        b"9" * 4400,
        b"-" + b"9" * 400,
        b"1e999",
        b"-1e400",
        b"NaN",
        b"Infinity",
        b"[" * 1100 + b"]" * 1100,
        b'{"a": ' * 300 + b"1" + b"}" * 300,
        b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1),
    ]
)
"""JSON text that used to raise: spliced in for a value."""

BASES = {
    path: [recording(name)["request"]["body"] for name in all_recordings(PROVIDER[path])]
    for path in PATHS
}


@st.composite
def provider_bodies(draw: st.DrawFn, path: str) -> bytes:
    """Bytes of a recorded request of `path`'s protocol with a few values replaced by
    arbitrary JSON, protocol words, or (sometimes) text that used to raise."""
    body: Any = json.loads(json.dumps(draw(st.sampled_from(BASES[path]))))
    evil = None
    for _ in range(draw(st.integers(1, 4))):
        node = body
        for _ in range(draw(st.integers(0, 4))):  # walk down to some container
            keys = sorted(node) if isinstance(node, dict) else list(range(len(node)))
            if not keys:
                break
            child = node[draw(st.sampled_from(keys))]
            if not isinstance(child, (dict, list)) or not child:
                break
            node = child
        value = draw(ANY_JSON | WORDS)
        if evil is None and draw(st.integers(0, 3)) == 0:
            evil, value = draw(EVIL), _HOLE
        if isinstance(node, dict):
            node[draw(KEYS | st.text(max_size=6))] = value
        elif node:
            node[draw(st.integers(0, len(node) - 1))] = value
        elif value == _HOLE:
            evil = None
    if isinstance(body, dict) and draw(st.booleans()):
        body["stream"] = True
    raw = json.dumps(body).encode()
    if evil is not None and json.dumps(_HOLE).encode() in raw:
        raw = raw.replace(json.dumps(_HOLE).encode(), evil, 1)
    return raw


FUZZ_PAIRS = {
    (on_miss, strict): EnginePair(
        ServerConfig(recordings=[shipped_dir("recordings")], on_miss=on_miss, strict=strict)
    )
    for on_miss in (OnMiss.ERROR, OnMiss.FALLBACK)
    for strict in (False, True)
}


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_fuzz_provider_bodies_never_raise_or_answer_500(data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(PATHS), label="path")
    raw = data.draw(
        provider_bodies(path) | ANY_JSON.map(lambda v: json.dumps(v).encode()), label="raw"
    )
    pair = FUZZ_PAIRS[data.draw(st.sampled_from(sorted(FUZZ_PAIRS)), label="config")]
    pair.engine.board.reset()
    fault = data.draw(st.none() | st.sampled_from(sorted(FAULT_TYPES)), label="fault")
    if fault is not None:
        pair.arm({"type": fault})
    decision = pair.decide(None, path=path, raw=raw)
    assert isinstance(decision, Reply)
    plan = decision.plan
    assert plan.status < 500 or decision.fired is not None, plan.body()[:300]
    body = plan.body()  # every piece renders
    if plan.status == 400 and decision.fired is None:  # a fault's 400 is its own shape
        error_message(path, json.loads(body))
    _encodable(decision.entry.to_json())
    _encodable([f.to_json() for f in pair.engine.board.history()])


# -- through the app -----------------------------------------------------------------


@pytest.fixture(scope="module")
def app_client() -> Iterator[TestClient]:
    app = create_app(ServerConfig())
    with TestClient(
        app, base_url="http://127.0.0.1", client=("127.0.0.1", 5000), raise_server_exceptions=True
    ) as client:
        yield client


JSON_HEADERS = {"content-type": "application/json"}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", sorted(BAD))
def test_each_class_through_the_app(app_client: TestClient, case: str, path: str) -> None:
    make, fragment = BAD[case]
    response = app_client.post(path, content=make(path), headers=JSON_HEADERS)
    assert response.status_code == 400
    assert said(fragment, path) in error_message(path, response.json())


CONTROL_BAD: dict[str, tuple[str, bytes, str]] = {
    "fault_surrogate": ("/__fault", b'{"type": "http_503", "message": "\\ud800"}', "surrogate"),
    "fault_huge_number": (
        "/__fault",
        b'{"type": "http_503", "retry_after": ' + b"9" * 400 + b"}",
        "integer of 400 digits",
    ),
    "fault_huge_integer": (
        "/__fault",
        b'{"type": "stall", "after_chunks": ' + b"9" * 5000 + b"}",
        "integer of 5000 digits",
    ),
    "fault_infinite": ("/__fault", b'{"type": "latency", "delay_ms": 1e999}', "1e999"),
    "fault_deep": ("/__fault", b"[" * 3000 + b"]" * 3000, "deeper than"),
    "profile_surrogate": (
        "/__profile",
        b'{"faults": [{"type": "http_503", "message": "\\ud800"}]}',
        "faults[0].message",
    ),
    "workspace_surrogate": ("/__workspace", b'{"path": "/tmp/\\ud800"}', "surrogate"),
    "scenario_surrogate": ("/__scenario", b'{"scenario": "\\udc00"}', "surrogate"),
    "session_surrogate": (
        "/__scenario",
        b'{"scenario": null, "session": "\\ud800"}',
        "at session",
    ),
    "embeddings_deep": (
        "/v1/embeddings",
        b'{"model": "m", "input": ' + b"[" * 2000 + b"]" * 2000 + b"}",
        "deeper than",
    ),
    "embeddings_surrogate": ("/v1/embeddings", b'{"model": "m", "input": "\\ud800"}', "surrogate"),
}


@pytest.mark.parametrize("case", sorted(CONTROL_BAD))
def test_bad_control_bodies_change_nothing(app_client: TestClient, case: str) -> None:
    app_client.post("/__reset")
    armed = app_client.post("/__fault", json={"type": "http_503", "remaining": 3}).json()
    path, raw, fragment = CONTROL_BAD[case]
    response = app_client.post(path, content=raw, headers=JSON_HEADERS)
    assert response.status_code == 400
    assert fragment in error_message(path, response.json())
    faults = app_client.get("/__fault")
    assert faults.status_code == 200
    assert [f["id"] for f in faults.json()["armed"]] == armed["ids"]  # nothing disarmed
    assert app_client.get("/__requests").status_code == 200


def test_a_query_spec_beyond_float_range_is_refused(app_client: TestClient) -> None:
    app_client.post("/__reset")
    for query in ("latency?delay_ms=1e999", "http_error?status=" + "9" * 5000):
        response = app_client.post(f"/__fault/{query}")
        assert response.status_code == 400, response.text
    assert app_client.get("/__fault").json()["armed"] == []


CONTROL_PATHS = ("/__fault", "/__profile", "/__scenario", "/__workspace", "/v1/embeddings")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    path=st.sampled_from(CONTROL_PATHS),
    value=ANY_JSON
    | st.fixed_dictionaries(
        {"type": st.sampled_from(sorted(FAULT_TYPES))},
        optional={
            "message": ANY_JSON,
            "remaining": ANY_JSON,
            "after_chunks": ANY_JSON,
            "delay_ms": ANY_JSON,
            "match": ANY_JSON,
        },
    )
    | st.fixed_dictionaries({"path": ANY_JSON})
    | st.fixed_dictionaries({"scenario": ANY_JSON}, optional={"session": ANY_JSON})
    | st.fixed_dictionaries({"faults": ANY_JSON}),
    evil=st.none() | EVIL,
)
def test_fuzz_control_bodies_never_answer_500(
    app_client: TestClient, path: str, value: Any, evil: bytes | None
) -> None:
    app_client.post("/__reset")
    raw = json.dumps(value).encode()
    if evil is not None:
        raw = _with_raw({"type": "http_503", "message": _HOLE, "path": "x"}, evil)
    before = app_client.get("/__fault").json()["armed"]
    response = app_client.post(path, content=raw, headers=JSON_HEADERS)
    assert response.status_code < 500, response.text
    response.json()
    after = app_client.get("/__fault")
    assert after.status_code == 200
    if response.status_code >= 400:
        assert after.json()["armed"] == before
    assert app_client.get("/__requests").status_code == 200


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_provider_bodies_through_the_app(app_client: TestClient, data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(PATHS))
    raw = data.draw(provider_bodies(path))
    response = app_client.post(path, content=raw, headers=JSON_HEADERS)
    assert response.status_code < 500, response.text
    if response.status_code == 400:
        error_message(path, response.json())


def test_an_unexpected_error_is_an_envelope_with_an_id_in_the_log(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = create_app(ServerConfig())
    state = app.state.chaos

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the sentence that must not reach the client")

    monkeypatch.setattr(state, "handle", broken)
    with (
        TestClient(app, base_url="http://127.0.0.1", client=("127.0.0.1", 5000)) as client,
        caplog.at_level(logging.ERROR, logger="chaosllm"),
    ):
        response = client.post(MESSAGES, json=GOOD[MESSAGES])
    assert response.status_code == 500
    assert response.headers["connection"] == "close"
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "api_error"
    message = body["error"]["message"]
    assert "must not reach" not in message
    error_id = re.search(r"error id ([0-9a-f]{8})", message)
    assert error_id is not None
    logged = [r for r in caplog.records if error_id.group(1) in r.getMessage()]
    assert logged and logged[0].exc_info is not None


# -- on sockets: a kept-alive connection, then a correct request ---------------------


class Client:
    """A raw HTTP/1.1 connection, read with h11: whatever bytes we send, and the
    responses exactly as the server framed them."""

    def __init__(self, server: ChaosServer) -> None:
        assert server.port is not None
        self.sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        self.h11 = h11.Connection(h11.CLIENT)

    def close(self) -> None:
        self.sock.close()

    def send(self, method: str, path: str, body: bytes = b"") -> tuple[h11.Response, Any]:
        headers = [("host", "127.0.0.1")]
        if method != "GET":
            headers += [("content-type", "application/json"), ("content-length", str(len(body)))]
        data = self.h11.send(h11.Request(method=method, target=path, headers=headers))
        if body:
            data += self.h11.send(h11.Data(data=body)) or b""
        data += self.h11.send(h11.EndOfMessage()) or b""
        self.sock.sendall(data or b"")
        response: h11.Response | None = None
        content = bytearray()
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(self.sock.recv(65536))
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                content += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                raise AssertionError(f"connection ended before the response: {event!r}")
        assert response is not None
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
        return response, json.loads(content) if content else None

    def closed_by_server(self) -> bool:
        self.sock.settimeout(5)
        return self.sock.recv(1) == b""


def header(response: h11.Response, name: bytes) -> bytes | None:
    return next((v for k, v in response.headers if k == name), None)


@pytest.fixture(scope="module", params=["builtin", "h11", "uvicorn"])
def live(request: pytest.FixtureRequest) -> Iterator[ChaosServer]:
    with ChaosServer(server=request.param) as server:
        yield server


@pytest.fixture
def client(live: ChaosServer) -> Iterator[Client]:
    live.reset()
    connection = Client(live)
    yield connection
    connection.close()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", sorted(BAD))
def test_each_class_on_a_kept_alive_connection(client: Client, case: str, path: str) -> None:
    make, fragment = BAD[case]
    response, body = client.send("POST", path, make(path))
    assert response.status_code == 400
    assert header(response, b"connection") != b"close"
    assert said(fragment, path) in error_message(path, body)
    again, answer = client.send("POST", path, json.dumps(GOOD[path]).encode())
    assert again.status_code == 200, answer
    assert header(again, b"x-chaosllm-match") == b"exact"


def test_a_surrogate_fault_message_arms_nothing(client: Client) -> None:
    response, body = client.send("POST", "/__fault", CONTROL_BAD["fault_surrogate"][1])
    assert response.status_code == 400 and "surrogate" in body["error"]["message"]
    listing, faults = client.send("GET", "/__fault")
    assert listing.status_code == 200 and faults["armed"] == []


def test_a_surrogate_workspace_disarms_nothing(live: ChaosServer, client: Client) -> None:
    (fault_id,) = live.arm("http_503")
    response, _ = client.send("POST", "/__workspace", CONTROL_BAD["workspace_surrogate"][1])
    assert response.status_code == 400
    listing, faults = client.send("GET", "/__fault")
    assert listing.status_code == 200
    assert [f["id"] for f in faults["armed"]] == [fault_id]
    assert client.send("POST", CHAT, json.dumps(GOOD[CHAT]).encode())[0].status_code == 503


@pytest.mark.parametrize("where", ["control", "provider"])
def test_an_unexpected_error_closes_with_an_envelope(
    live: ChaosServer,
    client: Client,
    where: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("unexpected")

    if where == "control":
        monkeypatch.setattr(live.state.board, "armed", broken)
        method, path, raw = "GET", "/__fault", b""
    else:
        monkeypatch.setattr(live.state, "handle", broken)
        method, path, raw = "POST", MESSAGES, json.dumps(GOOD[MESSAGES]).encode()
    with caplog.at_level(logging.ERROR, logger="chaosllm"):
        response, body = client.send(method, path, raw)
    assert response.status_code == 500
    assert header(response, b"connection") == b"close"
    error = body["error"]
    assert (error["type"], body.get("type")) == (
        ("api_error", "error") if where == "provider" else ("server_error", None)
    )
    found = re.search(r"error id ([0-9a-f]{8})", error["message"])
    assert found is not None
    assert any(found.group(1) in r.getMessage() for r in caplog.records)
    assert client.closed_by_server()
