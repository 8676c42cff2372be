"""Faults on live proxied streams, applied frame by frame as the upstream sends them.

The upstream is a small loopback HTTP server (`SlowUpstream`) that streams Chat
Completions frames and can hold back the rest of its answer until the test releases
it, so that "the client got frame 1 before the upstream sent frame 3" is observed with
events, not timed. The proxy under test is a `ChaosServer` in passthrough, record and
record-missing mode; the clients are the official openai SDK and a raw socket.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from chaosllm import ChaosServer
from chaosllm.providers.anthropic_messages import AnthropicMessages
from chaosllm.providers.openai_responses import OpenAIResponses
from chaosllm.store.recordings import RecordingStore
from tests.helpers import openai_client

pytestmark = pytest.mark.timeout(60)

MODES = ["passthrough", "record", "record-missing"]
WAIT = 10.0
"""The longest any event is waited for."""


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    payload = {
        "id": "chatcmpl-live",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def text_frames(n: int) -> list[bytes]:
    """A text answer: a role frame, n-1 words, the finish frame and [DONE]."""
    words = [chunk({"content": f"w{i} "}) for i in range(1, n)]
    return [chunk({"role": "assistant", "content": ""}), *words, chunk({}, "stop"), DONE]


def tool_frames() -> list[bytes]:
    head = {"index": 0, "id": "call_1", "type": "function"}
    return [
        chunk({"role": "assistant", "content": None}),
        chunk({"tool_calls": [{**head, "function": {"name": "weather", "arguments": ""}}]}),
        *(
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            for piece in ['{"ci', 'ty": ', '"Par', 'is"}']
        ),
        chunk({}, "tool_calls"),
        DONE,
    ]


DONE = b"data: [DONE]\n\n"


class SlowUpstream:
    """A loopback upstream that streams `frames` (one chunk each, `gap` seconds apart);
    with `hold` it sends `hold` frames, sets `held`, and waits for `release` before the
    rest."""

    def __init__(self, frames: list[bytes], *, hold: int | None = None, gap: float = 0.0):
        self.frames = frames
        self.hold = hold
        self.gap = gap
        self.held = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()
        self.sent: list[float] = []
        self.requests = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def close(self) -> None:
        self.release.set()
        self._stop.set()
        self._thread.join(WAIT)
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(WAIT)
                with suppress(OSError):
                    self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            got = conn.recv(65536)
            if not got:
                return
            data += got
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(body) < length:
            body += conn.recv(65536)
        self.requests += 1
        conn.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        )
        for i, frame in enumerate(self.frames):
            if self.hold is not None and i == self.hold:
                self.held.set()
                self.release.wait(WAIT)
            elif i and self.gap:
                time.sleep(self.gap)  # the upstream's own pace (not the test's)
            # Stamped before the write: the client may read the frame before this thread
            # runs again.
            self.sent.append(time.monotonic())
            conn.sendall(b"%x\r\n%s\r\n" % (len(frame), frame))
        conn.sendall(b"0\r\n\r\n")
        self.finished.set()


@contextmanager
def upstream_of(frames: list[bytes], **options: Any) -> Iterator[SlowUpstream]:
    server = SlowUpstream(frames, **options)
    try:
        yield server
    finally:
        server.close()


@contextmanager
def proxy_of(upstream: SlowUpstream, mode: str, record_dir: Path) -> Iterator[ChaosServer]:
    options: dict[str, Any] = {"mode": mode, "upstream": upstream.url}
    if mode != "passthrough":
        options["record_dir"] = record_dir
    with ChaosServer(**options) as server:
        yield server


BODY: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": "live"}],
    "stream": True,
}


def raw_request(server: ChaosServer, body: dict[str, Any] = BODY) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT)
    data = json.dumps(body).encode()
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        b"content-type: application/json\r\nauthorization: Bearer sk-test\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(data), data)
    )
    return sock


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        got = sock.recv(65536)
        if not got:
            break
        data += got
    return data


def read_to_end(sock: socket.socket) -> tuple[bytes, str]:
    """Every byte until the peer ends the connection, and how: ``fin`` or ``reset``."""
    data = b""
    try:
        while got := sock.recv(65536):
            data += got
    except ConnectionResetError:
        return data, "reset"
    return data, "fin"


def recorded_frames(record_dir: Path) -> list[bytes]:
    store = RecordingStore.load([record_dir])
    assert store.errors == []
    [exchange] = store.exchanges
    assert exchange.response.chunks is not None
    return [c.data.encode() for c in exchange.response.chunks]


def wait_for(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, "not within the bounded wait"
        time.sleep(0.01)


def entry_of(server: ChaosServer) -> dict[str, Any]:
    [entry] = server.requests()
    return entry


# -- the first frame is not moved ---------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("armed", [False, True], ids=["no-fault", "fault-after-5"])
def test_the_first_frame_reaches_the_client_before_the_upstream_sends_its_third(
    mode: str, armed: bool, tmp_path: Path
) -> None:
    frames = text_frames(20)
    with upstream_of(frames, hold=2) as upstream, proxy_of(upstream, mode, tmp_path) as server:
        if armed:
            server.arm("dropped_connection", after_chunks=5)
        with openai_client(server) as client:
            stream = client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "live"}], stream=True
            )
            first = next(iter(stream))
            # The upstream has sent two frames and waits: the client has the first already.
            assert not upstream.release.is_set()  # the held frame is not sent yet
            assert upstream.held.wait(WAIT) and len(upstream.sent) == 2
            assert first.choices[0].delta.role == "assistant"
            upstream.release.set()
            got = [first]
            if armed:
                with pytest.raises(openai.APIConnectionError):
                    got.extend(stream)
                assert len(got) == 5
            else:
                got.extend(stream)
                assert len(got) == len(frames) - 1
        if mode != "passthrough":
            wait_for(lambda: entry_of(server)["recording"] is not None)
            assert recorded_frames(tmp_path) == frames
        entry = entry_of(server)
        assert (entry["fault"] or {}).get("type") == ("dropped_connection" if armed else None)


# -- each live fault through the SDK and a raw socket, the recording unfaulted -----------------


@pytest.mark.parametrize("mode", MODES)
def test_live_faults_through_the_sdk_record_the_upstreams_whole_answer(
    mode: str, tmp_path: Path
) -> None:
    frames = text_frames(8)
    cases: list[tuple[str, dict[str, Any]]] = [
        ("truncated_stream", {"after_chunks": 3}),
        ("dropped_connection", {"after_chunks": 3}),
        ("error_in_200", {"after_chunks": 3, "message": "live error"}),
    ]
    for index, (type_, params) in enumerate(cases):
        record_dir = tmp_path / str(index)
        with upstream_of(frames) as upstream, proxy_of(upstream, mode, record_dir) as server:
            server.arm(type_, **params)
            got: list[Any] = []
            with openai_client(server) as client:
                stream = client.chat.completions.create(**{**BODY, "stream": True})
                if type_ == "truncated_stream":
                    got.extend(stream)  # a clean end without [DONE]: the SDK just stops
                elif type_ == "dropped_connection":
                    with pytest.raises(openai.APIConnectionError):
                        got.extend(stream)
                else:
                    with pytest.raises(openai.APIError, match="live error"):
                        got.extend(stream)
            assert len(got) == 3, type_
            assert [c.choices[0].delta.content for c in got[1:]] == ["w1 ", "w2 "]
            entry = entry_of(server)
            assert entry["fault"]["type"] == type_
            assert entry["status"] == 200
            assert entry["ending"] == ("closed" if type_ == "dropped_connection" else "complete")
            if mode == "passthrough":
                assert entry["recording"] is None
            else:
                wait_for(lambda s=server: entry_of(s)["recording"] is not None)  # type: ignore[misc]
                assert recorded_frames(record_dir) == frames
            assert upstream.requests == 1


@pytest.mark.parametrize("mode", MODES)
def test_reset_garbage_and_stall_on_a_live_stream_on_a_raw_socket(
    mode: str, tmp_path: Path
) -> None:
    frames = text_frames(8)
    cases: list[tuple[str, dict[str, Any]]] = [
        ("connection_reset", {"after_chunks": 2, "after_bytes": 7}),
        ("garbage", {"after_chunks": 2, "data": "NOT-SSE"}),
        ("stall", {"after_chunks": 2, "max_ms": 200}),
    ]
    for index, (type_, params) in enumerate(cases):
        record_dir = tmp_path / str(index)
        with upstream_of(frames) as upstream, proxy_of(upstream, mode, record_dir) as server:
            server.arm(type_, **params)
            with raw_request(server) as sock:
                data, how = read_to_end(sock)
            body = data.partition(b"\r\n\r\n")[2]
            assert data.startswith(b"HTTP/1.1 200 ")
            assert frames[0] in body and frames[1] in body and frames[2] not in body
            if type_ == "connection_reset":
                assert how == "reset"
                assert body.endswith(b"7\r\n" + frames[2][:7] + b"\r\n")
            elif type_ == "garbage":
                assert how == "fin" and body.endswith(b"7\r\nNOT-SSE\r\n")
            else:
                assert how == "fin" and body.endswith(frames[1] + b"\r\n")
            entry = entry_of(server)
            assert entry["fault"]["type"] == type_
            assert (
                entry["ending"]
                == {
                    "connection_reset": "reset",
                    "garbage": "closed",
                    "stall": "stalled",
                }[type_]
            )
            if mode != "passthrough":
                wait_for(lambda s=server: entry_of(s)["recording"] is not None)  # type: ignore[misc]
                assert recorded_frames(record_dir) == frames


@pytest.mark.parametrize("mode", MODES)
def test_malformed_tool_args_break_the_argument_deltas_as_they_pass(
    mode: str, tmp_path: Path
) -> None:
    frames = tool_frames()
    with upstream_of(frames, hold=3) as upstream, proxy_of(upstream, mode, tmp_path) as server:
        server.arm("malformed_tool_args")
        with openai_client(server) as client:
            stream = client.chat.completions.create(**BODY)
            chunks = iter(stream)
            got = [next(chunks), next(chunks), next(chunks)]
            # The first argument delta arrived, broken, while the upstream waits.
            assert not upstream.release.is_set()  # the held frame is not sent yet
            assert upstream.held.wait(WAIT) and len(upstream.sent) == 3
            upstream.release.set()
            got.extend(chunks)
        arguments = "".join(
            call.function.arguments or ""
            for c in got
            if c.choices and c.choices[0].delta.tool_calls
            for call in c.choices[0].delta.tool_calls
        )
        with pytest.raises(json.JSONDecodeError):
            json.loads(arguments)
        assert arguments == '{"'  # the first delta cut in half; the later ones dropped
        assert got[-1].choices[0].finish_reason == "tool_calls"
        entry = entry_of(server)
        assert entry["fault"]["type"] == "malformed_tool_args"
        if mode != "passthrough":
            wait_for(lambda: entry_of(server)["recording"] is not None)
            assert recorded_frames(tmp_path) == frames


def test_malformed_tool_args_is_not_consumed_by_a_stream_without_tool_calls(
    tmp_path: Path,
) -> None:
    frames = text_frames(4)
    with upstream_of(frames) as upstream, proxy_of(upstream, "passthrough", tmp_path) as server:
        [armed] = server.arm("malformed_tool_args")
        with raw_request(server) as sock:
            data = read_until(sock, b"0\r\n\r\n")
        assert all(frame in data for frame in frames)
        assert entry_of(server)["fault"] is None
        assert [f["id"] for f in server.faults()["armed"]] == [armed]


def test_a_fault_that_needs_the_whole_answer_keeps_the_buffered_path(tmp_path: Path) -> None:
    frames = text_frames(6)
    with upstream_of(frames) as upstream, proxy_of(upstream, "record", tmp_path) as server:
        server.arm("empty_response")
        server.arm("dropped_connection", after_chunks=1)
        with openai_client(server) as client:
            got = list(client.chat.completions.create(**BODY))
        assert "".join(c.choices[0].delta.content or "" for c in got if c.choices) == ""
        assert entry_of(server)["fault"]["type"] == "empty_response"
        assert entry_of(server)["recording"] is not None
        assert recorded_frames(tmp_path) == frames
        # The second fault was not offered to that request: it fires on the next one, live.
        with openai_client(server) as client, pytest.raises(openai.APIConnectionError):
            list(client.chat.completions.create(**BODY))
        assert server.requests()[-1]["fault"]["type"] == "dropped_connection"


def test_time_to_first_byte_with_a_fault_armed_equals_the_upstreams_own(tmp_path: Path) -> None:
    """20 frames 50 ms apart: the first byte follows the upstream's first frame at once,
    with ``dropped_connection(after_chunks=5)`` armed as without (the figure itself:
    ``benchmarks/live_ttfb.py``)."""
    frames = text_frames(19)
    delays: dict[bool, float] = {}
    for armed in (False, True):
        with (
            upstream_of(frames, gap=0.05) as upstream,
            proxy_of(upstream, "passthrough", tmp_path) as server,
        ):
            if armed:
                server.arm("dropped_connection", after_chunks=5)
            with raw_request(server) as sock:
                read_until(sock, b"data: ")
                got = time.monotonic()
                # The upstream's second frame is 50 ms after its first: not sent yet.
                assert len(upstream.sent) < 3
            delays[armed] = got - upstream.sent[0]
    # Both well before the upstream's second frame (50 ms after its first): the buffered
    # path would have waited for all 20 (about a second).
    assert delays[True] < 0.045 and delays[False] < 0.045, delays


# -- malformed_tool_args live in the other streaming protocols, through their SDKs ------------


def frames_of(provider: Any, answer: dict[str, Any]) -> list[bytes]:
    return [provider.codec.encode_frame(text) for text in provider.codec.stream_frames(answer)]


@contextmanager
def cut_at_the_first_argument(
    frames: list[bytes], marker: bytes, mode: str, record_dir: Path
) -> Iterator[tuple[SlowUpstream, ChaosServer, int]]:
    """A proxy in `mode`, ``malformed_tool_args`` armed, in front of an upstream that sends
    `frames` up to the first tool-argument frame (the first with `marker`) and holds the
    rest until released: the upstream, the proxy and that frame's index."""
    first = first_argument_frame(frames, marker)
    with (
        upstream_of(frames, hold=first + 1) as upstream,
        proxy_of(upstream, mode, record_dir) as server,
    ):
        server.arm("malformed_tool_args")
        yield upstream, server, first


def first_argument_frame(frames: list[bytes], marker: bytes) -> int:
    """The index of the first frame carrying argument text (`marker` and some text)."""
    return next(
        i
        for i, f in enumerate(frames)
        if marker in f and marker + b'""' not in f.replace(b" ", b"")
    )


ANTHROPIC_TOOL_ANSWER: dict[str, Any] = {
    "id": "msg_live",
    "type": "message",
    "role": "assistant",
    "model": "claude-haiku-4-5",
    "content": [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 12, "output_tokens": 9},
}


@pytest.mark.parametrize("mode", MODES)
def test_anthropic_sdk_gets_input_json_deltas_broken_as_they_pass(
    mode: str, tmp_path: Path
) -> None:
    frames = frames_of(AnthropicMessages(), ANTHROPIC_TOOL_ANSWER)
    with cut_at_the_first_argument(frames, b'"partial_json":', mode, tmp_path) as held:
        upstream, server, first = held
        client = anthropic.Anthropic(
            base_url=server.url, api_key="sk-ant-test", max_retries=0, timeout=10
        )
        with client:
            stream = client.messages.create(
                model="claude-haiku-4-5",
                max_tokens=64,
                messages=[{"role": "user", "content": "weather in Paris?"}],
                stream=True,
            )
            events = iter(stream)
            # The SDK passes over the ping event.
            shown = sum(b"event: ping" not in f for f in frames[: first + 1])
            got = [next(events) for _ in range(shown)]
            # The first argument delta arrived, cut, while the upstream waits.
            assert not upstream.release.is_set()  # the held frame is not sent yet
            assert upstream.held.wait(WAIT) and len(upstream.sent) == first + 1
            assert got[-1].type == "content_block_delta"
            upstream.release.set()
            got.extend(events)
        partial = "".join(
            e.delta.partial_json
            for e in got
            if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
        )
        with pytest.raises(json.JSONDecodeError):
            json.loads(partial)
        assert partial == '{"cit'  # the first fragment ('{"city": "') cut in half; the rest dropped
        [stop] = [e for e in got if e.type == "message_delta"]
        assert stop.delta.stop_reason == "max_tokens"  # as the buffered transform says
        texts = [
            e.delta.text
            for e in got
            if e.type == "content_block_delta" and e.delta.type == "text_delta"
        ]
        assert "".join(texts) == "Let me look."
        assert entry_of(server)["fault"]["type"] == "malformed_tool_args"
        if mode != "passthrough":
            wait_for(lambda: entry_of(server)["recording"] is not None)
            assert recorded_frames(tmp_path) == frames


RESPONSES_TOOL_ANSWER: dict[str, Any] = {
    "id": "resp_live",
    "object": "response",
    "created_at": 1,
    "status": "completed",
    "model": "gpt-4o-mini",
    "output": [
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "weather",
            "arguments": '{"city": "Paris", "unit": "celsius"}',
            "status": "completed",
        }
    ],
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "usage": {"input_tokens": 12, "output_tokens": 9, "total_tokens": 21},
}


@pytest.mark.parametrize("mode", MODES)
def test_responses_sdk_gets_function_call_arguments_broken_as_they_pass(
    mode: str, tmp_path: Path
) -> None:
    frames = frames_of(OpenAIResponses(), RESPONSES_TOOL_ANSWER)
    with cut_at_the_first_argument(frames, b'"delta":', mode, tmp_path) as held:
        upstream, server, first = held
        with openai_client(server) as client:
            stream = client.responses.create(
                model="gpt-4o-mini", input="weather in Paris?", stream=True
            )
            events = iter(stream)
            got: list[Any] = [next(events) for _ in range(first + 1)]
            assert not upstream.release.is_set()  # the held frame is not sent yet
            assert upstream.held.wait(WAIT) and len(upstream.sent) == first + 1
            assert got[-1].type == "response.function_call_arguments.delta"
            upstream.release.set()
            got.extend(events)
        deltas = "".join(e.delta for e in got if e.type == "response.function_call_arguments.delta")
        [done] = [e for e in got if e.type == "response.function_call_arguments.done"]
        [item] = [e.item for e in got if e.type == "response.output_item.done"]
        [completed] = [e.response for e in got if e.type == "response.completed"]
        # Every restatement says what the deltas made: one broken text, invalid JSON.
        assert done.arguments == deltas == item.arguments == completed.output[0].arguments
        with pytest.raises(json.JSONDecodeError):
            json.loads(deltas)
        assert deltas and RESPONSES_TOOL_ANSWER["output"][0]["arguments"].startswith(deltas)
        assert entry_of(server)["fault"]["type"] == "malformed_tool_args"
        if mode != "passthrough":
            wait_for(lambda: entry_of(server)["recording"] is not None)
            assert recorded_frames(tmp_path) == frames
