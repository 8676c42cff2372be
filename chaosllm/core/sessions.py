"""What the engine keeps per session (``X-Chaosllm-Session``; None: the requests without
one): how many requests it made (``match.turn``), the fresh ids its answers carried
(so that a later request echoing one is keyed as recorded), and the recording a fault
armed with ``reask`` broke for it. One map, least recently used first, bounded by
``--max-sessions``: a session forgotten starts fresh if seen again. The matcher's
cursors and the board's draw ranks are kept by those, with the same bound."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Final

from chaosllm.model import Exchange, StateVersion
from chaosllm.store.matching import Match

__all__ = ["MINTED_PER_SESSION", "Reask", "Session", "Sessions"]

MINTED_PER_SESSION: Final = 4096
"""How many fresh ids a session's requests are mapped back from (the newest)."""


@dataclass(frozen=True, slots=True)
class Reask:
    """The recording a ``reask`` fault broke, waiting for the session's re-ask."""

    exchange: Exchange
    """As reviewed for the request the fault broke (templated)."""
    match: Match
    fault_id: str
    request_seq: int


@dataclass(slots=True)
class Session:
    turns: int = 0
    """Provider requests since the last reset."""
    minted: OrderedDict[str, str] = field(default_factory=OrderedDict)
    """The fresh ids its answers carried, each mapped to the recorded id it stands for."""
    reask: Reask | None = None


class Sessions:
    """The per-session state (see the module doc); changes that decide answers (a
    waiting re-ask) bump `version`."""

    def __init__(self, max_sessions: int, version: StateVersion) -> None:
        self.max_sessions = max_sessions
        self.version = version
        self._sessions: OrderedDict[str | None, Session] = OrderedDict()
        self._lock = threading.Lock()
        self._reasks = 0
        """How many sessions have a re-ask waiting (none: nothing to look up)."""

    def __len__(self) -> int:
        return len(self._sessions)

    def _get(self, session: str | None) -> Session:
        """The session's state, made the most recently used (under the lock)."""
        sessions = self._sessions
        state = sessions.get(session)
        if state is None:
            state = sessions[session] = Session()
            if len(sessions) > self.max_sessions:
                _, gone = sessions.popitem(last=False)
                if gone.reask is not None:
                    self._reasks -= 1
        else:
            sessions.move_to_end(session)
        return state

    def next_turn(self, session: str | None) -> int:
        """Count a provider request of `session`: its number since the last reset (from 1)."""
        with self._lock:
            state = self._get(session)
            state.turns += 1
            return state.turns

    def minted(self, session: str | None) -> OrderedDict[str, str] | None:
        """The fresh ids (fresh -> recorded) the session's answers carried, if any."""
        state = self._sessions.get(session)
        return state.minted if state is not None and state.minted else None

    def mint(self, session: str | None, fresh: dict[str, str]) -> None:
        """Remember the fresh ids (recorded -> fresh) an answer to `session` carried."""
        with self._lock:
            kept = self._get(session).minted
            for old, new in fresh.items():
                kept[new] = old
            while len(kept) > MINTED_PER_SESSION:
                kept.popitem(last=False)

    def wait_reask(self, session: str | None, reask: Reask) -> None:
        """`reask` answers the session's next miss (one each, the newest wins)."""
        with self._lock:
            state = self._get(session)
            if state.reask is None:
                self._reasks += 1
            state.reask = reask
        self.version.bump()

    def take_reask(self, session: str | None) -> Reask | None:
        """The re-ask waiting for the session, no longer waiting (None: none)."""
        if not self._reasks:
            return None
        with self._lock:
            state = self._sessions.get(session)
            reask = state.reask if state is not None else None
            if state is None or reask is None:
                return None
            state.reask = None
            self._reasks -= 1
        self.version.bump()
        return reask

    @property
    def reasks(self) -> int:
        return self._reasks

    def clear(self) -> None:
        with self._lock:
            self._sessions.clear()
            self._reasks = 0
        self.version.bump()
