"""The fault board: armed faults, FIFO firing, atomic consumption, seeded draws.

Faults fire in the order they were armed: for each provider request the
first armed fault that matches it (path, model, session, stream), applies to
its answer, and wins its probability draw fires and uses one of its
`remaining`. All of that happens under one lock, so under any concurrency a
fault with ``remaining: N`` fires exactly N times.

Probability draws are deterministic: the k-th draw of the n-th fault armed for
a session (``match.session``; faults without one count together) since the last
reset comes from ``Random(f"{seed}:{session!r}:{n}:{k}")``, so the same seed and
the same requests give the same decisions whatever other sessions arm or run
concurrently, and again after a reset (a shared server reset between tests).
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from chaosllm.faults.spec import FaultSpec

__all__ = ["ArmedFault", "FaultBoard", "Fired", "RequestInfo"]


@dataclass(frozen=True, slots=True)
class RequestInfo:
    path: str
    model: str | None
    session: str | None
    stream: bool


@dataclass(slots=True)
class ArmedFault:
    id: str
    number: int
    spec: FaultSpec
    remaining: int
    armed_at: float
    fired: int = 0
    draws: int = 0
    draw_key: str = ""
    """Seeds this fault's draws: its session and its rank among that session's faults."""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            **self.spec.to_json(),
            "remaining": self.remaining,
            "fired": self.fired,
            "armed_at": self.armed_at,
        }

    def matches(self, request: RequestInfo) -> bool:
        m = self.spec.match
        return (
            (m.session is None or m.session == request.session)
            and (m.model is None or m.model == request.model)
            and (
                m.path is None
                or m.path == request.path
                or m.path == request.path.removeprefix("/v1")
            )
            and (m.stream is None or m.stream == request.stream)
        )


@dataclass(slots=True)
class Fired:
    """One firing: which fault, on which request (`request_seq`: its journal entry)."""

    fault_id: str
    type: str
    spec: FaultSpec
    session: str | None
    path: str
    time: float
    request_seq: int | None = None
    left: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.fault_id,
            "type": self.type,
            "session": self.session,
            "path": self.path,
            "time": self.time,
            "request_seq": self.request_seq,
            "remaining": self.left,
            "spec": self.spec.to_json(),
        }


@dataclass
class FaultBoard:
    seed: int = 0
    _armed: list[ArmedFault] = field(default_factory=list)
    _history: list[Fired] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _numbers: Any = field(default_factory=lambda: itertools.count(1))
    _ranks: dict[str | None, Any] = field(default_factory=dict)
    _buckets: dict[tuple[str | None, str | None], list[ArmedFault]] = field(default_factory=dict)
    """The armed faults by (match.session, match.model): a request only looks at the
    (up to four) buckets that can match it, so faults armed for other sessions or
    models cost it nothing."""

    @staticmethod
    def _key(fault: ArmedFault) -> tuple[str | None, str | None]:
        return (fault.spec.match.session, fault.spec.match.model)

    def _rebucket(self) -> None:
        buckets: dict[tuple[str | None, str | None], list[ArmedFault]] = {}
        for fault in self._armed:
            buckets.setdefault(self._key(fault), []).append(fault)
        self._buckets = buckets

    def _candidates(self, request: RequestInfo) -> list[ArmedFault]:
        """The armed faults whose session and model fit the request, in FIFO order."""
        keys = {
            (None, None),
            (None, request.model),
            (request.session, None),
            (request.session, request.model),
        }
        lists = [self._buckets[k] for k in keys if k in self._buckets]
        if len(lists) == 1:
            return lists[0]
        return sorted((f for bucket in lists for f in bucket), key=lambda f: f.number)

    def arm(self, specs: Sequence[FaultSpec]) -> list[ArmedFault]:
        """Arm validated specs, in order, all at once."""
        with self._lock:
            now = time.time()
            armed = []
            for spec in specs:
                number = next(self._numbers)
                session = spec.match.session
                rank = next(self._ranks.setdefault(session, itertools.count(1)))
                armed.append(
                    ArmedFault(
                        id=f"flt_{number}",
                        number=number,
                        spec=spec,
                        remaining=spec.remaining,
                        armed_at=now,
                        draw_key=f"{session!r}:{rank}",
                    )
                )
            self._armed.extend(armed)
            for fault in armed:
                self._buckets.setdefault(self._key(fault), []).append(fault)
            return armed

    def disarm(self, fault_id: str | None = None) -> int:
        """Disarm one fault (by id) or all; how many were disarmed."""
        with self._lock:
            if fault_id is None:
                count = len(self._armed)
                self._armed.clear()
                self._buckets.clear()
                return count
            before = len(self._armed)
            self._armed = [f for f in self._armed if f.id != fault_id]
            self._rebucket()
            return before - len(self._armed)

    def reset(self) -> None:
        """Disarm all and forget the history; the draws start again as on a fresh board
        (fault ids keep counting, so an old id never names a new fault)."""
        with self._lock:
            self._armed.clear()
            self._buckets.clear()
            self._history.clear()
            self._ranks.clear()

    def armed(self) -> list[dict[str, Any]]:
        with self._lock:
            return [f.to_json() for f in self._armed]

    def history(self, session: str | None = None) -> list[Fired]:
        with self._lock:
            return [h for h in self._history if session is None or h.session == session]

    def __len__(self) -> int:
        return len(self._armed)

    def may_fire(self, request: RequestInfo) -> bool:
        """Whether an armed fault matches the request (before its probability draw and
        whether it applies to the answer): a proxy then reads the answer whole, so that
        the fault can transform it."""
        if not self._armed:
            return False
        with self._lock:
            return any(fault.matches(request) for fault in self._candidates(request))

    def take(
        self, request: RequestInfo, applies: Callable[[FaultSpec], bool] = lambda spec: True
    ) -> Fired | None:
        """The fault that fires on this request, consumed; None if none does."""
        if not self._armed:
            return None
        with self._lock:
            for fault in self._candidates(request):
                if not fault.matches(request) or not applies(fault.spec):
                    continue
                if fault.spec.probability < 1.0:
                    draw = random.Random(f"{self.seed}:{fault.draw_key}:{fault.draws}").random()
                    fault.draws += 1
                    if draw >= fault.spec.probability:
                        continue
                fault.remaining -= 1
                fault.fired += 1
                if fault.remaining <= 0:
                    self._armed.remove(fault)
                    self._buckets[self._key(fault)].remove(fault)
                fired = Fired(
                    fault_id=fault.id,
                    type=fault.spec.type,
                    spec=fault.spec,
                    session=request.session,
                    path=request.path,
                    time=time.time(),
                    left=fault.remaining,
                )
                self._history.append(fired)
                return fired
        return None
