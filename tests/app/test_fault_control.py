"""The fault control plane over real HTTP (httpx against a running server): arming,
listing, disarming, profiles, the journal, and the semantics of firing -- one-shot,
`remaining`, FIFO, sessions, atomic consumption under concurrency, seeded chaos."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from chaosllm import ChaosServer
from chaosllm.faults import FAULT_TYPES
from chaosllm.store.profiles import list_profiles
from tests.helpers import request_body

pytestmark = pytest.mark.timeout(30)

CHAT = "/v1/chat/completions"
NAME = "knowledge/0004"
TIMEOUT = 5.0


def chat(
    http: httpx.Client, *, stream: bool = False, session: str | None = None, name: str = NAME
) -> int:
    """One provider request; its status."""
    headers = {"X-Chaosllm-Session": session} if session else {}
    return http.post(CHAT, json=request_body(name, stream=stream), headers=headers).status_code


def statuses(http: httpx.Client, count: int, **kwargs: Any) -> list[int]:
    return [chat(http, **kwargs) for _ in range(count)]


def armed(http: httpx.Client) -> list[dict[str, Any]]:
    response = http.get("/__fault")
    assert response.status_code == 200
    faults: list[dict[str, Any]] = response.json()["armed"]
    return faults


def journal(http: httpx.Client, session: str | None = None) -> list[dict[str, Any]]:
    """GET /__requests, once every listed request has finished being answered.

    The client can have read a whole answer a moment before the server records that it
    finished writing it; this is a bounded wait for that, not for the request itself."""
    params = {"session": session} if session else {}
    deadline = time.monotonic() + TIMEOUT
    while True:
        response = http.get("/__requests", params=params)
        assert response.status_code == 200
        entries: list[dict[str, Any]] = response.json()["requests"]
        if all(e["outcome"] != "pending" for e in entries):
            return entries
        assert time.monotonic() < deadline, f"requests still pending: {entries}"
        time.sleep(0.01)


def error_message(response: httpx.Response) -> str:
    message: str = response.json()["error"]["message"]
    return message


# -- arming -----------------------------------------------------------------------------------


def test_arm_one_object(http: httpx.Client) -> None:
    response = http.post("/__fault", json={"type": "http_503", "retry_after": 2})
    assert response.status_code == 201
    body = response.json()
    (fault_id,) = body["ids"]
    assert body["faults"] == [
        {
            "id": fault_id,
            "type": "http_503",
            "remaining": 1,
            "probability": 1.0,
            "retry_after": 2.0,
            "fired": 0,
            "armed_at": body["faults"][0]["armed_at"],
        }
    ]
    assert armed(http) == body["faults"]


def test_arm_an_array_in_order_and_fire_fifo(http: httpx.Client) -> None:
    specs = [
        {"type": "http_error", "status": 500},
        {"type": "http_error", "status": 502},
        {"type": "http_429", "retry_after": 0},
    ]
    response = http.post("/__fault", json=specs)
    assert response.status_code == 201
    ids = response.json()["ids"]
    assert len(ids) == 3
    assert [(f["id"], f["type"], f.get("status")) for f in armed(http)] == list(
        zip(ids, ["http_error", "http_error", "http_429"], [500, 502, None], strict=True)
    )
    assert statuses(http, 4) == [500, 502, 429, 200]


def test_a_bad_spec_in_an_array_arms_nothing(http: httpx.Client) -> None:
    response = http.post(
        "/__fault", json=[{"type": "http_503"}, {"type": "http_429"}, {"type": "bogus"}]
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_fault_spec"
    message = error_message(response)
    assert message.startswith("fault [2]: unknown fault type 'bogus'")
    assert all(name in message for name in FAULT_TYPES)
    assert armed(http) == []
    assert chat(http) == 200


@pytest.mark.parametrize(
    ("spec", "fragments"),
    [
        ({"type": "bogus"}, ["unknown fault type 'bogus'", *FAULT_TYPES]),
        ({"remaining": 2}, ["unknown fault type missing", *FAULT_TYPES]),
        (
            {"type": "http_503", "remaining": -1},
            ["remaining must be an integer >= 1, got -1", "http_503 takes retry_after", "message"],
        ),
        ({"type": "http_503", "remaining": 0}, ["remaining must be an integer >= 1"]),
        (
            {"type": "http_503", "probability": 1.5},
            ["probability must be a number within 0..1, got 1.5", "http_503 takes retry_after"],
        ),
        ({"type": "http_503", "probability": -0.1}, ["probability must be a number within 0..1"]),
        (
            {"type": "http_503", "after_chunks": 2},
            ["http_503 has no parameter 'after_chunks'", "retry_after", "message"],
        ),
        (
            {"type": "empty_reply", "after_chunks": 2},
            ["empty_reply has no parameter 'after_chunks'", "no parameters of its own"],
        ),
        (
            {"type": "stall", "colour": "red"},
            ["stall has no parameter 'colour'", "after_chunks", "max_ms"],
        ),
        (
            {"type": "stall", "after_chunks": -3},
            ["after_chunks must be >= 0, got -3", "stall takes after_chunks", "max_ms"],
        ),
        ({"type": "http_error", "status": 200}, ["status must be within 400..599", "retry_after"]),
        ({"type": "http_503", "match": {"host": "x"}}, ["match has no field 'host'", "session"]),
    ],
)
def test_bad_specs_get_400_saying_what_is_valid(
    http: httpx.Client, spec: dict[str, Any], fragments: list[str]
) -> None:
    response = http.post("/__fault", json=spec)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    message = error_message(response)
    for fragment in fragments:
        assert fragment in message
    assert armed(http) == []


def test_malformed_json_gets_400_listing_the_types(http: httpx.Client) -> None:
    response = http.post(
        "/__fault", content=b'{"type": "http_503",', headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"
    message = error_message(response)
    assert "could not parse the JSON" in message and all(t in message for t in FAULT_TYPES)
    assert http.post("/__fault", json=[]).status_code == 400
    assert armed(http) == []


def test_arm_by_type_with_query_parameters(http: httpx.Client) -> None:
    response = http.post(
        "/__fault/dropped_connection", params={"remaining": 2, "after_chunks": 1, "session": "s1"}
    )
    assert response.status_code == 201
    (fault,) = response.json()["faults"]
    assert fault["type"] == "dropped_connection" and fault["remaining"] == 2
    assert fault["after_chunks"] == 1 and fault["match"] == {"session": "s1"}

    def stream_frames(session: str | None) -> tuple[int, bool]:
        """Frames received and whether the body completed."""
        headers = {"X-Chaosllm-Session": session} if session else {}
        frames = 0
        with http.stream(
            "POST", CHAT, json=request_body(NAME, stream=True), headers=headers
        ) as response:
            try:
                for line in response.iter_lines():
                    frames += line.startswith("data: ")
            except httpx.RemoteProtocolError:
                return frames, False
        return frames, True

    assert stream_frames(None) == (19, True)  # another session: not affected
    assert stream_frames("s1") == (1, False)
    assert stream_frames("s2") == (19, True)
    assert stream_frames("s1") == (1, False)
    assert stream_frames("s1") == (19, True)  # used up
    assert [e["fault"] and e["fault"]["type"] for e in journal(http)] == [
        None,
        "dropped_connection",
        None,
        "dropped_connection",
        None,
    ]


def test_arm_by_type_refuses_bad_types_and_parameters(http: httpx.Client) -> None:
    response = http.post("/__fault/bogus")
    assert response.status_code == 400
    assert all(t in error_message(response) for t in FAULT_TYPES)
    response = http.post("/__fault/http_503", params={"after_chunks": 1})
    assert response.status_code == 400
    assert "http_503 has no parameter 'after_chunks'" in error_message(response)
    response = http.post("/__fault/stall", params={"max_ms": "soon"})
    assert response.status_code == 400 and "max_ms must be a number" in error_message(response)
    assert armed(http) == []


# -- listing and disarming ----------------------------------------------------------------------


def test_list_armed_and_fired_with_the_request_seq(http: httpx.Client) -> None:
    (fault_id,) = http.post("/__fault", json={"type": "http_503", "remaining": 2}).json()["ids"]
    listing = http.get("/__fault").json()
    assert set(listing["types"]) == set(FAULT_TYPES)
    assert listing["types"]["stall"] == ["after_chunks", "max_ms"]
    assert listing["fired"] == []
    assert statuses(http, 2, session="a") == [503, 503]
    assert chat(http) == 200
    listing = http.get("/__fault").json()
    assert listing["armed"] == []
    entries = journal(http)
    assert [f["request_seq"] for f in listing["fired"]] == [e["seq"] for e in entries[:2]]
    assert [
        (f["id"], f["type"], f["remaining"], f["session"], f["path"]) for f in listing["fired"]
    ] == [(fault_id, "http_503", 1, "a", CHAT), (fault_id, "http_503", 0, "a", CHAT)]
    assert listing["fired"][0]["spec"]["remaining"] == 2
    assert http.get("/__fault", params={"session": "b"}).json()["fired"] == []


def test_disarm_one_and_all(http: httpx.Client) -> None:
    ids = http.post(
        "/__fault", json=[{"type": "http_503"}, {"type": "http_429"}, {"type": "http_error"}]
    ).json()["ids"]
    response = http.delete(f"/__fault/{ids[1]}")
    assert response.status_code == 200 and response.json() == {"disarmed": 1}
    assert [f["id"] for f in armed(http)] == [ids[0], ids[2]]
    for unknown in (ids[1], "flt_999999"):
        response = http.delete(f"/__fault/{unknown}")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "unknown_fault"
        assert unknown in error_message(response)
    response = http.delete("/__fault")
    assert response.status_code == 200 and response.json() == {"disarmed": 2}
    assert armed(http) == [] and chat(http) == 200
    assert http.delete("/__fault").json() == {"disarmed": 0}


# -- profiles ---------------------------------------------------------------------------------


def test_profile_outage_recovers(http: httpx.Client) -> None:
    response = http.post("/__profile", json={"profile": "outage-recovers"})
    assert response.status_code == 201
    assert response.json()["profile"] == "outage-recovers"
    assert [f["type"] for f in response.json()["faults"]] == [
        "http_503",
        "http_error",
        "empty_reply",
    ]
    got = statuses(http, 3)
    with pytest.raises(httpx.RemoteProtocolError):
        chat(http)
    got += statuses(http, 2)
    assert got == [503, 503, 502, 200, 200]
    assert [e["fault"] and e["fault"]["type"] for e in journal(http)] == [
        "http_503",
        "http_503",
        "http_error",
        "empty_reply",
        None,
        None,
    ]


def test_profile_sent_inline(http: httpx.Client) -> None:
    response = http.post(
        "/__profile",
        json={
            "description": "mine",
            "faults": [
                {"type": "http_429", "retry_after": 0},
                {"type": "http_error", "status": 504},
            ],
        },
    )
    assert response.status_code == 201 and response.json()["profile"] == "(request)"
    assert statuses(http, 3) == [429, 504, 200]


@pytest.mark.parametrize(
    "name",
    [
        "no-such-profile",
        "../x",
        "../faults/outage-recovers",
        "outage-recovers/../outage-recovers",
        "/etc/passwd",
        "outage-recovers.json",
        "",
    ],
)
def test_bad_profile_names_get_400_and_read_no_file(http: httpx.Client, name: str) -> None:
    response = http.post("/__profile", json={"profile": name})
    assert response.status_code == 400
    message = error_message(response)
    assert "unknown profile" in message or "bad profile name" in message
    assert all(p in message for p in list_profiles())
    assert armed(http) == []


def test_profile_by_path_is_refused_over_http(http: httpx.Client, tmp_path: Path) -> None:
    # A path would let any control client make the server read its JSON files.
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"faults": [{"type": "http_503"}]}), "utf-8")
    relative = "../" * 20 + str(mine).lstrip("/")
    for name in (str(mine), relative):
        response = http.post("/__profile", json={"profile": name})
        assert response.status_code == 400, response.text
        assert "inline" in error_message(response)
    assert armed(http) == []


@pytest.mark.parametrize("body", [{}, {"profile": 3}, [], {"faults": "x"}])
def test_bad_profile_requests_get_400(http: httpx.Client, body: Any) -> None:
    response = http.post("/__profile", json=body)
    assert response.status_code == 400
    assert armed(http) == []


# -- the journal --------------------------------------------------------------------------------


def test_journal_fields_and_session_filter(http: httpx.Client) -> None:
    http.post(
        "/__fault",
        json={"type": "dropped_connection", "after_chunks": 2, "match": {"session": "s1"}},
    )
    with pytest.raises(httpx.RemoteProtocolError):
        chat(http, stream=True, session="s1")
    assert chat(http, session="s2") == 200
    miss = request_body(NAME, stream=False)
    miss["messages"][-1]["content"] = "Something nobody recorded"
    assert http.post(CHAT, json=miss).status_code == 404

    entries = journal(http)
    assert [e["seq"] for e in entries] == [1, 2, 3]
    first, second, third = entries
    assert {
        k: first[k]
        for k in (
            "session",
            "model",
            "stream",
            "recording",
            "match",
            "status",
            "frames_sent",
            "outcome",
            "miss",
            "path",
            "method",
        )
    } == {
        "session": "s1",
        "model": "gpt-4o",
        "stream": True,
        "recording": NAME,
        "match": "exact",
        "status": 200,
        "frames_sent": 2,
        "outcome": "complete",
        "miss": False,
        "path": CHAT,
        "method": "POST",
    }
    assert first["fault"]["type"] == "dropped_connection"
    assert first["fault"]["after_chunks"] == 2 and first["fault"]["id"].startswith("flt_")
    assert {
        k: second[k]
        for k in ("session", "stream", "recording", "fault", "status", "frames_sent", "outcome")
    } == {
        "session": "s2",
        "stream": False,
        "recording": NAME,
        "fault": None,
        "status": 200,
        "frames_sent": 0,
        "outcome": "complete",
    }
    assert second["bytes_sent"] > 0
    assert (third["session"], third["miss"], third["status"], third["recording"]) == (
        None,
        True,
        404,
        None,
    )

    assert [e["seq"] for e in journal(http, "s1")] == [1]
    assert [e["seq"] for e in journal(http, "s2")] == [2]
    assert journal(http, "nobody") == []


def test_journal_outcome_when_the_client_gives_up_on_a_stall(
    server: ChaosServer, http: httpx.Client
) -> None:
    http.post("/__fault", json={"type": "stall", "after_chunks": 3, "max_ms": 10_000})
    with pytest.raises(httpx.ReadTimeout), httpx.Client(timeout=0.3) as impatient:
        impatient.post(server.url + CHAT, json=request_body(NAME, stream=False))
    (entry,) = journal(http)
    assert entry["fault"]["type"] == "stall" and entry["outcome"] == "client_gone"


def test_delete_requests_clears_the_journal(http: httpx.Client) -> None:
    statuses(http, 2)
    response = http.delete("/__requests")
    assert response.status_code == 200 and response.json() == {"cleared": 2}
    assert journal(http) == []
    chat(http)
    assert [e["seq"] for e in journal(http)] == [1]  # numbering starts again


def test_delete_requests_of_one_session_keeps_the_others(http: httpx.Client) -> None:
    chat(http, session="mine")
    chat(http, session="theirs")
    response = http.delete("/__requests", params={"session": "mine"})
    assert response.status_code == 200 and response.json() == {"cleared": 1}
    assert [e["session"] for e in journal(http)] == ["theirs"]


def test_get_requests_can_wait_for_answers_in_flight(http: httpx.Client) -> None:
    chat(http)
    entries = http.get("/__requests", params={"settle": 2}).json()["requests"]
    assert [e["outcome"] for e in entries] == ["complete"]
    assert http.get("/__requests", params={"settle": "soon"}).status_code == 400


# -- firing semantics: specified in memory (tests/engine/test_engine.py); here real concurrency


def test_match_session_isolates_parallel_clients(server: ChaosServer) -> None:
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:
        http.post(
            "/__fault", json={"type": "http_503", "remaining": 5, "match": {"session": "alice"}}
        )
    start = threading.Barrier(2, timeout=TIMEOUT)
    results: dict[str, list[int]] = {}

    def client(session: str) -> None:
        with httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:
            start.wait()
            results[session] = statuses(http, 6, session=session)

    threads = [threading.Thread(target=client, args=(s,)) for s in ("alice", "bob")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT * 2)
        assert not thread.is_alive()
    assert results == {"alice": [503] * 5 + [200], "bob": [200] * 6}
    assert [e["status"] for e in server.requests("bob")] == [200] * 6


def test_remaining_n_fires_exactly_n_times_under_200_concurrent_requests(
    server: ChaosServer,
) -> None:
    n, concurrency = 7, 200
    body = request_body(NAME, stream=False)

    async def round_(client: httpx.AsyncClient) -> list[int]:
        assert (await client.post("/__reset")).status_code == 200
        response = await client.post("/__fault", json={"type": "http_503", "remaining": n})
        assert response.status_code == 201
        got: list[int] = []
        go = anyio.Event()

        async def one() -> None:
            await go.wait()
            got.append((await client.post(CHAT, json=body)).status_code)

        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(one)
            go.set()
        return got

    async def main() -> list[list[int]]:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        with anyio.fail_after(25):
            async with httpx.AsyncClient(
                base_url=server.url, limits=limits, timeout=TIMEOUT * 2
            ) as client:
                return [await round_(client) for _ in range(3)]

    for got in anyio.run(main):
        assert len(got) == concurrency
        assert got.count(503) == n and got.count(200) == concurrency - n
    fired = server.faults()["fired"]
    assert len(fired) == n and fired[-1]["remaining"] == 0
    assert sum(e["fault"] is not None for e in server.requests()) == n


def test_reset_disarms_and_clears(http: httpx.Client) -> None:
    http.post("/__fault", json={"type": "http_503", "remaining": 5})
    assert chat(http) == 503
    response = http.post("/__reset")
    assert response.status_code == 200 and response.json() == {"reset": True}
    listing = http.get("/__fault").json()
    assert listing["armed"] == [] and listing["fired"] == []
    assert journal(http) == []
    assert chat(http) == 200
