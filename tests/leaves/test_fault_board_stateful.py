"""The fault board as a state machine, against a plain list of armed faults.

Hypothesis arms faults (several at a time, with `remaining`, a match on session,
model, path and stream, probability 1 or 0), disarms one or all, takes faults for
random requests (some fault types not applying to the answer), and resets; after
every step the board must agree with the model: faults fire in FIFO order, each one
exactly `remaining` times unless disarmed, disarmed faults never fire, and the
listing, the history and `may_fire` say what the model says."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    precondition,
    rule,
)

from chaosllm.faults import FaultBoard, RequestInfo, parse_fault_spec

TYPES = ["http_503", "http_429", "empty_reply", "latency", "malformed_tool_args"]
SESSIONS = [None, "a", "b"]
MODELS = ["m1", "m2"]
PATHS = ["/v1/chat/completions", "/v1/responses", "/v1/messages"]

matches: st.SearchStrategy[dict[str, Any]] = st.one_of(
    st.just({}),  # often: so that several armed faults match one request
    st.fixed_dictionaries(
        {},
        optional={
            "session": st.sampled_from(["a", "b"]),
            "model": st.sampled_from(MODELS),
            "path": st.sampled_from([*PATHS, *(p.removeprefix("/v1") for p in PATHS)]),
            "stream": st.booleans(),
        },
    ),
)
specs = st.fixed_dictionaries(
    {
        "type": st.sampled_from(TYPES),
        "remaining": st.integers(1, 4),
        "probability": st.sampled_from([1.0, 1.0, 1.0, 0.0]),
        "match": matches,
    }
)
requests = st.builds(
    RequestInfo,
    path=st.sampled_from(PATHS),
    model=st.sampled_from(MODELS),
    session=st.sampled_from(SESSIONS),
    stream=st.booleans(),
)


@dataclass
class Armed:
    """The model of one armed fault."""

    id: str
    type: str
    remaining: int
    probability: float
    match: dict[str, Any]
    fired: int = 0

    def matches(self, request: RequestInfo) -> bool:
        m = self.match
        return (
            m.get("session", request.session) == request.session
            and m.get("model", request.model) == request.model
            and m.get("stream", request.stream) == request.stream
            and ("path" not in m or m["path"] in (request.path, request.path.removeprefix("/v1")))
        )


@dataclass
class Ledger:
    """Every fault ever armed: how many times it may fire and how many it did."""

    allowed: dict[str, int] = field(default_factory=dict)
    fired: dict[str, int] = field(default_factory=dict)
    gone: set[str] = field(default_factory=set)
    """Disarmed (one, all, or by a reset): these must never fire again."""


class FaultBoardMachine(RuleBasedStateMachine):
    faults = Bundle("faults")

    def __init__(self) -> None:
        super().__init__()
        self.board = FaultBoard(seed=7)
        self.armed: list[Armed] = []
        """The model: the armed faults in the order they fire."""
        self.history: list[tuple[str, str, str | None, str, int]] = []
        self.ledger = Ledger()

    def _disarmed(self, ids: set[str]) -> None:
        self.ledger.gone |= ids
        self.armed = [f for f in self.armed if f.id not in ids]

    @rule(target=faults, batch=st.lists(specs, min_size=1, max_size=3))
    def arm(self, batch: list[dict[str, Any]]) -> Any:
        armed = self.board.arm([parse_fault_spec(spec) for spec in batch])
        ids = [a.id for a in armed]
        assert len(set(ids)) == len(ids)
        assert not set(ids) & set(self.ledger.allowed), "a fault id was used again"
        for fault_id, spec in zip(ids, batch, strict=True):
            self.armed.append(
                Armed(fault_id, spec["type"], spec["remaining"], spec["probability"], spec["match"])
            )
            self.ledger.allowed[fault_id] = spec["remaining"]
            self.ledger.fired[fault_id] = 0
        return multiple(*ids)

    @rule(fault_id=faults)
    def disarm_one(self, fault_id: str) -> None:
        expected = sum(f.id == fault_id for f in self.armed)
        assert self.board.disarm(fault_id) == expected
        self._disarmed({fault_id})

    @rule()
    def disarm_all(self) -> None:
        assert self.board.disarm() == len(self.armed)
        self._disarmed({f.id for f in self.armed})

    @rule()
    def reset(self) -> None:
        self.board.reset()
        self._disarmed({f.id for f in self.armed})
        self.history.clear()

    @rule(request=requests, not_applying=st.sets(st.sampled_from(TYPES), max_size=2))
    def take(self, request: RequestInfo, not_applying: set[str]) -> None:
        assert self.board.may_fire(request) == any(f.matches(request) for f in self.armed)
        fired = self.board.take(request, applies=lambda spec: spec.type not in not_applying)
        expected = next(
            (
                f
                for f in self.armed
                if f.matches(request) and f.type not in not_applying and f.probability > 0
            ),
            None,
        )
        if expected is None:
            assert fired is None, fired
            return
        assert fired is not None, f"{expected} should have fired"
        assert fired.fault_id not in self.ledger.gone, "a disarmed fault fired"
        assert (fired.fault_id, fired.type) == (expected.id, expected.type), "not FIFO"
        expected.remaining -= 1
        expected.fired += 1
        assert (fired.session, fired.path, fired.left) == (
            request.session,
            request.path,
            expected.remaining,
        )
        self.ledger.fired[fired.fault_id] += 1
        if expected.remaining == 0:
            self.armed.remove(expected)
        self.history.append((fired.fault_id, fired.type, request.session, request.path, fired.left))

    @precondition(lambda self: bool(self.armed))
    @rule(data=st.data())
    def take_what_one_fault_matches(self, data: st.DataObject) -> None:
        """A request built to match an armed fault (random requests seldom match the
        narrow ones)."""
        fault = data.draw(st.sampled_from(self.armed))
        path = fault.match.get("path", "/v1/chat/completions")
        request = RequestInfo(
            path=path if path.startswith("/v1") else "/v1" + path,
            model=fault.match.get("model", "m1"),
            session=fault.match.get("session"),
            stream=fault.match.get("stream", False),
        )
        assert fault.matches(request)
        self.take(request, set())

    @invariant()
    def listing_is_the_model(self) -> None:
        listed = [
            (a["id"], a["type"], a["remaining"], a["fired"], a["probability"], a.get("match", {}))
            for a in self.board.armed()
        ]
        assert listed == [
            (f.id, f.type, f.remaining, f.fired, f.probability, f.match) for f in self.armed
        ]
        assert len(self.board) == len(self.armed)

    @invariant()
    def history_is_the_model(self) -> None:
        assert [
            (h.fault_id, h.type, h.session, h.path, h.left) for h in self.board.history()
        ] == self.history
        for session in SESSIONS:
            assert [h.fault_id for h in self.board.history(session)] == [
                h[0] for h in self.history if session is None or h[2] == session
            ]

    @invariant()
    def each_fault_fires_exactly_remaining_times(self) -> None:
        still = {f.id: f.remaining for f in self.armed}
        for fault_id, allowed in self.ledger.allowed.items():
            fired = self.ledger.fired[fault_id]
            if fault_id in still:
                assert fired + still[fault_id] == allowed
            elif fault_id not in self.ledger.gone:
                assert fired == allowed, (fault_id, fired, allowed)  # used up
            else:
                assert fired <= allowed


FaultBoardMachine.TestCase.settings = settings(
    max_examples=50, stateful_step_count=50, deadline=None
)
TestFaultBoard = FaultBoardMachine.TestCase
