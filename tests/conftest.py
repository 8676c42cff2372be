"""Shared fixtures: one real chaosllm server per test session (reset before each test
that uses it), and the shipped recordings."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest

from chaosllm import ChaosServer
from chaosllm.store.recordings import shipped_dir

pytest_plugins = ["pytester"]

RECORDINGS = shipped_dir("recordings")

CLOCK_SLACK = 0.02
"""Lower bounds on elapsed time allow this much: asyncio fires a timer up to one clock
resolution early, and a test measured a 200 ms stall as 0.197 s."""


def recording(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RECORDINGS / f"{name}.json").read_text("utf-8"))
    return data


def all_recordings(provider: str = "openai.chat") -> list[str]:
    """The shipped recordings of one provider (``<scenario>/<NNNN>``)."""
    return sorted(
        p.relative_to(RECORDINGS).with_suffix("").as_posix()
        for p in RECORDINGS.glob("*/*.json")
        if json.loads(p.read_text("utf-8")).get("provider", "openai.chat") == provider
    )


def request_body(name: str, *, stream: bool) -> dict[str, Any]:
    """The recorded request as the client sent it, as a JSON or a streaming call."""
    body = dict(recording(name)["request"]["body"])
    body.pop("stream", None)
    body.pop("stream_options", None)
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


CLI = [sys.executable, "-m", "chaosllm"]


@contextmanager
def serving(
    *args: str, env: dict[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`chaosllm serve --port 0 ARGS` as a subprocess: its URL and process; stopped with
    SIGTERM (then SIGKILL) on exit."""
    proc = subprocess.Popen(
        [*CLI, "serve", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # flushed at once; bounded by the test timeout
        assert line.startswith("chaosllm listening on http://127.0.0.1:"), (
            line,
            proc.stderr.read() if proc.stderr and proc.poll() is not None else "",
        )
        yield line.split()[-1], proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def openai_client(server: ChaosServer, **options: Any) -> openai.OpenAI:
    """An SDK client for `server` (use it in a `with` block: it owns sockets)."""
    options = {"api_key": "sk-test", "max_retries": 0, "timeout": 10, **options}
    return openai.OpenAI(base_url=server.base_url, **options)


@pytest.fixture(scope="session")
def shared_server() -> Iterator[ChaosServer]:
    with ChaosServer() as server:
        yield server


@pytest.fixture
def server(shared_server: ChaosServer) -> ChaosServer:
    shared_server.reset()
    return shared_server


@pytest.fixture
def recordings_dir(tmp_path: Path) -> Path:
    return tmp_path / "recordings"
