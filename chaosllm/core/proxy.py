"""The proxy modes' decisions: a request forwarded to the upstream (`forward`), what a
fault makes of it before it is forwarded (one whose answer owes nothing to the
upstream's is answered alone, and nothing is recorded), and what a fault makes of the
upstream's answer, read whole (`fault_upstream`) or as its frames arrive
(`fault_live`). The I/O is the record proxy's (`chaosllm.record.proxy`); the journal
records are written by `chaosllm.core.stages.finish`."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from chaosllm.core.call import Decision, Headers, ProviderCall, Proxy, Reply, Request
from chaosllm.core.journal import ending_of, head_status
from chaosllm.core.parse import parse_json
from chaosllm.core.stages import finish
from chaosllm.core.stages.fault import take
from chaosllm.core.stages.limit import charge, rate_limited
from chaosllm.core.stages.prepare import bind
from chaosllm.errors import InvalidRequest
from chaosllm.faults import FaultSpec, Fired
from chaosllm.faults.live import Claimed, LiveChoice, LiveContext, LiveFault
from chaosllm.model import JSON, ResponsePlan

if TYPE_CHECKING:
    from chaosllm.core.engine import Engine

__all__ = ["fault_live", "fault_upstream", "forward", "forward_unparsed"]

_NO_ANSWER = ResponsePlan(status=200, headers=(), pieces=())
"""What a fault that answers alone transforms (it keeps nothing of it)."""


def _proxied(proxy: Proxy) -> Request:
    """What the engine knows of a proxied request once the upstream answers."""
    assert proxy.digest is not None
    body, provider = proxy.body, proxy.call.provider
    return Request(
        proxy.call,
        body,
        proxy.digest,
        provider.wants_stream(body),
        provider.model_of(body),
        proxy.turn,
    )


def forward_unparsed(engine: Engine, call: ProviderCall, *, record: bool, turn: int) -> Decision:
    """Record and passthrough modes: the upstream is the judge of the request. It is
    forwarded as it is, and only recorded (and faulted) when it is a JSON object that
    can be keyed."""
    try:
        raw = call.body
        bodiless = not raw and call.provider.bodiless
        parsed = bind(call.provider, {} if bodiless else parse_json(raw), call)
    except InvalidRequest:
        parsed = None
    redactor = engine.redactor.carrying(call.credentials)
    body = redactor.request_body(parsed, call.body) if isinstance(parsed, dict) else None
    return forward(engine, call, body, record=record, miss=False, turn=turn)


def forward(
    engine: Engine, call: ProviderCall, body: JSON, *, record: bool, miss: bool, turn: int
) -> Decision:
    provider = call.provider
    problem = None
    if body is None:
        problem = "the request body is not a JSON object: forwarded, not recorded"
    digest = provider.digest(body) if body is not None else None
    stream = provider.wants_stream(body)
    model = provider.model_of(body) if body is not None else None
    model = model if isinstance(model, str) else None
    fields = {**call.journal_fields(model, stream, digest), "match": "upstream", "miss": miss}
    if body is not None:
        fields.update(provider.journal_fields(body))
    headers: Headers = (("x-chaosllm-match", "upstream"),)
    if digest is not None:
        headers += (("x-chaosllm-digest", digest),)
    if engine.limiter is not None:  # the prompt's tokens (the answer's are not known yet)
        limited = charge(engine, call, body=body, answer=None)
        if not limited.allowed:
            return rate_limited(engine, call, fields, limited)
        headers += provider.rate_limit_headers(limited)
    request = None
    if body is not None:
        assert digest is not None
        request = Request(call, body, digest, stream, model, turn)
        request.fields.update(provider.journal_fields(body))
    faultable = (
        request is not None
        and len(engine.board) > 0
        and engine.board.may_fire(request.info(answer_known=False))
    )
    drawn: tuple[FaultSpec, ...] = ()
    if faultable:
        assert request is not None
        request.fields.update(match="upstream", miss=miss)
        reply, drawn, faultable = _answer_alone(engine, request, headers)
        if reply is not None:
            return reply
    entry = finish.pending(engine, {**fields, "error": problem})
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
    engine: Engine, request: Request, headers: Headers
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

    plan, fired = take(engine, request, _NO_ANSWER, None, alone, waits=wait)
    if fired is None:
        return None, tuple(drawn), waiting
    reply = finish.alone(engine, request, plan.with_(headers=plan.headers + headers), fired)
    return reply, (), False


def fault_upstream(engine: Engine, proxy: Proxy, plan: ResponsePlan, answer: JSON) -> ResponsePlan:
    """A proxied answer, read whole, after the fault that fires on it (if any)."""
    request = _proxied(proxy)
    drawn = proxy.drawn

    def undrawn(spec: FaultSpec) -> bool:
        return not any(spec is d for d in drawn)

    faulted, fired = take(engine, request, plan, answer, undrawn if drawn else None)
    if fired is not None:
        fired.request_seq = proxy.entry.seq
        finish.amend(
            engine,
            proxy.entry,
            **request.fields,
            status=head_status(faulted),
            ending=ending_of(faulted),
        )
    return faulted


def fault_live(engine: Engine, proxy: Proxy) -> LiveChoice:
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
    machines: list[tuple[FaultSpec, LiveFault]] = []
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
        machines.append((spec, machine))
        drawn.append(spec)
        return True

    def wait(spec: FaultSpec) -> None:
        nonlocal waiting
        waiting = True

    info = request.info(None, answer_known=False)
    fired = engine.board.take(info, live, waits=wait)
    if fired is not None:
        _fired_live(engine, proxy, fired)
        return LiveChoice(fault=next(m for s, m in machines if s is fired.spec))
    if waiting:
        later = replace(proxy, drawn=tuple(drawn))
        return LiveChoice(buffered=lambda plan, answer: fault_upstream(engine, later, plan, answer))
    if not deferred:
        return LiveChoice()
    pending = deferred[0]
    machine = pending.entry.live(pending, ctx) if pending.entry.live is not None else None
    assert machine is not None

    def claim() -> bool:
        fired = engine.board.take(info, lambda spec: spec is pending)
        if fired is not None:
            _fired_live(engine, proxy, fired)
        return fired is not None

    return LiveChoice(fault=Claimed(machine, claim))


def _fired_live(engine: Engine, proxy: Proxy, fired: Fired) -> None:
    fired.request_seq = proxy.entry.seq
    fault = {**fired.spec.to_json(), "id": fired.fault_id}
    finish.amend(engine, proxy.entry, fault={**fault, "params": fired.spec.effective_params()})
