"""Start-up, store loading, matcher miss path and nearest matching.

- start-up: spawn ``chaosllm serve --recordings DIR --port 0`` and time until
  its ``chaosllm listening on`` line (then check ``/health`` counts them all);
- `RecordingStore.load` alone, in this process (page cache warm: the files were
  just written and read by the spawned servers);
- the miss path of `Matcher` at 10k recordings: the nearest-index build (lazy:
  done by the first miss, or `Matcher.warm`), ``match()`` raising `NoMatch`
  end to end, and `explain_miss` alone;
- ``benchmarks/bench_nearest.py`` (100k synthetic documents), run as is.
"""

from __future__ import annotations

import gc
import json
import random
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from servers import BENCH_DIR, chaosllm_argv, start_server

__all__ = [
    "JournalGC",
    "MissPath",
    "NearestResult",
    "journal_gc",
    "miss_path",
    "percentile",
    "run_bench_nearest",
    "startup_env",
    "startup_times",
    "store_load_times",
]


def percentile(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def startup_env(tmp: Path, *, cache: bool) -> dict[str, str]:
    """The environment of a start-up run: Python's bytecode cache on (as after ``pip
    install``, which compiles it; kept under `tmp`, not in the source tree, since a
    development shell may set ``PYTHONDONTWRITEBYTECODE``), and the recordings load cache
    under `tmp` (`cache`) or off."""
    env = {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": str(tmp / "pycache")}
    if cache:
        env.update({"CHAOSLLM_CACHE_DIR": str(tmp / "load-cache"), "CHAOSLLM_NO_CACHE": ""})
    else:
        env["CHAOSLLM_NO_CACHE"] = "1"
    return env


def startup_times(
    recordings: Path, runs: int, expected: int, env: dict[str, str] | None = None
) -> list[float]:
    """Seconds from spawn to "chaosllm listening on", for `runs` fresh processes (with
    `env` added to the environment)."""
    times: list[float] = []
    for i in range(runs):
        server = start_server(
            f"chaosllm-startup-{i}",
            chaosllm_argv(
                ["serve", "--server", "builtin", "--port", "0", "--recordings", str(recordings)]
            ),
            timeout=120.0,
            env=env,
        )
        try:
            with httpx.Client(timeout=10.0, trust_env=False) as client:
                loaded = client.get(server.url + "/health").json().get("recordings")
            if loaded != expected:
                raise RuntimeError(f"the server loaded {loaded} recordings, not {expected}")
            times.append(server.ready_s)
        finally:
            server.stop()
    return times


_LOAD_SNIPPET = """
import gc, json, sys, time
from pathlib import Path
from chaosllm.store.cache import RecordingsCache
from chaosllm.store.recordings import RecordingStore
cache = RecordingsCache(Path(sys.argv[3])) if len(sys.argv) > 3 else False
if cache:
    RecordingStore.load([Path(sys.argv[1])], cache=cache)  # fills it
times = []
for _ in range(int(sys.argv[2])):
    gc.collect()
    start = time.perf_counter()
    store = RecordingStore.load([Path(sys.argv[1])], cache=cache)
    times.append(time.perf_counter() - start)
    count, errors = len(store.exchanges), len(store.errors)
    del store
print(json.dumps({"times": times, "count": count, "errors": errors}))
"""


def store_load_times(
    recordings: Path, runs: int, expected: int, cache_dir: Path | None = None
) -> list[float]:
    """`RecordingStore.load` alone, `runs` times, in a fresh interpreter (so that the
    benchmark driver's own heap does not slow its garbage collections); every file
    parsed, or with `cache_dir`, from a load cache there (filled first)."""
    cache_arg = [str(cache_dir)] if cache_dir is not None else []
    done = subprocess.run(
        [sys.executable, "-c", _LOAD_SNIPPET, str(recordings), str(runs), *cache_arg],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"RecordingStore.load failed:\n{done.stderr}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["count"] != expected or result["errors"]:
        raise RuntimeError(f"loaded {result['count']} recordings, {result['errors']} errors")
    times: list[float] = result["times"]
    return times


@dataclass
class MissPath:
    recordings: int
    index_build_s: float
    match_miss_ms: list[float] = field(default_factory=list)
    explain_ms: list[float] = field(default_factory=list)
    misses: int = 0
    queries: int = 0

    def to_json(self) -> dict[str, Any]:
        def stats(values: list[float]) -> dict[str, float]:
            return {
                "n": len(values),
                "p50_ms": round(percentile(values, 50), 3),
                "p99_ms": round(percentile(values, 99), 3),
                "max_ms": round(max(values), 3) if values else float("nan"),
            }

        return {
            "recordings": self.recordings,
            "index_build_s": round(self.index_build_s, 3),
            "queries": self.queries,
            "misses": self.misses,
            "match_miss": stats(self.match_miss_ms),
            "explain_miss": stats(self.explain_ms),
        }


def _edited(body: dict[str, Any], rng: random.Random, fraction: float) -> dict[str, Any]:
    """`body` with `fraction` of the words of its last user message replaced."""
    messages = [dict(m) for m in body["messages"]]
    last = messages[-1]
    words = str(last["content"]).split()
    for i in rng.sample(range(len(words)), max(1, int(len(words) * fraction))):
        words[i] = f"changed{rng.randrange(10**6)}"
    last["content"] = " ".join(words)
    return {**body, "messages": messages}


def miss_path(recordings: Path, queries: int, seed: int = 11) -> MissPath:
    """Time `Matcher` on requests that match nothing: half near misses (40 % of the
    last message's words changed), half novel conversations."""
    from chaosllm.errors import NoMatch
    from chaosllm.providers import PROVIDERS
    from chaosllm.store.matching import Matcher
    from chaosllm.store.recordings import RecordingStore

    provider = PROVIDERS["openai.chat"]
    store = RecordingStore.load([recordings])
    matcher = Matcher(store)
    start = time.perf_counter()
    matcher.warm()
    result = MissPath(
        recordings=len(store.exchanges), index_build_s=time.perf_counter() - start, queries=queries
    )
    rng = random.Random(seed)
    bodies: list[dict[str, Any]] = []
    for i in range(queries):
        if i % 2 == 0:
            source = rng.choice(store.exchanges).request.body
            bodies.append(_edited(dict(source), rng, 0.4))
        else:
            words = [f"novel{rng.randrange(10**5)}" for _ in range(rng.randint(10, 60))]
            bodies.append(
                {
                    "model": "gpt-4o-mini",
                    "messages": [
                        {"role": "system", "content": "You are a benchmark."},
                        {"role": "user", "content": " ".join(words)},
                    ],
                }
            )
    for body in bodies:
        digest = provider.digest(body)
        start = time.perf_counter()
        try:
            matcher.match(provider, body, digest, consume=False)
        except NoMatch:
            result.match_miss_ms.append((time.perf_counter() - start) * 1000)
            result.misses += 1
        start = time.perf_counter()
        matcher.explain_miss(provider, body, digest)
        result.explain_ms.append((time.perf_counter() - start) * 1000)
    return result


@dataclass
class JournalGC:
    """A full garbage collection with the journal holding N entries, as the app adds them."""

    sizes: list[int]
    collect_ms: list[float]
    objects_per_entry: float

    def to_json(self) -> dict[str, Any]:
        return {
            "entries": self.sizes,
            "gc_collect_ms": [round(t, 1) for t in self.collect_ms],
            "gc_tracked_objects_per_entry": round(self.objects_per_entry, 1),
        }


def journal_gc(sizes: Sequence[int] = (0, 10_000, 100_000)) -> JournalGC:
    """Time ``gc.collect()`` (what a generation-2 collection costs the server, during
    which it serves nothing) with the journal at each size."""
    from chaosllm.core.journal import Journal

    times: list[float] = []
    per_entry = 0.0
    for size in sizes:
        journal = Journal()
        gc.collect()
        before = len(gc.get_objects())
        for i in range(size):
            entry = journal.add(
                session=None,
                method="POST",
                path="/v1/chat/completions",
                model="gpt-4o-mini",
                stream=False,
                digest=f"{i:064x}",
                recording="simple-chat/0001",
                match="exact",
                score=1.0,
                status=200,
            )
            entry.report.bytes_sent = 1000
        if size:
            per_entry = (len(gc.get_objects()) - before) / size
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            gc.collect()
            best = min(best, (time.perf_counter() - start) * 1000)
        times.append(best)
        del journal
    gc.collect()
    return JournalGC(sizes=list(sizes), collect_ms=times, objects_per_entry=per_entry)


@dataclass
class NearestResult:
    argv: list[str]
    rows: dict[str, dict[str, float]]
    lines: list[str]
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "argv": self.argv,
            "rows": self.rows,
            "output": self.lines,
            "seconds": round(self.seconds, 1),
        }


_ROW = re.compile(r"^(\S+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)(?:\s+([\d.]+)%)?\s*$")


def run_bench_nearest(n: int, queries: int, timeout_s: float = 900.0) -> NearestResult:
    argv = [
        sys.executable,
        str(BENCH_DIR / "bench_nearest.py"),
        "--n",
        str(n),
        "--queries",
        str(queries),
    ]
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"bench_nearest.py failed ({done.returncode}):\n{done.stderr}")
    rows: dict[str, dict[str, float]] = {}
    for line in done.stdout.splitlines():
        found = _ROW.match(line)
        if found:
            row = {
                "n": float(found.group(2)),
                "p50_ms": float(found.group(3)),
                "p99_ms": float(found.group(4)),
                "max_ms": float(found.group(5)),
            }
            if found.group(6):
                row["found_pct"] = float(found.group(6))
            rows[found.group(1)] = row
    if "all" not in rows:
        raise RuntimeError(f"cannot read bench_nearest.py's output:\n{done.stdout}")
    return NearestResult(
        argv=[Path(a).name if i < 2 else a for i, a in enumerate(argv)],
        rows=rows,
        lines=done.stdout.splitlines(),
        seconds=time.perf_counter() - start,
    )


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")
