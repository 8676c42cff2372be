"""A proxied session's faults, sans-IO: the session faults applied to a live upstream
session, as its events arrive.

In record and passthrough modes (and in record-missing from the first turn with no
recording on), a session is relayed to the upstream's WebSocket. `Relay` sees both
directions: `Relay.client` takes each client frame (a frame that ends a turn starts the
next turn's fault, if one is armed) and says what the client gets first; `Relay.server`
takes each upstream frame and says what the client gets for it.

A turn's fault is the first armed session fault that applies, as on a replayed turn
(`chaosllm.faults.session`). One whose effect is decided by the protocol alone (every
type but ``malformed_tool_args``) is taken from the board when the turn starts and fires
on the upstream's events as they arrive: the turn's first ``after_events`` events pass,
and at the next one the fault's transformation of the events so far says the rest (a
close, a drop, a stall: the session ends; an ``error``, an expiry: the rest of the
turn's answer is dropped up to its end, `SessionProtocol.answer_done`; a frame that is
not JSON, ``goAway``: the answer goes on, and ``goAway``'s close comes ``time_left_ms``
later). A turn that ends with fewer events gets the fault's tail when the client's next
turn begins, as a replayed turn's fault with ``after_events`` past its events. A fault
that needs the whole answer (`FaultType.session_whole`) armed before any other makes
the turn read to its end first (its events held back), then transformed whole, exactly
as on a replayed turn. A recording keeps the upstream's own events (up to where the
session ended): faults change only what the client gets.

Nothing here does I/O or reads a clock: every step is due now, but a ``goAway``'s close,
due its `Step.at_s` later.
"""

from __future__ import annotations

import json
from typing import Any

from chaosllm.core.journal import Journal
from chaosllm.core.live.verdict import SessionLog
from chaosllm.core.report import Outcome
from chaosllm.faults.board import FaultBoard, RequestInfo
from chaosllm.faults.session import CLOSE, DROP, EVENT, STALL, TEXT, Step
from chaosllm.faults.spec import FaultSpec
from chaosllm.providers.live import SessionProtocol, TurnState
from chaosllm.store.sessions import turn_key

__all__ = ["Relay", "ends", "journal_turn", "take_fault"]

_PASS = "pass"
_CUT = "cut"
"""The turn's answer was broken: its rest is dropped up to its end."""
_HOLD = "hold"
"""A fault that needs the whole answer may fire: the turn's events are held to its end."""
_ENDED = "ended"


def ends(steps: tuple[Step, ...]) -> bool:
    """Whether the steps end the session (a close, a drop, a stall)."""
    return any(s.kind in (CLOSE, DROP, STALL) for s in steps)


def take_fault(
    board: FaultBoard,
    request: RequestInfo,
    steps: tuple[Step, ...],
    protocol: SessionProtocol,
) -> tuple[tuple[Step, ...], dict[str, Any] | None]:
    """A whole turn's steps after the first armed session fault that applies (consumed),
    and that fault as the journal says it; the steps unchanged and None when none does."""
    outcome: dict[str, tuple[Step, ...]] = {}

    def applies(spec: FaultSpec) -> bool:
        transform = spec.entry.session
        if transform is None:
            return False
        after = transform(steps, spec, protocol)
        if after is None:
            return False
        outcome["steps"] = after
        return True

    fired = board.take(request, applies)
    if fired is None:
        return steps, None
    return outcome["steps"], _fault_json(fired.spec, fired.fault_id)


def journal_turn(
    journal: Journal | None,
    *,
    session: str | None,
    path: str,
    model: str | None,
    recording: str | None,
    how: str | None,
    miss: bool,
    fault: dict[str, Any] | None,
    steps: tuple[Step, ...],
) -> None:
    """One journal entry for a session's turn, with the model requests, in order (no
    digest: the HTTP verdicts, which follow a request's digest, leave it to the session
    verdicts): how it matched (``upstream``: relayed), its fault, its error and ending
    as its `steps` say (none: a relayed turn, whose events are the upstream's)."""
    if journal is None:
        return
    end = next((s for s in steps if s.kind != EVENT), None)
    error = next(
        (
            str(s.event["error"].get("message"))
            for s in steps
            if s.event is not None and isinstance(s.event.get("error"), dict)
        ),
        None,
    )
    if end is not None and end.kind == CLOSE and end.code == 1008:
        error = end.reason
    entry = journal.add(
        session=session,
        method="GET",
        path=path,
        model=model,
        stream=True,
        digest=None,
        status=101,
        recording=recording,
        match=how,
        miss=miss,
        error=error,
        fault=fault,
        ending="session" if end is None else end.kind,
        frames=sum(1 for s in steps if s.kind in (EVENT, TEXT)),
    )
    # The turn's steps are decided here; the executor sends them (nothing to wait for).
    entry.report.frames_sent = entry.record.frames or 0
    entry.report.outcome = Outcome.COMPLETE


def _fault_json(spec: FaultSpec, fault_id: str) -> dict[str, Any]:
    return {**spec.to_json(), "id": fault_id, "params": spec.effective_params()}


class Relay:
    """One relayed session's turns (module docstring)."""

    def __init__(
        self,
        board: FaultBoard,
        protocol: SessionProtocol,
        path: str,
        model: str | None,
        session: str | None,
        *,
        journal: Journal | None = None,
        turns: int = 0,
        log: SessionLog | None = None,
    ) -> None:
        self.board = board
        self.protocol = protocol
        self.path = path
        self.model = model
        self.session = session
        self.journal = journal
        self.turns = turns
        """Turns begun (the fault's ``match.turn``)."""
        self.state = _PASS
        self.pending: FaultSpec | None = None
        """The turn's fault, waiting for its ``after_events``-th event."""
        self.seen: list[Step] = []
        """The turn's events passed so far (while a fault is pending)."""
        self.held: list[Step] = []
        self.miss = False
        self.log = log
        """The session's log for the verdicts: each turn's digest and whether the client
        got it whole, the handles offered, whether it was told it is going away."""
        self.turn = TurnState()
        self.fired: list[dict[str, Any]] = []
        """The faults that fired, as the journal says them."""

    @property
    def ended(self) -> bool:
        return self.state == _ENDED

    def client(self, text: str) -> tuple[Step, ...]:
        """A client frame (forwarded to the upstream as it is): what the client gets
        before it; a frame that ends a turn begins the next turn."""
        return self.shown(self._client(text))

    def server(self, text: str) -> tuple[Step, ...]:
        """An upstream frame: what the client gets for it."""
        return self.shown(self._server(text))

    def upstream_closed(self) -> tuple[Step, ...]:
        """The upstream ended the session: what the client still gets first (a held turn,
        a pending fault's tail)."""
        return self.shown(self._flush())

    def _client(self, text: str) -> tuple[Step, ...]:
        if self.state == _ENDED:
            return ()
        try:
            event: Any = json.loads(text)
        except ValueError:
            return ()  # the upstream says what is wrong with it
        if not isinstance(event, dict) or self.protocol.check(event) is not None:
            return ()
        protocol = self.protocol
        if protocol.first_event is not None and protocol.kind_of(event) == protocol.first_event:
            setup = protocol.setup(event)
            model = setup.get("model")
            if isinstance(model, str):
                self.model = model.removeprefix("models/")
            handle = protocol.resumption_handle(setup)
            if isinstance(handle, str) and self.log is not None:
                self.log.resumed = handle
            return ()
        protocol.take(event, self.turn)
        if not protocol.ends_turn(event):
            return ()
        digest, _ = turn_key(protocol, self.turn)
        self.turn = TurnState()
        before = self._flush()
        if self.log is not None:
            self.log.turns.append((digest, True))
        if self.state != _ENDED:
            self.begin()
        return before

    def begin(self, *, miss: bool = False) -> None:
        """A turn begins (its client event sent): its fault is decided. `miss`: a turn
        relayed because no recording has it (record-missing), as the journal says."""
        self.turns += 1
        self.state, self.pending, self.seen, self.held = _PASS, None, [], []
        protocol = self.protocol
        request = RequestInfo(
            path=self.path, model=self.model, session=self.session, stream=True, turn=self.turns
        )
        whole_first = False

        def applies(spec: FaultSpec) -> bool:
            nonlocal whole_first
            transform = spec.entry.session
            if transform is None or whole_first:
                return False
            if spec.entry.session_whole:
                whole_first = True
                return False
            return transform((), spec, protocol) is not None

        fired = self.board.take(request, applies)
        fault = None
        if fired is not None:
            self.pending = fired.spec
            fault = _fault_json(fired.spec, fired.fault_id)
            self.fired.append(fault)
            self._broken()
        elif whole_first:
            self.state = _HOLD
            self.miss = miss
            return  # journalled when the held turn is transformed
        self._journal(fault, miss)

    def _server(self, text: str) -> tuple[Step, ...]:
        state = self.state
        if state == _ENDED:
            return ()
        try:
            event: Any = json.loads(text)
        except ValueError:
            event = None
        step = Step(EVENT, 0.0, event) if isinstance(event, dict) else Step(TEXT, 0.0, text=text)
        done = step.event is not None and self.protocol.answer_done(step.event)
        if state == _HOLD:
            self.held.append(step)
            return self._whole() if done else ()
        if state == _CUT:
            if done:
                self.state = _PASS
            return ()
        spec = self.pending
        if spec is None:
            return (step,)
        if len(self.seen) < int(spec.param("after_events")):
            self.seen.append(step)
            return (step,)
        transform = spec.entry.session
        assert transform is not None
        out = transform((*self.seen, step), spec, self.protocol) or ()
        tail = out[len(self.seen) :]
        self.pending, self.seen = None, []
        if ends(tail):
            if not any(s is step for s in tail):
                self.state = _ENDED
        elif not any(s is step for s in tail) and not done:
            self.state = _CUT
        return tail

    def _broken(self) -> None:
        """The turn's answer is not the client's whole (the verdicts' ``turns``)."""
        if self.log is not None and self.log.turns:
            self.log.turns[-1] = (self.log.turns[-1][0], False)

    def shown(self, steps: tuple[Step, ...]) -> tuple[Step, ...]:
        """`steps` as the client gets them, noted in the session's log: a handle offered,
        a going away (the upstream's or a fault's)."""
        log = self.log
        if log is not None:
            for step in steps:
                if step.event is None:
                    continue
                handle = self.protocol.offered_handle(step.event)
                if handle is not None:
                    log.offered.append(handle)
                if self.protocol.going_away(step.event):
                    log.went_away = True
        return steps

    def _flush(self) -> tuple[Step, ...]:
        """A turn ended (the client's next turn, the upstream's end) before its fault
        fired: the fault's tail after all of its events, or the held turn transformed."""
        if self.state == _HOLD:
            return self._whole()
        spec = self.pending
        if spec is None:
            return ()
        transform = spec.entry.session
        assert transform is not None
        out = transform(tuple(self.seen), spec, self.protocol) or ()
        tail = out[len(self.seen) :]
        self.pending, self.seen = None, []
        if ends(tail):
            self.state = _ENDED
        return tail

    def _whole(self) -> tuple[Step, ...]:
        held, self.held = tuple(self.held), []
        self.state = _PASS
        request = RequestInfo(
            path=self.path, model=self.model, session=self.session, stream=True, turn=self.turns
        )
        out, fault = take_fault(self.board, request, held, self.protocol)
        if fault is not None:
            self.fired.append(fault)
            self._broken()
        self._journal(fault, self.miss)
        self.miss = False
        if ends(out):
            self.state = _ENDED
        return out

    def _journal(self, fault: dict[str, Any] | None, miss: bool = False) -> None:
        """One journal entry per relayed turn (``match: upstream``), with its fault."""
        journal_turn(
            self.journal,
            session=self.session,
            path=self.path,
            model=self.model,
            recording=None,
            how="upstream",
            miss=miss,
            fault=fault,
            steps=(),
        )
