"""The recording proxy end to end, over real sockets.

The upstream is a second chaosllm replaying the shipped recordings (its faults make it
fail as a provider or a network would); the proxy under test is a `ChaosServer` in
record, record-missing or passthrough mode in front of it; the client is the official
`openai` SDK or httpx.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from chaosllm import ChaosServer, ServerError
from chaosllm.model import Exchange
from chaosllm.providers import PROVIDERS
from chaosllm.store.recordings import RecordingStore
from tests.helpers import RECORDINGS, free_port, openai_client, recording, request_body

pytestmark = pytest.mark.timeout(60)

KEY = "sk-proj-" + "PlantedKey0123456789" * 3
"""An API key shape: redacted wherever it appears."""
OTHER_KEY = "sk-ant-api03-" + "AnotherPlantedKey987" * 3
SECRET = "hunter2-correct-horse-battery"
"""A configured secret (--secret)."""

JSON_NAMES = ["simple-chat/0001", "tool-call/0001", "parallel-tools/0001", "refusal/0001"]
STREAM_NAMES = [
    "streaming-tools/0001",
    "knowledge/0004",
    "reasoning/0001",
    "streaming-usage/0001",
    "simple-chat/0001",
]
SHORT = "knowledge/0004"
"""A short answer recorded from a stream: 16 answer frames, finish, usage, [DONE]."""

Proxy = Callable[..., AbstractContextManager[ChaosServer]]


@pytest.fixture
def record_dir(tmp_path: Path) -> Path:
    return tmp_path / "recordings"


@pytest.fixture
def proxy(upstream: ChaosServer, record_dir: Path) -> Proxy:
    @contextmanager
    def start(mode: str = "record", **kwargs: Any) -> Iterator[ChaosServer]:
        options: dict[str, Any] = {"upstream": upstream.url}
        if mode != "passthrough":
            options["record_dir"] = record_dir
        options.update(kwargs)
        with ChaosServer(mode=mode, **options) as server:
            yield server

    return start


@contextmanager
def sdk(server: ChaosServer, **kwargs: Any) -> Iterator[openai.OpenAI]:
    with openai_client(server, api_key=KEY, **kwargs) as client:
        yield client


def call(client: openai.OpenAI, name: str, *, stream: bool) -> Any:
    """The SDK's view of an answer: the completion, or the list of stream chunks."""
    if stream:
        return [
            c.model_dump()
            for c in client.chat.completions.create(**request_body(name, stream=True))
        ]
    return client.chat.completions.create(**request_body(name, stream=False))


def written(record_dir: Path) -> list[Path]:
    return sorted(record_dir.rglob("*.json")) if record_dir.exists() else []


def loaded(record_dir: Path) -> list[Exchange]:
    store = RecordingStore.load([record_dir])
    assert store.errors == []
    return store.exchanges


def raw_stream(url: str, name: str) -> tuple[int, bytes]:
    with httpx.Client(timeout=10) as client:
        response = client.post(url + "/v1/chat/completions", json=request_body(name, stream=True))
        return response.status_code, response.content


# -- record, then replay -----------------------------------------------------------------


def test_record_with_the_sdk_then_replay_gives_equal_sdk_objects(
    upstream: ChaosServer, proxy: Proxy, record_dir: Path
) -> None:
    cases = [(n, False) for n in JSON_NAMES] + [(n, True) for n in STREAM_NAMES]
    with sdk(upstream) as direct:
        expected = [call(direct, n, stream=s) for n, s in cases]
    with proxy("record") as server, sdk(server) as client:
        proxied = [call(client, n, stream=s) for n, s in cases]
        journal = server.requests()
    assert proxied == expected
    assert [e["recording"] for e in journal] == [
        f"recorded/{i:04d}" for i in range(1, len(cases) + 1)
    ]
    assert {(e["match"], e["status"], e["outcome"]) for e in journal} == {
        ("upstream", 200, "complete")
    }
    assert len(written(record_dir)) == len(cases)

    with ChaosServer(record_dir) as replay, sdk(replay) as client:
        replayed = [call(client, n, stream=s) for n, s in cases]
        assert {e["match"] for e in replay.requests()} == {"exact"}
    assert replayed == expected
    # And each recording answers the other way too (JSON <-> stream).
    with ChaosServer(record_dir) as replay, sdk(replay) as client:
        assert call(client, "simple-chat/0001", stream=True) == call(
            client, "simple-chat/0001", stream=True
        )
        assert (
            call(client, "knowledge/0004", stream=False).choices[0].message.content
            == recording("knowledge/0004")["response"]["body"]["choices"][0]["message"]["content"]
        )


def test_recorded_frames_are_byte_identical_to_upstreams(
    upstream: ChaosServer, proxy: Proxy, record_dir: Path
) -> None:
    names = ["streaming-tools/0001", "reasoning/0001", "simple-chat/0001"]
    direct = {name: raw_stream(upstream.url, name) for name in names}
    with proxy("record") as server:
        through = {name: raw_stream(server.url, name) for name in names}
    assert through == direct
    by_digest = {e.digest: e for e in loaded(record_dir)}
    provider = PROVIDERS["openai.chat"]
    for name in names:
        exchange = by_digest[provider.digest(request_body(name, stream=True))]
        assert exchange.response.stream and exchange.response.chunks is not None
        frames = [c.data for c in exchange.response.chunks]
        assert "".join(frames).encode("utf-8") == direct[name][1]
        shipped = recording(name)["response"].get("chunks")
        if shipped is not None:
            assert frames == [c["data"] for c in shipped]
        assert frames[-1] == "data: [DONE]\n\n"
        assert all(f.endswith("\n\n") for f in frames)


def test_upstream_headers_of_interest_are_recorded_and_replayed(
    upstream: ChaosServer, proxy: Proxy, record_dir: Path
) -> None:
    shipped_headers = recording("simple-chat/0001")["response"]["headers"]
    with proxy("record") as server, httpx.Client(timeout=10) as client:
        response = client.post(
            server.url + "/v1/chat/completions", json=request_body("simple-chat/0001", stream=False)
        )
        assert response.headers["x-request-id"] == shipped_headers["x-request-id"]
    [path] = written(record_dir)
    data = json.loads(path.read_text("utf-8"))
    assert data["response"]["headers"] == shipped_headers
    assert data["meta"]["upstream"] == upstream.url
    with ChaosServer(record_dir) as replay, httpx.Client(timeout=10) as client:
        response = client.post(
            replay.url + "/v1/chat/completions", json=request_body("simple-chat/0001", stream=False)
        )
        assert response.headers["x-request-id"] == shipped_headers["x-request-id"]
        assert response.headers["openai-processing-ms"] == shipped_headers["openai-processing-ms"]


def test_error_answers_are_recorded_and_replayed_as_errors(
    upstream: ChaosServer, proxy: Proxy, record_dir: Path
) -> None:
    upstream.arm("http_429", retry_after=3, message="Slow down.")
    with proxy("record") as server, sdk(server) as client:
        with pytest.raises(openai.RateLimitError) as caught:
            call(client, SHORT, stream=True)
        assert caught.value.response.headers["retry-after"] == "3"
        [entry] = server.requests()
        assert entry["status"] == 429 and entry["recording"] == "recorded/0001"
    [path] = written(record_dir)
    data = json.loads(path.read_text("utf-8"))
    assert data["response"]["status"] == 429
    assert data["response"]["body"]["error"]["message"] == "Slow down."
    assert data["response"]["headers"]["retry-after"] == "3"
    assert data["response"]["headers"]["x-ratelimit-remaining-requests"] == "0"
    with ChaosServer(record_dir) as replay, sdk(replay) as client:
        with pytest.raises(openai.RateLimitError) as again:
            call(client, SHORT, stream=False)
        assert again.value.message == caught.value.message
        assert again.value.response.headers["retry-after"] == "3"


def test_timing_recorded_replays_a_recording_with_its_recorded_gaps(
    upstream: ChaosServer, proxy: Proxy, record_dir: Path
) -> None:
    name = "knowledge/0001"  # a short answer rendered as about ten frames
    upstream.arm("slow_stream", delay_ms=40, match={"stream": True})
    with proxy("record") as server:
        raw_stream(server.url, name)
    [exchange] = loaded(record_dir)
    assert exchange.response.chunks is not None
    delays = [c.delay_ms for c in exchange.response.chunks]
    assert len(delays) >= 8 and all(d >= 30 for d in delays), delays
    recorded_total = sum(delays) / 1000

    def replay_seconds(timing: str | float) -> tuple[float, bytes]:
        with ChaosServer(record_dir, timing=timing) as replay:
            started = time.monotonic()
            _, body = raw_stream(replay.url, name)
            return time.monotonic() - started, body

    fast, fast_body = replay_seconds("fast")
    recorded, recorded_body = replay_seconds("recorded")
    half, _ = replay_seconds(0.5)
    assert (
        fast_body
        == recorded_body
        == "".join(c.data for c in exchange.response.chunks).encode("utf-8")
    )
    assert fast < recorded_total * 0.5
    assert recorded_total * 0.9 <= recorded < recorded_total * 2 + 0.5
    assert recorded_total * 0.45 <= half < recorded_total


# -- record-missing and passthrough ------------------------------------------------------


def test_record_missing_replays_hits_and_records_misses(
    upstream: ChaosServer, proxy: Proxy, record_dir: Path
) -> None:
    with proxy("record-missing", recordings=[record_dir]) as server, sdk(server) as client:
        first = call(client, SHORT, stream=True)
        # At once, the same request: the SDK stops reading at [DONE], and must still find
        # the recording.
        assert call(client, SHORT, stream=True) == first
        assert call(client, SHORT, stream=False).choices[0].message.content
        other = call(client, "simple-chat/0001", stream=False)
        assert call(client, "simple-chat/0001", stream=False) == other
        journal = server.requests()
    assert [(e["match"], e["miss"], e["recording"]) for e in journal] == [
        ("upstream", True, "recorded/0001"),
        ("exact", False, "recorded/0001"),
        ("exact", False, "recorded/0001"),
        ("upstream", True, "recorded/0002"),
        ("exact", False, "recorded/0002"),
    ]
    assert len(upstream.requests()) == 2
    assert len(written(record_dir)) == 2
    # Restarted: what was recorded is replayed, nothing goes upstream.
    upstream.reset()
    with proxy("record-missing", recordings=[record_dir]) as server, sdk(server) as client:
        assert call(client, SHORT, stream=True) == first
    assert upstream.requests() == []


def test_passthrough_writes_nothing_and_armed_faults_apply_to_live_traffic(
    upstream: ChaosServer, proxy: Proxy, record_dir: Path, tmp_path: Path
) -> None:
    with proxy("passthrough") as server, sdk(server) as client:
        assert call(client, SHORT, stream=False).choices[0].message.content
        server.arm("http_503")
        with pytest.raises(openai.InternalServerError):
            call(client, SHORT, stream=False)
        server.arm("malformed_tool_args")
        broken = call(client, "tool-call/0001", stream=False)
        arguments = broken.choices[0].message.tool_calls[0].function.arguments
        with pytest.raises(json.JSONDecodeError):
            json.loads(arguments)
        server.arm("dropped_connection", after_chunks=3)
        frames: list[str] = []
        with pytest.raises(openai.APIConnectionError):
            for chunk in client.chat.completions.create(**request_body(SHORT, stream=True)):
                frames.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
        assert len(frames) == 3
        # Recovered: the next request is served normally.
        assert len(call(client, SHORT, stream=True)) == 18
        journal = server.requests()
    assert [e["fault"]["type"] if e["fault"] else None for e in journal] == [
        None,
        "http_503",
        "malformed_tool_args",
        "dropped_connection",
        None,
    ]
    assert [e["status"] for e in journal] == [200, 503, 200, 200, 200]
    assert all(e["match"] == "upstream" and e["recording"] is None for e in journal)
    # Faults transform the upstream's real answer: the upstream saw every request but the
    # one the 503 answered alone (issue #13: no paid call for an answer that ignores it).
    assert len(upstream.requests()) == 4
    assert list(tmp_path.rglob("*.json")) == []


def test_a_faulted_request_records_the_upstreams_real_answer(
    upstream: ChaosServer, proxy: Proxy, record_dir: Path
) -> None:
    with proxy("record") as server, httpx.Client(timeout=10) as client:
        server.arm("truncated_stream", after_chunks=2)
        response = client.post(
            server.url + "/v1/chat/completions", json=request_body(SHORT, stream=True)
        )
        assert response.text.count("\n\n") == 2 and "[DONE]" not in response.text
        [entry] = server.requests()
        assert entry["fault"]["type"] == "truncated_stream"
        assert entry["recording"] == "recorded/0001"
    [exchange] = loaded(record_dir)
    assert exchange.response.chunks is not None
    assert [c.data for c in exchange.response.chunks] == [
        c["data"] for c in recording(SHORT)["response"]["chunks"]
    ]


# -- secrets -----------------------------------------------------------------------------


def echo_recording(question: str, answer: str, pieces: list[str]) -> dict[str, Any]:
    """A recording whose answer quotes secrets back; `pieces` are its content deltas."""
    base = {
        "id": "chatcmpl-echo",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o-mini",
    }

    def frame(delta: dict[str, Any], finish: str | None = None) -> dict[str, str]:
        payload = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return {"data": "data: " + json.dumps(payload) + "\n\n"}

    return {
        "chaosllm": 1,
        "request": {
            "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": question}]}
        },
        "response": {
            "status": 200,
            "body": {
                "id": "chatcmpl-echo",
                "object": "chat.completion",
                "created": 1,
                "model": "gpt-4o-mini",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": answer},
                    }
                ],
            },
            "chunks": [
                frame({"role": "assistant", "content": ""}),
                *(frame({"content": p}) for p in pieces),
                frame({}, "stop"),
                {"data": "data: [DONE]\n\n"},
            ],
        },
    }


def test_planted_keys_never_reach_a_recording_and_replays_still_match(
    tmp_path: Path, record_dir: Path
) -> None:
    # An upstream whose model quotes keys back: whole in one frame, or split over frames.
    whole = f"Yes: {KEY} and {SECRET}."
    split = f"Also {OTHER_KEY}."
    cut = len("Also ") + 20
    upstream_dir = tmp_path / "upstream"
    (upstream_dir / "echo").mkdir(parents=True)
    # (Its recorded requests are redacted, as a recorder writes them.)
    for number, (question, answer, pieces) in enumerate(
        [
            (
                "Is [REDACTED] valid? Password: [REDACTED].",
                whole,
                ["Yes: ", KEY, " and ", SECRET, "."],
            ),
            ("And [REDACTED]?", split, [split[:cut], split[cut:]]),
        ],
        start=1,
    ):
        (upstream_dir / "echo" / f"{number:04d}.json").write_text(
            json.dumps(echo_recording(question, answer, pieces))
        )
    questions = [f"Is {KEY} valid? Password: {SECRET}.", f"And {OTHER_KEY}?"]

    def ask(client: openai.OpenAI, question: str, *, stream: bool) -> Any:
        body: dict[str, Any] = {
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": question}],
        }
        headers = {"api-key": OTHER_KEY, "x-api-key": KEY, "openai-organization": "org-x"}
        if stream:
            return "".join(
                c.choices[0].delta.content or ""
                for c in client.chat.completions.create(**body, stream=True, extra_headers=headers)
                if c.choices
            )
        return (
            client.chat.completions.create(**body, extra_headers=headers).choices[0].message.content
        )

    with (
        ChaosServer(upstream_dir, secrets=[SECRET]) as upstream,
        ChaosServer(
            mode="record", upstream=upstream.url, record_dir=record_dir, secrets=[SECRET]
        ) as server,
        sdk(server) as client,
    ):
        assert ask(client, questions[0], stream=False) == whole
        assert ask(client, questions[0], stream=True) == whole
        assert ask(client, questions[1], stream=True) == split
        assert [e["match"] for e in upstream.requests()] == ["exact"] * 3
    files = written(record_dir)
    assert len(files) == 3
    for path in record_dir.rglob("*"):
        if path.is_file():
            text = path.read_text("utf-8")
            for secret in (
                KEY,
                OTHER_KEY,
                SECRET,
                "Bearer",
                "org-x",
                KEY[:24],
                SECRET[:12],
                split[:cut],
                split[cut:],
            ):
                assert secret not in text, (path, secret)
    redacted = [json.loads(p.read_text("utf-8")) for p in files]
    assert (
        redacted[0]["request"]["body"]["messages"][0]["content"]
        == "Is [REDACTED] valid? Password: [REDACTED]."
    )
    assert redacted[1]["response"]["chunks"][2]["data"].count("[REDACTED]") == 1
    # The key split over frames: no frame can be redacted, so only the answer is kept.
    assert "chunks" not in redacted[2]["response"] and redacted[2]["response"]["stream"]
    assert redacted[2]["response"]["body"]["choices"][0]["message"]["content"] == "Also [REDACTED]."
    # The digest was computed after redaction: the same requests (keys and all) replay.
    with ChaosServer(record_dir, secrets=[SECRET]) as replay, sdk(replay) as client:
        assert ask(client, questions[0], stream=False) == "Yes: [REDACTED] and [REDACTED]."
        assert ask(client, questions[1], stream=True) == "Also [REDACTED]."
        assert [e["match"] for e in replay.requests()] == ["exact", "exact"]


# -- the environment's failures ----------------------------------------------------------


def test_an_unreachable_upstream_is_a_502_naming_it(record_dir: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with (
        ChaosServer(mode="record", upstream=dead, record_dir=record_dir) as server,
        sdk(server) as client,
    ):
        for stream in (False, True):
            with pytest.raises(openai.APIStatusError) as caught:
                call(client, SHORT, stream=stream)
            assert caught.value.status_code == 502
            assert dead in caught.value.message
            assert caught.value.body["code"] == "upstream_unreachable"  # type: ignore[index]
        assert [(e["status"], e["recording"]) for e in server.requests()] == [(502, None)] * 2
    assert written(record_dir) == []


@pytest.mark.parametrize(
    ("fault", "stream", "frames"),
    [
        ("dropped_connection", True, 3),
        ("connection_reset", True, 3),
        ("dropped_connection", False, None),
        ("connection_reset", False, None),
    ],
)
def test_an_upstream_that_drops_mid_answer_drops_the_client_and_nothing_is_written(
    upstream: ChaosServer,
    proxy: Proxy,
    record_dir: Path,
    fault: str,
    stream: bool,
    frames: int | None,
) -> None:
    upstream.arm(fault, after_chunks=3, after_bytes=100)
    with proxy("record") as server, httpx.Client(timeout=10) as client:
        received = b""
        with (
            pytest.raises(httpx.RemoteProtocolError),
            client.stream(
                "POST", server.url + "/v1/chat/completions", json=request_body(SHORT, stream=stream)
            ) as response,
        ):
            assert response.status_code == 200
            for data in response.iter_raw():
                received += data
        if frames is not None:
            assert received.count(b"\n\n") == frames
        else:
            assert len(received) == 100
        [entry] = server.requests()
        assert "dropped the connection mid-answer" in entry["error"]
        assert entry["recording"] is None
        # The proxy itself is fine: the next request is answered and recorded.
        assert (
            client.post(
                server.url + "/v1/chat/completions", json=request_body(SHORT, stream=stream)
            ).status_code
            == 200
        )
    assert len(written(record_dir)) == 1


@pytest.mark.parametrize(
    ("fault", "error"), [("empty_reply", "closed"), ("connection_reset", "reset")]
)
def test_an_upstream_that_answers_nothing_gives_the_client_nothing(
    upstream: ChaosServer, proxy: Proxy, record_dir: Path, fault: str, error: str
) -> None:
    upstream.arm(fault)
    with proxy("record") as server, httpx.Client(timeout=10) as client:
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            client.post(server.url + "/v1/chat/completions", json=request_body(SHORT, stream=False))
        [entry] = server.requests()
        assert f"{error} the connection without answering" in entry["error"]
    assert written(record_dir) == []


def test_a_stream_ended_without_its_terminator_is_passed_on_but_not_recorded(
    upstream: ChaosServer, proxy: Proxy, record_dir: Path
) -> None:
    upstream.arm("truncated_stream", after_chunks=4)
    with proxy("record") as server:
        status, body = raw_stream(server.url, SHORT)
        assert status == 200 and body.count(b"\n\n") == 4
        [entry] = server.requests()
        assert "without its terminator" in entry["error"] and entry["recording"] is None
    assert written(record_dir) == []


def test_a_client_that_goes_away_cancels_the_upstream_request(
    upstream: ChaosServer, proxy: Proxy, record_dir: Path
) -> None:
    upstream.arm("stall", after_chunks=2, max_ms=30_000)
    with proxy("record") as server, httpx.Client(timeout=10) as client:
        started = time.monotonic()
        with client.stream(
            "POST", server.url + "/v1/chat/completions", json=request_body(SHORT, stream=True)
        ) as response:
            received = b""
            for data in response.iter_raw():
                received += data
                if received.count(b"\n\n") == 2:
                    break
        [seen] = upstream.requests(settle=10)
        assert seen["outcome"] == "client_gone"
        assert time.monotonic() - started < 10
        [entry] = server.requests(settle=10)
        assert entry["outcome"] == "client_gone" and entry["recording"] is None
    assert written(record_dir) == []


def test_a_recording_that_cannot_be_written_still_answers_the_client(
    proxy: Proxy,
    record_dir: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with proxy("record") as server, sdk(server) as client:
        assert server.state.writer is not None

        def disk_full(*args: Any) -> Exchange:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(server.state.writer, "write", disk_full)
        with caplog.at_level(logging.ERROR, logger="chaosllm"):
            assert call(client, SHORT, stream=True) == call(client, SHORT, stream=True)
            assert call(client, SHORT, stream=False).choices[0].message.content
        journal = server.requests()
        assert all("No space left on device" in e["error"] for e in journal)
        assert all(e["status"] == 200 and e["recording"] is None for e in journal)
    assert any("could not be written" in r.getMessage() for r in caplog.records)


def test_an_unwritable_scenario_directory_is_an_error_not_an_outage(
    proxy: Proxy, record_dir: Path
) -> None:
    record_dir.mkdir()
    (record_dir / "recorded").write_text("a file in the way")
    with proxy("record") as server, sdk(server) as client:
        assert call(client, SHORT, stream=False).choices[0].message.content
        [entry] = server.requests()
        assert "could not be written" in entry["error"]


# -- under load --------------------------------------------------------------------------


def test_fifty_concurrent_recorded_requests_give_fifty_valid_files(
    upstream: ChaosServer, proxy: Proxy, record_dir: Path
) -> None:
    names = JSON_NAMES + STREAM_NAMES
    bodies = [request_body(names[i % len(names)], stream=i % 2 == 1) for i in range(50)]

    async def main(url: str) -> list[int]:
        async with httpx.AsyncClient(timeout=20) as client:
            responses = await asyncio.gather(
                *(client.post(url + "/v1/chat/completions", json=body) for body in bodies)
            )
        return [r.status_code for r in responses]

    with proxy("record") as server:
        assert asyncio.run(main(server.url)) == [200] * 50
        journal = server.requests()
    files = written(record_dir)
    assert [p.name for p in files] == [f"{i:04d}.json" for i in range(1, 51)]
    exchanges = loaded(record_dir)
    assert sorted(e.name for e in exchanges) == sorted(e["recording"] for e in journal)
    provider = PROVIDERS["openai.chat"]
    expected = sorted(provider.digest(b) for b in bodies)
    assert sorted(e.digest for e in exchanges) == expected
    assert all(e.stored_digest == e.digest for e in exchanges)


# -- configuration -----------------------------------------------------------------------


def test_proxy_modes_need_an_upstream_and_a_place_to_record(tmp_path: Path) -> None:
    upstream = "http://127.0.0.1:9"
    refused: list[tuple[str, dict[str, Any]]] = [
        ("needs --upstream URL", {"mode": "passthrough"}),
        ("give --record-dir DIR", {"mode": "record", "upstream": upstream}),
        (
            "refusing to record into the shipped",
            {"mode": "record-missing", "upstream": upstream, "recordings": RECORDINGS},
        ),
        ("invalid upstream URL", {"mode": "passthrough", "upstream": "ftp://example.com"}),
        (
            "bad scenario name",
            {
                "mode": "record",
                "upstream": upstream,
                "record_dir": tmp_path,
                "record_scenario": "../out",
            },
        ),
    ]
    for message, options in refused:
        with pytest.raises(ServerError, match=message):
            ChaosServer(**options)


def test_the_httpx_transport_behaves_the_same(
    upstream: ChaosServer, proxy: Proxy, record_dir: Path
) -> None:
    """httpx carries the requests when the environment names an HTTP proxy for the
    upstream: the same answers, recordings, drops and failures."""
    from chaosllm.record.proxy import Upstream

    with sdk(upstream) as direct:
        expected = [
            call(direct, "tool-call/0001", stream=False),
            call(direct, "streaming-tools/0001", stream=True),
        ]
    with proxy("record") as server, sdk(server) as client:
        server.state.upstream = Upstream(upstream.url, transport="httpx")
        assert [
            call(client, "tool-call/0001", stream=False),
            call(client, "streaming-tools/0001", stream=True),
        ] == expected
        upstream.arm("dropped_connection", after_chunks=3)
        with pytest.raises(openai.APIConnectionError):
            call(client, SHORT, stream=True)
        upstream.arm("empty_reply")
        with pytest.raises(openai.APIConnectionError):
            call(client, SHORT, stream=False)
        journal = server.requests()
        server.state.upstream = Upstream(f"http://127.0.0.1:{free_port()}", transport="httpx")
        with pytest.raises(openai.APIStatusError) as caught:
            call(client, SHORT, stream=False)
        assert caught.value.status_code == 502
    assert [e["recording"] for e in journal] == ["recorded/0001", "recorded/0002", None, None]
    assert "dropped the connection mid-answer" in journal[2]["error"]
    assert "closed the connection without answering" in journal[3]["error"]
    with ChaosServer(record_dir) as replay, sdk(replay) as client:
        assert [
            call(client, "tool-call/0001", stream=False),
            call(client, "streaming-tools/0001", stream=True),
        ] == expected


def test_the_upstream_client_reuses_connections_and_survives_a_closed_one(
    upstream: ChaosServer, proxy: Proxy
) -> None:
    with proxy("passthrough") as server, httpx.Client(timeout=10) as client:
        for _ in range(5):
            assert (
                client.post(
                    server.url + "/v1/chat/completions", json=request_body(SHORT, stream=True)
                ).status_code
                == 200
            )
        # An answer that closes its connection after a complete message (close_after):
        # the next request must not reuse it.
        upstream.arm("truncated_stream", after_chunks=1, match={"stream": False})
        client.post(server.url + "/v1/chat/completions", json=request_body(SHORT, stream=False))
        assert (
            client.post(
                server.url + "/v1/chat/completions", json=request_body(SHORT, stream=False)
            ).status_code
            == 200
        )
        journal = server.requests()
        assert [e["error"] for e in journal if e["error"]] == []


# -- SSE framing (pure) ------------------------------------------------------------------


@pytest.mark.parametrize("sep", ["\n\n", "\r\n\r\n"])
def test_the_frame_splitter_keeps_exact_frames_across_any_chunking(sep: str) -> None:
    from chaosllm.record.proxy import FrameSplitter

    eol = sep[: len(sep) // 2]
    frames = [f'data: {{"n": {i}}}{sep}'.encode() for i in range(5)]
    frames[2] = f": keep-alive{eol}data: a{eol}data: b{sep}".encode()
    body = b"".join(frames)
    for size in (1, 2, 3, 7, len(body)):
        splitter = FrameSplitter(0.0)
        for i in range(0, len(body), size):
            splitter.feed(body[i : i + size], float(i))
        splitter.finish()
        assert [f for f, _ in splitter.frames] == frames
    trailing = FrameSplitter(0.0)
    trailing.feed(body + b"data: [DONE]", 1.0)
    trailing.finish()
    assert b"".join(f for f, _ in trailing.frames) == body + b"data: [DONE]"


def test_the_frame_splitter_times_each_frame_by_its_last_bytes() -> None:
    from chaosllm.record.proxy import FrameSplitter

    splitter = FrameSplitter(10.0)
    assert splitter.feed(b"data: 1\n\ndata: 2", 10.5) == 1
    assert splitter.feed(b"\n\n", 10.7) == 1
    assert splitter.feed(b"data: 3\n\n", 10.7) == 1
    assert [round(d) for _, d in splitter.frames] == [500, 200, 0]


@pytest.mark.parametrize(
    ("url", "path", "target"),
    [
        ("http://127.0.0.1:9", "", b"/"),  # an MCP server given as a bare host: its root
        ("http://127.0.0.1:9/mcp", "", b"/mcp"),
        ("http://127.0.0.1:9/v1", "/v1/chat/completions", b"/v1/chat/completions"),
        ("http://127.0.0.1:9", "/v1/models", b"/v1/models"),
    ],
)
def test_the_upstream_target_of_a_path(url: str, path: str, target: bytes) -> None:
    from chaosllm.record.proxy import Upstream

    assert Upstream(url).target(path) == target
