"""Run ``chaosllm ARGS`` with benchmark instrumentation.

    python benchmarks/launch_chaosllm.py [--no-uvloop] [--gc-stats] -- serve ...

``--no-uvloop`` makes ``uvloop`` unimportable, so ``--server uvicorn`` runs on
the plain asyncio loop. ``--gc-stats`` times every garbage collection (through
`gc.callbacks`) and prints one ``GCSTATS {json}`` line per generation when the
server exits (SIGINT): how many collections, their total and longest pause.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["main"]


class _GCStats:
    def __init__(self) -> None:
        self.pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.pauses[int(info["generation"])].append((time.perf_counter() - self._start) * 1e3)

    def report(self) -> None:
        for generation, pauses in self.pauses.items():
            print(
                "GCSTATS "
                + json.dumps(
                    {
                        "generation": generation,
                        "collections": len(pauses),
                        "total_ms": round(sum(pauses), 1),
                        "max_ms": round(max(pauses), 1) if pauses else 0.0,
                    }
                ),
                flush=True,
            )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    stats: _GCStats | None = None
    while args and args[0] != "--":
        option = args.pop(0)
        if option == "--no-uvloop":
            sys.modules["uvloop"] = None  # type: ignore[assignment]
        elif option == "--gc-stats":
            stats = _GCStats()
            gc.callbacks.append(stats)
        else:
            print(f"launch_chaosllm.py: unknown option {option!r}", file=sys.stderr)
            return 2
    if args:
        args.pop(0)
    from chaosllm.cli import main as chaosllm_main

    try:
        return chaosllm_main(args)
    except KeyboardInterrupt:
        return 130
    finally:
        if stats is not None:
            stats.report()


if __name__ == "__main__":
    raise SystemExit(main())
