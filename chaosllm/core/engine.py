"""The engine: a provider call and the server's state in, a decision out, no I/O.

Theory of operation. `Engine.handle` is the whole request -> answer pipeline that SPEC §8
calls the sans-IO core, as a list of named stages (`chaosllm.core.stages`, a module
each):

    prepare -> match -> review -> render -> limit -> mint -> fault -> shape -> finish

A request the memo kept an answer for at the current state version is answered by
`finish.again` instead: a lookup (`chaosllm.core.memo`). In the proxy modes the decision
is a `Proxy` (`chaosllm.core.proxy`): ask the upstream, and let `fault_upstream` or
`fault_live` transform its answer. Behaviours only some modes or fixture formats need
plug in at the named hooks (`chaosllm.core.hooks`); the stages name none of them. The
engine changes only its own in-memory state (journal, fault board, matcher cursors,
sessions, memo); the HTTP app and the record proxy are thin adapters that read bodies and
write sockets. The journal is written by `chaosllm.core.stages.finish` and nowhere else.
"""

from __future__ import annotations

import logging
from typing import Any

from chaosllm.config import Mode, RateLimit, ServerConfig, session_scenario
from chaosllm.core import proxy
from chaosllm.core.background import StoredResponses
from chaosllm.core.call import Chosen, Decision, ProviderCall, Proxy, Reply, Request
from chaosllm.core.clock import Clock, SystemClock
from chaosllm.core.hooks import Hooks, default_hooks
from chaosllm.core.journal import Journal, JournalEntry
from chaosllm.core.memo import Memo
from chaosllm.core.parse import BAD_JSON, MAX_DEPTH, parse_json
from chaosllm.core.ratelimit import RateLimiter
from chaosllm.core.sessions import Sessions
from chaosllm.core.stages import fault, finish, limit, match, mint, prepare, render, review, shape
from chaosllm.core.stages.match import NO_RECORDING
from chaosllm.faults import FaultBoard
from chaosllm.faults.live import LiveChoice
from chaosllm.model import JSON, Exchange, ResponsePlan, StateVersion
from chaosllm.store.matching import Matcher
from chaosllm.store.recordings import RecordingStore
from chaosllm.store.redact import Redactor

__all__ = [
    "BAD_JSON",
    "MAX_DEPTH",
    "NO_RECORDING",
    "Decision",
    "Engine",
    "ProviderCall",
    "Proxy",
    "Reply",
    "parse_json",
]

log = logging.getLogger("chaosllm")


class Engine:
    """The store, matcher, fault board, journal, sessions, memo and configuration of a
    server, and the one call that decides what a provider request gets (`handle`)."""

    def __init__(
        self,
        config: ServerConfig,
        store: RecordingStore,
        *,
        clock: Clock | None = None,
        board: FaultBoard | None = None,
        redactor: Redactor | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        self.config = config
        self._store = store
        self.clock: Clock = clock if clock is not None else SystemClock()
        if board is None:
            board = FaultBoard(
                seed=config.seed,
                history_size=config.fault_history_size,
                max_sessions=config.max_sessions,
                max_faults=config.max_faults,
                monotonic=self.clock.monotonic,
            )
        self.board = board
        self.version: StateVersion = board.version
        """The state version: the board, the matcher, the sessions and the engine's own
        settings bump it (`chaosllm.core.memo`)."""
        self.matcher = Matcher(
            store,
            order=config.match_order,
            nearest_threshold=config.nearest_threshold,
            max_sessions=config.max_sessions,
            scenario_from_session=config.scenario_from_session,
            version=self.version,
        )
        self.journal = Journal(config.journal_size, clock=self.clock)
        self.redactor = redactor if redactor is not None else Redactor(config.secrets)
        self.sessions = Sessions(config.max_sessions, self.version)
        self.memo = Memo(self.version, max_bytes=config.memo_bytes)
        self.stored = StoredResponses(clock=self.clock)
        """The responses a client may ask for again (``background``, ``store``)."""
        self.hooks = hooks if hooks is not None else default_hooks()
        self.limiter: RateLimiter | None = None
        """The live rate limits (``--rate-limit``; `set_rate_limit`); None: off."""
        if config.rate_limit is not None:
            self.set_rate_limit(config.rate_limit)

    @property
    def store(self) -> RecordingStore:
        return self._store

    @store.setter
    def store(self, store: RecordingStore) -> None:
        """Serve from another store (its recordings decide the answers: a state change)."""
        self._store = store
        self.version.bump()

    # -- the decision -----------------------------------------------------------------

    def handle(self, call: ProviderCall, *, turn: int | None = None) -> Decision:
        """What `call` gets, as the mode says: a replayed recording (replay), that or the
        upstream's answer, recorded, when there is none (record-missing), always the
        upstream's answer, recorded (record) or not (passthrough). Armed faults apply in
        every mode. `turn`: the session's request number of a call handled again (None: a
        new request, counted)."""
        if turn is None:
            turn = self.sessions.next_turn(call.session)
        mode = self.config.mode
        if mode is Mode.RECORD or mode is Mode.PASSTHROUGH:
            return proxy.forward_unparsed(self, call, record=mode is Mode.RECORD, turn=turn)
        call = mint.echoed(self, call)
        kept = finish.again(self, call, turn)
        if kept is not None:
            return kept
        request = prepare.prepare(self, call, turn)
        if isinstance(request, Reply):
            return request
        chosen = match.match(self, request)
        if not isinstance(chosen, Chosen):
            return chosen
        chosen = review.review(self, request, chosen)
        if not isinstance(chosen, Chosen):
            return chosen
        return self.answer(request, chosen)

    def answer(self, request: Request, chosen: Chosen, *, faults: bool = True) -> Reply:
        """`chosen` served to `request`: rendered, charged, with fresh ids, through the
        first armed fault that fires on it (none when not `faults`), shaped, finished."""
        answer = render.render(self, request, chosen)
        refused = limit.limit(self, request, answer)
        if refused is not None:
            return refused
        faultable = fault.may_fire(self, request, answer) and faults
        mint.mint(self, request, chosen, answer, faultable)
        if faultable:
            fault.fault(self, request, answer)
        shape.shape(self, request, chosen, answer)
        return finish.served(self, request, chosen, answer)

    # -- proxied answers --------------------------------------------------------------

    def fault_upstream(self, proxied: Proxy, plan: ResponsePlan, answer: JSON) -> ResponsePlan:
        """A proxied answer, read whole, after the fault that fires on it (if any)."""
        return proxy.fault_upstream(self, proxied, plan, answer)

    def fault_live(self, proxied: Proxy) -> LiveChoice:
        """At the head of a proxied stream: the fault that transforms its frames as they
        arrive, if any (`chaosllm.core.proxy.fault_live`)."""
        return proxy.fault_live(self, proxied)

    def amend(self, entry: JournalEntry, **changes: Any) -> None:
        """What the proxy learnt about its answer (status, error), into the journal."""
        finish.amend(self, entry, **changes)

    # -- state ------------------------------------------------------------------------

    def set_rate_limit(self, limit: RateLimit | None) -> None:
        """Live rate limits from now on (every bucket full), or none (None)."""
        self.limiter = (
            RateLimiter(limit, self.clock, max_buckets=self.config.max_sessions)
            if limit is not None
            else None
        )
        self.version.bump()

    def recording_scenario(self, session: str | None) -> str:
        """Where a new recording made for `session` goes: its active scenario, else the
        scenario it names (``--scenario-from-session``), else the configured one."""
        active = self.matcher.active_scenario(session)
        if active is not None:
            return active
        if self.config.scenario_from_session and session is not None:
            return session_scenario(session)
        return self.config.record_scenario

    def learn(self, exchange: Exchange) -> None:
        """Serve a newly recorded exchange from now on."""
        self.matcher.add(exchange)

    def reload(self) -> None:
        self.store.reload()
        for error in self.store.errors:
            log.warning("skipped recording %s", error)
        self.matcher.reloaded()
        self.memo.clear()

    def reset(self) -> None:
        """Disarm every fault, clear the journal and fault history, rewind sequences,
        forget the sessions and empty the memo."""
        self.board.reset()
        self.journal.clear()
        self.matcher.reset()
        self.sessions.clear()
        self.memo.clear()
        self.stored.clear()
        if self.limiter is not None:
            self.limiter.clear()
