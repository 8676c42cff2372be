"""Match predicates and schedules on real sockets: exact under 200 concurrent requests
(``every``, ``after_requests`` with ``remaining``, ``turn`` per session), through the
official `openai` SDK (``contains``, ``tool``), the control plane's 400s and listing, the
query string, ``ttl_ms`` on a server whose board runs on a `ManualClock`, and the CLI."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Sequence
from typing import Any

import anyio
import httpx
import openai
import pytest

from chaosllm import ChaosServer
from chaosllm.core.clock import ManualClock
from tests.helpers import CLI, chat_messages, openai_client, recording, request_body

pytestmark = pytest.mark.timeout(60)

CHAT = "/v1/chat/completions"
NAME = "knowledge/0004"
TOOLS = "tool-call/0001"
TIMEOUT = 10.0
CONCURRENCY = 200


def concurrently(
    server: ChaosServer, spec: Any, sessions: Sequence[str | None]
) -> list[tuple[str | None, int]]:
    """Arm `spec` over HTTP, then send one request per entry of `sessions` all at once
    (one connection each); each request's session and status."""
    body = request_body(NAME, stream=False)

    async def main() -> list[tuple[str | None, int]]:
        limits = httpx.Limits(max_connections=len(sessions), max_keepalive_connections=0)
        async with httpx.AsyncClient(
            base_url=server.url, limits=limits, timeout=TIMEOUT * 2
        ) as client:
            assert (await client.post("/__fault", json=spec)).status_code == 201
            got: list[tuple[str | None, int]] = []
            go = anyio.Event()

            async def one(session: str | None) -> None:
                headers = {"X-Chaosllm-Session": session} if session else {}
                await go.wait()
                response = await client.post(CHAT, json=body, headers=headers)
                got.append((session, response.status_code))

            with anyio.fail_after(40):
                async with anyio.create_task_group() as tg:
                    for session in sessions:
                        tg.start_soon(one, session)
                    go.set()
            return got

    return anyio.run(main)


# -- exact under concurrency ------------------------------------------------------------------


def test_every_3_fires_on_exactly_a_third_of_200_concurrent_requests(
    server: ChaosServer,
) -> None:
    got = concurrently(server, {"type": "http_503", "every": 3, "remaining": 1000}, [None] * 200)
    statuses = Counter(status for _, status in got)
    assert statuses == {503: 66, 200: 134}
    fired = server.faults()["fired"]
    assert [f["seen"] for f in fired] == list(range(3, 199, 3))
    assert server.faults()["armed"][0]["seen"] == CONCURRENCY
    assert sum(e["fault"] is not None for e in server.requests()) == 66


def test_after_10_with_remaining_5_fires_exactly_5_times_after_the_first_10(
    server: ChaosServer,
) -> None:
    spec = {"type": "http_503", "after_requests": 10, "remaining": 5}
    got = concurrently(server, spec, [None] * CONCURRENCY)
    assert Counter(status for _, status in got) == {503: 5, 200: CONCURRENCY - 5}
    assert [f["seen"] for f in server.faults()["fired"]] == [11, 12, 13, 14, 15]
    assert server.faults()["armed"] == []


def test_turn_fires_once_per_session_under_concurrency(server: ChaosServer) -> None:
    sessions = [f"s{i}" for i in range(20)]
    specs = [{"type": "http_503", "match": {"session": s, "turn": 7}} for s in sessions]
    got = concurrently(server, specs, sessions * 10)
    failed = Counter(session for session, status in got if status == 503)
    assert failed == dict.fromkeys(sessions, 1)
    assert server.faults()["armed"] == []
    assert sorted(f["session"] for f in server.faults()["fired"]) == sorted(sessions)


# -- the SDK ----------------------------------------------------------------------------------


def test_contains_and_tool_through_the_openai_sdk(server: ChaosServer, http: httpx.Client) -> None:
    weather = recording(TOOLS)["request"]["body"]
    simple = request_body(NAME, stream=False)
    word = weather["messages"][-1]["content"].split()[-1]
    assert word not in json.dumps(simple["messages"])
    spec = {"type": "http_503", "remaining": 1, "match": {"contains": word}}
    assert http.post("/__fault", json=spec).status_code == 201
    with openai_client(server) as client:
        ok = client.chat.completions.create(
            model=simple["model"], messages=chat_messages(simple["messages"])
        )
        assert ok.choices[0].message.content
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(
                model=weather["model"],
                messages=chat_messages(weather["messages"]),
                tools=weather["tools"],
            )
        spec = {"type": "http_error", "status": 502, "match": {"tool": "get_weather"}}
        assert http.post("/__fault", json=spec).status_code == 201
        client.chat.completions.create(
            model=simple["model"], messages=chat_messages(simple["messages"])
        )  # offers no tool: served
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(
                model=weather["model"],
                messages=chat_messages(weather["messages"]),
                tools=weather["tools"],
            )
        assert refused.value.status_code == 502


# -- the control plane ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"every": 0}, "every must be an integer >= 1"),
        ({"after_requests": -1}, "after_requests must be an integer >= 0"),
        ({"ttl_ms": "soon"}, "ttl_ms must be a number"),
        ({"ttl_ms": -1}, "ttl_ms must be a number > 0"),
        ({"match": {"turn": 0}}, "match.turn must be an integer >= 1"),
        ({"match": {"contains": 5}}, "match.contains must be a string"),
        ({"match": {"tools": "x"}}, "match has no field 'tools'"),
    ],
)
def test_bad_fields_get_a_400_and_arm_nothing(
    http: httpx.Client, spec: dict[str, Any], says: str
) -> None:
    response = http.post("/__fault", json=[{"type": "http_429"}, {"type": "http_503", **spec}])
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_fault_spec"
    assert says in response.json()["error"]["message"]
    assert http.get("/__fault").json()["armed"] == []


def test_the_query_string_and_the_listing(http: httpx.Client) -> None:
    response = http.post(
        "/__fault/http_503",
        params={
            "every": "2",
            "after_requests": "1",
            "turn": "3",
            "contains": "42",
            "ttl_ms": "9e6",
        },
    )
    assert response.status_code == 201, response.text
    (listed,) = http.get("/__fault").json()["armed"]
    assert listed["every"] == 2 and listed["after_requests"] == 1 and listed["seen"] == 0
    assert listed["match"] == {"turn": 3, "contains": "42"}
    assert listed["ttl_ms"] == 9e6 and 0 < listed["expires_in_ms"] <= 9e6
    bad = http.post("/__fault/http_503", params={"every": "twice"})
    assert bad.status_code == 400 and "every must be an integer" in bad.text


def test_ttl_on_a_server_whose_board_runs_on_a_manual_clock() -> None:
    clock = ManualClock()
    with ChaosServer() as server:
        server.state.board.monotonic = clock.monotonic
        server.arm("http_503", ttl_ms=500, remaining=10)
        with httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:
            body = request_body(NAME, stream=False)
            assert http.post(CHAT, json=body).status_code == 503
            clock.advance(0.499)
            assert http.post(CHAT, json=body).status_code == 503
            assert http.get("/__fault").json()["armed"][0]["expires_in_ms"] == pytest.approx(1)
            clock.advance(0.001)
            assert http.post(CHAT, json=body).status_code == 200
            assert http.get("/__fault").json()["armed"] == []


def test_the_cli_arms_predicates_and_schedules(server: ChaosServer) -> None:
    done = subprocess.run(
        [
            *CLI,
            "fault",
            "arm",
            "http_503",
            "--url",
            server.url,
            "--every",
            "2",
            "--after-requests",
            "1",
            "--ttl-ms",
            "60000",
            "--turn",
            "4",
            "--contains",
            "hello",
            "--tool",
            "get_weather",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    (armed,) = server.faults()["armed"]
    assert (armed["every"], armed["after_requests"], armed["ttl_ms"]) == (2, 1, 60000.0)
    assert armed["match"] == {"contains": "hello", "tool": "get_weather", "turn": 4}
