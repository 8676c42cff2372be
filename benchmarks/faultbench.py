"""The fault board under load (issue 3): armed-but-not-matching faults and arm/disarm.

Every provider request with armed faults scans the board (FIFO, under a lock)
for the first fault that matches it. With 100 faults that never match, each
request pays a full scan: this measures what that costs in throughput. The
arm + disarm round trip is ``POST /__fault`` then ``DELETE /__fault/{id}`` on
one keep-alive `httpx.Client`, as a test fixture does around each test.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any
from urllib.parse import urlsplit

import httpx

__all__ = [
    "arm_non_matching",
    "board_state",
    "clear_journal",
    "disarm_all",
    "raw_round_trips",
    "round_trips",
    "take_cost_us",
]


def _client(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=10.0, trust_env=False)


def arm_non_matching(url: str, by: str, count: int = 100) -> list[str]:
    """Arm `count` http_503 faults that can never match the benchmark's requests:
    ``by="session"``: each for another session; ``by="model"``: each for another model."""
    specs: list[dict[str, Any]] = [
        {"type": "http_503", "match": {by: f"other-{by}-{i}"}} for i in range(count)
    ]
    with _client(url) as client:
        response = client.post("/__fault", json=specs)
        response.raise_for_status()
        ids: list[str] = response.json()["ids"]
    if len(ids) != count:
        raise RuntimeError(f"armed {len(ids)} faults, not {count}")
    return ids


def disarm_all(url: str) -> None:
    with _client(url) as client:
        client.delete("/__fault").raise_for_status()


def clear_journal(url: str) -> None:
    """``DELETE /__requests``: so that one cell does not pay for the journal of the last."""
    with _client(url) as client:
        client.delete("/__requests").raise_for_status()


def board_state(url: str) -> tuple[int, int]:
    """(armed, fired) on the server."""
    with _client(url) as client:
        data = client.get("/__fault").json()
    return len(data["armed"]), len(data["fired"])


def round_trips(url: str, iterations: int, warmup: int = 100) -> list[float]:
    """Milliseconds of each arm + disarm pair, after `warmup` untimed pairs."""
    spec = {"type": "http_503", "match": {"session": "round-trip-probe"}}
    times: list[float] = []
    with _client(url) as client:
        for i in range(warmup + iterations):
            start = time.perf_counter()
            armed = client.post("/__fault", json=spec)
            fault_id = armed.json()["ids"][0]
            disarmed = client.delete(f"/__fault/{fault_id}")
            elapsed = (time.perf_counter() - start) * 1000
            if armed.status_code != 201 or disarmed.status_code != 200:
                raise RuntimeError(
                    f"arm {armed.status_code} / disarm {disarmed.status_code}: "
                    f"{disarmed.text[:200]}"
                )
            if i >= warmup:
                times.append(elapsed)
    return times


class _RawClient:
    """A minimal keep-alive HTTP/1.1 client on a blocking socket: what is left of a
    round trip once the client library's own cost is taken out."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host = f"{parts.hostname}:{parts.port}"
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=10.0)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def close(self) -> None:
        self.sock.close()

    def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        head = (
            f"{method} {path} HTTP/1.1\r\nhost: {self.host}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        )
        self.sock.sendall(head.encode("ascii") + body)
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        head_bytes, _, rest = self.buffer.partition(b"\r\n\r\n")
        lines = head_bytes.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
            elif name.strip().lower() == b"transfer-encoding":
                raise RuntimeError("the raw client reads Content-Length bodies only")
        while len(rest) < length:
            self.buffer = rest
            self._fill()
            rest = self.buffer
        self.buffer = rest[length:]
        return status, rest[:length]

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.buffer += data


def raw_round_trips(url: str, iterations: int, warmup: int = 100) -> list[float]:
    """`round_trips` with `_RawClient` instead of httpx."""
    spec = json.dumps({"type": "http_503", "match": {"session": "round-trip-probe"}}).encode()
    client = _RawClient(url)
    times: list[float] = []
    try:
        for i in range(warmup + iterations):
            start = time.perf_counter()
            status, body = client.request("POST", "/__fault", spec)
            fault_id = json.loads(body)["ids"][0]
            status2, _ = client.request("DELETE", f"/__fault/{fault_id}")
            elapsed = (time.perf_counter() - start) * 1000
            if status != 201 or status2 != 200:
                raise RuntimeError(f"arm {status} / disarm {status2}")
            if i >= warmup:
                times.append(elapsed)
    finally:
        client.close()
    return times


def take_cost_us(armed: int = 100, calls: int = 20_000) -> dict[str, float]:
    """In-process: microseconds per `FaultBoard.take` for a request no armed fault
    matches, with `armed` faults (by session, by model) and with none."""
    from chaosllm.faults import FaultBoard, RequestInfo, parse_fault_specs

    request = RequestInfo(
        path="/v1/chat/completions", model="gpt-4o-mini", session="bench", stream=False
    )
    costs: dict[str, float] = {}
    for label, specs in (
        ("none", []),
        (
            "session",
            [{"type": "http_503", "match": {"session": f"other-{i}"}} for i in range(armed)],
        ),
        ("model", [{"type": "http_503", "match": {"model": f"other-{i}"}} for i in range(armed)]),
    ):
        board = FaultBoard()
        if specs:
            board.arm(parse_fault_specs(specs))
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(calls):
                if board.take(request) is not None:
                    raise RuntimeError("a non-matching fault fired")
            best = min(best, (time.perf_counter() - start) / calls * 1e6)
        costs[label] = round(best, 2)
    return costs
