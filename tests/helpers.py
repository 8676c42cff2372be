"""Plain helpers shared by the test modules (fixtures live in conftest.py): the shipped
recordings, servers and SDK clients, raw sockets, plans and fault transforms, files."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import anyio
import openai
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionMessageParam

from chaosllm import ChaosServer
from chaosllm.faults import FaultContext, apply_fault, parse_fault_spec
from chaosllm.model import Ending, Framing, Piece, ResponsePlan
from chaosllm.providers.sse import FrameSplitter
from chaosllm.store.recordings import shipped_dir

RECORDINGS = shipped_dir("recordings")
CLIENT_RECORDINGS = Path(__file__).resolve().parent / "clients" / "recordings"
"""Recordings the client tests serve besides the shipped ones: requests only one SDK
can send (google-genai's automatic function calling)."""
ROOT = Path(__file__).resolve().parent.parent
"""The repository's root: paths to its files are built from here, so that a test module
reads the same files from whichever folder under tests/ it is in."""
EXAMPLES = ROOT / "examples"
"""The example clients (``examples/``)."""
CLI = [sys.executable, "-m", "chaosllm"]

FAILURE_CLASSES = (
    "context_length_exceeded",
    "insufficient_quota",
    "content_filter",
    "invalid_api_key",
    "model_not_found",
    "overloaded",
)
"""The fault types of the named failure classes (SPEC §5), in the spec's order."""

SESSION_FAULTS = (
    "ws_close",
    "ws_drop",
    "session_error",
    "session_expired",
    "go_away",
    "session_stall",
    "rate_limits_exhausted",
    "malformed_event",
)
"""The session faults (SPEC section 5, WebSocket sessions), in the catalogue's order."""
QUIRKS = (
    "keepalive_comments",
    "crlf_frames",
    "data_no_space",
    "split_utf8",
    "restated_tool_args",
    "filter_frames",
    "usage_only_frame",
    "pace",
)
"""The wire quirks and the pace, in the catalogue's order (after the failure classes)."""

MCP_FAULTS = (
    "mcp_error",
    "tool_error",
    "mcp_timeout",
    "mcp_stream_drop",
    "mcp_session_lost",
    "tools_changed",
    "bad_tool_output",
)
"""The MCP servers' faults (SPEC §5), in the spec's order (after the quirks)."""

CLOCK_SLACK = 0.02
"""Lower bounds on elapsed time allow this much: asyncio fires a timer up to one clock
resolution early, and a test measured a 200 ms stall as 0.197 s."""


# -- the shipped recordings ------------------------------------------------------------


def recording(name: str, root: Path = RECORDINGS) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((root / f"{name}.json").read_text("utf-8"))
    return data


def any_recording(name: str) -> dict[str, Any]:
    """A shipped recording, or one of the client tests' own (`CLIENT_RECORDINGS`): the
    one folder that holds `name`."""
    [root] = [r for r in (RECORDINGS, CLIENT_RECORDINGS) if (r / f"{name}.json").exists()]
    return recording(name, root)


def chunk_data(name: str) -> list[str]:
    """The data of each chunk of the shipped recording `name` (a stream)."""
    return [c["data"] for c in recording(name)["response"]["chunks"]]


def written_chunk_data(record_dir: Path) -> list[str]:
    """The data of each chunk of the one recording written under `record_dir` (a stream)."""
    [written] = record_dir.rglob("*.json")
    return [c["data"] for c in json.loads(written.read_text("utf-8"))["response"]["chunks"]]


def all_recordings(provider: str = "openai.chat") -> list[str]:
    """The shipped recordings of one provider (``<scenario>/<NNNN>``)."""
    return sorted(
        p.relative_to(RECORDINGS).with_suffix("").as_posix()
        for p in RECORDINGS.glob("*/*.json")
        if json.loads(p.read_text("utf-8")).get("provider", "openai.chat") == provider
    )


def sdk_arguments(name: str, **fields: Any) -> dict[str, Any]:
    """The recorded request's body as an SDK call's arguments: ``stream`` left out, for the
    call to say (or set here with the other `fields`)."""
    body = dict(recording(name)["request"]["body"])
    body.pop("stream", None)
    return {**body, **fields}


def request_body(name: str, *, stream: bool) -> dict[str, Any]:
    """The recorded request as the client sent it, as a JSON or a streaming call."""
    body = sdk_arguments(name)
    body.pop("stream_options", None)
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def chat_completion(
    content: str | None,
    *,
    model: str = "m",
    message: Mapping[str, Any] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A Chat Completions answer: one assistant message saying `content` (with `message`'s
    other fields), finished by ``stop``; `fields` add to the top level or replace it."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", **(message or {}), "content": content},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        **fields,
    }


# -- servers and clients ---------------------------------------------------------------


@contextmanager
def serving(
    *args: str, env: dict[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`chaosllm serve --port 0 ARGS` as a subprocess: its URL and process; stopped with
    SIGTERM (then SIGKILL) on exit."""
    proc = subprocess.Popen(
        [*CLI, "serve", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # flushed at once; bounded by the test timeout
        assert line.startswith("chaosllm listening on http://127.0.0.1:"), (
            line,
            proc.stderr.read() if proc.stderr and proc.poll() is not None else "",
        )
        yield line.split()[-1], proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


@contextmanager
def loopback_upstream(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """A real HTTP upstream on 127.0.0.1 (a free port) answering with `handler` in a
    thread: its base URL; shut down (and its thread joined, bounded) on exit."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def write_json(handler: BaseHTTPRequestHandler, answer: Any, status: int = 200) -> None:
    """A whole JSON answer from a loopback upstream's `handler`."""
    data = json.dumps(answer).encode()
    handler.send_response(status)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def write_chunk(handler: BaseHTTPRequestHandler, data: bytes) -> None:
    """One chunk of a chunked body (`handler` sent ``transfer-encoding: chunked``)."""
    handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
    handler.wfile.flush()


@contextmanager
def recording_proxy(
    mode: str = "record", **options: Any
) -> Iterator[tuple[ChaosServer, ChaosServer]]:
    """An upstream (a chaosllm replaying the shipped recordings) and a `ChaosServer` in
    `mode` (record, record-missing, passthrough) in front of it, with `options`
    (``record_dir``...): ``(upstream, proxy)``."""
    with (
        ChaosServer() as upstream,
        ChaosServer(mode=mode, upstream=upstream.url, **options) as proxy,
    ):
        yield upstream, proxy


def openai_client(server: ChaosServer, **options: Any) -> openai.OpenAI:
    """An SDK client for `server` (use it in a `with` block: it owns sockets)."""
    options = {"api_key": "sk-test", "max_retries": 0, "timeout": 10, **options}
    return openai.OpenAI(base_url=server.base_url, **options)


def session_client(server: ChaosServer, session: str, **options: Any) -> openai.OpenAI:
    """`openai_client` whose requests name the chaosllm session `session`."""
    return openai_client(server, default_headers={"X-Chaosllm-Session": session}, **options)


def async_openai_client(server: ChaosServer, **options: Any) -> openai.AsyncOpenAI:
    """`openai_client`'s async twin (use it in an `async with` block)."""
    options = {"api_key": "sk-test", "max_retries": 0, "timeout": 10, **options}
    return openai.AsyncOpenAI(base_url=server.base_url, **options)


def chat_messages(messages: Sequence[Mapping[str, Any]]) -> list[ChatCompletionMessageParam]:
    """Chat messages built as JSON (recorded, or from an SDK object's ``model_dump``) as
    the SDK's message params: the JSON value narrowed for the type checker, unchanged."""
    return cast("list[ChatCompletionMessageParam]", list(messages))


def run_within(seconds: float, exercise: Callable[[], Awaitable[None]]) -> None:
    """`exercise` run on a fresh event loop, failing if it takes longer than `seconds`."""

    async def main() -> None:
        with anyio.fail_after(seconds):
            await exercise()

    anyio.run(main)


# -- raw sockets -----------------------------------------------------------------------


def free_port() -> int:
    """A local port nothing listens on (bound once, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def read_until_eof(sock: socket.socket) -> bytes:
    """Every byte the peer sends until it closes the connection."""
    data = bytearray()
    while True:
        got = sock.recv(65536)
        if not got:
            return bytes(data)
        data += got


def read_head(sock: socket.socket) -> tuple[int, bytes, bytes]:
    """A response's status, its head and the bytes read after it (EOF first fails)."""
    data = b""
    while b"\r\n\r\n" not in data:
        got = sock.recv(65536)
        assert got, f"EOF before a head: {data!r}"
        data += got
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), head, rest


def read_response(sock: socket.socket) -> tuple[int, bytes, bytes]:
    """A complete Content-Length response: status, head, body."""
    status, head, body = read_head(sock)
    match = re.search(rb"(?i)content-length: (\d+)", head)
    assert match is not None, head
    while len(body) < int(match[1]):
        got = sock.recv(65536)
        assert got, "EOF inside the body"
        body += got
    return status, head, body


# -- plans and fault transforms --------------------------------------------------------


def piece_texts(plan: ResponsePlan, errors: str = "strict") -> list[str]:
    """The plan's pieces as text (for a stream: its frames, as a provider parses them)."""
    return [p.data.decode("utf-8", errors) for p in plan.pieces]


def faulted(plan: ResponsePlan, ctx: FaultContext, type_: str, **params: Any) -> ResponsePlan:
    """`plan` transformed by the fault `type_` with `params`, which must apply."""
    out = apply_fault(parse_fault_spec({"type": type_, **params}), plan, ctx)
    assert out is not None
    return out


def split_in_pieces(splitter: FrameSplitter, body: bytes, cuts: Sequence[int]) -> list[bytes]:
    """The frames `splitter` cuts `body` into when it arrives in pieces, cut at `cuts`."""
    bounds = [0, *sorted(cuts), len(body)]
    for start, end in itertools.pairwise(bounds):
        splitter.feed(body[start:end], 0.0)
    splitter.finish()
    return [data for data, _ in splitter.frames]


def transformed(
    rendered: tuple[ResponsePlan, FaultContext], type_: str, **params: Any
) -> tuple[ResponsePlan, ResponsePlan]:
    """A rendered plan (and the context it was rendered in) before and after the fault
    `type_` with `params`, which must apply."""
    plan, ctx = rendered
    return plan, faulted(plan, ctx, type_, **params)


# -- files -----------------------------------------------------------------------------


def write(path: Path, data: Any) -> Path:
    """`data` at `path` (parents made): a string as it is, anything else as JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data, indent=2), "utf-8")
    return path


def wire_plans(
    *, delay_ms: float, stall_ms: float, endings: Sequence[Ending]
) -> st.SearchStrategy[ResponsePlan]:
    """Plans as the wire tests draw them: odd headers (framing and connection ones
    among them), short pieces, a delay of `delay_ms` now and then, any framing and
    declared length, a head or none, and one of `endings`."""
    value = st.from_regex(r"[!-~]([ !-~]{0,10}[!-~])?", fullmatch=True)
    header = st.tuples(
        st.sampled_from(
            ["content-type", "X-Mixed-Case", "connection", "content-length", "transfer-encoding"]
        ),
        st.one_of(value, st.sampled_from(["close", "keep-alive", "upgrade", "chunked"])),
    )
    piece = st.builds(
        Piece,
        data=st.binary(max_size=40),
        delay_ms=st.sampled_from([0.0, 0.0, 0.0, delay_ms]),
        frame=st.booleans(),
    )
    return st.builds(
        ResponsePlan,
        status=st.sampled_from([200, 201, 204, 304, 404, 429, 500, 599]),
        headers=st.lists(header, max_size=4).map(tuple),
        pieces=st.lists(piece, max_size=5).map(tuple),
        framing=st.sampled_from([Framing.LENGTH, Framing.CHUNKED]),
        ending=st.sampled_from(list(endings)),
        content_length=st.one_of(st.none(), st.integers(0, 80)),
        head_delay_ms=st.sampled_from([0.0, 0.0, delay_ms]),
        send_head=st.sampled_from([True, True, True, False]),
        stall_ms=st.sampled_from([0.0, stall_ms]),
        close_after=st.booleans(),
    )


class MemoryTransport:
    """An asyncio transport for a connection protocol driven in memory: what it writes,
    whether it closed, whether reading is paused."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False
        self.reading = True

    def write(self, data: bytes) -> None:
        self.written += data

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(
            name, default
        )

    def close(self) -> None:
        self.closed = True

    abort = close

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def set_protocol(self, protocol: Any) -> None:
        pass
