"""One WebSocket session's replay, sans-IO: client event text in, steps out.

Theory of operation
-------------------
`LiveSession.open` gives the steps on connect (the protocol's opening events);
`LiveSession.receive` takes one client frame and gives the steps that answer it:

- a frame that is not a client event (not JSON, not an object with a ``type``, a type
  the protocol does not know) is an ``error`` event in the protocol's shape (Realtime),
  or a close with 1008 (a protocol with no error event); a binary frame where the
  protocol wants text is a close with 1008;
- an event that does not end a turn adds to the turn's content and gets the protocol's
  acknowledgement at once;
- an event that ends a turn is matched (`chaosllm.store.sessions.SessionStore.match`:
  exact digest, sequence, nearest) and answered with the recorded server events of the
  turn, each at its recorded time after the turn ended scaled by the timing (0: all at
  once); the first armed session fault that applies (`chaosllm.faults.session`) then
  transforms those steps; a miss is the protocol's error naming the nearest turns.

Nothing here does I/O or reads a clock: the executor (`chaosllm.http.live`) sends each
step at its time.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from chaosllm.core.journal import Journal
from chaosllm.core.live.relay import journal_turn, take_fault
from chaosllm.core.live.verdict import MAX_LOGGED, SessionLog
from chaosllm.faults.board import FaultBoard, RequestInfo
from chaosllm.faults.session import CLOSE, EVENT, RELAY, Step
from chaosllm.providers.live import SessionProtocol, TurnState
from chaosllm.store.sessions import SessionRecording, SessionStore, turn_key

__all__ = ["LiveHub", "LiveSession"]

log = logging.getLogger("chaosllm")

MAX_HISTORY = 100_000
"""Client events a record-missing session keeps to relay (past them its misses are
misses)."""

MAX_HANDLES = 10_000
"""Resumption handles remembered (the oldest forgotten first)."""


class LiveHub:
    """What every session of a server shares: the session recordings (loaded on the
    first session), the fault board, the timing and the threshold of nearest matching."""

    def __init__(
        self,
        dirs: Iterable[Path],
        board: FaultBoard,
        *,
        timing: float = 0.0,
        nearest_threshold: float = 0.9,
        journal: Journal | None = None,
        relay_misses: bool = False,
    ) -> None:
        self.relay_misses = relay_misses
        """Record-missing: a turn with no recording is relayed to the upstream (a
        `RELAY` step) instead of answered with a miss."""
        self.journal = journal
        """Where each session turn is journalled with the model requests, in order."""
        self.dirs = list(dirs)
        self.board = board
        self.timing = timing
        self.nearest_threshold = nearest_threshold
        self._store: SessionStore | None = None
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.logs: deque[SessionLog] = deque(maxlen=MAX_LOGGED)
        """The sessions opened, newest last (`chaosllm.core.live.verdict`)."""
        self.handles: OrderedDict[str, tuple[SessionRecording, int]] = OrderedDict()
        """Resumption handles offered: where each session was (the newest `MAX_HANDLES`)."""

    def offer(self, session_id: str, recording: SessionRecording, position: int) -> str:
        """A new resumption handle for a session at `position` of `recording`."""
        handle = "chaosllm-" + hashlib.sha256(f"{session_id}:{position}".encode()).hexdigest()[:24]
        with self._lock:
            self.handles[handle] = (recording, position)
            while len(self.handles) > MAX_HANDLES:
                self.handles.popitem(last=False)
        return handle

    def resume(self, handle: str) -> tuple[SessionRecording, int] | None:
        with self._lock:
            return self.handles.get(handle)

    @property
    def store(self) -> SessionStore:
        with self._lock:
            if self._store is None:
                self._store = SessionStore(self.dirs)
                for error in self._store.errors:
                    log.warning("skipped session recording %s", error)
            return self._store

    def reload(self) -> None:
        with self._lock:
            self._store = None

    def session(
        self, protocol: SessionProtocol, path: str, query: dict[str, str], session: str | None
    ) -> LiveSession:
        n = next(self._ids)
        live = LiveSession(self, protocol, path, query, session, f"s{n}")
        live.log = SessionLog(n, protocol.name, session)
        with self._lock:
            self.logs.append(live.log)
        return live

    def clear(self) -> None:
        """Forget the sessions' log (a reset)."""
        with self._lock:
            self.logs.clear()


def offer_handle(event: dict[str, Any]) -> str:
    """The handle a resumption offer carries."""
    update = event.get("sessionResumptionUpdate")
    return str(update.get("newHandle", "")) if isinstance(update, dict) else ""


class LiveSession:
    """One connection's session state (module docstring)."""

    def __init__(
        self,
        hub: LiveHub,
        protocol: SessionProtocol,
        path: str,
        query: dict[str, str],
        session: str | None,
        session_id: str,
    ) -> None:
        self.hub = hub
        self.protocol = protocol
        self.path = path
        self.model = protocol.model_of(query)
        self.session = session
        self.session_id = session_id
        self.turn = TurnState()
        self.following: SessionRecording | None = None
        self.position = 0
        self.events_in = 0
        self.turns = 0
        self.last_fault: dict[str, Any] | None = None
        self.started = protocol.first_event is None
        self.resumable = False
        """Whether the client's setup asked for resumption handles."""
        self.resumed: str | None = None
        """The handle this session resumed from."""
        self.log = SessionLog(0, protocol.name, session)
        self.history: list[str] | None = [] if hub.relay_misses else None
        """Record-missing: the client events so far, which bring an upstream opened at
        a turn with no recording to where the session is."""

    def open(self) -> tuple[Step, ...]:
        return tuple(
            Step(EVENT, 0.0, e) for e in self.protocol.opening(self.model, self.session_id)
        )

    def receive_bytes(self, data: bytes) -> tuple[Step, ...]:
        return (
            Step(CLOSE, code=1008, reason="binary frames are not client events: send JSON text"),
        )

    def receive(self, text: str) -> tuple[Step, ...]:
        protocol = self.protocol
        self.events_in += 1
        try:
            event: Any = json.loads(text)
        except ValueError as exc:
            return self._bad(f"The client event is not valid JSON: {exc}")
        problem = protocol.check(event)
        if problem is not None:
            return self._bad(problem)
        if self.history is not None and len(self.history) < MAX_HISTORY:
            self.history.append(text)
        if protocol.first_event is not None:
            first = protocol.kind_of(event) == protocol.first_event
            if first == self.started:
                why = "sent twice" if first else "must come first"
                return self._bad(f"{protocol.first_event} {why}")
            if first:
                return self._start(event)
        protocol.take(event, self.turn)
        if self.turn.audio_bytes > protocol.max_audio_bytes:
            self.turn = TurnState()
            return self._bad("the input audio buffer is over its limit; commit or clear it")
        if not protocol.ends_turn(event):
            acks = protocol.acks(event, self.session_id, self.events_in)
            return tuple(Step(EVENT, 0.0, e) for e in acks)
        return self._answer()

    def _start(self, event: dict[str, Any]) -> tuple[Step, ...]:
        protocol = self.protocol
        self.started = True
        setup = protocol.setup(event)
        model = setup.get("model")
        if isinstance(model, str):
            self.model = model.removeprefix("models/")
        handle = protocol.resumption_handle(setup)
        self.resumable = handle is not False
        if isinstance(handle, str):
            where = self.hub.resume(handle)
            if where is None:
                return self._bad("unknown session resumption handle")
            self.following, self.position = where
            self.resumed = self.log.resumed = handle
        return tuple(Step(EVENT, 0.0, e) for e in protocol.opened(setup, self.session_id))

    def _bad(self, message: str) -> tuple[Step, ...]:
        if self.protocol.miss_closes:
            return (Step(CLOSE, code=1008, reason=message),)
        return (
            Step(
                EVENT,
                0.0,
                self.protocol.error_event("invalid_request_error", message, "invalid_event"),
            ),
        )

    def _answer(self) -> tuple[Step, ...]:
        protocol, hub = self.protocol, self.hub
        digest, text = turn_key(protocol, self.turn)
        self.turn = TurnState()
        self.turns += 1
        store = hub.store
        found = store.match(
            protocol,
            digest,
            text,
            self.following,
            self.position,
            threshold=hub.nearest_threshold,
        )
        relay = self.history is not None and len(self.history) < MAX_HISTORY
        if found is None and relay:
            self.log.turns.append((digest, True))
            return (Step(RELAY),)  # journalled by the relay (`Relay.begin`)
        if found is None:
            missed = self._miss(store, digest, text)
            self._journal(None, None, None, missed)
            return missed
        self.following = found.recording
        self.position = found.turn.index + 1
        scale = hub.timing
        steps = tuple(
            Step(EVENT, max(0.0, (e.t_ms - found.turn.ended_ms) / 1000.0 * scale), e.event)
            for e in found.turn.answer
        )
        if self.resumable:
            offer = protocol.resumption_event(
                hub.offer(self.session_id, found.recording, self.position)
            )
            if offer is not None:
                steps += (Step(EVENT, steps[-1].at_s if steps else 0.0, offer),)
                self.log.offered.append(offer_handle(offer))
        answered = self._fault(steps)
        whole = answered == steps
        self._journal(found.recording.name, found.how, self.last_fault, answered)
        self.log.turns.append((digest, whole))
        if any(step.event is not None and protocol.going_away(step.event) for step in answered):
            self.log.went_away = True
        return answered

    def _fault(self, steps: tuple[Step, ...]) -> tuple[Step, ...]:
        request = RequestInfo(
            path=self.path,
            model=self.model,
            session=self.session,
            stream=True,
            turn=self.turns,
        )
        answered, self.last_fault = take_fault(self.hub.board, request, steps, self.protocol)
        return answered

    def _journal(
        self,
        recording: str | None,
        how: str | None,
        fault: dict[str, Any] | None,
        steps: tuple[Step, ...],
    ) -> None:
        """One journal entry for the turn: with the model requests, in order (no digest:
        the HTTP verdicts, which follow a request's digest, leave it to the session
        verdicts)."""
        journal_turn(
            self.hub.journal,
            session=self.session,
            path=self.path,
            model=self.model,
            recording=recording,
            how=how,
            miss=recording is None,
            fault=fault,
            steps=steps,
        )

    def _miss(self, store: SessionStore, digest: str, text: str) -> tuple[Step, ...]:
        near = store.nearest(self.protocol, text)
        names = ", ".join(f"{r.name} turn {t.index + 1} ({score:.2f})" for score, r, t in near)
        message = (
            f"chaosllm: no recorded session turn matches this one (digest {digest[:12]}); "
            f"nearest: {names or 'none'}. Record it with --mode record-missing."
        )
        if self.protocol.miss_closes:  # a close reason is at most 123 bytes
            short = ", ".join(f"{r.name}#{t.index + 1}" for _, r, t in near[:2])
            reason = f"chaosllm: no recorded turn matches; nearest {short or 'none'}"
            return (Step(CLOSE, code=1008, reason=reason[:123]),)
        return (
            Step(
                EVENT,
                0.0,
                self.protocol.error_event("invalid_request_error", message, "no_recording"),
            ),
        )
