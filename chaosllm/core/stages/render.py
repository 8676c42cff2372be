"""Stage 4: the chosen exchange as this request gets it (the ``exchange`` hooks) rendered
by its provider as a plan, at the pace of ``--timing ttft=...`` when one is set (with
jitter its draws are the request's own: such an answer is not kept in the memo)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

from chaosllm.core.call import Answer, Chosen, Request
from chaosllm.faults.transform import paced
from chaosllm.model import JSON, Exchange, RecordedRequest, RecordedResponse, ResponsePlan
from chaosllm.providers.base import Provider

if TYPE_CHECKING:
    from chaosllm.core.engine import Engine

__all__ = ["draw_key", "render", "render_answer", "rendered"]


def rendered(provider: Provider, body: JSON, answer: JSON, path: str, digest: str) -> Exchange:
    """An exchange made up on the spot for `answer` (a fallback, a fault's new answer)."""
    return Exchange(
        provider=provider.name,
        request=RecordedRequest(method="POST", path=path, body=body),
        response=RecordedResponse(status=200, body=answer),
        digest=digest,
        name="(rendered)",
        scenario="(rendered)",
    )


def draw_key(engine: Engine, request: Request) -> str:
    """What seeds a request's random draws (a pace's jitter): the server seed, the
    session and its request number, so ``--seed`` repeats them exactly."""
    return f"{engine.config.seed}:{request.call.session!r}:{request.turn}:timing"


def _plan(
    engine: Engine, request: Request, exchange: Exchange, key: Hashable | None
) -> ResponsePlan:
    """The plan of `exchange` for `request`, kept in the memo under `key` (a stored
    recording's rendering; None: not kept), paced last when the pace has jitter (its
    draws are the request's own)."""
    provider, pace = request.call.provider, engine.config.pace
    plan: ResponsePlan | None = engine.memo.get(key) if key is not None else None
    if plan is None:
        plan = provider.render(exchange, request.body, timing=engine.config.timing)
        if pace is not None and not pace.jitter:
            plan = paced(plan, pace, provider, "")  # the same every time: kept paced
        if key is not None:
            engine.memo.put(key, plan, plan.body_length)
    if pace is not None and pace.jitter:
        request.keep = False
        plan = paced(plan, pace, provider, draw_key(engine, request))
    return plan


def render(engine: Engine, request: Request, chosen: Chosen) -> Answer:
    exchange = chosen.exchange
    for hook in engine.hooks.exchange:
        exchange = hook(engine, request, exchange)
    key = None
    match = chosen.match
    if match is not None and exchange is match.exchange:  # a stored recording, as it is
        provider, timing = request.call.provider, engine.config.timing
        variant = provider.render_key(exchange, request.body, timing=timing)
        key = ("render", provider.name, exchange.key, variant)
    plan = _plan(engine, request, exchange, key)
    return Answer(exchange, plan, exchange.response.body, rendering=key)


def render_answer(engine: Engine, request: Request, answer: JSON) -> ResponsePlan:
    """The plan of a new answer to `request` (what a fault that rewrites the answer
    renders), at the pace asked."""
    call = request.call
    exchange = rendered(call.provider, request.body, answer, call.path, request.digest)
    return _plan(engine, request, exchange, None)
