"""Four small clients over the official `openai` SDK, each careless in one way, for the
verdicts of ``GET /__verdict`` (``ChaosServer.verdict()``) to find. Each turns the SDK's
own retries off (``max_retries=0``) and retries, or not, in its own loop.

- `ignores_retry_after`: retries a failure at once, whatever ``Retry-After`` said
  (``retry_after_ignored``).
- `no_backoff`: retries retryable failures at once, again and again (``no_backoff``).
- `retries_everything`: retries every error status, 400 included, after a short,
  growing pause (``retried_non_retryable``).
- `gives_up_at_once`: one attempt, whatever the failure (``gave_up_early``).

    reply = no_backoff(openai.OpenAI(), {"model": "gpt-4o-mini", "messages": [...]})

The reference resilient client (`examples/resilient_client.py`) earns no finding.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import openai
from openai.types.chat import ChatCompletion

__all__ = ["gives_up_at_once", "ignores_retry_after", "no_backoff", "retries_everything"]

RETRYABLE = frozenset({408, 409, 429, 500, 502, 503, 504, 529})


def _once(client: openai.OpenAI, request: dict[str, Any]) -> ChatCompletion:
    reply: ChatCompletion = client.with_options(max_retries=0).chat.completions.create(**request)
    return reply


def _loop(
    client: openai.OpenAI,
    request: dict[str, Any],
    *,
    attempts: int,
    retry: Callable[[Exception], bool],
    pause: Callable[[int], float],
) -> ChatCompletion:
    for attempt in range(1, attempts + 1):
        try:
            return _once(client, request)
        except (openai.APIStatusError, openai.APIConnectionError) as exc:
            if attempt == attempts or not retry(exc):
                raise
            time.sleep(pause(attempt))
    raise AssertionError("unreachable")  # pragma: no cover


def _retryable(exc: Exception) -> bool:
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in RETRYABLE
    return True  # a connection error, a timeout


def ignores_retry_after(client: openai.OpenAI, request: dict[str, Any]) -> ChatCompletion:
    """Up to 4 attempts; a retryable failure is retried at once, Retry-After or not."""
    return _loop(client, request, attempts=4, retry=_retryable, pause=lambda attempt: 0.0)


def no_backoff(client: openai.OpenAI, request: dict[str, Any]) -> ChatCompletion:
    """Up to 4 attempts, each straight after the failure before it: no backoff at all
    (it does honour a Retry-After, so that is all it gets wrong)."""

    def pause(exc: Exception) -> float:
        if isinstance(exc, openai.APIStatusError):
            value = exc.response.headers.get("retry-after")
            if value is not None:
                return float(value)
        return 0.0

    for attempt in range(1, 5):
        try:
            return _once(client, request)
        except (openai.APIStatusError, openai.APIConnectionError) as exc:
            if attempt == 4 or not _retryable(exc):
                raise
            time.sleep(pause(exc))
    raise AssertionError("unreachable")  # pragma: no cover


def retries_everything(client: openai.OpenAI, request: dict[str, Any]) -> ChatCompletion:
    """Up to 3 attempts; any error status is retried (a 400 too), after 0.05 s, 0.1 s."""
    return _loop(
        client, request, attempts=3, retry=lambda exc: True, pause=lambda n: 0.05 * 2 ** (n - 1)
    )


def gives_up_at_once(client: openai.OpenAI, request: dict[str, Any]) -> ChatCompletion:
    """One attempt: any failure is the caller's problem."""
    return _once(client, request)
