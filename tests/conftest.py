"""Shared fixtures: one real chaosllm server per test session (reset before each test
that uses it), and the shipped recordings."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chaosllm import ChaosServer
from chaosllm.store import shipped_dir

pytest_plugins = ["pytester"]

RECORDINGS = shipped_dir("recordings")


def recording(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RECORDINGS / f"{name}.json").read_text("utf-8"))
    return data


def all_recordings() -> list[str]:
    return sorted(p.relative_to(RECORDINGS).with_suffix("").as_posix()
                  for p in RECORDINGS.glob("*/*.json"))


def request_body(name: str, *, stream: bool) -> dict[str, Any]:
    """The recorded request as the client sent it, as a JSON or a streaming call."""
    body = dict(recording(name)["request"]["body"])
    body.pop("stream", None)
    body.pop("stream_options", None)
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


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
