"""Stage 2: the recording that answers a request (the ``before_match`` hooks first, then
the matcher: exact, sequence, nearest), or what a miss gets: the recording a ``reask``
fault broke for the session, an ``on_miss`` hook's decision, the upstream in
record-missing mode, the provider's 404 naming the nearest recordings, or the canned
fallback answer."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from chaosllm.config import Mode, OnMiss
from chaosllm.core import proxy
from chaosllm.core.call import Chosen, Decision, Request
from chaosllm.core.stages import finish
from chaosllm.core.stages.render import rendered
from chaosllm.errors import NoMatch
from chaosllm.faults import FAULT_TYPES
from chaosllm.providers.base import ErrorKind

if TYPE_CHECKING:
    from chaosllm.core.engine import Engine

__all__ = ["NO_RECORDING", "match"]

log = logging.getLogger("chaosllm")

NO_RECORDING = "no_recording"
"""The ``code`` of the error a request no recording answers gets (chaosllm's own: a 404
that a framework may read as a wrong model name)."""


def match(engine: Engine, request: Request) -> Chosen | Decision:
    """The exchange chosen to answer `request`, or the decision a miss ends in."""
    for hook in engine.hooks.before_match:
        chosen = hook(engine, request)
        if chosen is not None:
            return chosen
    call = request.call
    try:
        found = engine.matcher.match(
            call.provider, request.body, request.digest, call.session, consume=False
        )
    except NoMatch as exc:
        return _miss(engine, request, exc)
    if not found.stable:
        request.keep = False  # the choice depends on where the session is in its recordings
    name = found.exchange.name
    request.fields.update(recording=name, match=found.strategy.value, score=round(found.score, 4))
    return Chosen(
        found.exchange,
        found,
        (("x-chaosllm-recording", name), ("x-chaosllm-match", found.strategy.value)),
    )


def _miss(engine: Engine, request: Request, exc: NoMatch) -> Decision:
    call, provider = request.call, request.call.provider
    waiting = engine.sessions.take_reask(call.session)
    if waiting is not None:
        exchange = waiting.exchange
        request.fields.update(recording=exchange.name, match="reask")
        log.info(
            "re-ask: %s answered from %s (broken by fault %s on request #%d)",
            request.digest,
            exchange.name,
            waiting.fault_id,
            waiting.request_seq,
        )
        headers = (("x-chaosllm-recording", exchange.name), ("x-chaosllm-match", "reask"))
        return engine.answer(request, Chosen(exchange, waiting.match, headers), faults=False)
    for hook in engine.hooks.on_miss:
        decided = hook(engine, request)
        if decided is not None:
            return decided
    if engine.config.mode is Mode.RECORD_MISSING:
        return proxy.forward(engine, call, request.body, record=True, miss=True, turn=request.turn)
    if engine.config.on_miss is not OnMiss.FALLBACK:
        explanation = _after_a_fault(engine, call.session) + exc.explanation
        log.warning("miss: %s", explanation)
        plan = provider.render_error(404, explanation, kind=ErrorKind.NO_MATCH, code=NO_RECORDING)
        headers = (("x-chaosllm-match", "miss"), ("x-chaosllm-digest", request.digest))
        return finish.missed(engine, request, plan.with_(headers=plan.headers + headers))
    log.warning(
        "[chaosllm] unknown request digest %s (model %r): serving the fallback answer",
        request.digest,
        request.model,
    )
    exchange = next(
        (e for e in (hook(engine, request) for hook in engine.hooks.fallback) if e is not None),
        None,
    ) or rendered(
        provider,
        request.body,
        provider.fallback(request.body, request.digest),
        call.path,
        request.digest,
    )
    request.fields.update(miss=True, match="fallback")
    return engine.answer(request, Chosen(exchange, None, (("x-chaosllm-match", "fallback"),)))


def _after_a_fault(engine: Engine, session: str | None) -> str:
    """What a miss says first when the session's previous request was faulted: the
    likely cause is the client answering the broken response with a new request."""
    previous = engine.journal.last(session)
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
