"""What chaosllm checks about a request before it is matched, and the answers it gives
instead of a recording when a check refuses it.

`precheck` runs on every provider request before it is matched: the request
validator, by the provider's own rules (`chaosllm.providers.conversation`). Once a
recording is matched, `chaosllm.core.review` runs the reviewers registered at the
``review`` hook. Findings go to the request's journal entry (``findings``,
``GET /__findings``). With ``--strict`` a request with any finding is refused with a 400
shaped like the provider's own (its message and ``param``), before it consumes anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chaosllm.model import JSON, Exchange
from chaosllm.providers.base import ErrorKind, Provider

__all__ = ["Refusal", "Review", "precheck", "strict_refusal"]


@dataclass(frozen=True, slots=True)
class Refusal:
    """An answer chaosllm gives instead of the recording: an error in the provider's shape."""

    status: int
    message: str
    kind: str
    error: str
    """What the journal says about it."""
    code: str | None = None
    param: str | None = None
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(slots=True)
class Review:
    exchange: Exchange
    """The exchange to serve (adapted to the live run)."""
    findings: list[dict[str, Any]] = field(default_factory=list)
    refusal: Refusal | None = None


def precheck(provider: Provider, body: JSON) -> list[dict[str, Any]]:
    """The request validator's findings about the conversation, by the provider's own
    rules (orphan tool calls and results, role order, doubled messages...)."""
    return [f.to_json() for f in provider.conversation_findings(body)]


def strict_refusal(findings: list[dict[str, Any]]) -> Refusal:
    """`--strict`: the request is refused with its first finding."""
    first = findings[0]
    message = first["message"]
    if len(findings) > 1:
        message += f" (chaosllm --strict: {len(findings)} findings; GET /__findings lists them)"
    return Refusal(
        400,
        message,
        ErrorKind.INVALID_REQUEST,
        error=f"refused by --strict: {first['check']}",
        param=first.get("param"),
        headers=(("x-chaosllm-match", "refused"),),
    )
