"""Stage 4: the chosen exchange as this request gets it (the ``exchange`` hooks) rendered
by its provider as a plan, at the pace of ``--timing ttft=...`` when one is set (with
jitter its draws are the request's own: such an answer is not kept in the memo)."""

from __future__ import annotations

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


def _plan(engine: Engine, request: Request, exchange: Exchange) -> ResponsePlan:
    provider = request.call.provider
    plan = provider.render(exchange, request.body, timing=engine.config.timing)
    pace = engine.config.pace
    if pace is None:
        return plan
    if pace.jitter:
        request.keep = False
        return paced(plan, pace, provider, draw_key(engine, request))
    return paced(plan, pace, provider, "")


def render(engine: Engine, request: Request, chosen: Chosen) -> Answer:
    exchange = chosen.exchange
    for hook in engine.hooks.exchange:
        exchange = hook(engine, request, exchange)
    return Answer(exchange, _plan(engine, request, exchange), exchange.response.body)


def render_answer(engine: Engine, request: Request, answer: JSON) -> ResponsePlan:
    """The plan of a new answer to `request` (what a fault that rewrites the answer
    renders), at the pace asked."""
    call = request.call
    exchange = rendered(call.provider, request.body, answer, call.path, request.digest)
    return _plan(engine, request, exchange)
