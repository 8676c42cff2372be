"""Shared fixtures: one real chaosllm server per test session (reset before each test
that uses it), an SDK client and an HTTP client for it, a second one as the upstream of
the proxies under test, an in-memory engine, and a place to record to. Plain helpers are
in tests/helpers.py; a module's own fixture of the same name wins."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from chaosllm import ChaosServer
from tests.helpers import openai_client
from tests.memory import EnginePair

pytest_plugins = ["pytester"]


@pytest.fixture(scope="session")
def shared_server() -> Iterator[ChaosServer]:
    with ChaosServer() as server:
        yield server


@pytest.fixture
def server(shared_server: ChaosServer) -> ChaosServer:
    """The shared server as a fresh one is: what `ChaosServer.reset` keeps (the default
    scenario, the workspace, a rate limit) is cleared too, so that no test's choice
    reaches the tests after it, in whatever order they run."""
    shared_server.reset()
    shared_server.use_scenario(None)
    shared_server.set_workspace(None)
    shared_server.set_rate_limit(None)
    return shared_server


@pytest.fixture
def sdk(server: ChaosServer) -> Iterator[openai.OpenAI]:
    """An `openai` client for `server` (a module's own `server` fixture, where it has one)."""
    with openai_client(server) as client:
        yield client


@pytest.fixture
def http(server: ChaosServer) -> Iterator[httpx.Client]:
    """An HTTP client for `server`'s control plane and endpoints."""
    with httpx.Client(base_url=server.url, timeout=10.0) as client:
        yield client


@pytest.fixture(scope="session")
def shared_upstream() -> Iterator[ChaosServer]:
    """A second server replaying the shipped recordings: what the proxies under test (in
    record, record-missing or passthrough mode) ask."""
    with ChaosServer() as upstream:
        yield upstream


@pytest.fixture
def upstream(shared_upstream: ChaosServer) -> ChaosServer:
    """The shared upstream with no fault armed and an empty journal."""
    shared_upstream.reset()
    return shared_upstream


@pytest.fixture
def pair() -> EnginePair:
    """An engine in memory over the shipped recordings (tests/memory.py)."""
    return EnginePair.of()


@pytest.fixture
def recordings_dir(tmp_path: Path) -> Path:
    return tmp_path / "recordings"
