"""What the wire did with a plan, filled in while it executes it: the live half of a
journal entry (`chaosllm.core.journal`)."""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable

__all__ = ["Outcome", "PlanReport"]


class Outcome(str, enum.Enum):
    COMPLETE = "complete"
    """The plan ran to its end as written (whatever its ending)."""
    CLIENT_GONE = "client_gone"
    """The client closed or reset the connection before the plan finished."""
    ERROR = "error"
    """The server failed while executing the plan."""
    CANCELLED = "cancelled"
    """The client cancelled the request (MCP's ``notifications/cancelled``): the server
    stopped answering it where it was (`PlanReport.stop`)."""


class PlanReport:
    """What the wire layer did with a plan: filled in as it executes it.

    Setting `outcome` marks the report settled (`wait` returns): a client can
    read a whole answer a moment before the server knows it finished writing it.
    The event behind `wait` is made only when someone waits (most never do).

    `stop` asks the wire to stop answering (the client cancelled the request): a wait
    of the plan (a delay, a stall) ends at once and the connection is closed, the
    outcome `Outcome.CANCELLED`. The wire listens with `on_stop` only while it waits.
    """

    __slots__ = (
        "_listeners",
        "_outcome",
        "_settled",
        "_stopped",
        "bytes_sent",
        "degraded",
        "frames_sent",
        "head_sent",
    )
    _lock = threading.Lock()

    def __init__(
        self,
        *,
        frames_sent: int = 0,
        bytes_sent: int = 0,
        head_sent: bool = False,
        outcome: Outcome | None = None,
        degraded: str | None = None,
    ) -> None:
        self.frames_sent = frames_sent
        self.bytes_sent = bytes_sent
        self.head_sent = head_sent
        self.degraded = degraded
        """Set when the server could not do exactly what the plan says."""
        self._settled: threading.Event | None = None
        self._outcome = outcome
        self._stopped = False
        self._listeners: list[Callable[[], None]] | None = None

    @property
    def stopped(self) -> bool:
        """Whether `stop` was called."""
        return self._stopped

    def stop(self) -> bool:
        """Stop answering (from any thread); whether the answer was still going."""
        with PlanReport._lock:
            if self._stopped or self._outcome is not None:
                return False
            self._stopped = True
            listeners, self._listeners = self._listeners or [], None
        for listener in listeners:
            listener()
        return True

    def on_stop(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener` (from the thread that stops) when `stop` is called, at once if
        it was; the function that removes it."""
        with PlanReport._lock:
            if not self._stopped:
                if self._listeners is None:
                    self._listeners = []
                self._listeners.append(listener)
                return lambda: self._forget(listener)
        listener()
        return lambda: None

    def _forget(self, listener: Callable[[], None]) -> None:
        with PlanReport._lock:
            if self._listeners is not None and listener in self._listeners:
                self._listeners.remove(listener)

    @property
    def outcome(self) -> Outcome | None:
        return self._outcome

    @outcome.setter
    def outcome(self, value: Outcome | None) -> None:
        with PlanReport._lock:
            self._outcome = value
            settled = self._settled
        if value is not None and settled is not None:
            settled.set()

    def wait(self, timeout: float) -> bool:
        """Wait until the outcome is known; whether it is."""
        with PlanReport._lock:
            if self._outcome is not None:
                return True
            if self._settled is None:
                self._settled = threading.Event()
            settled = self._settled
        return settled.wait(timeout)

    def _fields(self) -> tuple[object, ...]:
        return (self.frames_sent, self.bytes_sent, self.head_sent, self._outcome, self.degraded)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PlanReport):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"PlanReport(frames_sent={self.frames_sent}, bytes_sent={self.bytes_sent}, "
            f"head_sent={self.head_sent}, outcome={self._outcome}, "
            f"degraded={self.degraded!r})"
        )
