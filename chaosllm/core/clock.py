"""Time, as the engine sees it: a clock object, so tests can set the time instead of sleeping."""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    def wall(self) -> float:
        """Seconds since the epoch (for people reading the journal)."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for gaps between requests)."""


class SystemClock:
    """The machine's clocks."""

    def wall(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to (`advance`): for tests."""

    def __init__(self, wall: float = 1_700_000_000.0, monotonic: float = 1_000.0) -> None:
        self._wall = wall
        self._monotonic = monotonic

    def wall(self) -> float:
        return self._wall

    def monotonic(self) -> float:
        return self._monotonic

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self._wall += seconds
        self._monotonic += seconds
