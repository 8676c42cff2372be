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

Bounded state. The history of fired faults keeps the newest `history_size` firings
(``--fault-history-size``); `counts` says how many fired since the last reset and how
many of those the history dropped. The draw ranks are the board's only per-session
state: the ranks of at most `max_sessions` sessions (``--max-sessions``) are kept, the
least recently armed forgotten first, and never those of a session that still has an
armed fault (nor the ranks of faults without a session). A session forgotten and armed
again numbers its faults from 1, as after a reset: its draws are those of a fresh
session, so a run stays reproducible as long as fewer than `max_sessions` other sessions
arm faults during it.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from chaosllm.errors import ConfigError
from chaosllm.faults.spec import FaultSpec

__all__ = [
    "DEFAULT_HISTORY_SIZE",
    "DEFAULT_MAX_SESSIONS",
    "ArmedFault",
    "FaultBoard",
    "Fired",
    "RequestInfo",
]

DEFAULT_HISTORY_SIZE = 1000
"""How many firings the history keeps (the newest): ``--fault-history-size``."""
DEFAULT_MAX_SESSIONS = 10_000
"""How many sessions' state is kept (the most recently used): ``--max-sessions``."""


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
    history_size: int = DEFAULT_HISTORY_SIZE
    """How many firings `history` keeps (the newest; 0: none, only `counts`)."""
    max_sessions: int = DEFAULT_MAX_SESSIONS
    """Of how many sessions the draw ranks are kept (see the module doc)."""
    _armed: list[ArmedFault] = field(default_factory=list)
    _history: deque[Fired] = field(init=False)
    _fired_total: int = field(default=0, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _numbers: Any = field(default_factory=lambda: itertools.count(1))
    _ranks: OrderedDict[str | None, Any] = field(default_factory=OrderedDict)
    """Each session's rank counter, the least recently armed first."""
    _live: dict[str | None, int] = field(default_factory=dict)
    """How many armed faults each session has (its ranks are not forgotten)."""
    _buckets: dict[tuple[str | None, str | None], list[ArmedFault]] = field(default_factory=dict)
    """The armed faults by (match.session, match.model): a request only looks at the
    (up to four) buckets that can match it, so faults armed for other sessions or
    models cost it nothing. A bucket is dropped when its last fault goes."""

    def __post_init__(self) -> None:
        if isinstance(self.history_size, bool) or not (
            isinstance(self.history_size, int) and self.history_size >= 0
        ):
            raise ConfigError(
                f"fault history size must be an integer >= 0, not {self.history_size!r}"
            )
        if isinstance(self.max_sessions, bool) or not (
            isinstance(self.max_sessions, int) and self.max_sessions >= 1
        ):
            raise ConfigError(f"max sessions must be an integer >= 1, not {self.max_sessions!r}")
        self._history = deque(maxlen=self.history_size)

    @staticmethod
    def _key(fault: ArmedFault) -> tuple[str | None, str | None]:
        return (fault.spec.match.session, fault.spec.match.model)

    def _rebucket(self) -> None:
        buckets: dict[tuple[str | None, str | None], list[ArmedFault]] = {}
        for fault in self._armed:
            buckets.setdefault(self._key(fault), []).append(fault)
        self._buckets = buckets

    def _gone(self, fault: ArmedFault) -> None:
        """Bookkeeping for a fault that left `_armed` (under the lock)."""
        session = fault.spec.match.session
        left = self._live[session] - 1
        if left:
            self._live[session] = left
        else:
            del self._live[session]

    def _rank(self, session: str | None) -> int:
        """The next rank of `session`'s faults; forgets the least recently armed
        sessions without armed faults beyond `max_sessions` (under the lock)."""
        ranks = self._ranks
        counter = ranks.get(session)
        if counter is None:
            counter = ranks[session] = itertools.count(1)
            if len(ranks) > self.max_sessions:
                self._forget_ranks()
        else:
            ranks.move_to_end(session)
        rank: int = next(counter)
        return rank

    def _forget_ranks(self) -> None:
        """Forget the ranks of the least recently armed sessions beyond `max_sessions`,
        skipping those with armed faults and the faults without a session."""
        ranks, live = self._ranks, self._live
        excess = len(ranks) - self.max_sessions
        doomed = []
        for session in ranks:
            if excess <= 0:
                break
            if session is not None and session not in live:
                doomed.append(session)
                excess -= 1
        for session in doomed:
            del ranks[session]

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
                self._live[session] = self._live.get(session, 0) + 1
                rank = self._rank(session)
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
                self._live.clear()
                return count
            gone = [f for f in self._armed if f.id == fault_id]
            if not gone:
                return 0
            self._armed = [f for f in self._armed if f.id != fault_id]
            for fault in gone:
                self._gone(fault)
            self._rebucket()
            return len(gone)

    def reset(self) -> None:
        """Disarm all and forget the history; the draws start again as on a fresh board
        (fault ids keep counting, so an old id never names a new fault)."""
        with self._lock:
            self._armed.clear()
            self._buckets.clear()
            self._history.clear()
            self._fired_total = 0
            self._ranks.clear()
            self._live.clear()

    def armed(self) -> list[dict[str, Any]]:
        with self._lock:
            return [f.to_json() for f in self._armed]

    def history(self, session: str | None = None) -> list[Fired]:
        """The newest `history_size` firings (of one session), oldest first."""
        with self._lock:
            return [h for h in self._history if session is None or h.session == session]

    def counts(self) -> dict[str, int]:
        """``fired_total``: how many faults fired since the last reset (all sessions);
        ``fired_dropped``: how many of those firings the history no longer holds (as
        ``GET /__fault`` reports them)."""
        with self._lock:
            return {
                "fired_total": self._fired_total,
                "fired_dropped": self._fired_total - len(self._history),
            }

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
                    key = self._key(fault)
                    bucket = self._buckets[key]
                    bucket.remove(fault)
                    if not bucket:
                        del self._buckets[key]
                    self._gone(fault)
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
                self._fired_total += 1
                return fired
        return None
