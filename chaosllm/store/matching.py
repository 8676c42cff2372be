"""Which recording answers a request.

Matchers run in a configurable order (default ``exact,sequence,nearest``):

- **exact**: the request digest, O(1). Several recordings with one digest
  (an agent loop asking the same thing twice) are served in file order, one
  per request, per session; the last one repeats. A streaming request prefers
  the recordings made from a stream, a JSON request the others (each framing
  has its own turn), so that the same body asked both ways (``invoke`` then
  ``stream``) gets the recorded bytes of each; only when no recording has the
  request's framing is one of the other rendered.
- **sequence**: the next exchange of the active scenario not yet served to
  this session (`POST /__scenario`), whatever the request says.
- **nearest**: the most similar recording of the same provider over
  normalised text (ids, timestamps, absolute paths, ports normalised away),
  served when its similarity reaches the threshold. The score is the lower of
  the whole conversation's similarity and the latest turn's, so a long shared
  system prompt cannot make a different question look like a recorded one. It
  never pairs requests of different server-side conversations
  (`Codec.thread`: a Responses ``previous_response_id``), whose ids the
  normalisation would hide.

A miss raises `NoMatch` whose message names the digest and the nearest
recordings with how they differ. Per-session state (cursors, used exchanges,
active scenario, how often each exchange was served) lives here; sessions are the
``X-Chaosllm-Session`` header. With `scenario_from_session`, a session starts on the
scenario named after it (`chaosllm.config.session_scenario`) when one is loaded.
The state of at most `max_sessions` sessions is kept (``--max-sessions``): beyond that
the least recently used session is forgotten (`session_counts` counts them), and if it
is seen again it starts fresh, as after a reset: the active default scenario, every
sequence and cursor at its start. Sessions used more recently are untouched, so a run
is reproducible as long as fewer than `max_sessions` sessions are used at once. The
requests without a session share one state that is never forgotten.

Other fixture formats (`chaosllm.store.formats`) plug in through `Exchange.keyed_by`:

- hash-keyed fixtures are keyed by a digest of their own canonicalisation; when
  any are loaded and the request digest misses, exact matching computes the
  request's digest under that canonicalisation too and looks it up (still
  O(1)). The engine logs a miss as the hash-keyed stub does
  (`chaosllm.core.mock_llm.log_miss`), so that the answer can be saved as
  ``<hash>.json``;
- trace fixtures have no recorded requests: only sequence matching serves
  them. A session with no active scenario picks the trace whose ``model_name``
  is the request's model, or the only trace loaded, so a trace is served in
  order per session without ``POST /__scenario``; the next step is chosen as
  IronClaw's TraceLlm chooses it (`chaosllm.store.formats.trace.next_step`: by
  hint for interleaved threads, the next text step for a request without
  tools). A request past its last step, one for a model_name that several
  traces share, or one without tools when only tool steps are left, is a miss
  that says so.

The live workspace (`set_workspace`, ``POST /__workspace``) is turned back into
``<WORKSPACE>`` in requests before they are keyed (`chaosllm.store.templating`). Every
exchange served since the last reset is remembered for `unused`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from chaosllm.config import DEFAULT_ORDER, Strategy, session_scenario
from chaosllm.errors import ConfigError, NoMatch, UnknownScenario
from chaosllm.model import JSON, Exchange, Keying, StateVersion
from chaosllm.providers import PROVIDERS, Provider
from chaosllm.store.diff import json_differences
from chaosllm.store.formats import ALIAS_DIGESTS
from chaosllm.store.formats.trace import next_step as trace_next_step
from chaosllm.store.nearest import NearestIndex, similarity
from chaosllm.store.normalize import normalize_text
from chaosllm.store.recordings import RecordingStore
from chaosllm.store.templating import tokenize_workspace

__all__ = ["DEFAULT_ORDER", "Match", "Matcher", "Strategy"]

log = logging.getLogger("chaosllm")


Cursor = tuple[str, ...]
"""Which turn of several exact candidates a session is at (see `_cursor_key`)."""


@dataclass(frozen=True, slots=True)
class Match:
    exchange: Exchange
    strategy: Strategy
    score: float = 1.0
    request: JSON = None
    """The request body as it was matched, when not the one given (the live workspace
    turned into ``<WORKSPACE>``)."""
    cursor: Cursor | None = None
    """The exact-match cursor the match advances when consumed (None: the exchange's)."""
    serves: int = 0
    """How often the exchange was served (consumed) to this session before."""
    skips: tuple[str, ...] = ()
    """Trace steps passed over for good by this match (consumed with it)."""
    stable: bool = False
    """Whether the same request matches the same way however often it is consumed (an
    exact match of the only recording with its digest): until the state version changes
    (`chaosllm.model.StateVersion`), the engine may keep its answer."""


@dataclass
class _Session:
    scenario: str | None = None
    used: set[str] = field(default_factory=set)
    cursors: dict[Cursor, int] = field(default_factory=dict)
    served: dict[str, int] = field(default_factory=dict)
    """How often each exchange (by name) was served to the session."""


class Matcher:
    def __init__(
        self,
        store: RecordingStore,
        *,
        order: Sequence[Strategy] = DEFAULT_ORDER,
        nearest_threshold: float = 0.9,
        candidates: int = 3,
        max_sessions: int = 10_000,
        scenario_from_session: bool = False,
        version: StateVersion | None = None,
    ) -> None:
        if not 0.0 <= nearest_threshold <= 1.0:
            raise ValueError("nearest_threshold must be within [0, 1]")
        if isinstance(max_sessions, bool) or not (
            isinstance(max_sessions, int) and max_sessions >= 1
        ):
            raise ConfigError(f"max sessions must be an integer >= 1, not {max_sessions!r}")
        self.store = store
        self.order = tuple(order)
        self.nearest_threshold = nearest_threshold
        self.candidates = candidates
        self._lock = threading.Lock()
        self.max_sessions = max_sessions
        """How many sessions' state is kept (the most recently used; see the module doc)."""
        self.scenario_from_session = scenario_from_session
        """A new session starts on the scenario named after it, when one is loaded."""
        self._sessions: OrderedDict[str | None, _Session] = OrderedDict()
        """Each session's state, the least recently used first."""
        self._forgotten = 0
        """Sessions whose state was forgotten since the last reset."""
        self._index: NearestIndex | None = None
        self._keys_by_provider: dict[str, frozenset[int]] = {}
        self._default_scenario: str | None = None
        self._served: set[str] = set()
        self.workspace: str | None = None
        """The live workspace path (`set_workspace`)."""
        self.version = version if version is not None else StateVersion()
        """Bumped by every change of what a request matches (the engine's memo reads it)."""

    # -- state ------------------------------------------------------------------

    def _session(self, session: str | None) -> _Session:
        sessions = self._sessions
        state = sessions.get(session)
        if state is None:
            scenario = self._default_scenario
            if self.scenario_from_session and session is not None:
                own = session_scenario(session)
                if own in self.store.by_scenario:
                    scenario = own
            state = sessions[session] = _Session(scenario=scenario)
            if len(sessions) - (None in sessions) > self.max_sessions:
                self._forget_oldest()
        else:
            sessions.move_to_end(session)
        return state

    def _forget_oldest(self) -> None:
        """Forget the least recently used session (never the requests without one)."""
        sessions = self._sessions
        del sessions[next(key for key in sessions if key is not None)]
        if not self._forgotten:
            log.warning(
                "more than %d sessions: the state of the least recently used is forgotten "
                "(seen again, it starts fresh); --max-sessions raises the bound",
                self.max_sessions,
            )
        self._forgotten += 1

    def session_counts(self) -> dict[str, int]:
        """``sessions``: how many sessions' state is kept; ``sessions_dropped``: how many
        were forgotten (`max_sessions`) since the last reset."""
        with self._lock:
            return {
                "sessions": len(self._sessions) - (None in self._sessions),
                "sessions_dropped": self._forgotten,
            }

    def set_scenario(self, scenario: str | None, session: str | None = None) -> None:
        """Select the active scenario (None clears it) and rewind that session's sequence."""
        if scenario is not None and scenario not in self.store.by_scenario:
            known = ", ".join(sorted(self.store.by_scenario)) or "(none loaded)"
            raise UnknownScenario(f"unknown scenario {scenario!r}; loaded scenarios: {known}")
        with self._lock:
            if session is None:
                self._default_scenario = scenario
                self._sessions.clear()
            state = self._session(session)
            state.scenario = scenario
            state.used.clear()
            state.cursors.clear()
            self.version.bump()

    def active_scenario(self, session: str | None = None) -> str | None:
        with self._lock:
            return self._session(session).scenario

    def reset(self) -> None:
        """Rewind every sequence and cursor, forget what was served (the active default
        scenario and the workspace are kept)."""
        with self._lock:
            self._sessions.clear()
            self._served.clear()
            self._forgotten = 0
            self.version.bump()

    def set_workspace(self, path: str | None) -> None:
        """The live workspace path that ``<WORKSPACE>`` in recordings stands for (None:
        no templating)."""
        with self._lock:
            self.workspace = path or None
            self.version.bump()

    def unused(self) -> list[Exchange]:
        """The exchanges not served to any request since the last reset (or reload)."""
        with self._lock:
            served = set(self._served)
        return [e for e in self.store.exchanges if e.name not in served]

    def reloaded(self) -> None:
        """Forget state that refers to the previous contents of the store."""
        with self._lock:
            self._sessions.clear()
            self._served.clear()
            self._index = None
            if self._default_scenario not in self.store.by_scenario:
                self._default_scenario = None
            self.version.bump()

    def add(self, exchange: Exchange) -> None:
        """Add a new recording to the store and the indexes: later requests match it."""
        with self._lock:
            self.store.add(exchange)
            if self._index is not None:
                key = len(self.store.exchanges) - 1
                provider = PROVIDERS[exchange.provider]
                self._index.add(
                    key, normalize_text(provider.codec.match_text(exchange.request.body))
                )
                keys = self._keys_by_provider.get(exchange.provider, frozenset())
                self._keys_by_provider[exchange.provider] = keys | {key}
            self.version.bump()

    # -- matching ---------------------------------------------------------------

    def match(
        self,
        provider: Provider,
        body: JSON,
        digest: str,
        session: str | None = None,
        *,
        consume: bool = True,
    ) -> Match:
        """The recording that answers `body`. With ``consume=False`` nothing advances
        until `consume(match, session)`: a request whose answer a fault destroys leaves
        the sequence where it was, so the client's retry gets the same exchange."""
        workspace = self.workspace
        if workspace is not None:
            keyed = tokenize_workspace(body, workspace)
            if keyed is not body:
                body, digest = keyed, provider.digest(keyed)
        with self._lock:
            state = self._session(session)
            for strategy in self.order:
                found = self._try(strategy, provider, body, digest, state)
                if found is not None:
                    if workspace is not None:
                        found = dataclasses.replace(found, request=body)
                    if consume:
                        self._consume(found, state)
                    return found
            exhausted = (
                self._exhausted(state)
                + self._model_clash(state, provider, body)
                + self._no_text_step(state, provider, body)
            )
        raise NoMatch(digest, exhausted + self.explain_miss(provider, body, digest))

    def consume(self, match: Match, session: str | None = None) -> None:
        with self._lock:
            # The session was just matched (and moved to the end): no need to again.
            state = self._sessions.get(session)
            self._consume(match, state if state is not None else self._session(session))

    def _consume(self, match: Match, state: _Session) -> None:
        name = match.exchange.name
        state.used.add(name)
        self._served.add(name)
        if match.skips:
            state.used.update(match.skips)
            self._served.update(match.skips)
        state.served[name] = state.served.get(name, 0) + 1
        if match.strategy is Strategy.EXACT:
            key = match.cursor if match.cursor is not None else _cursor_key(match.exchange)
            state.cursors[key] = state.cursors.get(key, 0) + 1

    def _exhausted(self, state: _Session) -> str:
        """What a miss says first when the session's trace has no step left."""
        scenario = state.scenario
        if scenario is None or scenario not in self.store.sequence_scenarios:
            return ""
        steps = self.store.by_scenario.get(scenario, [])
        if not all(e.name in state.used for e in steps):
            return ""
        return (
            f"More LLM calls than the trace {scenario!r} has steps: all {len(steps)} of "
            f"its text/tool_calls steps were served to this session, and this is call "
            f"{len(steps) + 1}. The client made a call the trace did not record (POST "
            f"/__reset rewinds the trace for a new run).\n"
        )

    def _no_text_step(self, state: _Session, provider: Provider, body: JSON) -> str:
        """What a miss says first when a request without tools finds only tool steps."""
        scenario = state.scenario
        if scenario is None or scenario not in self.store.sequence_scenarios:
            return ""
        left = [
            e
            for e in self.store.by_scenario.get(scenario, ())
            if e.provider == provider.name and e.name not in state.used
        ]
        if not left or trace_next_step(left, body) is not None:
            return ""
        return (
            f"The request offers no tools, so it gets the trace's next text step (as "
            f"TraceLlm's complete() does), but the {len(left)} step(s) left of "
            f"{scenario!r} are all tool_calls steps: send the tools the agent offers.\n"
        )

    def _model_clash(self, state: _Session, provider: Provider, body: JSON) -> str:
        """What a miss says first when several traces answer as the request's model."""
        model = provider.model_of(body)
        if state.scenario is not None or not isinstance(model, str):
            return ""
        clash = [s for s, m in self.store.sequence_scenarios.items() if m == model]
        if len(clash) < 2:
            return ""
        files = ", ".join(f"{s} ({self._where(self.store.by_scenario[s][0])})" for s in clash)
        return (
            f"{len(clash)} traces share the model_name {model!r}, so the model cannot "
            f"choose one: {files}. Give each trace its own model_name, or select one with "
            f'POST /__scenario {{"scenario": NAME}} (per session: X-Chaosllm-Session).\n'
        )

    def _try(
        self, strategy: Strategy, provider: Provider, body: JSON, digest: str, state: _Session
    ) -> Match | None:
        if strategy is Strategy.EXACT:
            candidates = self.store.by_digest.get((provider.name, digest))
            if not candidates:
                candidates = self._alias_candidates(provider, body)
            if not candidates:
                return None
            # Asked first, the only recording with the digest is the match whatever was
            # consumed before.
            stable = len(candidates) == 1 and self.order[0] is Strategy.EXACT
            if state.scenario is not None:
                in_scenario = [e for e in candidates if e.scenario == state.scenario]
                candidates = in_scenario or candidates
            key = _cursor_key(candidates[0])
            if len(candidates) > 1:
                # The recorded bytes of the request's framing, when there are some.
                stream = provider.wants_stream(body)
                framed = [e for e in candidates if e.response.stream == stream]
                if framed and len(framed) < len(candidates):
                    candidates = framed
                    key = (*key, "stream" if stream else "json")
            exchange = candidates[min(state.cursors.get(key, 0), len(candidates) - 1)]
            served = state.served.get(exchange.name, 0) if state.served else 0
            return Match(exchange, Strategy.EXACT, 1.0, None, key, served, stable=stable)
        if strategy is Strategy.SEQUENCE:
            if state.scenario is None:
                state.scenario = self._trace_for(provider, body)
            if state.scenario is None:
                return None
            step = trace_next_step(
                [
                    e
                    for e in self.store.by_scenario.get(state.scenario, ())
                    if e.provider == provider.name and e.name not in state.used
                ],
                body,
            )
            if step is None:
                return None
            exchange, skips = step
            return Match(
                exchange,
                Strategy.SEQUENCE,
                serves=state.served.get(exchange.name, 0),
                skips=skips,
            )
        hits = self._nearest(provider, body, 1)
        if not hits or hits[0][1] < self.nearest_threshold:
            return None
        thread = provider.codec.thread(body)
        if provider.codec.thread(hits[0][0].request.body) != thread:
            hits = [
                (exchange, score)
                for exchange, score in self._nearest(provider, body, 4)
                if provider.codec.thread(exchange.request.body) == thread
            ]
            if not hits or hits[0][1] < self.nearest_threshold:
                return None
        exchange, score = hits[0]
        return Match(exchange, Strategy.NEAREST, score, serves=state.served.get(exchange.name, 0))

    def _alias_candidates(self, provider: Provider, body: JSON) -> list[Exchange] | None:
        """The exchanges keyed by a digest of their own that answer `body`, if any."""
        for keyed_by in self.store.alias_keyings.get(provider.name, ()):
            try:
                alias = ALIAS_DIGESTS[keyed_by](body)
            except (TypeError, ValueError, AttributeError):
                continue
            found = self.store.by_alias.get((provider.name, keyed_by, alias))
            if found:
                return found
        return None

    def _trace_for(self, provider: Provider, body: JSON) -> str | None:
        """The trace a session with no active scenario follows: the one answering as the
        request's model, else the only one loaded."""
        traces = self.store.sequence_scenarios
        if not traces:
            return None
        model = provider.model_of(body)
        by_model = [s for s, m in traces.items() if m is not None and m == model]
        if len(by_model) == 1:
            return by_model[0]
        return next(iter(traces)) if len(traces) == 1 else None

    def _nearest(self, provider: Provider, body: JSON, k: int) -> list[tuple[Exchange, float]]:
        """The k best recordings by min(similarity of the whole conversation, similarity
        of the latest turn): both must be near-identical for a high score."""
        index = self._ensure_index()
        keys = self._keys_by_provider.get(provider.name)
        if not keys:
            return []
        text = normalize_text(provider.codec.match_text(body))
        turn = normalize_text(provider.codec.turn_text(body))
        scored = []
        for key, whole in index.query(text, k=max(4 * k, 12), keys=keys):
            exchange = self.store.exchanges[key]
            recorded_turn = normalize_text(provider.codec.turn_text(exchange.request.body))
            scored.append((exchange, min(whole, similarity(turn, recorded_turn))))
        scored.sort(key=lambda item: -item[1])
        return scored[:k]

    def _ensure_index(self) -> NearestIndex:
        if self._index is None:
            index = NearestIndex()
            keys: dict[str, set[int]] = {}
            for key, exchange in enumerate(self.store.exchanges):
                if exchange.keyed_by != Keying.REQUEST:
                    continue  # no recorded request to compare with
                provider = PROVIDERS[exchange.provider]
                index.add(key, normalize_text(provider.codec.match_text(exchange.request.body)))
                keys.setdefault(exchange.provider, set()).add(key)
            self._keys_by_provider = {p: frozenset(k) for p, k in keys.items()}
            self._index = index
        return self._index

    def warm(self) -> None:
        """Build the nearest index now rather than on the first request that needs it."""
        with self._lock:
            self._ensure_index()

    def _where(self, exchange: Exchange) -> str:
        if not exchange.source:
            return "in memory"
        return _relative(exchange.source, self.store.dirs)

    def explain_miss(self, provider: Provider, body: JSON, digest: str) -> str:
        model = provider.model_of(body)
        lines = [
            f"No recording matches this request (digest {digest}, provider "
            f"{provider.name}, model {model!r}; matchers tried: "
            f"{', '.join(s.value for s in self.order)})."
        ]
        nearest = self._nearest(provider, body, self.candidates)
        if nearest:
            lines.append("Nearest recordings (what differs: recorded != requested):")
            canonical = provider.canonical(body)
            for exchange, score in nearest:
                diffs = _differences(provider.canonical(exchange.request.body), canonical)
                lines.append(
                    f"  {exchange.name} (similarity {score:.2f}, {self._where(exchange)}): "
                    + ("; ".join(diffs) if diffs else "differs only in volatile values")
                )
        elif not self.store.sequence_scenarios:
            lines.append("No recordings of this provider are loaded.")
        if Keying.HASH_KEYED in self.store.alias_keyings.get(provider.name, ()):
            try:
                alias = ALIAS_DIGESTS[Keying.HASH_KEYED](body)
                lines.append(
                    f"Hash-keyed fixtures are loaded: this request's fixture hash "
                    f"is {alias}; save its answer as {alias}.json."
                )
            except (TypeError, ValueError, AttributeError):
                pass
        traces = self.store.sequence_scenarios
        if traces:
            lines.append(
                "Trace fixtures are served in order to a session following one: "
                "send the trace's model_name as the model, or select it with "
                'POST /__scenario {"scenario": NAME}; loaded traces: '
                + ", ".join(f"{s} (model_name {m!r})" for s, m in list(traces.items())[:10])
                + "."
            )
        lines.append(
            "Record it with --mode record-missing, serve a canned answer with "
            "--on-miss fallback, or see what is loaded (and the questions it answers) "
            f"with `chaosllm ls --provider {provider.name}`."
        )
        return "\n".join(lines)


def _relative(source: str, dirs: Sequence[Path]) -> str:
    """`source` relative to the recordings directory it is under, spelt with that
    directory's last component (``recordings/knowledge/0001.json``): an error a client
    reads names no absolute path of the machine."""
    for root in dirs:
        top = str(root).rstrip(os.sep)
        if source.startswith(top + os.sep):
            return f"{os.path.basename(top) or top}/{source[len(top) + 1 :]}".replace(os.sep, "/")
    return os.path.basename(source)


def _cursor_key(exchange: Exchange) -> Cursor:
    """The exact-match cursor of the exchanges sharing `exchange`'s key."""
    if exchange.keyed_by == Keying.REQUEST:
        return (exchange.provider, exchange.digest)
    return (exchange.provider, f"{exchange.keyed_by}:{exchange.digest}")


def _differences(recorded: JSON, requested: JSON) -> list[str]:
    """Where two canonical requests differ; when their conversations have different
    lengths, their last messages are compared first (index-by-index is then noise)."""
    lines: list[str] = []
    if isinstance(recorded, dict) and isinstance(requested, dict):
        a, b = recorded.get("messages"), requested.get("messages")
        if isinstance(a, list) and isinstance(b, list) and a and b and len(a) != len(b):
            lines = [
                f"last message.{line}" if not line.startswith("$") else "last message" + line[1:]
                for line in json_differences(a[-1], b[-1], limit=2)
            ]
    return lines + json_differences(recorded, requested, limit=4 - len(lines))
