"""Stage 8: the plan as sent: chaosllm's headers (which recording, how it matched, the
request's digest) and the ``headers`` hooks', the live rate-limit headers instead of any
recorded ones, the ``plan`` hooks last, then the ``answered`` hooks (which see the whole
answer); and what the journal says of the answer (what of it was estimated, a recorded
error's facts)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from chaosllm.core.call import Answer, Chosen, Headers, Request
from chaosllm.core.journal import answer_facts
from chaosllm.model import ResponsePlan

if TYPE_CHECKING:
    from chaosllm.core.engine import Engine

__all__ = ["shape"]


def _with_live_headers(plan: ResponsePlan, live: Headers) -> ResponsePlan:
    """`plan` with the live rate-limit headers instead of any recorded ones."""
    if not live:
        return plan
    names = {name for name, _ in live}
    kept = tuple(h for h in plan.headers if h[0].lower() not in names)
    return plan.with_headers(kept + live)


def shape(engine: Engine, request: Request, chosen: Chosen, answer: Answer) -> None:
    provider = request.call.provider
    extra = chosen.headers + (("x-chaosllm-digest", request.digest),)
    for headers in engine.hooks.headers:
        extra += headers(engine, request)
    plan = answer.plan
    plan = plan.with_headers(plan.headers + extra, answer.pieces)
    estimated = provider.estimated(answer.exchange.response, request.body)
    if estimated:
        request.fields["estimated"] = estimated
    if answer.fired is None and plan.send_head and plan.status >= 400:  # a recorded error
        request.fields.update(answer_facts(plan, False))
    if answer.limited is not None:
        plan = _with_live_headers(plan, provider.rate_limit_headers(answer.limited))
    for hook in engine.hooks.plan:
        plan = hook(engine, request, plan)
    answer.plan = plan
    for answered in engine.hooks.answered:
        answered(engine, request, answer)
