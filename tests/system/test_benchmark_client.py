"""The concurrency benchmark's client (``benchmarks/concurrency.py``): it counts a frame
when the blank line ending it is read, however the bytes are split across reads, and
measures a real chaosllm server's recorded-timing streams over sockets."""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from chaosllm import ChaosServer
from tests.helpers import ROOT

BENCH = ROOT / "benchmarks" / "concurrency.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chaosllm_bench_concurrency", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _counted(bench: ModuleType, reads: list[bytes]) -> list[int]:
    """How many frames the client has counted after each read of `reads`."""
    loop = asyncio.new_event_loop()
    try:
        stream = bench._Stream(loop.create_future())
        counts = []
        for data in reads:
            stream.data_received(data)
            counts.append(len(stream.arrivals))
        return counts
    finally:
        loop.close()


WIRE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    b'e\r\ndata: {"a":1}\n\n\r\n'
    b"c\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
)


def test_a_frame_counts_when_the_read_holding_its_blank_line_ends(bench: ModuleType) -> None:
    """Every way of cutting the bytes in two or three reads counts the frames at the read
    that holds the second newline of each blank line, as counting the whole text read so
    far does (the client before it kept no buffer)."""
    cuts = range(1, len(WIRE))
    for first, second in itertools.combinations(cuts, 2):
        reads = [WIRE[:first], WIRE[first:second], WIRE[second:]]
        expected = [WIRE[:end].count(b"\n\n") for end in (first, second, len(WIRE))]
        assert _counted(bench, reads) == expected, (first, second)


def test_newline_runs_pair_up_as_in_the_whole_text(bench: ModuleType) -> None:
    """Runs of newlines across reads pair from their start (three newlines are one blank
    line and a spare), whichever read each byte comes in."""
    text = b"a\n\n\nb\n\n\n\nc\n\n\n\n\nd\n"
    for size in range(1, 5):
        reads = [text[i : i + size] for i in range(0, len(text), size)]
        ends = itertools.accumulate(len(r) for r in reads)
        assert _counted(bench, reads) == [text[:end].count(b"\n\n") for end in ends]


@pytest.mark.timeout(60)
def test_the_client_measures_recorded_timing_streams_on_sockets(
    bench: ModuleType, tmp_path: Path
) -> None:
    """A few streams of the benchmark's recording from a real server, read by the client:
    every stream is complete, its 20 frames counted, and the gaps are near 50 ms (the
    bound is loose: a shared machine; the benchmark measures the figure itself)."""
    recordings = bench.timed_recording(tmp_path, frames=bench.FRAMES, gap_ms=bench.GAP_MS)
    body = (tmp_path / "timed-request.json").read_bytes()
    with ChaosServer(recordings, timing="recorded") as server:
        host, _, port = server.url.removeprefix("http://").rpartition(":")
        loop = bench._new_loop()
        try:
            found: dict[str, Any] = loop.run_until_complete(bench._gaps(host, int(port), 5, body))
        finally:
            loop.close()
    assert found["streams"] == 5
    assert found["complete"] == 5
    assert found["data_gaps"]["gaps_per_stream"] == bench.FRAMES - 2
    assert found["p50_ms"] is not None and found["p50_ms"] < 25
    assert 25 < found["done_gap_p50_ms"] < 75
