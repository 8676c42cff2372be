"""Passthrough overhead: chaosllm as a proxy in front of an upstream, vs the upstream alone.

    python benchmarks/bench_proxy.py [--quick] [--json FILE]

The upstream is `chaosllm serve` replaying the shipped recordings; the proxy is
`chaosllm serve --mode passthrough --upstream URL` in front of it. Both are
subprocesses; the load comes from this process (latency) and from `wrk` (throughput;
a separate process), or, without wrk, from a pool of worker processes.

- **Added latency**: requests sent one at a time on one keep-alive connection,
  alternating direct and proxied (so drift hits both alike); p50 of proxied minus p50
  of direct, per call. Target <= 1 ms.
- **Throughput**: closed-loop load at 32 connections for a few seconds, direct then
  proxied; proxied req/s / direct req/s. Target >= 0.5x. On a small machine the
  proxied path runs two servers and the load generator on the same cores, so this is
  the ratio a user sees on one host, not the proxy's cost alone.

Both for a JSON answer and for a 19-frame SSE stream.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
POST_LUA = Path(__file__).resolve().parent / "post.lua"
LATENCY_TARGET_MS = 1.0
THROUGHPUT_TARGET = 0.5

WORKLOADS = {
    "json": ("simple-chat/0001", False),
    "sse": ("knowledge/0004", True),
}


def request_body(name: str, *, stream: bool) -> bytes:
    data = json.loads((ROOT / "recordings" / f"{name}.json").read_text("utf-8"))
    body = dict(data["request"]["body"])
    body.pop("stream", None)
    body.pop("stream_options", None)
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode("utf-8")


# -- servers ---------------------------------------------------------------------------


@contextmanager
def chaosllm(*args: str) -> Iterator[str]:
    """`chaosllm serve --port 0 ARGS` in a subprocess; yields its base URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "chaosllm", "serve", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("chaosllm listening on "):
            raise RuntimeError(f"chaosllm serve {' '.join(args)} did not start: {line!r}")
        yield line.split()[-1]
    finally:
        for sig, wait in ((signal.SIGINT, 5), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            if proc.poll() is not None:
                break
            proc.send_signal(sig)
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        if proc.stdout is not None:
            proc.stdout.close()


# -- latency: one request at a time -------------------------------------------------------


class Caller:
    """POSTs on one keep-alive connection and reads the whole answer."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(
            parts.hostname or "127.0.0.1", parts.port, timeout=10
        )

    def __call__(self, body: bytes) -> float:
        started = time.perf_counter()
        self.conn.request(
            "POST",
            "/v1/chat/completions",
            body=body,
            headers={"content-type": "application/json", "authorization": "Bearer sk-bench"},
        )
        response = self.conn.getresponse()
        response.read()
        elapsed = time.perf_counter() - started
        if response.status != 200:
            raise RuntimeError(f"status {response.status}")
        return elapsed

    def close(self) -> None:
        self.conn.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency(direct_url: str, proxy_url: str, body: bytes, samples: int) -> dict[str, Any]:
    direct, proxied = Caller(direct_url), Caller(proxy_url)
    try:
        for _ in range(max(50, samples // 10)):  # warm-up: connections, caches, JIT-less
            direct(body)
            proxied(body)
        d: list[float] = []
        p: list[float] = []
        for i in range(samples):
            if i % 2:
                d.append(direct(body))
                p.append(proxied(body))
            else:
                p.append(proxied(body))
                d.append(direct(body))
    finally:
        direct.close()
        proxied.close()
    ms = 1000.0
    return {
        "samples": samples,
        "direct_p50_ms": round(statistics.median(d) * ms, 3),
        "proxy_p50_ms": round(statistics.median(p) * ms, 3),
        "direct_p99_ms": round(percentile(d, 0.99) * ms, 3),
        "proxy_p99_ms": round(percentile(p, 0.99) * ms, 3),
        "added_p50_ms": round((statistics.median(p) - statistics.median(d)) * ms, 3),
        "added_p50_paired_ms": round(
            statistics.median([b - a for a, b in zip(d, p, strict=True)]) * ms, 3
        ),
    }


# -- throughput: closed-loop load from another process --------------------------------------


def wrk(url: str, body_file: Path, seconds: float, connections: int) -> float:
    args = [
        shutil.which("wrk") or "wrk",
        "-t",
        "1",
        "-c",
        str(connections),
        "-d",
        f"{max(1, round(seconds))}s",
        "--timeout",
        "10s",
        "-s",
        str(POST_LUA),
        url + "/v1/chat/completions",
        "--",
        str(body_file),
        "Authorization",
        "Bearer sk-bench",
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 60, check=False)
    for line in done.stdout.splitlines():
        if line.startswith("WRKJSON "):
            summary = json.loads(line.removeprefix("WRKJSON "))
            errors = sum(summary["errors"].values())
            if errors:
                raise RuntimeError(f"wrk saw {errors} errors against {url}: {summary}")
            rps: float = summary["requests"] / (summary["duration_us"] / 1e6)
            return rps
    raise RuntimeError(f"wrk failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")


def _worker(
    url: str, body: bytes, deadline: float, connections: int, out: Any
) -> None:  # pragma: no cover - runs in a worker process
    import threading

    counts = [0] * connections

    def loop(i: int) -> None:
        caller = Caller(url)
        try:
            while time.time() < deadline:
                caller(body)
                counts[i] += 1
        finally:
            caller.close()

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put(sum(counts))


def pool_load(url: str, body: bytes, seconds: float, connections: int) -> float:
    """Without wrk: closed-loop load from worker processes (threads of blocking clients)."""
    workers = max(1, min(4, (os.cpu_count() or 2) - 1))
    queue: Any = multiprocessing.get_context("spawn").Queue()
    start = time.time() + 1.0
    deadline = start + seconds
    procs = [
        multiprocessing.get_context("spawn").Process(
            target=_worker, args=(url, body, deadline, max(1, connections // workers), queue)
        )
        for _ in range(workers)
    ]
    for proc in procs:
        proc.start()
    total = sum(queue.get(timeout=seconds + 60) for _ in procs)
    for proc in procs:
        proc.join(timeout=10)
    return total / (seconds + 1.0)


def throughput(
    direct_url: str, proxy_url: str, body: bytes, seconds: float, connections: int
) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("wb", suffix=".json", delete=False) as fh:
        fh.write(body)
        body_file = Path(fh.name)
    try:
        if shutil.which("wrk"):
            tool = "wrk"
            wrk(direct_url, body_file, 1, connections)  # warm-up
            wrk(proxy_url, body_file, 1, connections)
            direct = wrk(direct_url, body_file, seconds, connections)
            proxied = wrk(proxy_url, body_file, seconds, connections)
        else:
            tool = "worker processes"
            direct = pool_load(direct_url, body, seconds, connections)
            proxied = pool_load(proxy_url, body, seconds, connections)
    finally:
        body_file.unlink()
    return {
        "tool": tool,
        "connections": connections,
        "seconds": seconds,
        "direct_rps": round(direct, 1),
        "proxy_rps": round(proxied, 1),
        "ratio": round(proxied / direct, 3) if direct else 0.0,
    }


# -- the run ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples, shorter load")
    parser.add_argument("--samples", type=int, help="latency samples per target")
    parser.add_argument("--seconds", type=float, help="seconds of load per cell")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")
    args = parser.parse_args(argv)
    samples = args.samples or (300 if args.quick else 2000)
    seconds = args.seconds or (2.0 if args.quick else 5.0)

    results: dict[str, Any] = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    with ExitStack() as stack:
        upstream = stack.enter_context(chaosllm())
        proxy = stack.enter_context(chaosllm("--mode", "passthrough", "--upstream", upstream))
        for name, (recording, stream) in WORKLOADS.items():
            body = request_body(recording, stream=stream)
            print(f"[{name}] latency: {samples} sequential calls each way ...", flush=True)
            lat = latency(upstream, proxy, body, samples)
            print(
                f"[{name}] throughput: {seconds:g} s at {args.connections} connections "
                f"each way ...",
                flush=True,
            )
            tput = throughput(upstream, proxy, body, seconds, args.connections)
            results[name] = {"latency": lat, "throughput": tput}

    print()
    print(
        f"{'workload':<8} {'figure':<34} {'direct':>10} {'proxied':>10} {'value':>9} "
        f"{'target':>8}  verdict"
    )
    met_all = True
    for name in WORKLOADS:
        lat, tput = results[name]["latency"], results[name]["throughput"]
        added = lat["added_p50_ms"]
        ok = added <= LATENCY_TARGET_MS
        met_all &= ok
        print(
            f"{name:<8} {'p50 latency per call (ms), added':<34} {lat['direct_p50_ms']:>10.3f} "
            f"{lat['proxy_p50_ms']:>10.3f} {added:>9.3f} {'<= 1 ms':>8}  "
            f"{'met' if ok else 'NOT MET'}"
        )
        print(
            f"{'':<8} {'p99 latency per call (ms)':<34} {lat['direct_p99_ms']:>10.3f} "
            f"{lat['proxy_p99_ms']:>10.3f}"
        )
        ok = tput["ratio"] >= THROUGHPUT_TARGET
        met_all &= ok
        print(
            f"{'':<8} {'throughput (req/s), proxied/direct':<34} {tput['direct_rps']:>10.1f} "
            f"{tput['proxy_rps']:>10.1f} {tput['ratio']:>8.2f}x {'>= 0.5x':>8}  "
            f"{'met' if ok else 'NOT MET'}"
        )
    print(
        f"\nload: {results['json']['throughput']['tool']}; {results['cpus']} CPUs; "
        f"Python {results['python']}"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0 if met_all else 1


if __name__ == "__main__":
    sys.exit(main())
