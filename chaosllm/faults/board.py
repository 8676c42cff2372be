"""The fault board: armed faults, FIFO firing, atomic consumption, seeded draws.

Faults fire in the order they were armed: for each provider request the
first armed fault that matches it (path, model, session, stream, contains, tool,
turn), applies to its answer, is due by its schedule and wins its probability draw
fires and uses one of its `remaining`. All of that happens under one lock, so under
any concurrency a fault with ``remaining: N`` fires exactly N times.

Schedules. A fault counts the matching requests offered to it (`ArmedFault.seen`):
those that match it, that it applies to, and that no fault armed before it took (a
request is offered to each fault once, also in the proxy modes, where it may be
offered before and after the upstream answers). With ``after_requests: N`` the first
N pass; with ``every: K`` only the K-th, 2K-th... after those is due. Its probability
is drawn on the due ones only. Counting happens under the same lock as consumption,
so ``every: 3`` fires on exactly a third of the matching requests under any
concurrency. ``ttl_ms`` disarms a fault once that many milliseconds (on the board's
`monotonic` clock: the engine's `Clock`) have passed since it was armed.

Request facts. ``match.contains`` and ``match.tool`` read the request body (its last
user message, the tools it offers) and the answer (the tools it calls) through the
provider (`FaultHooks.last_user_text`, `tool_names`, `called_tool_names`), only when a
fault armed for the request asks, and once per request. Before the upstream has
answered (`RequestInfo.answer_known` false), a ``tool`` the request does not offer
may still be called by the answer: `may_fire` says the fault may fire (the proxy then
reads the answer whole), and `take` leaves it (and the faults armed after it) for the
answer.

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

from chaosllm.errors import ConfigError, TooManyFaults
from chaosllm.faults.spec import FaultSpec
from chaosllm.model import JSON, StateVersion
from chaosllm.providers.base import Provider

__all__ = [
    "DEFAULT_HISTORY_SIZE",
    "DEFAULT_MAX_FAULTS",
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
DEFAULT_MAX_FAULTS = 10_000
"""How many faults may be armed at once: ``--max-faults``."""


@dataclass(frozen=True, slots=True)
class RequestInfo:
    path: str
    model: str | None
    session: str | None
    stream: bool
    turn: int = 0
    """The session's n-th provider request since the last reset (from 1; 0: not counted,
    which no ``match.turn`` matches)."""
    provider: Provider | None = field(default=None, compare=False)
    """The protocol that reads `body` and `answer` (None: ``contains`` and ``tool`` never
    match)."""
    body: JSON = field(default=None, compare=False)
    """The request body (as recorded: redacted)."""
    answer: JSON = field(default=None, compare=False)
    """The answer a fault would transform."""
    answer_known: bool = True
    """False before a proxied request's upstream has answered (`answer` is not yet
    known)."""
    server: str | None = None
    """The named (MCP) server the request addresses; None: a model request."""


class _Facts:
    """What ``match.contains`` and ``match.tool`` read off one request, each read once and
    only when a fault asks."""

    __slots__ = ("_offered", "_request", "_text", "_tools")

    _UNREAD: Any = object()

    def __init__(self, request: RequestInfo) -> None:
        self._request = request
        self._text: Any = self._UNREAD
        self._offered: frozenset[str] | None = None
        self._tools: frozenset[str] | None = None

    def text(self) -> str | None:
        """The text of the request's last user message."""
        if self._text is self._UNREAD:
            r = self._request
            self._text = (
                r.provider.faults.last_user_text(r.body) if r.provider is not None else None
            )
        text: str | None = self._text
        return text

    def offered(self) -> frozenset[str]:
        """The tools the request offers."""
        if self._offered is None:
            r = self._request
            self._offered = (
                r.provider.faults.tool_names(r.body) if r.provider is not None else frozenset()
            )
        return self._offered

    def tools(self) -> frozenset[str]:
        """The tools the request offers or its answer calls."""
        if self._tools is None:
            r = self._request
            called = (
                r.provider.faults.called_tool_names(r.answer)
                if r.provider is not None and r.answer_known
                else frozenset()
            )
            self._tools = self.offered() | called
        return self._tools


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
    seen: int = 0
    """How many matching requests were offered to it (what `after_requests` and `every`
    count)."""
    expires: float | None = None
    """When `ttl_ms` disarms it, on the board's monotonic clock (None: never)."""

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        """As ``GET /__fault`` lists it; with `now` (the board's monotonic time), a fault
        with a ``ttl_ms`` says how long it has left (``expires_in_ms``)."""
        data = {
            "id": self.id,
            **self.spec.to_json(),
            "remaining": self.remaining,
            "fired": self.fired,
            "armed_at": self.armed_at,
        }
        if self.spec.counts_requests:
            data["seen"] = self.seen
        if self.expires is not None and now is not None:
            data["expires_in_ms"] = round(max(0.0, self.expires - now) * 1000, 3)
        return data

    def matches(
        self, request: RequestInfo, facts: _Facts | None = None, *, maybe: bool = False
    ) -> bool:
        """Whether the request is one it fires on; `maybe`: a ``tool`` the request does not
        offer counts as matched while the answer is unknown (it may call it)."""
        m = self.spec.match
        if not (
            (m.session is None or m.session == request.session)
            and (m.model is None or m.model == request.model)
            and (
                m.path is None
                or m.path == request.path
                or m.path == request.path.removeprefix("/v1")
            )
            and (m.stream is None or m.stream == request.stream)
            and (m.turn is None or m.turn == request.turn)
            and (
                request.server == m.server
                if m.server is not None
                else request.server is None or self.spec.entry.mcp
            )
        ):
            return False
        if not m.reads_body:
            return True
        facts = facts if facts is not None else _Facts(request)
        if m.contains is not None:
            text = facts.text()
            if text is None or m.contains not in text:
                return False
        if m.tool is not None and m.tool not in facts.tools():
            return maybe and not request.answer_known
        return True

    def due(self) -> bool:
        """Counts one more matching request; whether the schedule lets it fire on it."""
        self.seen += 1
        spec = self.spec
        if not spec.counts_requests:
            return True
        passed = self.seen - spec.after_requests
        return passed > 0 and passed % spec.every == 0


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
    seen: int = 0
    """Which matching request offered to the fault it fired on (1: the first)."""

    def to_json(self) -> dict[str, Any]:
        data = {
            "id": self.fault_id,
            "type": self.type,
            "session": self.session,
            "path": self.path,
            "time": self.time,
            "request_seq": self.request_seq,
            "remaining": self.left,
            "spec": self.spec.to_json(),
        }
        if self.spec.counts_requests:
            data["seen"] = self.seen
        return data


@dataclass
class FaultBoard:
    seed: int = 0
    history_size: int = DEFAULT_HISTORY_SIZE
    """How many firings `history` keeps (the newest; 0: none, only `counts`)."""
    max_sessions: int = DEFAULT_MAX_SESSIONS
    """Of how many sessions the draw ranks are kept (see the module doc)."""
    max_faults: int = DEFAULT_MAX_FAULTS
    """How many faults may be armed at once (`arm` raises `TooManyFaults` past it)."""
    monotonic: Callable[[], float] = time.monotonic
    """The clock `ttl_ms` is measured on (seconds; the engine's `Clock.monotonic`)."""
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
    _expiring: int = field(default=0, init=False)
    """How many armed faults have a ``ttl_ms`` (none: nothing to expire)."""
    version: StateVersion = field(default_factory=StateVersion)
    """Bumped by every change of the armed faults (armed, fired, disarmed, expired, reset):
    the engine's memo keeps no answer across one."""

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
        if isinstance(self.max_faults, bool) or not (
            isinstance(self.max_faults, int) and self.max_faults >= 1
        ):
            raise ConfigError(f"max faults must be an integer >= 1, not {self.max_faults!r}")
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
        self.version.bump()
        if fault.expires is not None:
            self._expiring -= 1
        session = fault.spec.match.session
        left = self._live[session] - 1
        if left:
            self._live[session] = left
        else:
            del self._live[session]

    def _remove(self, fault: ArmedFault) -> None:
        """Take one fault off the board (under the lock)."""
        self._armed.remove(fault)
        key = self._key(fault)
        bucket = self._buckets[key]
        bucket.remove(fault)
        if not bucket:
            del self._buckets[key]
        self._gone(fault)

    def _expire(self) -> float | None:
        """Disarm the faults whose ``ttl_ms`` has passed (under the lock); the time now,
        when any fault has a ``ttl_ms``."""
        if not self._expiring:
            return None
        now = self.monotonic()
        for fault in [f for f in self._armed if f.expires is not None and f.expires <= now]:
            self._remove(fault)
        return now

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
        """Arm validated specs, in order, all at once; `TooManyFaults` (and none armed)
        when the board would hold more than `max_faults`."""
        with self._lock:
            self._expire()
            if len(self._armed) + len(specs) > self.max_faults:
                raise TooManyFaults(
                    f"{len(self._armed)} faults are armed and the board holds at most "
                    f"{self.max_faults} (--max-faults): arming {len(specs)} more was refused, "
                    f"none armed. Disarm some (DELETE /__fault, or DELETE /__fault/ID) or "
                    f"start chaosllm with a larger --max-faults."
                )
            now = time.time()
            ticks = self.monotonic() if any(s.ttl_ms is not None for s in specs) else 0.0
            armed = []
            for spec in specs:
                number = next(self._numbers)
                session = spec.match.session
                self._live[session] = self._live.get(session, 0) + 1
                rank = self._rank(session)
                expires = None
                if spec.ttl_ms is not None:
                    expires = ticks + spec.ttl_ms / 1000
                    self._expiring += 1
                armed.append(
                    ArmedFault(
                        id=f"flt_{number}",
                        number=number,
                        spec=spec,
                        remaining=spec.remaining,
                        armed_at=now,
                        draw_key=f"{session!r}:{rank}",
                        expires=expires,
                    )
                )
            self._armed.extend(armed)
            for fault in armed:
                self._buckets.setdefault(self._key(fault), []).append(fault)
            self.version.bump()
            return armed

    def disarm(self, fault_id: str | None = None) -> int:
        """Disarm one fault (by id) or all; how many were disarmed."""
        with self._lock:
            self._expire()
            if fault_id is None:
                count = len(self._armed)
                self._armed.clear()
                self._buckets.clear()
                self._live.clear()
                self._expiring = 0
                self.version.bump()
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
            self._expiring = 0
            self.version.bump()

    def armed(self) -> list[dict[str, Any]]:
        with self._lock:
            now = self._expire()
            return [f.to_json(now) for f in self._armed]

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
        the fault can transform it. When none does, `take` would fire none and count none:
        a request answered without asking it leaves the board as asking would."""
        if not self._armed:
            return False
        with self._lock:
            self._expire()
            candidates = self._candidates(request)
            if not candidates:  # armed for other sessions and models only
                return False
            facts = _Facts(request)
            return any(fault.matches(request, facts, maybe=True) for fault in candidates)

    def take(
        self,
        request: RequestInfo,
        applies: Callable[[FaultSpec], bool] = lambda spec: True,
        *,
        waits: Callable[[FaultSpec], None] | None = None,
    ) -> Fired | None:
        """The fault that fires on this request, consumed; None if none does. `waits`: told
        of the first fault that may match once the answer is known (a ``tool`` the answer
        may call, `RequestInfo.answer_known` false); it and the faults armed after it wait
        for the answer, and none fires now."""
        if not self._armed:
            return None
        with self._lock:
            self._expire()
            facts = _Facts(request)
            for fault in self._candidates(request):
                if not fault.matches(request, facts):
                    if waits is not None and fault.matches(request, facts, maybe=True):
                        waits(fault.spec)
                        return None
                    continue
                if not applies(fault.spec):
                    continue
                if not fault.due():
                    continue
                if fault.spec.probability < 1.0:
                    draw = random.Random(f"{self.seed}:{fault.draw_key}:{fault.draws}").random()
                    fault.draws += 1
                    if draw >= fault.spec.probability:
                        continue
                fault.remaining -= 1
                fault.fired += 1
                self.version.bump()
                if fault.remaining <= 0:
                    self._remove(fault)
                fired = Fired(
                    fault_id=fault.id,
                    type=fault.spec.type,
                    spec=fault.spec,
                    session=request.session,
                    path=request.path,
                    time=time.time(),
                    left=fault.remaining,
                    seen=fault.seen,
                )
                self._history.append(fired)
                self._fired_total += 1
                return fired
        return None
