"""What the default server runs per request, in-process: `DirectHandler` and the engine.

The builtin server (`chaosllm serve`, ``--server builtin``) hands every provider POST
in replay mode to `chaosllm.http.direct.DirectHandler` with the parsed method, path,
query, headers and body, and writes the plan it returns: no ASGI, no Starlette, no
middleware. This module calls that handler exactly as the server does (the request
the benchmark's wrk sends: the same headers, the same body), and times it: the best of
`repeats` x `requests` calls, microseconds of CPU time per request. Variants: an anonymous JSON
replay (what wrk sends), the same with a session header (a recording served again to a
session gets fresh ids), a 20-frame SSE replay, and `Engine.handle` alone.

Run as a script for the figures (``python benchmarks/hotpath.py``), or with
``--profile`` for a cProfile of the anonymous JSON replay.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import workloads

if TYPE_CHECKING:
    from chaosllm.http.state import ChaosState

__all__ = ["Call", "cpu_us_per_call", "hot_path_costs", "in_process_calls"]

Call = Callable[[], object]


def in_process_calls(payloads: workloads.Payloads) -> tuple[ChaosState, dict[str, Call]]:
    from chaosllm.config import ServerConfig
    from chaosllm.core.engine import ProviderCall
    from chaosllm.http.direct import DirectHandler
    from chaosllm.http.state import ChaosState
    from chaosllm.providers import provider_for_path

    state = ChaosState.from_config(ServerConfig(recordings=[payloads.recordings]))
    handler = DirectHandler(state)
    path = "/v1/chat/completions"
    bodies = {p: payloads.request_file(p).read_bytes() for p in ("json", "sse")}

    def headers(body: bytes, session: bytes | None) -> list[tuple[bytes, bytes]]:
        found = [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        if session is not None:
            found.append((b"x-chaosllm-session", session))
        return found

    def direct(body: bytes, session: bytes | None) -> Call:
        given = headers(body, session)

        def call() -> object:
            answered = handler("POST", path, b"", given, body)
            assert answered is not None and answered[0].status == 200
            return answered

        return call

    provider = provider_for_path(path)
    assert provider is not None
    engine_call = ProviderCall(provider=provider, path=path, body=bodies["json"])

    def engine() -> object:
        return state.handle(engine_call)

    calls = {
        "direct/json": direct(bodies["json"], None),
        "direct/json+session": direct(bodies["json"], b"bench"),
        "direct/sse": direct(bodies["sse"], None),
        "engine/json": engine,
    }
    for label, call in calls.items():  # warm every cache, and check the answers
        for _ in range(3):
            call()
        if not label.startswith("engine"):
            answered = call()
            assert isinstance(answered, tuple)
            plan = answered[0]
            if label.endswith("sse") and workloads.count_frames(plan.body()) != 20:
                raise RuntimeError("the in-process stream does not have 20 frames")
            if dict(plan.headers).get("x-chaosllm-match") != "exact":
                raise RuntimeError(f"{label}: not an exact replay")
    return state, calls


def cpu_us_per_call(call: Call, requests: int) -> float:
    # CPU time of this process, not wall time: on a shared machine the time the process
    # waits for a core is someone else's.
    gc.collect()
    start = time.process_time()
    for _ in range(requests):
        call()
    return (time.process_time() - start) / requests * 1e6


def hot_path_costs(
    payloads: workloads.Payloads, *, requests: int = 2000, repeats: int = 9
) -> dict[str, float]:
    """µs per request, best of `repeats` (round robin): ``direct/json``,
    ``direct/json+session``, ``direct/sse``, ``engine/json``."""
    state, calls = in_process_calls(payloads)
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(repeats):
        for label, call in calls.items():
            state.journal.clear()
            best[label] = min(best[label], cpu_us_per_call(call, requests))
    return {label: round(value, 2) for label, value in best.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="store_true", help="cProfile the JSON replay")
    parser.add_argument("--session", action="store_true", help="profile it session-tagged")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        payloads = workloads.make_bench_recordings(Path(tmp))
        if args.profile:
            _, calls = in_process_calls(payloads)
            call = calls["direct/json+session" if args.session else "direct/json"]
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(args.requests * 5):
                call()
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
            return 0
        for label, value in hot_path_costs(
            payloads, requests=args.requests, repeats=args.repeats
        ).items():
            print(f"{label:24} {value:8.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
