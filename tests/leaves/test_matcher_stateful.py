"""The matcher as a state machine over a small in-memory store, against a plain model.

Hypothesis lays out a few recordings (some sharing one request digest, in two
scenarios), then matches requests per session (consuming at once, or later with
`consume`), selects scenarios per session or for all, and resets. The model says
what must be served: exact matches go through the recordings of one digest in file
order per session and the last one repeats; with a scenario active, a request no
recording answers gets the scenario's next exchange this session has not been
served; nothing advances until a match is consumed; a reset rewinds every session
and forgets what was served; sessions never see each other's progress."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from chaosllm.config import Strategy
from chaosllm.errors import NoMatch, UnknownScenario
from chaosllm.model import Exchange, RecordedRequest, RecordedResponse
from chaosllm.providers.openai_chat import OpenAIChat
from chaosllm.store.matching import Match, Matcher
from chaosllm.store.recordings import RecordingStore

P = OpenAIChat()
SESSIONS = [None, "a", "b"]
SCENARIOS = ["alpha", "beta"]
QUESTIONS = [
    {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"question {i}"}]}
    for i in range(3)
]
"""Requests; the layout records answers to the first two only."""
DIGESTS = [P.digest(q) for q in QUESTIONS]

layouts = st.lists(
    st.tuples(st.integers(0, len(QUESTIONS) - 2), st.sampled_from(SCENARIOS)),
    min_size=1,
    max_size=7,
)


def exchange(number: int, question: int, scenario: str) -> Exchange:
    body = QUESTIONS[question]
    return Exchange(
        provider=P.name,
        request=RecordedRequest("POST", "/v1/chat/completions", body),
        response=RecordedResponse(200, {"id": f"chatcmpl-{number}", "choices": []}),
        digest=P.digest(body),
        name=f"{scenario}/{number:04d}",
        scenario=scenario,
    )


@dataclass
class SessionModel:
    scenario: str | None
    used: set[str] = field(default_factory=set)
    served_of: dict[str, int] = field(default_factory=dict)
    """How many exact matches of each digest this session consumed."""


class MatcherModel:
    def __init__(self, exchanges: list[Exchange]) -> None:
        self.exchanges = exchanges
        self.default: str | None = None
        self.sessions: dict[str | None, SessionModel] = {}
        self.served: set[str] = set()

    def state(self, session: str | None) -> SessionModel:
        if session not in self.sessions:
            self.sessions[session] = SessionModel(self.default)
        return self.sessions[session]

    def match(self, session: str | None, digest: str) -> tuple[str, Strategy] | None:
        state = self.state(session)
        recorded = [e for e in self.exchanges if e.digest == digest]
        if recorded:
            if state.scenario is not None:
                recorded = [e for e in recorded if e.scenario == state.scenario] or recorded
            position = min(state.served_of.get(digest, 0), len(recorded) - 1)
            return recorded[position].name, Strategy.EXACT
        if state.scenario is None:
            return None
        for e in self.exchanges:
            if e.scenario == state.scenario and e.name not in state.used:
                return e.name, Strategy.SEQUENCE
        return None

    def consume(self, session: str | None, exchange: Exchange, strategy: Strategy) -> None:
        state = self.state(session)
        state.used.add(exchange.name)
        self.served.add(exchange.name)
        if strategy is Strategy.EXACT:
            state.served_of[exchange.digest] = state.served_of.get(exchange.digest, 0) + 1

    def set_scenario(self, scenario: str | None, session: str | None) -> None:
        if session is None:
            self.default = scenario
            self.sessions.clear()
        self.sessions[session] = SessionModel(scenario)

    def reset(self) -> None:
        self.sessions.clear()
        self.served.clear()


class MatcherMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pending: dict[str | None, Match] = {}
        """Matches made with consume=False, not consumed yet, by session."""
        self.sequenced: dict[str | None, Exchange] = {}
        """The exchange the sequence last served, by session."""

    @initialize(layout=layouts)
    def load(self, layout: list[tuple[int, str]]) -> None:
        store = RecordingStore(dirs=[])
        exchanges = [exchange(n, q, s) for n, (q, s) in enumerate(layout, start=1)]
        for e in exchanges:
            store.add(e)
        self.matcher = Matcher(store, order=(Strategy.EXACT, Strategy.SEQUENCE))
        self.model = MatcherModel(exchanges)

    @rule(
        session=st.sampled_from(SESSIONS),
        # the unrecorded question often: sequence matching serves it
        question=st.one_of(st.just(len(QUESTIONS) - 1), st.integers(0, len(QUESTIONS) - 1)),
        consume=st.booleans(),
    )
    def match(self, session: str | None, question: int, consume: bool) -> None:
        body, digest = QUESTIONS[question], DIGESTS[question]
        expected = self.model.match(session, digest)
        if expected is None:
            with pytest.raises(NoMatch):
                self.matcher.match(P, body, digest, session, consume=consume)
            return
        found = self.matcher.match(P, body, digest, session, consume=consume)
        assert (found.exchange.name, found.strategy) == expected
        if consume:
            self._consumed(session, found)
        else:
            self.pending[session] = found

    def _consumed(self, session: str | None, found: Match) -> None:
        self.model.consume(session, found.exchange, found.strategy)
        if found.strategy is Strategy.SEQUENCE:
            self.sequenced[session] = found.exchange

    @precondition(lambda self: bool(self.pending))
    @rule(data=st.data())
    def consume_later(self, data: st.DataObject) -> None:
        session = data.draw(st.sampled_from(sorted(self.pending, key=str)))
        found = self.pending.pop(session)
        self.matcher.consume(found, session)
        self._consumed(session, found)

    @precondition(lambda self: bool(self.sequenced))
    @rule(data=st.data())
    def ask_what_the_sequence_served(self, data: st.DataObject) -> None:
        """The recorded request of an exchange the sequence served, asked in the same
        session: sequence matching leaves the exact matches' progress alone."""
        session = data.draw(st.sampled_from(sorted(self.sequenced, key=str)))
        question = QUESTIONS.index(self.sequenced.pop(session).request.body)
        self.match(session, question, consume=True)

    @rule(
        scenario=st.sampled_from([None, *SCENARIOS, "gamma"]),
        session=st.sampled_from(SESSIONS),
    )
    def set_scenario(self, scenario: str | None, session: str | None) -> None:
        loaded = {e.scenario for e in self.model.exchanges}
        if scenario is not None and scenario not in loaded:
            with pytest.raises(UnknownScenario):
                self.matcher.set_scenario(scenario, session)
            return
        self.matcher.set_scenario(scenario, session)
        self.model.set_scenario(scenario, session)

    @rule()
    def reset(self) -> None:
        self.matcher.reset()
        self.model.reset()

    @invariant()
    def unused_is_what_was_never_served(self) -> None:
        assert [e.name for e in self.matcher.unused()] == [
            e.name for e in self.model.exchanges if e.name not in self.model.served
        ]

    @invariant()
    def each_session_has_its_scenario(self) -> None:
        for session in SESSIONS:
            assert self.matcher.active_scenario(session) == self.model.state(session).scenario


MatcherMachine.TestCase.settings = settings(max_examples=50, stateful_step_count=50, deadline=None)
TestMatcher = MatcherMachine.TestCase
