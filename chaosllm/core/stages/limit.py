"""Stage 5: the live rate limit (``--rate-limit``): the caller (its API key's id and its
session) charged for the request before any fault or consuming, and the provider's 429
when its buckets are empty. A limited server keeps no answer in the memo (every request
changes the buckets)."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from chaosllm.core.call import Answer, ProviderCall, Reply, Request
from chaosllm.core.journal import answer_facts
from chaosllm.core.ratelimit import Caller, api_key, completion_tokens, key_id, prompt_tokens
from chaosllm.core.stages import finish
from chaosllm.model import JSON, Piece, ResponsePlan
from chaosllm.providers.base import JSON_HEADERS
from chaosllm.providers.ratelimits import RateLimitState, openai_duration

if TYPE_CHECKING:
    from chaosllm.core.engine import Engine

__all__ = ["charge", "limit", "rate_limited"]


def charge(engine: Engine, call: ProviderCall, *, body: JSON, answer: JSON) -> RateLimitState:
    """Charge the call's caller for it: one request, its prompt's tokens and `answer`'s
    completion tokens."""
    assert engine.limiter is not None
    key = api_key(call.headers, call.query)
    caller: Caller = (key_id(key) if key is not None else None, call.session)
    provider = call.provider
    prompt = prompt_tokens(provider, body, call.body)
    completion = completion_tokens(provider, answer, body) if answer is not None else 0
    return engine.limiter.take(caller, prompt, completion)


def limit(engine: Engine, request: Request, answer: Answer) -> Reply | None:
    """None when the request may be answered (the state noted on `answer`), else the 429."""
    if engine.limiter is None:
        return None
    request.keep = False
    state = charge(engine, request.call, body=request.body, answer=answer.answer)
    if not state.allowed:
        return rate_limited(engine, request.call, request.journal_fields(), state)
    answer.limited = state
    return None


def rate_limited(
    engine: Engine, call: ProviderCall, fields: dict[str, Any], state: RateLimitState
) -> Reply:
    """The provider's 429 for a caller whose buckets are empty, with ``Retry-After``
    (whole seconds) and ``retry-after-ms`` saying the exact wait, and its live headers."""
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
    body = provider.errors.throttled_answer(message, retry_after=wait_ms / 1000)
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
    return finish.limited(engine, call, {**fields, **answer_facts(plan, False)}, plan)
