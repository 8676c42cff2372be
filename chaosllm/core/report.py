"""What the wire did with a plan, filled in while it executes it: the live half of a
journal entry (`chaosllm.core.journal`)."""

from __future__ import annotations

import enum
import threading

__all__ = ["Outcome", "PlanReport"]


class Outcome(str, enum.Enum):
    COMPLETE = "complete"
    """The plan ran to its end as written (whatever its ending)."""
    CLIENT_GONE = "client_gone"
    """The client closed or reset the connection before the plan finished."""
    ERROR = "error"
    """The server failed while executing the plan."""


class PlanReport:
    """What the wire layer did with a plan: filled in as it executes it.

    Setting `outcome` marks the report settled (`wait` returns): a client can
    read a whole answer a moment before the server knows it finished writing it.
    The event behind `wait` is made only when someone waits (most never do).
    """

    __slots__ = ("_outcome", "_settled", "bytes_sent", "degraded", "frames_sent", "head_sent")
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
