"""The formats' modules each write a directory of fixtures in their format (their
`fixtures` fixture); `server` serves it, and the top conftest's `sdk` asks it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chaosllm import ChaosServer


@pytest.fixture
def server(fixtures: Path) -> Iterator[ChaosServer]:
    """A server on the module's `fixtures` directory."""
    with ChaosServer(fixtures) as running:
        yield running
