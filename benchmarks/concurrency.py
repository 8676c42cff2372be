"""Concurrency at realistic timing, measured by a client in another process.

- ``gaps``: N concurrent streams of a recording whose frames were recorded `gap_ms`
  apart, replayed with ``--timing recorded``; each frame's arrival time is taken when the
  client reads the blank line that ends it, and the figure is the p99 over every gap of
  every stream of |observed gap - recorded gap|. The same client measures aimock
  (`aimock_fixtures`): aimock delays each of a stream's data chunks (the role delta, the
  content pieces, the finish chunk), by ``--latency`` or by a fixture's
  ``recordedTimings``, but writes ``[DONE]`` right after the finish chunk, with no delay
  it can be told; so the client also reports the figure over the gaps between the data
  frames only (``data_gaps``: the first ``FRAMES - 2`` gaps, the same for both servers)
  and the observed gap before ``[DONE]`` (``done_gap_p50_ms``).

  The client's own delays count into the figure, so it is kept cheap: one
  `asyncio.Protocol` per stream (no task, no stream reader, no buffer), on uvloop when
  installed (``client_loop`` in the output), every request written in one pass, the
  collector off from the first request to the last frame, and every connection closed
  together after the last stream is complete (closing each as its stream ends put 500
  closes, on both sides, into the last gap). A blank line's time is taken in
  ``data_received``, as the loop hands over the bytes it read. (Until issue #11 it was
  a stream-reader task per stream on the plain asyncio loop, reading through
  ``asyncio.wait_for``: with 500 streams its own loop lag was most of the figure, about
  15-20 ms of a 20-25 ms p99, while the kernel's receive timestamps of the same
  server's frames gave about 3 ms.)
- ``idle``: N keep-alive connections, each having made one request, held open; the
  driver reads the server's RSS before and after from /proc, and times a request on a
  fresh connection meanwhile.

Run as ``python concurrency.py gaps HOST PORT N BODYFILE`` or ``... idle HOST PORT N``
(the driver, `run.py`, does it); everything stays on 127.0.0.1 and stops by itself.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import resource
import socket
import sys
import time
from pathlib import Path
from typing import Any, cast

FRAMES = 20
GAP_MS = 50.0


def timed_recording(root: Path, frames: int = FRAMES, gap_ms: float = GAP_MS) -> Path:
    """A recordings directory with one stream whose `frames` frames were recorded
    `gap_ms` apart (the first frame after `gap_ms` too); the request body file beside it."""
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "Count slowly, please."}],
    }
    chunks = []
    words = [f"w{i} " for i in range(frames - 2)]
    base = {
        "id": "chatcmpl-timed",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o-mini",
    }
    for i, word in enumerate(words):
        delta: dict[str, Any] = {"content": word} if i else {"role": "assistant", "content": word}
        frame = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        chunks.append({"data": f"data: {json.dumps(frame)}\n\n", "delay_ms": gap_ms})
    finish = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    chunks.append({"data": f"data: {json.dumps(finish)}\n\n", "delay_ms": gap_ms})
    chunks.append({"data": "data: [DONE]\n\n", "delay_ms": gap_ms})
    answer = "".join(words)
    recording = {
        "chaosllm": 1,
        "provider": "openai.chat",
        "request": {"method": "POST", "path": "/v1/chat/completions", "body": body},
        "response": {
            "status": 200,
            "stream": True,
            "chunks": chunks,
            "body": {
                "id": "chatcmpl-timed",
                "object": "chat.completion",
                "created": 1,
                "model": "gpt-4o-mini",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": answer, "refusal": None},
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": frames, "total_tokens": 25},
            },
        },
    }
    recordings = root / "timed-recordings"
    (recordings / "timed").mkdir(parents=True, exist_ok=True)
    (recordings / "timed" / "0001.json").write_text(json.dumps(recording), encoding="utf-8")
    (root / "timed-request.json").write_text(json.dumps({**body, "stream": True}), "utf-8")
    return recordings


AIMOCK_CHUNK = 4
"""aimock's ``chunkSize`` for `aimock_fixtures`: its answer is ``FRAMES - 3`` pieces of
this many characters, so that role delta + pieces + finish + ``[DONE]`` = `FRAMES` frames."""


def aimock_fixtures(
    root: Path, *, recorded_timings: bool, frames: int = FRAMES, gap_ms: float = GAP_MS
) -> Path:
    """A fixtures directory for aimock answering `timed_recording`'s request (the same
    request file) with a stream of `frames` frames. With `recorded_timings`, the fixture
    carries aimock's own replay timing (``recordedTimings``: the first data chunk after
    ``ttftMs``, each next one after its ``interChunkDelaysMs``, all `gap_ms`); without,
    it carries none and the server is started with ``--latency`` `gap_ms` (a delay before
    every data chunk). Either way ``[DONE]`` follows the finish chunk at once."""
    pieces = frames - 3
    answer = "".join(f"w{i:02d} " for i in range(pieces))
    assert len(answer) == pieces * AIMOCK_CHUNK
    fixture: dict[str, Any] = {
        "match": {"userMessage": "Count slowly, please."},
        "response": {"content": answer},
        "chunkSize": AIMOCK_CHUNK,
    }
    if recorded_timings:
        data_chunks = frames - 1
        fixture["recordedTimings"] = {
            "ttftMs": gap_ms,
            "interChunkDelaysMs": [gap_ms] * (data_chunks - 1),
            "totalDurationMs": gap_ms * data_chunks,
        }
    name = "aimock-timed-recorded" if recorded_timings else "aimock-timed-latency"
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "timed.json").write_text(
        json.dumps({"fixtures": [fixture]}, indent=2), encoding="utf-8"
    )
    return directory


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when it is installed (chaosllm depends on it), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _raise_nofile(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(hard, max(soft, wanted)) if hard != resource.RLIM_INFINITY else wanted
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def _request(host: str, port: int, body: bytes) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s:%d\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (host.encode(), port, len(body), body)
    )


class _Stream(asyncio.Protocol):
    """One stream's connection: takes the time of every frame's end.

    The time is read in `data_received`, right after the loop read the bytes from the
    socket, once per blank line (two newlines) in them; a blank line split across two
    reads counts when its second newline is read. No buffer is kept: only whether the
    last byte read is a newline not yet paired. The stream is done (`done`) at its
    `FRAMES`-th frame or when the server ends the connection."""

    __slots__ = ("arrivals", "done", "pending", "transport")

    def __init__(self, done: asyncio.Future[None]) -> None:
        self.arrivals: list[float] = []
        self.done = done
        self.pending = False
        """The last byte read is a newline that does not end a blank line."""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if self.pending and data[:1] == b"\n":
            found = 1 + data.count(b"\n\n", 1)
            rest = data[1:]
        else:
            found = data.count(b"\n\n")
            rest = data
        # A run of newlines at the end pairs up from its start: an odd run leaves one.
        run = len(rest) - len(rest.rstrip(b"\n")) if rest[-1:] == b"\n" else 0
        self.pending = run % 2 == 1
        if found:
            arrivals = self.arrivals
            arrivals.extend([now] * found)
            if len(arrivals) >= FRAMES and not self.done.done():
                self.done.set_result(None)  # closed with the others, after the last

    def eof_received(self) -> bool:
        self._finish()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish()

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)
        if self.transport is not None:
            self.transport.close()


async def _gaps(host: str, port: int, n: int, body: bytes) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    request = _request(host, port, body)
    streams: list[_Stream] = []

    def stream() -> _Stream:
        made = _Stream(loop.create_future())
        streams.append(made)
        return made

    await asyncio.gather(*(loop.create_connection(stream, host, port) for _ in range(n)))
    await asyncio.sleep(0.5)  # every connection open before the first request
    gc.collect()
    gc.disable()  # no collector pause of the client's own in the figure
    try:
        for each in streams:
            assert each.transport is not None
            each.transport.write(request)
        # Bounded: a stream that stalls is left out (incomplete), as a read timeout would.
        await asyncio.wait([s.done for s in streams], timeout=FRAMES * GAP_MS / 1000 + 30)
    finally:
        gc.enable()
        for each in streams:
            each._finish()
    errors: list[float] = []
    data_errors: list[float] = []
    done_gaps: list[float] = []
    complete = 0
    for each in streams:
        arrivals = each.arrivals
        if len(arrivals) < FRAMES:
            continue
        complete += 1
        gaps = [(b - a) * 1000 for a, b in itertools.pairwise(arrivals[:FRAMES])]
        errors.extend(abs(gap - GAP_MS) for gap in gaps)
        data_errors.extend(abs(gap - GAP_MS) for gap in gaps[: FRAMES - 2])
        done_gaps.append(gaps[-1])
    for values in (errors, data_errors, done_gaps):
        values.sort()

    def pct(values: list[float], q: float) -> float | None:
        return round(values[min(len(values) - 1, int(q * len(values)))], 2) if values else None

    return {
        "streams": n,
        "complete": complete,
        "p50_ms": pct(errors, 0.5),
        "p99_ms": pct(errors, 0.99),
        "max_ms": round(errors[-1], 2) if errors else None,
        "data_gaps": {
            "gaps_per_stream": FRAMES - 2,
            "p50_ms": pct(data_errors, 0.5),
            "p99_ms": pct(data_errors, 0.99),
            "max_ms": round(data_errors[-1], 2) if data_errors else None,
        },
        "done_gap_p50_ms": pct(done_gaps, 0.5),
        "client_loop": type(loop).__module__.partition(".")[0],
    }


def _idle(host: str, port: int, n: int) -> None:
    socks = []
    for _ in range(n):
        sock = socket.create_connection((host, port), timeout=10)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        got = b""
        while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
        socks.append(sock)
    print(json.dumps({"held": len(socks)}), flush=True)
    sys.stdin.readline()  # the driver says when to let go
    for sock in socks:
        sock.close()


def main(argv: list[str]) -> int:
    mode, host, port, n = argv[0], argv[1], int(argv[2]), int(argv[3])
    _raise_nofile(n + 256)
    if mode == "gaps":
        body = Path(argv[4]).read_bytes()
        loop = _new_loop()
        try:
            found = loop.run_until_complete(_gaps(host, port, n, body))
        finally:
            loop.close()
        print(json.dumps(found), flush=True)
    elif mode == "idle":
        _idle(host, port, n)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
