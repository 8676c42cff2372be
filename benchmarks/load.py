"""HTTP load from a separate process: `wrk` with `post.lua`.

`wrk` is a closed-loop generator: each of its connections (keep-alive,
HTTP/1.1) sends the next request as soon as the previous response is complete,
so requests/s is the server's capacity at that concurrency and the latencies
are per request under that load.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from machine import NOISY_PCT, Interference
from servers import BENCH_DIR, affinity

__all__ = ["LoadResult", "LoadSettings", "WrkMissing", "require_wrk", "run_wrk"]

POST_LUA = BENCH_DIR / "post.lua"

INSTALL_HINT = (
    "wrk is not installed. Install it from Debian/Ubuntu with\n"
    "    sudo apt-get update && sudo apt-get install -y wrk\n"
    "(macOS: brew install wrk), then run this benchmark again."
)


class WrkMissing(RuntimeError):
    pass


def require_wrk() -> str:
    path = shutil.which("wrk")
    if path is None:
        raise WrkMissing(INSTALL_HINT)
    return path


@dataclass(frozen=True)
class LoadSettings:
    duration_s: float = 5.0
    warmup_s: float = 2.0
    threads: int = 1
    connections: int = 32
    timeout_s: float = 5.0


@dataclass(frozen=True)
class LoadResult:
    requests: int
    duration_s: float
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    errors: dict[str, int]
    server_cpu_pct: float | None = None
    """CPU time the server process used during the measured run, in % of one core."""
    other_cpu_pct: float | None = None
    """CPU time processes other than ours used meanwhile (% of one core): interference."""

    @property
    def noisy(self) -> bool:
        return self.other_cpu_pct is not None and self.other_cpu_pct > NOISY_PCT

    @property
    def ok(self) -> bool:
        return self.requests > 0 and not any(self.errors.values())

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _wrk(
    url: str, body_file: Path, headers: Mapping[str, str], duration_s: float, settings: LoadSettings
) -> dict[str, Any]:
    args = [
        require_wrk(),
        "-t",
        str(settings.threads),
        "-c",
        str(settings.connections),
        "-d",
        f"{max(1, round(duration_s))}s",
        "--timeout",
        f"{settings.timeout_s:g}s",
        "-s",
        str(POST_LUA),
        url,
        "--",
        str(body_file),
    ]
    for name, value in headers.items():
        args += [name, value]
    done = subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=duration_s + 60,
        check=False,
        preexec_fn=affinity("load"),
    )
    for line in done.stdout.splitlines():
        if line.startswith("WRKJSON "):
            summary: dict[str, Any] = json.loads(line.removeprefix("WRKJSON "))
            return summary
    raise RuntimeError(f"wrk failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")


def run_wrk(
    url: str,
    body_file: Path,
    settings: LoadSettings,
    headers: Mapping[str, str] | None = None,
    *,
    pid: int | None = None,
) -> LoadResult:
    """Warm up for ``settings.warmup_s``, then measure for ``settings.duration_s``
    (and the CPU use of process `pid` meanwhile)."""
    headers = dict(headers or {})
    if settings.warmup_s > 0:
        _wrk(url, body_file, headers, settings.warmup_s, settings)
    with Interference([pid] if pid is not None else []) as probe:
        raw = _wrk(url, body_file, headers, settings.duration_s, settings)
    duration = raw["duration_us"] / 1e6
    return LoadResult(
        requests=raw["requests"],
        duration_s=round(duration, 3),
        rps=round(raw["requests"] / duration, 1) if duration > 0 else 0.0,
        p50_ms=raw["p50_us"] / 1000,
        p90_ms=raw["p90_us"] / 1000,
        p99_ms=raw["p99_us"] / 1000,
        max_ms=raw["max_us"] / 1000,
        mean_ms=round(raw["mean_us"] / 1000, 3),
        errors={k: int(v) for k, v in raw["errors"].items()},
        server_cpu_pct=probe.pid_pct,
        other_cpu_pct=probe.other_pct,
    )
