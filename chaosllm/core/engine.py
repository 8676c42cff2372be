"""The engine: a provider call and the server's state in, a decision out, no I/O.

Theory of operation. `Engine.handle` is the whole request -> answer pipeline that
SPEC §8 calls the sans-IO core. For one `ProviderCall` (provider, path, session, raw
body, headers) it

1. parses and validates the body (a bad one is refused in the provider's 400 envelope),
2. redacts it and computes its digest over the redacted request, as the recorder keys it,
3. runs the request validator (`oracle.precheck`),
4. matches a recording (exact, sequence, nearest), or decides what a miss gets (the
   provider's 404 naming the nearest recordings, the canned fallback answer, or the
   upstream in record-missing mode),
5. reviews the match (`oracle.review`: trace checks, templating, structured outputs),
6. renders the exchange through its provider (a recording served to the session before
   gets fresh ids, as a real API mints new ones in every answer; the ids it minted are
   turned back into the recorded ones when a later request of the session echoes them)
   and lets the first armed fault that fires transform the plan (`chaosllm.faults`),
   consuming the recording only when the client still gets the answer,

and returns a `Reply` (the plan to execute, with its journal entry) or, in the proxy
modes, a `Proxy` (ask the upstream; `fault_upstream` later transforms its answer). In
the proxy modes a fault whose answer owes nothing to the upstream's (an error status, an
empty reply, a reset or garbage before any head: the catalogue's ``answers_alone``) is a
`Reply` without asking the upstream, and nothing is recorded. The engine changes only
its own in-memory state (journal, fault board, matcher cursors, the ids it minted); the
HTTP app and the record proxy are thin adapters that read bodies and write sockets. The
journal is written here and nowhere else: a status only when a head is sent, and how
the answer ends the connection (`chaosllm.core.journal.ending_of`).
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from chaosllm.config import Mode, OnMiss, RateLimit, ServerConfig, session_scenario
from chaosllm.core import mock_llm
from chaosllm.core.clock import Clock, SystemClock
from chaosllm.core.journal import Journal, JournalEntry, answer_facts, ending_of, head_status
from chaosllm.core.oracle import Refusal, Review, precheck, review, strict_refusal
from chaosllm.core.ratelimit import (
    Caller,
    RateLimiter,
    api_key,
    completion_tokens,
    key_id,
    prompt_tokens,
)
from chaosllm.errors import InvalidRequest, NoMatch
from chaosllm.faults import (
    FAULT_TYPES,
    FaultBoard,
    FaultContext,
    FaultSpec,
    Fired,
    RequestInfo,
    apply_fault,
    fault_applies,
)
from chaosllm.faults.live import Claimed, LiveChoice, LiveContext, LiveFault
from chaosllm.faults.transform import paced
from chaosllm.model import (
    JSON,
    Exchange,
    Piece,
    RecordedRequest,
    RecordedResponse,
    ResponsePlan,
)
from chaosllm.providers.base import JSON_HEADERS, ErrorKind, Provider, swap_strings
from chaosllm.providers.ratelimits import RateLimitState, openai_duration
from chaosllm.store.matching import Match, Matcher, Strategy
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

BAD_JSON = (
    "We could not parse the JSON body of your request. (HINT: This likely means you "
    "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, "
    "but what was sent was not valid JSON.)"
)

Headers = tuple[tuple[str, str], ...]

NO_RECORDING = "no_recording"
"""The ``code`` of the error a request no recording answers gets (chaosllm's own: a 404
that a framework may read as a wrong model name)."""


@dataclass(frozen=True, slots=True)
class ProviderCall:
    """One provider request, as the adapter read it off the wire."""

    provider: Provider
    path: str
    body: bytes
    session: str | None = None
    method: str = "POST"
    headers: Headers = ()
    """Request headers, names in lower case."""
    query: bytes = b""


@dataclass(frozen=True, slots=True)
class Reply:
    """Answer with `plan`."""

    plan: ResponsePlan
    entry: JournalEntry
    recording: str | None = None
    """The recording served (None: an error, a miss or the fallback answer)."""
    consumed: bool = False
    """Whether serving it advanced the session's place in its recordings."""
    fired: Fired | None = None
    """The fault that transformed the plan."""


@dataclass(frozen=True, slots=True)
class Proxy:
    """Ask the upstream, pass its answer through (record it when `record`), and hand it
    to `Engine.fault_upstream` first when `faultable`."""

    call: ProviderCall
    body: JSON
    """The request as recorded (redacted); None when it is not a JSON object that can be
    keyed (it is forwarded as it is, and neither recorded nor faulted)."""
    digest: str | None
    entry: JournalEntry
    record: bool
    faultable: bool
    headers: Headers = ()
    """Headers chaosllm adds to the answer."""
    drawn: tuple[FaultSpec, ...] = ()
    """Faults that drew (and lost) their probability for this request before it was
    forwarded: `fault_upstream` does not draw them again."""
    turn: int = 0
    """The session's n-th provider request (``match.turn``)."""


Decision = Reply | Proxy

_NO_ANSWER = ResponsePlan(status=200, headers=(), pieces=())
"""What a fault that answers alone transforms (it keeps nothing of it)."""


@dataclass(frozen=True, slots=True)
class _Reask:
    """The recording a ``reask`` fault broke, waiting for the session's re-ask."""

    exchange: Exchange
    """As reviewed for the request the fault broke (templated)."""
    match: Match
    fault_id: str
    request_seq: int


MINTED_PER_SESSION = 4096
"""How many fresh ids a session's requests are mapped back from (the newest)."""


@dataclass(slots=True)
class _Request:
    """What the engine has learnt about a call so far; becomes its journal record."""

    call: ProviderCall
    body: JSON
    digest: str
    stream: bool
    model: Any
    turn: int = 0
    """The session's n-th provider request since the last reset (from 1)."""
    fields: dict[str, Any] = field(default_factory=dict)
    prepared: _Prepared | None = None
    """The prepared body it was read from (a replay; None for a proxied request)."""

    def info(self, answer: JSON = None, *, answer_known: bool = True) -> RequestInfo:
        """What the fault board matches this request by, with the `answer` a fault would
        transform (`answer_known` false: not known yet)."""
        model = self.model if isinstance(self.model, str) else None
        call = self.call
        return RequestInfo(
            path=call.path,
            model=model,
            session=call.session,
            stream=self.stream,
            turn=self.turn,
            provider=call.provider,
            body=self.body,
            answer=answer,
            answer_known=answer_known,
        )

    def journal_fields(self) -> dict[str, Any]:
        call = self.call
        return {
            "session": call.session,
            "method": call.method,
            "path": call.path,
            "model": self.model,
            "stream": self.stream,
            "digest": self.digest,
            **self.fields,
        }


_LANES = 1024
"""How many quiet replays the engine keeps (`Engine._open_lane`)."""


@dataclass(frozen=True, slots=True)
class _Lane:
    """A quiet anonymous replay worked out once: the prepared body it answers, the
    recording the matcher chose, the plan sent, and its journal record after the sequence
    number and times (`JournalRecord[3:]`)."""

    prepared: _Prepared
    exchange: Exchange
    plan: ResponsePlan
    record: tuple[Any, ...]
    cors: bool
    """Whether DocsGPT's hash-keyed mode added its CORS headers (a reload may change it)."""


@dataclass(frozen=True, slots=True)
class _Prepared:
    """What a request body alone decides (see `Engine._prepare`). Shared by every request
    with the same bytes: never mutated."""

    body: JSON
    digest: str
    stream: bool
    model: Any
    findings: tuple[Mapping[str, Any], ...]


class _PreparedCache:
    """The prepared bodies of recent requests, keyed by their raw bytes: a client that
    sends the same request again (a retry, a load test, a replayed agent loop) skips
    parsing, validation, redaction and digesting. Bounded by entries and bytes, oldest
    first out; bodies larger than `max_body` are not kept."""

    def __init__(
        self, entries: int = 1024, total_bytes: int = 16 << 20, max_body: int = 256 << 10
    ) -> None:
        self.entries = entries
        self.total_bytes = total_bytes
        self.max_body = max_body
        self._items: dict[tuple[str, bytes], _Prepared] = {}
        self._bytes = 0

    def get(self, key: tuple[str, bytes]) -> _Prepared | None:
        return self._items.get(key)

    def put(self, key: tuple[str, bytes], value: _Prepared) -> None:
        size = len(key[1])
        if size > self.max_body or key in self._items:
            return
        items = self._items
        while items and (len(items) >= self.entries or self._bytes + size > self.total_bytes):
            oldest = next(iter(items))
            del items[oldest]
            self._bytes -= len(oldest[1])
        items[key] = value
        self._bytes += size

    def __len__(self) -> int:
        return len(self._items)


def _proxied(proxy: Proxy) -> _Request:
    """What the engine knows of a proxied request once the upstream answers (the request
    `fault_upstream` and `fault_live` fault), as `Engine._proxy` read it."""
    assert proxy.digest is not None
    body, provider = proxy.body, proxy.call.provider
    return _Request(
        proxy.call,
        body,
        proxy.digest,
        provider.wants_stream(body),
        provider.model_of(body),
        proxy.turn,
    )


def _bound_key(call: ProviderCall) -> str:
    """The prepared-body cache key of a provider with path parameters: its name, the path
    and the query (which `Provider.bind` folds into the request)."""
    return f"{call.provider.name}\x00{call.path}?{call.query.decode('latin-1')}"


def _bind(provider: Provider, body: JSON, call: ProviderCall) -> JSON:
    """`body` with what the call's path and query say folded in (`Provider.bind`), for a
    provider with path parameters (the body itself otherwise)."""
    if not provider.path_templates:
        return body
    params = provider.path_params(call.path)
    if params is None:
        if call.path not in provider.paths:
            raise InvalidRequest(f"{call.path} is not a path {provider.name} serves.")
        params = {}
    return provider.bind(body, params, call.query.decode("latin-1"))


_PLAN_FIELDS = tuple(f.name for f in fields(ResponsePlan))
_PIECES = _PLAN_FIELDS.index("pieces")


def _with_pieces(plan: ResponsePlan, pieces: tuple[Piece, ...]) -> ResponsePlan:
    """`plan` with other pieces (`dataclasses.replace` costs several times as much)."""
    values = [getattr(plan, name) for name in _PLAN_FIELDS]
    values[_PIECES] = pieces
    return ResponsePlan(*values)


def _with_live_headers(plan: ResponsePlan, live: Headers) -> ResponsePlan:
    """`plan` with the live rate-limit headers instead of any recorded ones."""
    if not live:
        return plan
    names = {name for name, _ in live}
    kept = tuple(h for h in plan.headers if h[0].lower() not in names)
    return plan.with_(headers=kept + live)


def _rendered(provider: Provider, body: JSON, answer: JSON, path: str, digest: str) -> Exchange:
    return Exchange(
        provider=provider.name,
        request=RecordedRequest(method="POST", path=path, body=body),
        response=RecordedResponse(status=200, body=answer),
        digest=digest,
        name="(rendered)",
        scenario="(rendered)",
    )


class Engine:
    """The store, matcher, fault board, journal and configuration of a server, and the
    one call that decides what a provider request gets (`handle`)."""

    def __init__(
        self,
        config: ServerConfig,
        store: RecordingStore,
        *,
        clock: Clock | None = None,
        board: FaultBoard | None = None,
        redactor: Redactor | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.matcher = Matcher(
            store,
            order=config.match_order,
            nearest_threshold=config.nearest_threshold,
            max_sessions=config.max_sessions,
            scenario_from_session=config.scenario_from_session,
        )
        self.journal = Journal(config.journal_size, clock=self.clock)
        self.board = (
            board
            if board is not None
            else FaultBoard(
                seed=config.seed,
                history_size=config.fault_history_size,
                max_sessions=config.max_sessions,
                monotonic=self.clock.monotonic,
            )
        )
        self.redactor = redactor if redactor is not None else Redactor(config.secrets)
        self._prepared = _PreparedCache()
        self._reviewed: dict[
            tuple[int, int, str | None, bool],
            tuple[JSON, Exchange, Exchange, tuple[dict[str, Any], ...], Refusal | None],
        ] = {}
        """Reviews of exact matches (`_review`), by prepared body and exchange."""
        self._lanes: dict[int, _Lane] = {}
        """Quiet replays worked out once (`_lane_reply`), by prepared body."""
        self._headed: dict[
            tuple[int, Headers],
            tuple[ResponsePlan, tuple[ResponsePlan, int | None, str, tuple[str, ...]]],
        ] = {}
        self._minted: OrderedDict[str | None, OrderedDict[str, str]] = OrderedDict()
        """Per session (the most recently used last), the fresh ids its answers carried,
        each mapped to the recorded id it stands for."""
        self._reasks: OrderedDict[str | None, _Reask] = OrderedDict()
        """Per session (the most recently used last), the recording a fault armed with
        ``reask`` broke: its next miss is answered with it (one each, newest wins)."""
        self._turns: OrderedDict[str | None, int] = OrderedDict()
        """Per session (the most recently used last), how many provider requests it made
        since the last reset (``match.turn``); the newest `max_sessions` sessions."""
        self._turns_lock = threading.Lock()
        self._paced: dict[int, tuple[ResponsePlan, ResponsePlan]] = {}
        """Renderings at the pace of ``--timing ttft=...`` without jitter, by rendering
        (the same every time: kept, so the caches after it keep hitting)."""
        self.limiter: RateLimiter | None = None
        """The live rate limits (``--rate-limit``; `set_rate_limit`); None: off."""
        if config.rate_limit is not None:
            self.set_rate_limit(config.rate_limit)

    # -- the decision -----------------------------------------------------------------

    def handle(self, call: ProviderCall, *, turn: int | None = None) -> Decision:
        """What `call` gets, as the mode says: a replayed recording (replay), that or the
        upstream's answer, recorded, when there is none (record-missing), always the
        upstream's answer, recorded (record) or not (passthrough). Armed faults apply in
        every mode. `turn`: the session's request number of a call handled again (None: a
        new request, counted)."""
        if turn is None:
            turn = self._next_turn(call.session)
        mode = self.config.mode
        if mode is Mode.RECORD or mode is Mode.PASSTHROUGH:
            return self._proxy_unparsed(call, record=mode is Mode.RECORD, turn=turn)
        if self._minted:
            minted = self._minted.get(call.session)
            if minted:
                body = call.provider.recorded_ids(call.body, minted)
                if body != call.body:
                    call = replace(call, body=body)
        provider = call.provider
        # A provider with path parameters reads the request off the path too.
        key = (_bound_key(call) if provider.path_templates else provider.name, call.body)
        prepared = self._prepared.get(key)
        if prepared is None:
            try:
                prepared = self._prepare(provider, call.body, call)
            except InvalidRequest as exc:
                plan = provider.render_error(
                    400,
                    exc.message,
                    kind=ErrorKind.INVALID_REQUEST,
                    code=exc.code,
                    param=exc.param,
                )
                entry = self.journal.add(
                    session=call.session,
                    method=call.method,
                    path=call.path,
                    model=None,
                    stream=False,
                    digest=None,
                    status=400,
                    ending="complete",
                    error=exc.message,
                )
                return Reply(plan, entry)
            self._prepared.put(key, prepared)
        if call.session is None and self._lanes:
            lane = self._lanes.get(id(prepared))
            if lane is not None and lane.prepared is prepared:
                quick = self._lane_reply(lane, call, turn)
                if quick is not None:
                    return quick
        body = prepared.body
        request = _Request(
            call, body, prepared.digest, prepared.stream, prepared.model, turn, prepared=prepared
        )
        findings = [dict(f) for f in prepared.findings]
        request.fields["findings"] = findings
        if findings and self.config.strict:
            return self._refuse(request, strict_refusal(findings))
        if mock_llm.MARKER in call.body and mock_llm.hash_keyed_mode(
            self.store.alias_keyings, provider.name
        ):
            directed = self._directed(request)  # DocsGPT's in-band directives win
            if directed is not None:
                return directed
        try:
            match = self.matcher.match(provider, body, request.digest, call.session, consume=False)
        except NoMatch as exc:
            return self._miss(request, exc)
        exchange = match.exchange
        request.fields.update(
            recording=exchange.name, match=match.strategy.value, score=round(match.score, 4)
        )
        checked = self._review(provider, body, match, findings)
        if checked.refusal is not None:
            return self._refuse(request, checked.refusal)
        extra = (
            ("x-chaosllm-recording", exchange.name),
            ("x-chaosllm-match", match.strategy.value),
        )
        return self._serve(request, checked.exchange, extra, match)

    def _serve(
        self,
        request: _Request,
        exchange: Exchange,
        extra: Headers,
        match: Match | None,
        *,
        faults: bool = True,
    ) -> Reply:
        """`exchange` rendered for the request, through the first armed fault that fires
        on it (none when not `faults`), and consumed from `match` when the client gets
        it."""
        provider = request.call.provider
        exchange = mock_llm.for_request(exchange, request.body)
        plan = provider.render(exchange, request.body, timing=self.config.timing)
        if self.config.pace is not None:
            plan = self._at_pace(plan, request)
        answer = exchange.response.body
        limited = None
        limiter = self.limiter
        if limiter is not None:  # the live rate limit: before any fault or consuming
            limited = self._take_rate(limiter, request.call, body=request.body, answer=answer)
            if not limited.allowed:
                return self._rate_limited(request.call, request.journal_fields(), limited)
        # Only when an armed fault matches the request is the board asked to fire one (and
        # the answer with fresh ids worked out for it to transform).
        may_fire = bool(self.board) and self.board.may_fire(request.info(answer))
        faultable = faults and may_fire
        # Fresh ids only within a session: anonymous requests always get the recording.
        pieces = None
        if match is not None and match.serves and request.call.session is not None:
            pieces, answer = self._fresh_ids(request, exchange, plan, match.serves, faultable)
        fired = None
        if faultable:
            # A fault transforms the plan with its fresh ids; when none fires, the plan
            # stays the rendering (so the head worked out for it is found again below).
            given = plan if pieces is None else plan.with_(pieces=pieces)
            faulted, fired = self._take_fault(request, given, answer)
            if fired is not None:
                plan, pieces = faulted, None
        consumed = match is not None and (fired is None or fired.spec.entry.delivers_answer)
        if consumed:
            assert match is not None
            self.matcher.consume(match, request.call.session)
        extra += (("x-chaosllm-digest", request.digest),)
        if mock_llm.hash_keyed_mode(self.store.alias_keyings, provider.name):
            extra += mock_llm.CORS_HEADERS  # as DocsGPT's stub answers
        if fired is None:
            plan, status, ending, estimated = self._headed_plan(plan, extra, request, exchange)
            if pieces is not None:  # fresh ids: the same lengths, so the same head and ending
                plan = _with_pieces(plan, pieces)
        else:  # faulted: a plan of its own, not kept
            status, ending = head_status(plan), ending_of(plan)
            estimated = provider.estimated(exchange.response, request.body)
            headers = plan.headers + extra
            plan = plan.with_(headers=headers, pieces=pieces if pieces is not None else plan.pieces)
        if estimated:
            request.fields["estimated"] = estimated
        if fired is None and status is not None and status >= 400:  # a recorded error
            request.fields.update(answer_facts(plan, False))
        if limited is not None:
            plan = _with_live_headers(plan, provider.rate_limit_headers(limited))
        if request.call.headers:  # the mock LLM's delay headers
            plan = mock_llm.delayed(plan, request.call.headers)
        entry = self.journal.add(**request.journal_fields(), status=status, ending=ending)
        if fired is not None:
            fired.request_seq = entry.seq
        if match is not None:
            self._remember_reask(request.call.session, exchange, match, fired, entry.seq)
            if fired is None and pieces is None and limited is None:
                self._open_lane(request, exchange, match, plan, entry, may_fire)
        return Reply(
            plan,
            entry,
            recording=exchange.name if match is not None else None,
            consumed=consumed,
            fired=fired,
        )

    # -- the quiet lane -----------------------------------------------------------------

    def _quiet(self) -> bool:
        """Whether nothing but the recording and the armed faults decides an anonymous
        replay's answer: no live rate limit, no pace, no re-ask waiting, no live workspace.
        (Whether a fault may fire on it: `FaultBoard.may_fire`.)"""
        return (
            self.limiter is None
            and self.config.pace is None
            and not self._reasks
            and self.matcher.workspace is None
        )

    def _open_lane(
        self,
        request: _Request,
        exchange: Exchange,
        match: Match,
        plan: ResponsePlan,
        entry: JournalEntry,
        may_fire: bool,
    ) -> None:
        """After an anonymous exact replay that nothing else shaped (no fault, finding,
        template, fresh ids, mock-LLM directive or delay) and that no armed fault matches
        (`may_fire`, as `_serve` asked the board): keep its plan and journal record, so
        that the same request repeated while the server is quiet is answered with them
        (`_lane_reply`), the matcher still choosing (and advancing) the recording."""
        call = request.call
        if (
            call.session is not None
            or call.headers
            or match.strategy is not Strategy.EXACT
            or match.request is not None
            or exchange is not match.exchange
            or request.fields.get("findings")
            or mock_llm.MARKER in call.body
            or not self._quiet()
            or may_fire
        ):
            return
        prepared = request.prepared
        if prepared is None:
            return
        lanes = self._lanes
        if len(lanes) >= _LANES:
            lanes.pop(next(iter(lanes)), None)
        cors = mock_llm.hash_keyed_mode(self.store.alias_keyings, call.provider.name)
        lanes[id(prepared)] = _Lane(prepared, exchange, plan, entry.record[3:], cors)

    def _lane_reply(self, lane: _Lane, call: ProviderCall, turn: int) -> Reply | None:
        """The kept answer to a quiet anonymous replay repeated (see `_open_lane`), when the
        server is still quiet for it and the matcher still picks the same recording (else
        None: the request takes the whole way)."""
        if call.headers or not self._quiet():
            return None
        prepared = lane.prepared
        if len(self.board):
            model = prepared.model
            info = RequestInfo(
                path=call.path,
                model=model if isinstance(model, str) else None,
                session=None,
                stream=prepared.stream,
                turn=turn,
                provider=call.provider,
                body=prepared.body,
                answer=lane.exchange.response.body,
            )
            if self.board.may_fire(info):
                return None
        provider = call.provider
        if mock_llm.hash_keyed_mode(self.store.alias_keyings, provider.name) is not lane.cors:
            return None
        try:
            match = self.matcher.match(
                provider, prepared.body, prepared.digest, None, consume=False
            )
        except NoMatch:
            return None
        if match.exchange is not lane.exchange or match.strategy is not Strategy.EXACT:
            return None
        self.matcher.consume(match, None)
        entry = self.journal.add_like(lane.record)
        return Reply(lane.plan, entry, recording=lane.exchange.name, consumed=True)

    def _review(
        self, provider: Provider, body: JSON, match: Match, findings: list[dict[str, Any]]
    ) -> Review:
        """`review`, worked out once for an exact match of the same prepared body (it is a
        function of the body, the exchange, the workspace and ``--strict`` alone); its
        findings are added to `findings` each time."""
        workspace, strict = self.matcher.workspace, self.config.strict
        if match.strategy is not Strategy.EXACT or match.request is not None:
            return review(
                provider, body, match, workspace=workspace, strict=strict, findings=findings
            )
        exchange = match.exchange
        key = (id(body), id(exchange), workspace, strict)
        kept = self._reviewed.get(key)
        if kept is not None and kept[0] is body and kept[1] is exchange:
            findings.extend([dict(f) for f in kept[3]])
            return Review(kept[2], findings, kept[4])
        before = len(findings)
        checked = review(
            provider, body, match, workspace=workspace, strict=strict, findings=findings
        )
        if len(self._reviewed) >= 1024:
            self._reviewed.pop(next(iter(self._reviewed)), None)
        added = tuple(dict(f) for f in findings[before:])
        self._reviewed[key] = (body, exchange, checked.exchange, added, checked.refusal)
        return checked

    def _headed_plan(
        self, plan: ResponsePlan, extra: Headers, request: _Request, exchange: Exchange
    ) -> tuple[ResponsePlan, int | None, str, tuple[str, ...]]:
        """`plan` with chaosllm's headers added, its journal status and ending, and what of
        it is estimated: worked out once for the same rendering with the same headers."""
        key = (id(plan), extra)
        kept = self._headed.get(key)
        if kept is not None and kept[0] is plan:
            return kept[1]
        estimated = request.call.provider.estimated(exchange.response, request.body)
        headed = (
            plan.with_(headers=plan.headers + extra),
            head_status(plan),
            ending_of(plan),
            estimated,
        )
        if len(self._headed) >= 1024:
            del self._headed[next(iter(self._headed))]
        self._headed[key] = (plan, headed)
        return headed

    def _remember_reask(
        self, session: str | None, exchange: Exchange, match: Match, fired: Fired | None, seq: int
    ) -> None:
        """After a recording is served to `session`: the re-ask a ``reask`` fault that broke
        it waits for, or none (the client got an answer: a later miss is no re-ask)."""
        reasks = self._reasks
        if fired is None or fired.spec.entry.delivers_answer or not fired.spec.reask:
            if reasks:
                reasks.pop(session, None)
            return
        reasks[session] = _Reask(exchange, match, fired.fault_id, seq)
        reasks.move_to_end(session)
        while len(reasks) > self.config.max_sessions:
            reasks.popitem(last=False)

    def _reask(self, request: _Request) -> Reply | None:
        """A miss that is the session's re-ask of a recording a ``reask`` fault broke:
        that recording, unfaulted (and consumed, as if the client had got it)."""
        waiting = self._reasks.pop(request.call.session, None) if self._reasks else None
        if waiting is None:
            return None
        exchange = waiting.exchange
        request.fields.update(recording=exchange.name, match="reask")
        log.info(
            "re-ask: %s answered from %s (broken by fault %s on request #%d)",
            request.digest,
            exchange.name,
            waiting.fault_id,
            waiting.request_seq,
        )
        extra = (("x-chaosllm-recording", exchange.name), ("x-chaosllm-match", "reask"))
        return self._serve(request, exchange, extra, waiting.match, faults=False)

    def _miss(self, request: _Request, exc: NoMatch) -> Decision:
        call, provider = request.call, request.call.provider
        reask = self._reask(request)
        if reask is not None:
            return reask
        mocked = provider.name == "openai.chat"
        if mocked:
            answered = self._mock_llm_miss(request)
            if answered is not None:
                return answered
            mocked = mock_llm.hash_keyed_mode(self.store.alias_keyings, provider.name)
            if mocked:
                mock_llm.log_miss(request.body)
        if self.config.mode is Mode.RECORD_MISSING:
            return self._proxy(call, request.body, record=True, miss=True, turn=request.turn)
        if self.config.on_miss is not OnMiss.FALLBACK:
            explanation = self._after_a_fault(call.session) + exc.explanation
            log.warning("miss: %s", explanation)
            plan = provider.render_error(
                404, explanation, kind=ErrorKind.NO_MATCH, code=NO_RECORDING
            )
            entry = self.journal.add(
                **request.journal_fields(),
                status=404,
                ending="complete",
                miss=True,
                error="no recording",
            )
            headers = (("x-chaosllm-match", "miss"), ("x-chaosllm-digest", request.digest))
            return Reply(plan.with_(headers=plan.headers + headers), entry)
        log.warning(
            "[chaosllm] unknown request digest %s (model %r): serving the fallback answer",
            request.digest,
            request.model,
        )
        if mocked:  # the stub's generic answer
            exchange = mock_llm.fallback_exchange(request.body)
        else:
            answer = provider.fallback(request.body, request.digest)
            exchange = _rendered(provider, request.body, answer, call.path, request.digest)
        request.fields.update(miss=True, match="fallback")
        return self._serve(request, exchange, (("x-chaosllm-match", "fallback"),), None)

    def _directed(self, request: _Request) -> Reply | None:
        """The answer a DocsGPT in-band directive pins (`chaosllm.core.mock_llm`), if any."""
        directed = mock_llm.directive_exchange(request.body)
        if directed is None:
            return None
        request.fields.update(match="directive")
        return self._serve(request, directed, (("x-chaosllm-match", "directive"),), None)

    def _mock_llm_miss(self, request: _Request) -> Decision | None:
        """A chat request no recording answers, as DocsGPT's stub would answer it: by an
        in-band directive, or by a ``<hash>.json`` saved into a recordings directory
        since the load (learnt, then the request handled again)."""
        call = request.call
        tried = mock_llm.hash_keyed_mode(self.store.alias_keyings, call.provider.name)
        if mock_llm.MARKER in call.body and not tried:  # (tried before matching)
            directed = self._directed(request)
            if directed is not None:
                return directed
        added = mock_llm.added_fixture(self.store.dirs, request.body)
        key = (call.provider.name, added[0].keyed_by, added[0].digest) if added else None
        if key is None or key in self.store.by_alias:
            return None  # none, or known already (and it did not answer)
        for exchange in added:
            self.learn(exchange)
        log.info("[mock-llm] loaded fixture %s saved while serving", added[0].source)
        return self.handle(call, turn=request.turn)

    def _refuse(self, request: _Request, refusal: Refusal) -> Reply:
        plan = request.call.provider.render_error(
            refusal.status,
            refusal.message,
            kind=refusal.kind,
            code=refusal.code,
            param=refusal.param,
        )
        entry = self.journal.add(
            **request.journal_fields(),
            status=refusal.status,
            ending="complete",
            error=refusal.error,
        )
        return Reply(plan.with_(headers=plan.headers + refusal.headers), entry)

    def _after_a_fault(self, session: str | None) -> str:
        """What a miss says first when the session's previous request was faulted: the
        likely cause is the client answering the broken response with a new request."""
        previous = self.journal.last(session)
        fault = previous.record.fault if previous is not None else None
        if previous is None or fault is None:
            return ""
        entry = FAULT_TYPES.get(str(fault.get("type")))
        if entry is not None and entry.delivers_answer:
            return ""  # the client got the answer: its next request is no re-ask
        broken = previous.record.recording
        return (
            f"The previous request of this session (#{previous.seq}) got the fault "
            f"{fault.get('type')!r} ({fault.get('id')})"
            + (f" instead of the recording {broken}" if broken else "")
            + ": this request is probably how the client answers a broken response (a "
            "retry prompt, the validation error, the tool error), and nobody recorded it. "
            "Record the flow with the fault armed (--mode record-missing), or let the "
            "test expect the client to give up.\n"
        )

    def _fresh_ids(
        self,
        request: _Request,
        exchange: Exchange,
        plan: ResponsePlan,
        serves: int,
        faultable: bool,
    ) -> tuple[tuple[Piece, ...] | None, JSON]:
        """The pieces and answer of a recording served to this session `serves` times
        before, with fresh ids (seeded by the server seed, the session, the recording and
        `serves`; None: it has none); the session's later requests that echo them are
        keyed as recorded. The answer with fresh ids only when a fault may transform it
        (`faultable`), else the recorded one."""
        session = request.call.session
        key = f"{self.config.seed}:{session!r}:{exchange.name}:{serves}"
        answer = exchange.response.body
        pieces, fresh = request.call.provider.fresh_ids(plan, answer, key)
        if not fresh:
            return None, answer
        kept = self._minted.get(session)
        if kept is None:
            kept = self._minted[session] = OrderedDict()
            if len(self._minted) > self.config.max_sessions:
                self._minted.popitem(last=False)
        else:
            self._minted.move_to_end(session)
        for old, new in fresh.items():
            kept[new] = old
        while len(kept) > MINTED_PER_SESSION:
            kept.popitem(last=False)
        # The answer a fault sees, with the same ids (only a fault needs it).
        return pieces, swap_strings(answer, fresh) if faultable else answer

    def _prepare(self, provider: Provider, raw: bytes, call: ProviderCall) -> _Prepared:
        """Parse, bind (`Provider.bind`: what the path and query say), validate and redact
        a request body, and what follows from it alone: its digest (over the redacted
        request, as the recorder keys it), whether it asks for a stream, its model, the
        request validator's findings. `InvalidRequest` for a body the provider refuses."""
        body = _bind(provider, parse_json(raw), call)
        provider.validate(body)
        body = self.redactor.request_body(body, raw)
        return _Prepared(
            body,
            provider.digest(body),
            provider.wants_stream(body),
            provider.model_of(body),
            tuple(precheck(provider, body)),
        )

    # -- faults -----------------------------------------------------------------------

    def _draw_key(self, request: _Request) -> str:
        """What seeds a request's random draws (a pace's jitter): the server seed, the
        session and its request number, so ``--seed`` repeats them exactly."""
        return f"{self.config.seed}:{request.call.session!r}:{request.turn}:timing"

    def _at_pace(self, plan: ResponsePlan, request: _Request) -> ResponsePlan:
        """`plan` at the pace of ``--timing ttft=...`` (`chaosllm.faults.transform.paced`)."""
        pace = self.config.pace
        assert pace is not None
        provider = request.call.provider
        if pace.jitter:
            return paced(plan, pace, provider, self._draw_key(request))
        kept = self._paced.get(id(plan))
        if kept is not None and kept[0] is plan:
            return kept[1]
        result = paced(plan, pace, provider, "")
        if len(self._paced) >= 1024:
            self._paced.pop(next(iter(self._paced)), None)
        self._paced[id(plan)] = (plan, result)
        return result

    def _take_fault(
        self,
        request: _Request,
        plan: ResponsePlan,
        answer: JSON,
        only: Callable[[FaultSpec], bool] | None = None,
        *,
        waits: Callable[[FaultSpec], None] | None = None,
    ) -> tuple[ResponsePlan, Fired | None]:
        """The plan after the fault that fires on this request (if any), consumed from the
        board; the same for a replayed answer and a live upstream one. `only`: which of
        the armed faults may (asked in FIFO order, before each one's draw). `waits`: the
        answer is not known yet (a proxied request before it is forwarded); told of a fault
        that may match the answer (`FaultBoard.take`)."""
        provider, body, digest = request.call.provider, request.body, request.digest
        path, timing, stream = request.call.path, self.config.timing, request.stream

        def render(new_answer: JSON) -> ResponsePlan:
            exchange = _rendered(provider, body, new_answer, path, digest)
            plan = provider.render(exchange, body, timing=timing)
            return plan if self.config.pace is None else self._at_pace(plan, request)

        ctx = FaultContext(
            provider=provider,
            stream=stream,
            answer=answer,
            render=render,
            request=body,
            draw_key=self._draw_key(request),
        )

        def applies(spec: FaultSpec) -> bool:
            return (only is None or only(spec)) and fault_applies(
                spec, provider, answer, request=body, stream=stream
            )

        info = request.info(answer, answer_known=waits is None)
        fired = self.board.take(info, applies, waits=waits)
        if fired is None:
            return plan, None
        faulted = apply_fault(fired.spec, plan, ctx)
        assert faulted is not None
        request.fields["fault"] = {
            **fired.spec.to_json(),
            "id": fired.fault_id,
            "params": fired.spec.effective_params(),
        }
        request.fields.update(answer_facts(faulted, request.stream))
        return faulted, fired

    def fault_upstream(self, proxy: Proxy, plan: ResponsePlan, answer: JSON) -> ResponsePlan:
        """A proxied answer, read whole, after the fault that fires on it (if any)."""
        request = _proxied(proxy)
        drawn = proxy.drawn

        def undrawn(spec: FaultSpec) -> bool:
            return not any(spec is d for d in drawn)

        faulted, fired = self._take_fault(request, plan, answer, undrawn if drawn else None)
        if fired is not None:
            fired.request_seq = proxy.entry.seq
            self.journal.amend(
                proxy.entry,
                **request.fields,
                status=head_status(faulted),
                ending=ending_of(faulted),
            )
        return faulted

    def fault_live(self, proxy: Proxy) -> LiveChoice:
        """At the head of a proxied stream (a 200 whose frames are about to arrive): the
        streaming counterpart of `fault_upstream`. The armed faults are offered in FIFO
        order, as there; the first that matches decides. One with a streaming counterpart
        (`FaultType.live`) fires now and transforms the frames as they arrive
        (`LiveChoice.fault`); one that applies only to some answers (``malformed_tool_args``)
        is taken from the board when a frame shows it applies (`Claimed`), as long as no
        other fault matches after it; one without a counterpart needs the whole answer
        (`LiveChoice.buffered`: `fault_upstream`, which does not offer the faults again
        that were offered here). No fault: an empty choice."""
        request = _proxied(proxy)
        body, provider, stream = proxy.body, proxy.call.provider, request.stream
        ctx = LiveContext(provider, body)
        drawn = list(proxy.drawn)
        machines: dict[int, LiveFault] = {}
        deferred: list[FaultSpec] = []
        waiting = False

        def live(spec: FaultSpec) -> bool:
            nonlocal waiting
            if waiting or any(spec is d for d in proxy.drawn):
                return False
            entry = spec.entry
            machine = None
            if entry.live is not None and stream:
                machine = entry.live(spec, ctx)
            if machine is None or deferred:
                waiting = True  # it needs the whole answer: it and those after it wait
                return False
            if not entry.applies(provider, None):
                deferred.append(spec)  # taken when a frame shows it applies
                return False
            machines[id(spec)] = machine
            drawn.append(spec)
            return True

        def wait(spec: FaultSpec) -> None:
            nonlocal waiting
            waiting = True

        info = request.info(None, answer_known=False)
        fired = self.board.take(info, live, waits=wait)
        if fired is not None:
            self._fired_live(proxy, fired)
            return LiveChoice(fault=machines[id(fired.spec)])
        if waiting:
            later = replace(proxy, drawn=tuple(drawn))
            return LiveChoice(
                buffered=lambda plan, answer: self.fault_upstream(later, plan, answer)
            )
        if not deferred:
            return LiveChoice()
        pending = deferred[0]
        machine = pending.entry.live(pending, ctx) if pending.entry.live is not None else None
        assert machine is not None

        def claim() -> bool:
            fired = self.board.take(info, lambda spec: spec is pending)
            if fired is not None:
                self._fired_live(proxy, fired)
            return fired is not None

        return LiveChoice(fault=Claimed(machine, claim))

    def _fired_live(self, proxy: Proxy, fired: Fired) -> None:
        fired.request_seq = proxy.entry.seq
        fault = {**fired.spec.to_json(), "id": fired.fault_id}
        self.journal.amend(proxy.entry, fault={**fault, "params": fired.spec.effective_params()})

    def amend(self, entry: JournalEntry, **changes: Any) -> None:
        """What the proxy learnt about its answer (status, error), into the journal."""
        self.journal.amend(entry, **changes)

    # -- the proxy modes --------------------------------------------------------------

    def _proxy_unparsed(self, call: ProviderCall, *, record: bool, turn: int) -> Decision:
        # The upstream is the judge of the request: it is forwarded as it is, and only
        # recorded (and faulted) when it is a JSON object that can be keyed.
        try:
            parsed = _bind(call.provider, parse_json(call.body), call)
        except InvalidRequest:
            parsed = None
        body = self.redactor.request_body(parsed, call.body) if isinstance(parsed, dict) else None
        return self._proxy(call, body, record=record, miss=False, turn=turn)

    def _proxy(
        self, call: ProviderCall, body: JSON, *, record: bool, miss: bool, turn: int
    ) -> Decision:
        provider = call.provider
        problem = None
        if body is None:
            problem = "the request body is not a JSON object: forwarded, not recorded"
        digest = provider.digest(body) if body is not None else None
        stream = provider.wants_stream(body)
        model = provider.model_of(body) if body is not None else None
        model = model if isinstance(model, str) else None
        info = RequestInfo(
            path=call.path,
            model=model,
            session=call.session,
            stream=stream,
            turn=turn,
            provider=provider,
            body=body,
            answer_known=False,
        )
        headers: Headers = (("x-chaosllm-match", "upstream"),)
        if digest is not None:
            headers += (("x-chaosllm-digest", digest),)
        limiter = self.limiter
        if limiter is not None:  # the live rate limit: the prompt's tokens (the answer's
            # are not known before it is asked for)
            limited = self._take_rate(limiter, call, body=body, answer=None)
            if not limited.allowed:
                fields = {
                    "session": call.session,
                    "method": call.method,
                    "path": call.path,
                    "model": model,
                    "stream": stream,
                    "digest": digest,
                    "match": "upstream",
                    "miss": miss,
                }
                return self._rate_limited(call, fields, limited)
            headers += provider.rate_limit_headers(limited)
        faultable = body is not None and len(self.board) > 0 and self.board.may_fire(info)
        drawn: tuple[FaultSpec, ...] = ()
        if faultable:
            assert digest is not None
            request = _Request(call, body, digest, stream, model, turn)
            request.fields.update(match="upstream", miss=miss)
            reply, drawn, faultable = self._answer_alone(request, headers)
            if reply is not None:
                return reply
        entry = self.journal.add(
            session=call.session,
            method=call.method,
            path=call.path,
            model=model,
            stream=stream,
            digest=digest,
            match="upstream",
            miss=miss,
            error=problem,
            status=0,
        )
        return Proxy(
            call,
            body,
            digest,
            entry,
            record=record and body is not None,
            faultable=faultable,
            headers=headers,
            drawn=drawn,
            turn=turn,
        )

    def _answer_alone(
        self, request: _Request, headers: Headers
    ) -> tuple[Reply | None, tuple[FaultSpec, ...], bool]:
        """Before a proxied request is forwarded: the `Reply` of a fault that answers it
        without the upstream's answer (the first armed one that fires, as long as no fault
        armed before it needs that answer), else the faults that drew their probability
        and lost (not to be drawn again on the answer), and whether one armed later may
        still fire on the answer."""
        stream = request.stream
        drawn: list[FaultSpec] = []
        waiting = False

        def alone(spec: FaultSpec) -> bool:
            nonlocal waiting
            if waiting:
                return False
            if spec.entry.answers_alone(spec, stream):
                drawn.append(spec)
                return True
            waiting = True  # this one needs the answer: it and those after it wait for it
            return False

        def wait(spec: FaultSpec) -> None:
            nonlocal waiting
            waiting = True  # it may match the answer: it and those after it wait for it

        plan, fired = self._take_fault(request, _NO_ANSWER, None, alone, waits=wait)
        if fired is None:
            return None, tuple(drawn), waiting
        entry = self.journal.add(
            **request.journal_fields(), status=head_status(plan), ending=ending_of(plan)
        )
        fired.request_seq = entry.seq
        return Reply(plan.with_(headers=plan.headers + headers), entry, fired=fired), (), False

    # -- live rate limits ------------------------------------------------------------

    def set_rate_limit(self, limit: RateLimit | None) -> None:
        """Live rate limits from now on (every bucket full), or none (None)."""
        self.limiter = (
            RateLimiter(limit, self.clock, max_buckets=self.config.max_sessions)
            if limit is not None
            else None
        )

    def _take_rate(
        self, limiter: RateLimiter, call: ProviderCall, *, body: JSON, answer: JSON
    ) -> RateLimitState:
        """Charge the call's caller (its API key's id and session) for it: one request, its
        prompt's tokens and `answer`'s completion tokens."""
        key = api_key(call.headers, call.query)
        caller: Caller = (key_id(key) if key is not None else None, call.session)
        provider = call.provider
        prompt = prompt_tokens(provider, body, call.body)
        completion = completion_tokens(provider, answer, body) if answer is not None else 0
        return limiter.take(caller, prompt, completion)

    def _rate_limited(
        self, call: ProviderCall, fields: dict[str, Any], state: RateLimitState
    ) -> Reply:
        """The provider's 429 for a caller whose buckets are empty, with ``Retry-After``
        (whole seconds) and ``retry-after-ms`` saying the exact wait, and its live
        headers."""
        provider = call.provider
        wait_ms = max(1, math.ceil(state.retry_after * 1000 - 1e-6))
        meter = state.requests if state.exhausted == "requests" else state.tokens
        assert meter is not None
        what = "requests per min (RPM)"
        if state.exhausted != "requests":
            what = "tokens per min (TPM)"
        model = fields.get("model")
        message = (
            f"Rate limit reached for {model if isinstance(model, str) else 'this model'} on "
            f"{what}: Limit {meter.limit}, Remaining {meter.remaining}. Please try again in "
            f"{openai_duration(wait_ms / 1000)}. (chaosllm --rate-limit)"
        )
        body = provider.error_body(429, message)
        headers = (
            JSON_HEADERS
            + provider.error_headers(429)
            + (
                ("retry-after", str(math.ceil(wait_ms / 1000))),
                ("retry-after-ms", str(wait_ms)),
            )
            + provider.rate_limit_headers(state)
        )
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        plan = ResponsePlan(status=429, headers=headers, pieces=(Piece(data, frame=False),))
        entry = self.journal.add(
            **{
                **fields,
                **answer_facts(plan, False),
                "status": 429,
                "ending": "complete",
                "error": "rate limited",
                "rate_limited": True,
            }
        )
        return Reply(plan, entry)

    # -- recordings and state ---------------------------------------------------------

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
        self._lanes.clear()

    def reset(self) -> None:
        """Disarm every fault, clear the journal and fault history, rewind sequences."""
        self.board.reset()
        self.journal.clear()
        self.matcher.reset()
        self._minted.clear()
        self._reasks.clear()
        self._lanes.clear()
        with self._turns_lock:
            self._turns.clear()
        if self.limiter is not None:
            self.limiter.clear()

    def _next_turn(self, session: str | None) -> int:
        """Count a provider request of `session`: its number since the last reset (from
        1). A session forgotten beyond `max_sessions` counts from 1 again."""
        with self._turns_lock:
            turns = self._turns
            turn = turns.get(session, 0) + 1
            turns[session] = turn
            if turn > 1:
                turns.move_to_end(session)
            elif len(turns) > self.config.max_sessions:
                turns.popitem(last=False)
            return turn


MAX_DEPTH = 128
"""The deepest nesting of arrays and objects a body may have (`parse_json`): deeper ones are
refused before anything recursive (validation, redaction, digests, rendering) sees them."""

_FLOAT_MAX = sys.float_info.max
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
_ENCODED_SURROGATE = re.compile(rb"\xed[\xa0-\xbf]")
"""A surrogate escape (``\\ud800``), or one encoded as UTF-8 (which `json.loads` lets
through): the only ways a lone surrogate gets into a decoded string."""
_SURROGATE = re.compile("[\ud800-\udfff]")
_FLOAT_DIGITS = len(str(int(_FLOAT_MAX)))
"""Digits of the largest float (309): an integer with more is beyond float range."""


def parse_json(raw: bytes) -> Any:
    """The JSON value of a body; `InvalidRequest` saying what is wrong when it is not JSON,
    nests deeper than `MAX_DEPTH`, holds a number that is no finite 64-bit float (NaN,
    Infinity, 1e999, an integer too long for one) or a lone UTF-16 surrogate (``\\ud800``,
    which no UTF-8 encoder can write back): nothing that would fail later to digest,
    render or log. Numbers are checked as they are read; the value is walked only when
    its bytes allow a refusal (deep nesting, a surrogate)."""
    try:
        encoding = json.detect_encoding(raw)  # as json.loads: UTF-8, -16 or -32
        value = _DECODER.decode(raw.decode(encoding, "surrogatepass"))
    except InvalidRequest:
        raise
    except RecursionError:
        raise _too_deep() from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise InvalidRequest(BAD_JSON, code="invalid_json") from None
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and _deeper_than(value, MAX_DEPTH):
        raise _too_deep()
    if (
        encoding != "utf-8"
        or (b"\\u" in raw and _ESCAPED_SURROGATE.search(raw))
        or (b"\xed" in raw and _ENCODED_SURROGATE.search(raw))
    ):
        _check_values(value)
    return value


def _too_deep() -> InvalidRequest:
    return InvalidRequest(
        f"The request body nests arrays and objects deeper than {MAX_DEPTH} levels, "
        "which chaosllm does not read.",
        code="invalid_json",
    )


def _non_finite(literal: str) -> Any:
    raise InvalidRequest(
        f"The request body holds {literal}, which is not JSON: numbers must be finite.",
        code="invalid_json",
    )


def _finite_float(literal: str) -> float:
    number = float(literal)
    if not math.isfinite(number):
        raise InvalidRequest(
            f"The request body holds the number {literal[:40]}, beyond the range of a "
            "64-bit float.",
            code="invalid_json",
        )
    return number


def _float_range_int(literal: str) -> int:
    digits = len(literal) - literal.startswith("-")
    if digits >= _FLOAT_DIGITS and (digits > _FLOAT_DIGITS or abs(int(literal)) > _FLOAT_MAX):
        raise InvalidRequest(
            f"The request body holds an integer of {digits} digits, beyond the range of a "
            "64-bit float.",
            code="invalid_json",
        )
    return int(literal)


_DECODER = json.JSONDecoder(
    parse_constant=_non_finite, parse_float=_finite_float, parse_int=_float_range_int
)


def _deeper_than(value: Any, limit: int) -> bool:
    if type(value) is not dict and type(value) is not list:
        return False
    stack = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        item, depth = pop()
        if depth > limit:
            return True
        for child in item.values() if type(item) is dict else item:
            kind = type(child)
            if kind is dict or kind is list:
                push((child, depth + 1))
    return False


def _check_values(value: Any) -> None:
    """`InvalidRequest` naming the first lone surrogate in `value` (in a key or a string),
    and where it is (``messages[0].content``)."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            found = _SURROGATE.search(item)
            if found is not None:
                where = _shown(path)
                raise InvalidRequest(
                    f"The request body holds a lone UTF-16 surrogate "
                    f"(\\u{ord(found.group()):04x}) at {where or 'the top level'}: a JSON "
                    "string must be valid Unicode (a surrogate escape needs its pair).",
                    param=where or None,
                    code="invalid_json",
                )
        elif isinstance(item, dict):
            for key, child in item.items():
                inner = f"{path}.{key}" if path else key
                stack.append((child, inner))
                stack.append((key, inner))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))


def _shown(path: str) -> str:
    """A place in a body, printable: a key may hold the surrogate itself (escaped here),
    and a long one is cut."""
    return path.encode("utf-8", "backslashreplace").decode("utf-8")[:200]
