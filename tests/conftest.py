"""Shared fixtures: one real chaosllm server per test session (reset before each test
that uses it), an SDK client for it, and a place to record to. Plain helpers are in
tests/helpers.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from chaosllm import ChaosServer
from tests.helpers import openai_client

pytest_plugins = ["pytester"]


@pytest.fixture(scope="session")
def shared_server() -> Iterator[ChaosServer]:
    with ChaosServer() as server:
        yield server


@pytest.fixture
def server(shared_server: ChaosServer) -> ChaosServer:
    shared_server.reset()
    return shared_server


@pytest.fixture
def sdk(server: ChaosServer) -> Iterator[openai.OpenAI]:
    """An `openai` client for `server` (a module's own `server` fixture, where it has one)."""
    with openai_client(server) as client:
        yield client


@pytest.fixture
def recordings_dir(tmp_path: Path) -> Path:
    return tmp_path / "recordings"
