"""Where one request's time goes, stage by stage: one exact request replayed in process.

    python benchmarks/profile_request.py                    # JSON replay through the wire
    python benchmarks/profile_request.py --via direct       # DirectHandler + engine only
    python benchmarks/profile_request.py --via engine       # Engine.handle only
    python benchmarks/profile_request.py --kind sse --session -n 20000

The request is the one the benchmarks' wrk sends (`workloads`: the shipped simple-chat
recording's body, or the 20-frame stream). ``--via wire`` (the default) feeds its raw
bytes to the builtin server's connection protocol (`chaosllm.wire.server`, with a
transport that counts what is written and sends nothing), so one request is all the
default server runs: httptools parsing, `DirectHandler`, the engine, the plan compiled
and written. ``--via direct`` and ``--via engine`` are `hotpath`'s calls.

It prints the CPU microseconds per request without the profiler, then a cProfile of
``-n`` requests in three views, each scaled to that real time:

- **by stage**: the time of each chaosllm module (``--by module``) or package
  (``--by package``), *with the library and C code it calls* folded into it (a
  non-chaosllm function's own time is shared among its callers, in proportion to what
  each spent in it, up to the first chaosllm one). Stages are modules, whatever they
  are called: when `Engine.handle` is cut into stage functions in modules under
  ``chaosllm/core/`` (``chaosllm/core/stages/...``), each shows up as its own row;
  ``--by package`` folds them into their folder;
- **call tree**: the chaosllm functions under the entry point, with the time under
  each (cumulative), ``--depth`` levels deep: the pipeline's stages as functions;
- **top functions**: own time, any module.

cProfile's own cost per call inflates small functions; the shares are what to read.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import os
import pstats
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import hotpath
import workloads
from servers import REPO_DIR

__all__ = ["Func", "group_of", "main", "stage_times"]

Func = tuple[str, int, str]
"""A pstats key: file, line, function name."""
Edge = tuple[int, int, float, float]
"""pstats' per-caller figures: primitive calls, calls, own time, cumulative time."""
Row = tuple[int, int, float, float, dict[Func, Edge]]

PATH = "/v1/chat/completions"
ENTRIES = {
    "wire": "data_received",
    "direct": "__call__",
    "engine": "handle",
}
"""The function each entry point is entered through (its row is the call tree's root)."""
_HINTS = {
    "chaosllm/wire": "parse, write",
    "chaosllm/http": "request in",
    "chaosllm/store": "match",
    "chaosllm/faults": "fault",
    "chaosllm/providers": "parse, render",
    "chaosllm/core/journal": "journal",
    "chaosllm/core/oracle": "review",
}
"""Words that say what a module prefix does, for the reader (longest prefix wins); a
module that matches none is shown by its path alone."""


# -- the entry points ----------------------------------------------------------------


class _Sink:
    """A transport that counts what is written: the socket's part left out."""

    def __init__(self) -> None:
        self.written = 0
        self.first = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        if not self.first:
            self.first = bytes(data[:4096])
        self.written += len(data)

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
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass


def _loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def wire_call(
    payloads: workloads.Payloads, kind: str, session: bool, access: bool = False
) -> hotpath.Call:
    """One request through the builtin server's connection protocol, as its bytes; with
    `access`, its access line written as ``chaosllm serve`` writes it (to a buffer for
    the null device)."""
    from chaosllm.config import ServerConfig
    from chaosllm.http.access import AccessLog, LineBuffer
    from chaosllm.http.app import create_app
    from chaosllm.http.direct import DirectHandler
    from chaosllm.http.state import ChaosState
    from chaosllm.wire import WireServer
    from chaosllm.wire.protocol import Connection

    state = ChaosState.from_config(ServerConfig(recordings=[payloads.recordings]))
    if access:
        state.access = AccessLog(LineBuffer(open(os.devnull, "w"), prefix="chaosllm: "))  # noqa: SIM115
    server = WireServer(create_app(state=state), direct=DirectHandler(state), memo=state.memo)
    loop = _loop()
    asyncio.set_event_loop(loop)
    server.loop = loop  # as `serve` sets it, which binds a socket: the protocol alone here
    conn = Connection(server)
    sink = _Sink()
    conn.connection_made(sink)  # type: ignore[arg-type]  # a transport in all it uses
    raw = workloads.raw_request("127.0.0.1", 8000, PATH, payloads.request_file(kind).read_bytes())
    if session:
        raw = raw.replace(b"\r\n\r\n", b"\r\nX-Chaosllm-Session: bench\r\n\r\n", 1)

    async def settle() -> None:
        while conn.busy:  # a paced answer: its player runs from the loop
            await asyncio.sleep(0)

    def call() -> object:
        conn.data_received(raw)
        if conn.busy:
            loop.run_until_complete(settle())
        return sink.written

    call()
    if sink.closed or not sink.first.startswith(b"HTTP/1.1 200 "):
        raise RuntimeError(f"the wire answered {sink.first[:200]!r} (closed {sink.closed})")
    if b"x-chaosllm-match: exact" not in sink.first.lower():
        raise RuntimeError("the wire's answer is not an exact replay")
    return call


def entry_call(
    via: str, payloads: workloads.Payloads, kind: str, session: bool, access: bool = False
) -> hotpath.Call:
    if via == "wire":
        return wire_call(payloads, kind, session, access)
    _, calls = hotpath.in_process_calls(payloads)
    if via == "engine":
        if kind != "json" or session:
            raise SystemExit("--via engine replays the anonymous JSON request only")
        return calls["engine/json"]
    return calls[f"direct/{kind}" + ("+session" if session else "")]


# -- grouping ----------------------------------------------------------------------------


def _relative(path: str) -> str | None:
    """`path` inside the repository (``chaosllm/core/engine.py``), or None."""
    try:
        return Path(path).resolve().relative_to(REPO_DIR).as_posix()
    except (ValueError, OSError):
        return None


def group_of(func: Func, by: str) -> str | None:
    """The stage `func` belongs to: its chaosllm module (``chaosllm/core/engine``) or, with
    ``by="package"``, its folder (``chaosllm/core``); None outside chaosllm."""
    rel = _relative(func[0])
    if rel is None or not rel.startswith("chaosllm/"):
        return None
    module = rel.removesuffix(".py").removesuffix("/__init__")
    if by == "package" and module.count("/") >= 2:
        return module.rpartition("/")[0]
    return module


def other_group(func: Func) -> str:
    """What a function outside chaosllm is: ``C builtins``, ``stdlib json``, a library."""
    path = func[0]
    if path == "~" or not path:
        return "C builtins"
    parts = Path(path).parts
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1].removesuffix(".py")
    rel = _relative(path)
    if rel is not None:
        return rel
    return (
        "stdlib " + Path(path).stem
        if Path(path).parent.name.startswith("python")
        else ("stdlib " + Path(path).parent.name)
    )


def _hint(group: str) -> str:
    best = max((p for p in _HINTS if group == p or group.startswith(p + "/")), key=len, default="")
    return f" ({_HINTS[best]})" if best else ""


def stage_times(stats: dict[Func, Row], by: str) -> dict[str, float]:
    """Own seconds by stage, each non-chaosllm function's own time folded into the
    stages of its callers (in proportion to each caller's share of it)."""
    memo: dict[Func, dict[str, float]] = {}
    busy: set[Func] = set()

    def owners(func: Func) -> dict[str, float]:
        """The stages `func`'s own time belongs to, as fractions summing to 1."""
        group = group_of(func, by)
        if group is not None:
            return {group: 1.0}
        if func in memo:
            return memo[func]
        callers = stats[func][4] if func in stats else {}
        total = sum(edge[2] + edge[3] for edge in callers.values())
        if func in busy or not callers or total <= 0:
            return {other_group(func): 1.0}
        busy.add(func)
        shares: dict[str, float] = collections.defaultdict(float)
        for caller, edge in callers.items():
            weight = (edge[2] + edge[3]) / total
            for name, part in owners(caller).items():
                shares[name] += weight * part
        busy.discard(func)
        memo[func] = dict(shares)
        return memo[func]

    times: dict[str, float] = collections.defaultdict(float)
    for func, row in stats.items():
        for name, part in owners(func).items():
            times[name] += row[2] * part
    return dict(times)


# -- the views ---------------------------------------------------------------------------


def _label(func: Func) -> str:
    rel = _relative(func[0])
    where = rel if rel is not None else other_group(func)
    return f"{func[2]} ({where}:{func[1]})"


def _callees(stats: dict[Func, Row]) -> dict[Func, dict[Func, Edge]]:
    found: dict[Func, dict[Func, Edge]] = collections.defaultdict(dict)
    for func, row in stats.items():
        for caller, edge in row[4].items():
            found[caller][func] = edge
    return found


def _tree(
    stats: dict[Func, Row], root: Func, depth: int, floor: float
) -> Iterator[tuple[int, Func, float]]:
    """(level, function, cumulative seconds under it from its caller) for the chaosllm
    functions below `root`; calls through library code are followed to the chaosllm
    functions they reach."""
    callees = _callees(stats)

    def walk(func: Func, level: int, seen: frozenset[Func]) -> Iterator[tuple[int, Func, float]]:
        if level > depth:
            return
        below: dict[Func, float] = collections.defaultdict(float)

        def reach(f: Func, scale: float, through: frozenset[Func]) -> None:
            for g, edge in callees.get(f, {}).items():
                if g in through:
                    continue
                if group_of(g, "module") is not None:
                    below[g] += edge[3] * scale
                elif edge[3] > floor:  # through a library: whatever chaosllm it calls
                    whole = stats[g][3] or 1.0
                    reach(g, scale * edge[3] / whole, through | {g})

        reach(func, 1.0, seen)
        for g, cum in sorted(below.items(), key=lambda item: -item[1]):
            if cum < floor:
                continue
            yield level, g, cum
            yield from walk(g, level + 1, seen | {g})

    return walk(root, 1, frozenset({root}))


def _root(stats: dict[Func, Row], via: str) -> Func:
    name = ENTRIES[via]
    candidates = [f for f in stats if f[2] == name and group_of(f, "module") is not None]
    if not candidates:
        raise RuntimeError(f"no {name} of chaosllm in the profile")
    return max(candidates, key=lambda f: stats[f][3])


@dataclass
class Report:
    requests: int
    real_us: float
    profiled_s: float
    stages: dict[str, float]
    tree: list[tuple[int, Func, float]]
    top: list[tuple[Func, float, int]]

    def lines(self, rows: int) -> list[str]:
        scale = self.real_us / (self.profiled_s / self.requests * 1e6)

        def us(seconds: float) -> str:
            return f"{seconds / self.requests * 1e6 * scale:7.2f} us"

        def pct(seconds: float) -> str:
            return f"{100 * seconds / self.profiled_s:5.1f}%"

        out = [
            f"{self.requests} requests; {self.real_us:.2f} us of CPU per request without the "
            f"profiler, {self.profiled_s / self.requests * 1e6:.2f} us with it "
            "(the figures below are scaled to the first)",
            "",
            "by stage (own time, with the library and C code it calls):",
        ]
        for name, seconds in sorted(self.stages.items(), key=lambda item: -item[1])[:rows]:
            out.append(f"  {pct(seconds)}  {us(seconds)}  {name}{_hint(name)}")
        out += ["", "call tree (time under each chaosllm function, from the entry point):"]
        for level, func, seconds in self.tree[: rows * 3]:
            out.append(f"  {pct(seconds)}  {us(seconds)}  {'  ' * (level - 1)}{_label(func)}")
        out += ["", "top functions (own time):"]
        for func, seconds, calls in self.top[:rows]:
            per = calls / self.requests
            out.append(f"  {pct(seconds)}  {us(seconds)}  {per:5.1f}/req  {_label(func)}")
        return out


def profile_request(call: hotpath.Call, requests: int, via: str, by: str, depth: int = 6) -> Report:
    real_us = min(hotpath.cpu_us_per_call(call, max(200, requests // 5)) for _ in range(3))
    # CPU time, not wall time: on a shared machine a wait for a core is someone else's.
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    for _ in range(requests):
        call()
    profiler.disable()
    raw: dict[Func, Row] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    # The profiler's own disable() call is no part of the request.
    stats = {f: row for f, row in raw.items() if "disable" not in f[2]}
    root = _root(stats, via)
    total = stats[root][3]
    return Report(
        requests=requests,
        real_us=real_us,
        profiled_s=total,
        stages=stage_times(stats, by),
        tree=list(_tree(stats, root, depth, total * 0.01)),
        top=sorted(((f, row[2], row[1]) for f, row in stats.items()), key=lambda item: -item[1]),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--via", choices=tuple(ENTRIES), default="wire", help="entry point")
    parser.add_argument("--kind", choices=("json", "sse"), default="json")
    parser.add_argument("--session", action="store_true", help="session-tagged: fresh ids")
    parser.add_argument(
        "--access", action="store_true", help="with the access log, as chaosllm serve (wire)"
    )
    parser.add_argument("-n", "--requests", type=int, default=10_000)
    parser.add_argument("--by", choices=("module", "package"), default="module")
    parser.add_argument("--rows", type=int, default=20, help="rows of each view")
    parser.add_argument("--depth", type=int, default=6, help="levels of the call tree")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="chaosllm-prof-") as tmp:
        payloads = workloads.make_bench_recordings(Path(tmp))
        call: Callable[[], object] = entry_call(
            args.via, payloads, args.kind, args.session, args.access
        )
        for _ in range(50):  # warm every cache
            call()
        report = profile_request(call, args.requests, args.via, args.by, args.depth)
    print(
        f"{args.kind} request{' (session)' if args.session else ''} via {args.via}: "
        f"where the time goes"
    )
    for line in report.lines(args.rows):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
