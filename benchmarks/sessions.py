"""Concurrent replayed WebSocket sessions at recorded timing (issue #26): each session
asks the shipped ``realtime-text`` turn and times every server event of the answer
against its recorded gap after the turn ended; the figure is the p99 of
|arrival - (sent + recorded gap)| over all events of all sessions.

Run by ``benchmarks/run.py`` (section ``sessions``) or alone:
``python benchmarks/sessions.py ws://127.0.0.1:PORT 200``."""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

RECORDING = Path(__file__).resolve().parent.parent / "recordings" / "realtime-text" / "0001.json"


SPREAD_S = 1.0
"""The turns of the sessions start evenly over this many seconds (all 200 are open and
answering at once: a turn lasts 0.3 s at recorded timing), as real sessions' users do not
speak in the same millisecond."""


def expected_gaps() -> tuple[list[dict[str, Any]], list[float]]:
    events = json.loads(RECORDING.read_text("utf-8"))["session"]["events"]
    clients = [e for e in events if e["from"] == "client"]
    end = next(i for i, e in enumerate(events) if e["event"]["type"] == "response.create")
    answer = [e for e in events[end + 1 :] if e["from"] == "server"]
    ended = events[end]["t_ms"]
    return [c["event"] for c in clients], [(e["t_ms"] - ended) / 1000.0 for e in answer]


async def one(
    url: str,
    sent: list[dict[str, Any]],
    gaps: list[float],
    errors: list[float],
    delay: float,
    opened: asyncio.Barrier,
) -> None:
    from websockets.asyncio.client import connect

    async with connect(url + "/v1/realtime?model=gpt-realtime", compression=None) as ws:
        await ws.recv()
        for event in sent[:-1]:
            await ws.send(json.dumps(event))
            await ws.recv()
        await opened.wait()  # every session open (the handshakes are not what is timed)
        await asyncio.sleep(delay)  # then each asks at its own moment
        started = time.perf_counter()
        await ws.send(json.dumps(sent[-1]))
        for gap in gaps:
            await ws.recv()
            errors.append(abs(time.perf_counter() - started - gap) * 1000.0)


async def run(url: str, sessions: int) -> dict[str, float]:
    sent, gaps = expected_gaps()
    errors: list[float] = []
    spread = SPREAD_S / sessions
    opened = asyncio.Barrier(sessions)
    await asyncio.gather(
        *(one(url, sent, gaps, errors, i * spread, opened) for i in range(sessions))
    )
    errors.sort()
    return {
        "sessions": sessions,
        "events": len(errors),
        "p50_ms": statistics.median(errors),
        "p99_ms": errors[min(len(errors) - 1, int(len(errors) * 0.99))],
        "max_ms": errors[-1],
    }


def measure(url: str, sessions: int = 200) -> dict[str, float]:
    return asyncio.run(run(url, sessions))


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 200)))
