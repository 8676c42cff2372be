"""aimock (``@copilotkit/aimock``, Node.js) serving the same two answers, for comparison.

Installed with npm into ``benchmarks/.aimock/`` (gitignored) on first use and
run with its ``llmock`` CLI (``dist/cli.js``: ``-p 0 -f FIXTURES -c CHUNK``),
which prints ``aimock server listening on http://127.0.0.1:PORT``. Fixtures
match on the last user message (``match.userMessage``). aimock splits a
streamed answer into pieces of ``--chunk-size`` characters and frames them as
role delta + pieces + finish chunk + ``[DONE]``; the chunk size is chosen so
the benchmark answer streams as exactly 20 frames, like chaosllm's.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from servers import BENCH_DIR

__all__ = [
    "AIMOCK_DIR",
    "AIMOCK_PACKAGE",
    "Aimock",
    "chunk_size_for",
    "install_aimock",
    "write_fixtures",
]

AIMOCK_DIR = BENCH_DIR / ".aimock"
AIMOCK_PACKAGE = "@copilotkit/aimock@1.43.0"
_CLI = Path("node_modules") / "@copilotkit" / "aimock" / "dist" / "cli.js"


@dataclass(frozen=True)
class Aimock:
    cli: Path
    version: str
    node: str

    def argv(self, fixtures: Path, chunk_size: int) -> list[str]:
        return [
            self.node,
            str(self.cli),
            "-p",
            "0",
            "-h",
            "127.0.0.1",
            "-f",
            str(fixtures),
            "-c",
            str(chunk_size),
            "--log-level",
            "info",
        ]


def install_aimock(timeout_s: float = 300.0) -> Aimock | str:
    """aimock ready to run, or a one-line reason why it cannot be."""
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        return "npm/node not found (install Node.js >= 20 to compare with aimock)"
    cli = AIMOCK_DIR / _CLI
    if not cli.exists():
        AIMOCK_DIR.mkdir(parents=True, exist_ok=True)
        try:
            done = subprocess.run(
                [
                    npm,
                    "install",
                    "--no-audit",
                    "--no-fund",
                    "--prefix",
                    str(AIMOCK_DIR),
                    AIMOCK_PACKAGE,
                ],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return f"npm install {AIMOCK_PACKAGE} timed out after {timeout_s:.0f} s"
        if done.returncode != 0 or not cli.exists():
            last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]
            return f"npm install {AIMOCK_PACKAGE} failed: {last[0]}"
    package = cli.parent.parent / "package.json"
    version = json.loads(package.read_text(encoding="utf-8")).get("version", "?")
    return Aimock(cli=cli, version=str(version), node=node)


def chunk_size_for(text: str, pieces: int) -> int:
    """A ``--chunk-size`` that cuts `text` into exactly `pieces` pieces."""
    for size in range(1, len(text) + 1):
        if math.ceil(len(text) / size) == pieces:
            return size
    raise ValueError(f"no chunk size cuts {len(text)} characters into {pieces} pieces")


def write_fixtures(root: Path, answers: dict[str, str]) -> Path:
    """One fixture file: each user message -> its answer (JSON and streaming alike)."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "bench.json"
    path.write_text(
        json.dumps(
            {
                "fixtures": [
                    {"match": {"userMessage": question}, "response": {"content": answer}}
                    for question, answer in answers.items()
                ]
            },
            indent=2,
        ),
        encoding="utf-8",
    )
    return root
