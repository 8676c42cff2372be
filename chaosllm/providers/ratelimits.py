"""Live rate limits as the protocols tell them: the state of a caller's buckets (plain
data the engine's limiter fills in, `chaosllm.core.ratelimit`) and the ways the real APIs
write it in headers. Pure.

What the real APIs send (each provider renders its own, `Provider.rate_limit_headers`):

- OpenAI: ``x-ratelimit-limit-requests``, ``x-ratelimit-remaining-requests``,
  ``x-ratelimit-reset-requests`` and the ``-tokens`` trio; a reset is the time until the
  bucket is full again, written as OpenAI writes durations (``6ms``, ``1s``, ``1m0s``,
  ``17.5s``: Go's ``time.Duration`` form, `openai_duration`).
- Anthropic: ``anthropic-ratelimit-requests-limit``, ``-remaining``, ``-reset`` and the same
  for ``-tokens-``, ``-input-tokens-`` and ``-output-tokens-``; a reset is the RFC 3339 time
  at which the bucket is full again (`rfc3339`).
- Azure OpenAI: ``x-ratelimit-remaining-requests`` and ``x-ratelimit-remaining-tokens`` only.
- Gemini, Bedrock and Ollama send no rate-limit headers on their answers: none are sent.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

__all__ = ["Meter", "RateLimitState", "openai_duration", "rfc3339"]


@dataclass(frozen=True, slots=True)
class Meter:
    """One bucket as a caller sees it after its request."""

    limit: int
    """Its capacity (per minute)."""
    remaining: int
    """What is left in it (whole units, never below 0)."""
    reset: float
    """Seconds until it is full again."""


@dataclass(frozen=True, slots=True)
class RateLimitState:
    """A caller's buckets (None: that one is not limited) and, when it was refused, how
    long it must wait."""

    requests: Meter | None = None
    tokens: Meter | None = None
    """Input and output tokens together: the bucket that refuses."""
    input_tokens: Meter | None = None
    """The prompt tokens alone (Anthropic's ``input-tokens``), against the same limit."""
    output_tokens: Meter | None = None
    """The completion tokens alone (Anthropic's ``output-tokens``)."""
    wall: float = 0.0
    """The time of the request (seconds since the epoch), for absolute resets."""
    allowed: bool = True
    retry_after: float = 0.0
    """When refused: seconds until the buckets can serve the request."""
    exhausted: str | None = None
    """When refused: which bucket (``requests`` or ``tokens``)."""


def openai_duration(seconds: float) -> str:
    """A duration as OpenAI writes its resets (Go's ``time.Duration.String``, to the
    millisecond): ``0s``, ``6ms``, ``1s``, ``17.5s``, ``1m0s``, ``1h2m3.25s``."""
    ms = max(0, math.ceil(seconds * 1000 - 1e-6))
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    whole, fraction = divmod(rest, 1000)
    text = f"{whole}.{fraction:03d}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    if minutes:
        return f"{minutes}m{text}"
    return text


def rfc3339(wall: float) -> str:
    """An instant as Anthropic writes its resets: RFC 3339, UTC, whole seconds (rounded up,
    so the bucket is full by then): ``2025-01-01T00:00:00Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(math.ceil(wall - 1e-6)))
