"""Every fault in the catalogue, as it really happens on the wire.

A raw socket writes an HTTP/1.1 POST by hand and reads what comes back: the
status line and headers, the chunked framing (did the terminating ``0\\r\\n\\r\\n``
come?), the SSE frames, and how the connection ended -- EOF (``recv`` gave
``b""``), ECONNRESET, or silence (the socket timed out). Each test asserts
exactly what the wire carries, for a JSON and a streaming request.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from chaosllm import ChaosServer
from chaosllm.faults import FAULT_TYPES
from chaosllm.faults.transform import DEFAULT_GARBAGE
from tests.helpers import CLOCK_SLACK, recording, request_body

pytestmark = pytest.mark.timeout(30)

NAME = "knowledge/0004"
"""A short answer recorded from a stream: 16 answer frames, finish, usage, [DONE]."""
ANSWER_FRAMES = 16
ALL_FRAMES = 19
TOOLS_JSON = "tool-call/0001"
TOOLS_STREAM = "streaming-tools/0001"
SOCKET_TIMEOUT = 3.0
DEADLINE = 10.0
"""No single exchange may take longer than this, whatever the server does."""

EOF, RESET, TIMEOUT, COMPLETE = "eof", "reset", "timeout", "complete"


# -- a raw HTTP/1.1 client that reports exactly what arrived --------------------------------


@dataclass
class Wire:
    """What one request got back on the socket."""

    raw: bytes = b""
    """Every byte received, as received."""
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    chunked: bool = False
    body: bytes = b""
    """The body bytes (de-chunked), or all the bytes when no HTTP head came."""
    chunks: list[bytes] = field(default_factory=list)
    """Each chunk's payload, in order (chunked bodies)."""
    terminated: bool = False
    """The terminating ``0\\r\\n\\r\\n`` arrived (chunked bodies)."""
    complete: bool = False
    """The HTTP message ended as framed (terminating chunk, or the whole Content-Length)."""
    end: str = ""
    """How the reading ended: complete (message done, connection left open), eof, reset,
    timeout."""
    head_after: float | None = None
    """Seconds from sending the request to the complete head."""
    first_byte_after: float | None = None
    elapsed: float = 0.0
    """Seconds from sending the request to the end of reading."""

    @property
    def frames(self) -> list[bytes]:
        """The chunks that are well-formed SSE frames (``data: ...`` + blank line)."""
        return [c for c in self.chunks if c.startswith(b"data: ") and c.endswith(b"\n\n")]

    @property
    def payloads(self) -> list[str]:
        return [f.decode("utf-8")[len("data: ") :].strip() for f in self.frames]

    @property
    def chunk_payloads(self) -> list[dict[str, Any]]:
        """The JSON payloads of the frames, [DONE] excluded."""
        return [json.loads(p) for p in self.payloads if p != "[DONE]"]

    def json(self) -> Any:
        return json.loads(self.body)


class _Reader:
    def __init__(self, sock: socket.socket, sent_at: float) -> None:
        self.sock = sock
        self.sent_at = sent_at
        self.buf = bytearray()
        self.wire = Wire()

    def recv(self) -> str | None:
        """Read once into the buffer; how the connection ended, or None if bytes came."""
        if time.monotonic() - self.sent_at > DEADLINE:
            raise AssertionError(f"still reading after {DEADLINE} s: {self.wire!r}")
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            return RESET
        except TimeoutError:
            return TIMEOUT
        if not data:
            return EOF
        if self.wire.first_byte_after is None:
            self.wire.first_byte_after = time.monotonic() - self.sent_at
        self.wire.raw += data
        self.buf += data
        return None

    def parse_head(self) -> bool | None:
        """True once the head is parsed; False when the bytes are not HTTP; None: need more."""
        if len(self.buf) >= 5 and not self.buf.startswith(b"HTTP/"):
            return False
        head, sep, rest = bytes(self.buf).partition(b"\r\n\r\n")
        if not sep:
            return None
        lines = head.decode("latin-1").split("\r\n")
        self.wire.status = int(lines[0].split(" ")[1])
        for line in lines[1:]:
            name, _, value = line.partition(":")
            self.wire.headers[name.strip().lower()] = value.strip()
        self.wire.chunked = self.wire.headers.get("transfer-encoding") == "chunked"
        self.wire.head_after = time.monotonic() - self.sent_at
        self.buf[:] = rest
        return True

    def parse_chunks(self) -> None:
        w = self.wire
        while not w.terminated:
            line, sep, rest = bytes(self.buf).partition(b"\r\n")
            if not sep:
                return
            size = int(line.split(b";")[0], 16)
            if len(rest) < size + 2:
                return
            assert rest[size : size + 2] == b"\r\n", f"bad chunk framing: {bytes(self.buf)!r}"
            if size == 0:
                w.terminated = w.complete = True
            else:
                w.chunks.append(rest[:size])
                w.body += rest[:size]
            self.buf[:] = rest[size + 2 :]

    def run(self, until_eof: bool) -> Wire:
        w = self.wire
        state = "head"
        while True:
            if state == "head":
                parsed = self.parse_head()
                if parsed is False:
                    state = "raw"
                elif parsed:
                    state = "body"
            if state == "body":
                if w.chunked:
                    self.parse_chunks()
                else:
                    w.body += self.buf
                    self.buf.clear()
                    if len(w.body) >= int(w.headers.get("content-length", "0")):
                        w.complete = True
                if w.complete and not until_eof:
                    w.end = COMPLETE
                    break
            if state == "raw":
                w.body += self.buf
                self.buf.clear()
            ended = self.recv()
            if ended is not None:
                if state == "head" and self.buf:
                    w.body = bytes(self.buf)  # a fragment that never became a head
                w.end = ended
                break
        w.elapsed = time.monotonic() - self.sent_at
        return w


def send_post(
    sock: socket.socket,
    body: dict[str, Any],
    *,
    path: str = "/v1/chat/completions",
    headers: dict[str, str] | None = None,
) -> float:
    data = json.dumps(body).encode("utf-8")
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n"
    )
    for name, value in (headers or {}).items():
        head += f"{name}: {value}\r\n"
    sock.sendall(head.encode("latin-1") + b"\r\n" + data)
    return time.monotonic()


def read_wire(
    sock: socket.socket, sent_at: float, *, timeout: float = SOCKET_TIMEOUT, until_eof: bool = False
) -> Wire:
    sock.settimeout(timeout)
    return _Reader(sock, sent_at).run(until_eof)


@contextlib.contextmanager
def connect(server: ChaosServer) -> Iterator[socket.socket]:
    assert server.port is not None
    sock = socket.create_connection((server.host, server.port), timeout=SOCKET_TIMEOUT)
    try:
        yield sock
    finally:
        sock.close()


def call(
    server: ChaosServer,
    name: str = NAME,
    *,
    stream: bool,
    timeout: float = SOCKET_TIMEOUT,
    until_eof: bool = False,
) -> Wire:
    """One request of the recording `name` on a fresh connection."""
    with connect(server) as sock:
        return read_wire(
            sock,
            send_post(sock, request_body(name, stream=stream)),
            timeout=timeout,
            until_eof=until_eof,
        )


def fault_of_last_request(server: ChaosServer) -> str | None:
    entries = server.requests()
    assert entries, "the server saw no provider request"
    fault = entries[-1]["fault"]
    return None if fault is None else str(fault["type"])


def baseline(server: ChaosServer, name: str = NAME, *, stream: bool) -> Wire:
    wire = call(server, name, stream=stream)
    assert wire.status == 200 and wire.complete, wire
    return wire


def answer_bytes(name: str = NAME) -> bytes:
    """The non-stream body chaosllm serves for a recording (what the wire carries)."""
    return json.dumps(recording(name)["response"]["body"], ensure_ascii=False).encode("utf-8")


def finishes(payload: dict[str, Any]) -> bool:
    return payload.get("choices") == [] or any(
        c.get("finish_reason") for c in payload.get("choices") or []
    )


# -- the unfaulted baseline the faults are measured against -------------------------------


def test_baseline_json_and_stream(server: ChaosServer) -> None:
    plain = baseline(server, stream=False)
    assert plain.end == COMPLETE and plain.body == answer_bytes()
    assert plain.headers["content-length"] == str(len(answer_bytes()))
    stream = baseline(server, stream=True)
    assert stream.chunked and stream.terminated and stream.end == COMPLETE
    assert len(stream.frames) == ALL_FRAMES and stream.payloads[-1] == "[DONE]"
    assert not any(finishes(p) for p in stream.chunk_payloads[:ANSWER_FRAMES])
    assert all(finishes(p) for p in stream.chunk_payloads[ANSWER_FRAMES:])
    assert [e["fault"] for e in server.requests()] == [None, None]


# -- empty_response -------------------------------------------------------------------------


def test_empty_response_json(server: ChaosServer) -> None:
    server.arm("empty_response")
    wire = call(server, stream=False)
    assert wire.status == 200 and wire.complete and wire.end == COMPLETE
    choice = wire.json()["choices"][0]
    assert choice["message"]["content"] is None and "tool_calls" not in choice["message"]
    assert choice["finish_reason"] == "stop"
    assert wire.json()["id"] == recording(NAME)["response"]["body"]["id"]
    assert fault_of_last_request(server) == "empty_response"


def test_empty_response_stream(server: ChaosServer) -> None:
    server.arm("empty_response")
    wire = call(server, stream=True)
    assert wire.status == 200 and wire.terminated and wire.end == COMPLETE
    payloads = wire.chunk_payloads
    # role delta, finish chunk, usage chunk (include_usage), then [DONE]: no content at all.
    assert [p["choices"][0]["delta"] for p in payloads[:2]] == [
        {"role": "assistant", "content": None, "refusal": None},
        {},
    ]
    assert payloads[1]["choices"][0]["finish_reason"] == "stop"
    assert payloads[2]["choices"] == [] and payloads[2]["usage"] is not None
    assert wire.payloads[3:] == ["[DONE]"]


# -- truncated_stream ----------------------------------------------------------------------


def test_truncated_stream_json_is_a_clean_short_body_then_close(server: ChaosServer) -> None:
    server.arm("truncated_stream")
    wire = call(server, stream=False, until_eof=True)
    assert wire.status == 200 and wire.complete and wire.end == EOF
    full = answer_bytes()
    assert wire.headers["content-length"] == str(len(full) // 2) == str(len(wire.body))
    assert wire.headers["connection"] == "close"
    assert full.startswith(wire.body)
    with pytest.raises(json.JSONDecodeError):
        wire.json()


@pytest.mark.parametrize("k", [0, 3])
def test_truncated_stream_k_frames_then_terminating_chunk(server: ChaosServer, k: int) -> None:
    full = baseline(server, stream=True)
    server.arm("truncated_stream", after_chunks=k)
    with connect(server) as sock:
        wire = read_wire(sock, send_post(sock, request_body(NAME, stream=True)))
        assert wire.status == 200 and wire.terminated and wire.end == COMPLETE
        assert wire.frames == full.frames[:k]
        assert "[DONE]" not in wire.payloads
        assert not any(finishes(p) for p in wire.chunk_payloads)
        # A clean end: the connection is still good for the next request.
        again = read_wire(sock, send_post(sock, request_body(NAME, stream=True)))
        assert again.frames == full.frames and again.terminated


def test_truncated_stream_default_is_two_frames(server: ChaosServer) -> None:
    server.arm("truncated_stream")
    wire = call(server, stream=True)
    assert len(wire.frames) == 2 and wire.terminated


def test_truncated_stream_after_chunks_is_clamped_to_the_answer(server: ChaosServer) -> None:
    server.arm("truncated_stream", after_chunks=1000)
    wire = call(server, stream=True)
    assert len(wire.frames) == ANSWER_FRAMES and wire.terminated
    assert "[DONE]" not in wire.payloads and not any(finishes(p) for p in wire.chunk_payloads)


# -- dropped_connection --------------------------------------------------------------------


def test_dropped_connection_json_half_the_body_then_fin(server: ChaosServer) -> None:
    server.arm("dropped_connection")
    wire = call(server, stream=False)
    full = answer_bytes()
    assert wire.status == 200 and wire.end == EOF and not wire.complete
    assert wire.headers["content-length"] == str(len(full))
    assert wire.body == full[: len(full) // 2]


def test_dropped_connection_json_after_bytes(server: ChaosServer) -> None:
    server.arm("dropped_connection", after_bytes=10)
    wire = call(server, stream=False)
    assert wire.end == EOF and not wire.complete and wire.body == answer_bytes()[:10]


@pytest.mark.parametrize("k", [0, 1, 5])
def test_dropped_connection_stream_k_frames_then_fin(server: ChaosServer, k: int) -> None:
    full = baseline(server, stream=True)
    server.arm("dropped_connection", after_chunks=k)
    wire = call(server, stream=True)
    assert wire.status == 200 and wire.chunked
    assert wire.frames == full.frames[:k] and wire.chunks == full.chunks[:k]
    assert wire.end == EOF and not wire.terminated


def test_after_chunks_alias_over_http(server: ChaosServer) -> None:
    with httpx.Client(base_url=server.url, timeout=SOCKET_TIMEOUT) as client:
        armed = client.post("/__fault", json={"type": "dropped_connection", "afterChunks": 4})
        assert armed.status_code == 201, armed.text
        assert armed.json()["faults"][0]["after_chunks"] == 4
    wire = call(server, stream=True)
    assert len(wire.frames) == 4 and wire.end == EOF and not wire.terminated


# -- error_in_200 --------------------------------------------------------------------------


def test_error_in_200_json(server: ChaosServer) -> None:
    server.arm("error_in_200")
    wire = call(server, stream=False)
    assert wire.status == 200 and wire.complete and wire.end == COMPLETE
    error = wire.json()["error"]
    assert set(wire.json()) == {"error"}
    assert error["type"] == "server_error" and error["message"]


@pytest.mark.parametrize("k", [0, 2])
def test_error_in_200_stream_k_frames_then_error_frame(server: ChaosServer, k: int) -> None:
    full = baseline(server, stream=True)
    server.arm("error_in_200", after_chunks=k, message="boom")
    wire = call(server, stream=True)
    assert wire.status == 200 and wire.terminated
    assert wire.frames[:k] == full.frames[:k] and len(wire.frames) == k + 1
    assert wire.frames[k].startswith(b'data: {"error":')
    assert json.loads(wire.payloads[k]) == {
        "error": {"message": "boom", "type": "server_error", "param": None, "code": None}
    }
    assert "[DONE]" not in wire.payloads


# -- http_503, http_429, http_error ----------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_http_503(server: ChaosServer, stream: bool) -> None:
    server.arm("http_503")
    wire = call(server, stream=stream)
    assert wire.status == 503 and wire.complete and not wire.chunked and not wire.frames
    assert wire.headers["content-type"] == "application/json"
    assert "retry-after" not in wire.headers
    assert wire.json()["error"]["type"] == "server_error"
    assert wire.json()["error"]["code"] == "service_unavailable"


def test_http_503_with_retry_after(server: ChaosServer) -> None:
    server.arm("http_503", retry_after=2)
    wire = call(server, stream=True)
    assert wire.status == 503
    assert wire.headers["retry-after"] == "2" and wire.headers["retry-after-ms"] == "2000"


@pytest.mark.parametrize("stream", [False, True])
def test_http_429_has_retry_after(server: ChaosServer, stream: bool) -> None:
    server.arm("http_429")
    wire = call(server, stream=stream)
    assert wire.status == 429 and wire.complete and not wire.frames
    assert wire.headers["retry-after"] == "1" and wire.headers["retry-after-ms"] == "1000"
    assert wire.headers["x-ratelimit-remaining-requests"] == "0"
    assert wire.json()["error"]["code"] == "rate_limit_exceeded"


@pytest.mark.parametrize(
    ("retry_after", "header", "header_ms"),
    [(0, "0", "0"), (0.1, "1", "100"), (2.5, "3", "2500"), (30, "30", "30000")],
)
def test_http_429_retry_after_header_is_whole_seconds_rounded_up(
    server: ChaosServer, retry_after: float, header: str, header_ms: str
) -> None:
    server.arm("http_429", retry_after=retry_after)
    wire = call(server, stream=False)
    assert (wire.headers["retry-after"], wire.headers["retry-after-ms"]) == (header, header_ms)


@pytest.mark.parametrize(
    ("status", "type_"),
    [
        (500, "server_error"),
        (502, "server_error"),
        (504, "timeout"),
        (400, "invalid_request_error"),
        (401, "invalid_request_error"),
        (404, "invalid_request_error"),
        (529, "server_error"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_http_error_statuses(server: ChaosServer, status: int, type_: str, stream: bool) -> None:
    server.arm("http_error", status=status)
    wire = call(server, stream=stream)
    assert wire.status == status and wire.complete and not wire.chunked
    assert wire.json()["error"]["type"] == type_
    assert wire.end == COMPLETE  # an ordinary response: the connection stays usable


# -- malformed_tool_args -------------------------------------------------------------------


def test_malformed_tool_args_json(server: ChaosServer) -> None:
    server.arm("malformed_tool_args")
    wire = call(server, TOOLS_JSON, stream=False)
    assert wire.status == 200 and wire.complete
    calls = wire.json()["choices"][0]["message"]["tool_calls"]
    original = recording(TOOLS_JSON)["response"]["body"]["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == [c["function"]["name"] for c in original]
    for call_, before in zip(calls, original, strict=True):
        arguments = call_["function"]["arguments"]
        assert before["function"]["arguments"].startswith(arguments)
        with pytest.raises(json.JSONDecodeError):
            json.loads(arguments)


def test_malformed_tool_args_stream(server: ChaosServer) -> None:
    server.arm("malformed_tool_args")
    wire = call(server, TOOLS_STREAM, stream=True)
    assert wire.status == 200 and wire.terminated and wire.payloads[-1] == "[DONE]"
    arguments: dict[int, str] = {}
    for payload in wire.chunk_payloads:
        for choice in payload["choices"]:
            for delta in choice["delta"].get("tool_calls") or []:
                arguments[delta["index"]] = arguments.get(delta["index"], "") + (
                    delta.get("function") or {}
                ).get("arguments", "")
    original = recording(TOOLS_STREAM)["response"]["body"]["choices"][0]["message"]["tool_calls"]
    assert len(arguments) == len(original) == 2
    for index, text in arguments.items():
        assert original[index]["function"]["arguments"].startswith(text)
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)


def test_malformed_tool_args_waits_for_an_answer_with_tool_calls(server: ChaosServer) -> None:
    (fault_id,) = server.arm("malformed_tool_args")
    plain = call(server, stream=False)  # no tool calls: served as recorded, fault kept
    assert plain.body == answer_bytes() and fault_of_last_request(server) is None
    assert [f["id"] for f in server.faults()["armed"]] == [fault_id]
    call(server, TOOLS_JSON, stream=False)
    assert fault_of_last_request(server) == "malformed_tool_args"
    assert server.faults()["armed"] == []


# -- connection_reset ----------------------------------------------------------------------


def test_connection_reset_json_before_any_byte(server: ChaosServer) -> None:
    server.arm("connection_reset")
    wire = call(server, stream=False)
    assert wire.end == RESET and wire.raw == b""


def test_connection_reset_json_after_bytes(server: ChaosServer) -> None:
    server.arm("connection_reset", after_bytes=20)
    wire = call(server, stream=False)
    assert wire.status == 200 and wire.body == answer_bytes()[:20]
    assert wire.end == RESET and not wire.complete


@pytest.mark.parametrize("k", [0, 3])
def test_connection_reset_stream_k_frames_then_rst(server: ChaosServer, k: int) -> None:
    full = baseline(server, stream=True)
    server.arm("connection_reset", after_chunks=k)
    wire = call(server, stream=True)
    assert wire.status == 200 and wire.chunked
    assert wire.frames == full.frames[:k] and wire.end == RESET and not wire.terminated


# -- empty_reply ---------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_empty_reply_no_bytes_then_eof(server: ChaosServer, stream: bool) -> None:
    server.arm("empty_reply")
    wire = call(server, stream=stream)
    assert wire.raw == b"" and wire.end == EOF
    assert fault_of_last_request(server) == "empty_reply"


# -- latency and slow_stream ---------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_latency_delays_the_head(server: ChaosServer, stream: bool) -> None:
    full = baseline(server, stream=stream)
    server.arm("latency", delay_ms=300)
    wire = call(server, stream=stream)
    assert wire.first_byte_after is not None and wire.first_byte_after >= 0.3
    assert wire.head_after is not None and wire.head_after >= 0.3
    assert wire.status == 200 and wire.complete and wire.body == full.body


def test_slow_stream_json_dribbles_the_body(server: ChaosServer) -> None:
    server.arm("slow_stream", delay_ms=40, piece_bytes=200)
    wire = call(server, stream=False)
    pieces = -(-len(answer_bytes()) // 200)
    assert pieces == 4
    assert wire.complete and wire.body == answer_bytes()
    assert wire.elapsed >= pieces * 0.04 - CLOCK_SLACK


def test_slow_stream_spaces_the_frames(server: ChaosServer) -> None:
    full = baseline(server, stream=True)
    server.arm("slow_stream", delay_ms=20)
    wire = call(server, stream=True)
    assert wire.terminated and wire.frames == full.frames
    assert wire.elapsed >= ALL_FRAMES * 0.02 - CLOCK_SLACK


# -- stall ---------------------------------------------------------------------------------


def test_stall_json_head_then_silence(server: ChaosServer) -> None:
    server.arm("stall", max_ms=5000)
    wire = call(server, stream=False, timeout=0.3)
    assert wire.status == 200 and wire.headers["content-length"] == str(len(answer_bytes()))
    assert wire.body == b"" and wire.end == TIMEOUT


def test_stall_json_bounded_by_max_ms(server: ChaosServer) -> None:
    server.arm("stall", max_ms=200)
    wire = call(server, stream=False)
    assert wire.status == 200 and wire.body == b"" and wire.end == EOF
    assert wire.elapsed >= 0.2 - CLOCK_SLACK


@pytest.mark.parametrize("k", [0, 2])
def test_stall_stream_k_frames_then_silence(server: ChaosServer, k: int) -> None:
    full = baseline(server, stream=True)
    server.arm("stall", after_chunks=k, max_ms=5000)
    wire = call(server, stream=True, timeout=0.3)
    assert wire.status == 200 and wire.frames == full.frames[:k]
    assert wire.end == TIMEOUT and not wire.terminated


def test_stall_stream_bounded_by_max_ms(server: ChaosServer) -> None:
    server.arm("stall", after_chunks=2, max_ms=200)
    wire = call(server, stream=True)
    assert len(wire.frames) == 2 and wire.end == EOF and not wire.terminated
    assert wire.elapsed >= 0.2 - CLOCK_SLACK


# -- garbage -------------------------------------------------------------------------------


def test_garbage_json_is_not_http(server: ChaosServer) -> None:
    server.arm("garbage")
    wire = call(server, stream=False)
    assert wire.status is None and not wire.raw.startswith(b"HTTP/")
    assert wire.raw == DEFAULT_GARBAGE and wire.end == EOF


def test_garbage_json_custom_data(server: ChaosServer) -> None:
    server.arm("garbage", data="SSH-2.0-OpenSSH_9.6\r\n")
    wire = call(server, stream=False)
    assert wire.raw == b"SSH-2.0-OpenSSH_9.6\r\n" and wire.end == EOF


@pytest.mark.parametrize("k", [0, 2])
def test_garbage_stream_k_frames_then_noise(server: ChaosServer, k: int) -> None:
    full = baseline(server, stream=True)
    server.arm("garbage", after_chunks=k)
    wire = call(server, stream=True)
    assert wire.status == 200 and wire.frames == full.frames[:k]
    assert wire.chunks[k:] == [DEFAULT_GARBAGE]
    assert wire.end == EOF and not wire.terminated


# -- the named failure classes (OpenAI's shapes here; every protocol's: test_failure_classes) --


@pytest.mark.parametrize(
    ("type_", "status", "error_type", "code"),
    [
        ("context_length_exceeded", 400, "invalid_request_error", "context_length_exceeded"),
        ("insufficient_quota", 429, "insufficient_quota", "insufficient_quota"),
        ("invalid_api_key", 401, "invalid_request_error", "invalid_api_key"),
        ("model_not_found", 404, "invalid_request_error", "model_not_found"),
        ("overloaded", 503, "service_unavailable_error", "server_is_overloaded"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_failure_class_statuses(
    server: ChaosServer, type_: str, status: int, error_type: str, code: str, stream: bool
) -> None:
    server.arm(type_)
    wire = call(server, stream=stream)
    assert wire.status == status and wire.complete and not wire.chunked and not wire.frames
    assert wire.end == COMPLETE
    error = wire.json()["error"]
    assert (error["type"], error["code"]) == (error_type, code) and error["message"]
    assert "retry-after" not in wire.headers and "x-should-retry" not in wire.headers


def test_context_length_exceeded_names_the_messages(server: ChaosServer) -> None:
    server.arm("context_length_exceeded")
    error = call(server, stream=False).json()["error"]
    assert error["param"] == "messages"
    assert error["message"].startswith("This model's maximum context length is 128000 tokens.")


def test_insufficient_quota_has_no_retry_after(server: ChaosServer) -> None:
    server.arm("insufficient_quota")
    wire = call(server, stream=False)
    assert wire.status == 429
    assert not {"retry-after", "retry-after-ms"} & set(wire.headers)


def test_invalid_api_key_is_a_401(server: ChaosServer) -> None:
    server.arm("invalid_api_key")
    assert call(server, stream=False).status == 401


def test_model_not_found_names_the_model(server: ChaosServer) -> None:
    server.arm("model_not_found")
    error = call(server, stream=False).json()["error"]
    model = request_body(NAME, stream=False)["model"]
    expected = f"The model `{model}` does not exist or you do not have access to it."
    assert error["message"] == expected


@pytest.mark.parametrize("stream", [False, True])
def test_content_filter_cuts_the_answer(server: ChaosServer, stream: bool) -> None:
    full = baseline(server, stream=stream)
    server.arm("content_filter")
    wire = call(server, stream=stream)
    assert wire.status == 200 and wire.complete
    if not stream:
        (choice,) = wire.json()["choices"]
        whole = full.json()["choices"][0]["message"]["content"]
        assert choice["finish_reason"] == "content_filter"
        assert whole.startswith(choice["message"]["content"])
        assert len(choice["message"]["content"]) < len(whole)
        return
    assert wire.terminated and wire.payloads[-1] == "[DONE]"  # a whole stream, cut short
    reasons = [c["choices"][0]["finish_reason"] for c in wire.chunk_payloads if c["choices"]]
    assert reasons[-1] == "content_filter" and len(wire.frames) < len(full.frames)


def test_overloaded_mid_stream_is_an_error_frame_after_k(server: ChaosServer) -> None:
    full = baseline(server, stream=True)
    server.arm("overloaded", after_chunks=2)
    wire = call(server, stream=True)
    assert wire.status == 200 and wire.terminated
    assert wire.frames[:2] == full.frames[:2] and len(wire.frames) == 3
    assert json.loads(wire.payloads[2])["error"]["code"] == "server_is_overloaded"


# -- the whole catalogue is covered ---------------------------------------------------------


def test_every_catalogue_type_has_wire_tests() -> None:
    """Each type has its raw-socket tests here, except the wire quirks, whose socket tests
    (the SDKs, a naive parser and the bytes on the wire, per quirk) are in
    tests/wire/test_quirks.py, the pace, whose are in tests/engine/test_pace.py, and the
    session faults, on a WebSocket in tests/clients/test_realtime_faults.py and
    test_gemini_live.py, the MCP faults, in tests/wire/test_mcp_wire.py, and the stored
    responses' and gateways' faults, in tests/wire/test_stored_and_gateway_faults.py."""
    from tests.clients import test_gemini_live, test_realtime_faults
    from tests.engine import test_pace
    from tests.wire import test_mcp_wire, test_quirks, test_stored_and_gateway_faults

    tests = [name for name in globals() if name.startswith("test_")]
    elsewhere = {*test_quirks.QUIRKS, *test_stored_and_gateway_faults.COVERED}
    sessions = [*vars(test_realtime_faults), *vars(test_gemini_live), *vars(test_mcp_wire)]
    elsewhere.update(t for t in FAULT_TYPES if any(n.startswith(f"test_{t}_") for n in sessions))
    if any(n.startswith("test_on_a_socket_the_pace") for n in vars(test_pace)):
        elsewhere.add("pace")
    untested = [
        t
        for t in FAULT_TYPES
        if t not in elsewhere and not any(n.startswith(f"test_{t}_") for n in tests)
    ]
    assert untested == []
