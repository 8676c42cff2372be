"""The last stage: the one place a journal record is written (and, for a proxied answer,
amended), the recording consumed when the client gets it, the re-ask a fault armed with
``reask`` waits for, and the answer kept in the memo when nothing but the request and the
state version decided it (`again` answers the same call from it: a lookup)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from chaosllm.core.call import Answer, Chosen, ProviderCall, Reply, Request
from chaosllm.core.journal import JournalEntry, ending_of, head_status
from chaosllm.core.oracle import Refusal
from chaosllm.core.sessions import Reask
from chaosllm.faults import Fired, RequestInfo
from chaosllm.model import ResponsePlan
from chaosllm.store.matching import Match

if TYPE_CHECKING:
    from chaosllm.core.engine import Engine

__all__ = ["again", "alone", "amend", "limited", "missed", "pending", "refuse", "refused", "served"]

KEPT_COST = 512
"""What a kept answer holds besides its request's and its answer's bytes."""


@dataclass(frozen=True, slots=True)
class Kept:
    """A replayed answer worked out once: the plan, the journal record after its sequence
    number and times (`JournalRecord[3:]`), the match to consume again, and what the
    fault board matches the request by."""

    plan: ResponsePlan
    record: tuple[Any, ...]
    match: Match
    info: RequestInfo
    """What the board matches the request by (its ``turn`` is each request's own)."""


def _key(call: ProviderCall) -> tuple[Any, ...]:
    return (
        "reply",
        call.provider.name,
        call.path,
        call.query,
        call.body,
        call.headers,
        call.session,
        call.credentials,
    )


def _record(
    engine: Engine, fields: dict[str, Any], credentials: tuple[str, ...] = ()
) -> JournalEntry:
    """The one call that writes a new journal record (its error text redacted of the
    request's `credentials`: a miss message quotes the prompt)."""
    error = fields.get("error")
    if credentials and isinstance(error, str):
        fields["error"] = engine.redactor.carrying(credentials).text(error)
    return engine.journal.add(**fields)


def _stamped(
    engine: Engine,
    call: ProviderCall,
    plan: ResponsePlan,
    entry: JournalEntry,
    recording: str | None = None,
    consumed: bool = False,
    fired: Fired | None = None,
) -> Reply:
    """`plan` answered to `call`, carrying the request id the provider sends with every
    answer, derived from the server seed and the answer's place in the journal (so
    ``--seed`` gives every run the same ids, and no two answers of a run share one)."""
    stamped = call.provider.errors.stamped(plan, f"{engine.config.seed}:{entry.seq}")
    return Reply(stamped, entry, recording, consumed, fired)


def refused(engine: Engine, call: ProviderCall, plan: ResponsePlan, error: str) -> Reply:
    """A body the provider refuses (before it is known as a request)."""
    entry = _record(
        engine,
        {
            **call.journal_fields(None, False, None),
            "status": plan.status,
            "ending": "complete",
            "error": error,
        },
        call.credentials,
    )
    return _stamped(engine, call, plan, entry)


def _entry(engine: Engine, request: Request, plan: ResponsePlan, **fields: Any) -> JournalEntry:
    """The record of `request` answered with `plan` (its status and how it ends)."""
    return _record(
        engine,
        {
            **request.journal_fields(),
            "status": head_status(plan),
            "ending": ending_of(plan),
            **fields,
        },
        request.call.credentials,
    )


def _reply(engine: Engine, request: Request, plan: ResponsePlan, **fields: Any) -> Reply:
    return _stamped(engine, request.call, plan, _entry(engine, request, plan, **fields))


def refuse(engine: Engine, request: Request, refusal: Refusal) -> Reply:
    """A check's refusal, in the provider's shape."""
    plan = request.call.provider.render_error(
        refusal.status, refusal.message, kind=refusal.kind, code=refusal.code, param=refusal.param
    )
    return _reply(
        engine, request, plan.with_(headers=plan.headers + refusal.headers), error=refusal.error
    )


def missed(engine: Engine, request: Request, plan: ResponsePlan) -> Reply:
    """The provider's 404 for a request no recording answers."""
    return _reply(engine, request, plan, miss=True, error="no recording")


def limited(
    engine: Engine, call: ProviderCall, fields: dict[str, Any], plan: ResponsePlan
) -> Reply:
    """The live rate limit's 429 (`fields`: the request's, and the answer's facts)."""
    entry = _record(
        engine,
        {
            **fields,
            "status": 429,
            "ending": "complete",
            "error": "rate limited",
            "rate_limited": True,
        },
    )
    return _stamped(engine, call, plan, entry)


def alone(engine: Engine, request: Request, plan: ResponsePlan, fired: Fired) -> Reply:
    """A proxied request answered by a fault without asking the upstream."""
    entry = _entry(engine, request, plan)
    fired.request_seq = entry.seq
    return _stamped(engine, request.call, plan, entry, fired=fired)


def pending(engine: Engine, fields: dict[str, Any]) -> JournalEntry:
    """A proxied request, its answer awaited (status 0)."""
    return _record(engine, {**fields, "status": 0})


def amend(engine: Engine, entry: JournalEntry, **changes: Any) -> None:
    """What a proxied answer said (its status, a fault, how it ended), into its record."""
    engine.journal.amend(entry, **changes)


def served(engine: Engine, request: Request, chosen: Chosen, answer: Answer) -> Reply:
    """A recording (or a canned answer) served: consumed when the client gets it,
    journalled, the session's re-ask settled, and kept when nothing else decided it."""
    match, fired, plan = chosen.match, answer.fired, answer.plan
    session = request.call.session
    consumed = match is not None and (fired is None or fired.spec.entry.delivers_answer)
    if consumed:
        assert match is not None
        engine.matcher.consume(match, session)
    entry = _entry(engine, request, plan)
    if fired is not None:
        fired.request_seq = entry.seq
    if match is not None:
        if fired is None or fired.spec.entry.delivers_answer or not fired.spec.reask:
            engine.sessions.take_reask(session)  # the client got an answer: no re-ask
        else:
            reask = Reask(answer.exchange, match, fired.fault_id, entry.seq)
            engine.sessions.wait_reask(session, reask)
        if request.keep and fired is None and request.key is not None:
            kept = Kept(plan, entry.record[3:], match, request.info(answer.answer))
            size = len(request.call.body) + plan.body_length + KEPT_COST
            engine.memo.put(_key(request.call), kept, size, stateful=True)
    recording = answer.exchange.name if match is not None else None
    return _stamped(engine, request.call, plan, entry, recording, consumed, fired)


def again(engine: Engine, call: ProviderCall, turn: int) -> Reply | None:
    """The kept answer to `call`, when one is valid at the state version and no armed
    fault matches it (else None: the call takes every stage)."""
    kept: Kept | None = engine.memo.get(_key(call))
    if kept is None:
        return None
    board = engine.board
    if len(board) and board.may_fire(replace(kept.info, turn=turn)):
        return None
    engine.matcher.consume(kept.match, call.session)
    entry = engine.journal.add_like(kept.record)
    return _stamped(engine, call, kept.plan, entry, kept.match.exchange.name, True)
