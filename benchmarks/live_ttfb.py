"""Time to first byte through the proxy in passthrough, with a fault armed and without.

    python benchmarks/live_ttfb.py [--samples N]

A loopback upstream streams 20 Chat Completions frames 50 ms apart; chaosllm runs in
passthrough in front of it (in process, the builtin server) and a raw socket asks for
the stream. The figure is how long after the upstream wrote its first frame the client
read the first byte of a frame (median of N), with nothing armed, with
``dropped_connection(after_chunks=5)`` armed (applied live, frame by frame) and, for
comparison, with ``empty_response`` armed (a fault that needs the whole answer: the
proxy reads all 20 frames first, about a second). `benchmarks/run.py` calls `measure`.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import threading
import time
from typing import Any

from chaosllm import ChaosServer

FRAMES = 20
GAP_S = 0.05


def _frame(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return b"data: " + json.dumps({"id": "c", "choices": [choice]}).encode() + b"\n\n"


STREAM = [
    _frame({"role": "assistant", "content": ""}),
    *(_frame({"content": f"w{i} "}) for i in range(1, FRAMES - 2)),
    _frame({}, "stop"),
    b"data: [DONE]\n\n",
]


class _Upstream:
    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.first: list[float] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            size = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            while len(body) < size:
                body += conn.recv(65536)
            try:
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
                )
                for i, frame in enumerate(STREAM):
                    if i:
                        time.sleep(GAP_S)
                    conn.sendall(b"%x\r\n%s\r\n" % (len(frame), frame))
                    if i == 0:
                        self.first.append(time.monotonic())
                conn.sendall(b"0\r\n\r\n")
            except OSError:
                pass  # the proxy closed it (passthrough: the client was cut)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self) -> None:
        self.sock.close()


def _first_byte(server: ChaosServer, upstream: _Upstream) -> float:
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body.encode())
        )
        data = b""
        while b"data: " not in data:
            got = sock.recv(65536)
            if not got:
                raise RuntimeError("no frame arrived")
            data += got
        return (time.monotonic() - upstream.first[-1]) * 1000


def measure(samples: int = 5) -> dict[str, float]:
    """Median milliseconds from the upstream's first frame to the client's first byte."""
    figures: dict[str, float] = {}
    upstream = _Upstream()
    try:
        with ChaosServer(mode="passthrough", upstream=upstream.url) as server:
            for label, fault in (
                ("none", None),
                ("dropped_connection after_chunks=5", {"after_chunks": 5}),
                ("empty_response (buffered)", None),
            ):
                times = []
                for _ in range(samples):
                    if label.startswith("dropped"):
                        server.arm("dropped_connection", **(fault or {}))
                    elif label.startswith("empty"):
                        server.arm("empty_response")
                    times.append(_first_byte(server, upstream))
                    server.disarm()
                figures[label] = statistics.median(times)
    finally:
        upstream.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=5)
    args = parser.parse_args()
    for label, ms in measure(args.samples).items():
        print(f"time to first byte, passthrough, {label}: {ms:.1f} ms")


if __name__ == "__main__":
    main()
