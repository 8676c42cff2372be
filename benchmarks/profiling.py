"""Where a server's time goes under load: `py-spy` sampling, summarised.

`profile_server` runs ``py-spy record`` on a server process while `wrk` loads
it (a separate, unmeasured run: sampling slows the server down) and reduces
the collapsed stacks to the functions with the most *self* samples and the
most *inclusive* samples (function and file, line numbers dropped).
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from load import LoadSettings, run_wrk

__all__ = ["Profile", "profile_server", "summarise_collapsed"]

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")
_IDLE_LEAVES = (
    # A thread-pool worker waiting for work (asyncio's default executor, started for
    # getaddrinfo at bind time): py-spy does not always see it as idle.
    "_worker (concurrent/futures/thread.py:81)",
)
_SITE = re.compile(r".*/(site-packages|lib/python\d\.\d+)/")


@dataclass
class Profile:
    samples: int
    top_self: list[tuple[str, float]]
    top_inclusive: list[tuple[str, float]]
    by_package: list[tuple[str, float]]
    """Self time per package (chaosllm.wire, chaosllm (app), starlette, uvicorn, h11...)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "self_by_package_pct": [[name, round(pct, 1)] for name, pct in self.by_package],
            "top_self_pct": [[name, round(pct, 1)] for name, pct in self.top_self],
            "top_inclusive_pct": [[name, round(pct, 1)] for name, pct in self.top_inclusive],
        }

    def lines(self, n: int = 15) -> list[str]:
        out = [
            f"  {self.samples} samples; self time by package: "
            + ", ".join(f"{name} {pct:.0f}%" for name, pct in self.by_package)
        ]
        out.append("  top self time:")
        out += [f"    {pct:5.1f}%  {name}" for name, pct in self.top_self[:n]]
        out.append("  chaosllm functions, inclusive time:")
        out += [f"    {pct:5.1f}%  {name}" for name, pct in self.top_inclusive[:n]]
        return out


def _label(frame: str) -> str:
    found = _FRAME.match(frame.strip())
    if not found:
        return frame.strip()
    path = _SITE.sub("", found.group("file"))
    path = re.sub(r".*/work/main/", "", path)
    return f"{found.group('func')} ({path})"


def _package(label: str) -> str:
    path = label.rpartition(" (")[2].rstrip(")")
    if path.startswith("chaosllm/wire/"):
        return "chaosllm.wire"
    if path.startswith("chaosllm/"):
        return "chaosllm (app)"
    head = path.split("/")[0]
    if head.endswith(".py"):
        return "stdlib " + head.removesuffix(".py")
    return head or "?"


def summarise_collapsed(text: str, top: int = 60) -> Profile:
    packages: collections.Counter[str] = collections.Counter()
    self_counts: collections.Counter[str] = collections.Counter()
    incl_counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        if stack.endswith(_IDLE_LEAVES):
            continue
        frames = [_label(f) for f in stack.split(";")]
        # py-spy puts the thread name first: drop it; skip idle samples (none with --idle off).
        frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += count
        self_counts[frames[-1]] += count
        packages[_package(frames[-1])] += count
        for name in set(frames):
            incl_counts[name] += count
    if total == 0:
        return Profile(0, [], [], [])
    return Profile(
        samples=total,
        by_package=[(n, 100 * c / total) for n, c in packages.most_common(12)],
        top_self=[(n, 100 * c / total) for n, c in self_counts.most_common(top)],
        # The functions of chaosllm with the most time under them (entry points left out).
        top_inclusive=[
            (n, 100 * c / total)
            for n, c in incl_counts.most_common()
            if "(chaosllm/" in n and c < 0.99 * total
        ][:top],
    )


def profile_server(
    pid: int, url: str, body_file: Path, settings: LoadSettings, seconds: int = 5
) -> Profile | str:
    """Sample `pid` with py-spy for `seconds` under wrk load; the summary, or why not."""
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        return "py-spy not installed (pip install py-spy)"
    with tempfile.TemporaryDirectory(prefix="chaosllm-prof-") as tmp:
        out = Path(tmp) / "stacks.txt"
        argv = [
            py_spy,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(seconds),
            "--rate",
            "500",
            "--format",
            "raw",
            "--output",
            str(out),
        ]
        load = LoadSettings(
            duration_s=seconds + 1,
            warmup_s=0,
            threads=settings.threads,
            connections=settings.connections,
            timeout_s=settings.timeout_s,
        )
        wrk = threading.Thread(target=run_wrk, args=(url, body_file, load), daemon=True)
        wrk.start()
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=seconds + 60, check=False
        )
        wrk.join(seconds + 60)
        if done.returncode != 0 or not out.exists():
            return f"py-spy failed ({done.returncode}): {(done.stderr or done.stdout)[-300:]}"
        return summarise_collapsed(out.read_text(encoding="utf-8", errors="replace"))
