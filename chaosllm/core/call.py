"""What flows through the engine's stages: the call the adapter read off the wire
(`ProviderCall`), what the engine learns about it on the way (`Request`, which becomes its
journal record), the recording chosen to answer it (`Chosen`), and the decisions it
ends in (`Reply`, `Proxy`)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from chaosllm.core.journal import JournalEntry
from chaosllm.faults import FaultSpec, Fired, RequestInfo
from chaosllm.model import JSON, Exchange, Piece, ResponsePlan
from chaosllm.providers.base import Provider
from chaosllm.providers.ratelimits import RateLimitState
from chaosllm.store.matching import Match

__all__ = [
    "Answer",
    "Chosen",
    "Decision",
    "Headers",
    "Prepared",
    "ProviderCall",
    "Proxy",
    "Reply",
    "Request",
]

Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class ProviderCall:
    """One provider request, as the adapter read it off the wire."""

    provider: Provider
    path: str
    body: bytes
    session: str | None = None
    method: str = "POST"
    headers: Headers = ()
    """Request headers, names in lower case."""
    query: bytes = b""
    credentials: tuple[str, ...] = ()
    """The credentials the request carries (`chaosllm.store.redact.credential_values`):
    redacted from all that is kept of it."""

    def journal_fields(self, model: Any, stream: bool, digest: str | None) -> dict[str, Any]:
        """The head of the call's journal record: who asked what, how."""
        return {
            "session": self.session,
            "method": self.method,
            "path": self.path,
            "model": model,
            "stream": stream,
            "digest": digest,
        }


@dataclass(frozen=True, slots=True)
class Reply:
    """Answer with `plan`."""

    plan: ResponsePlan
    entry: JournalEntry
    recording: str | None = None
    """The recording served (None: an error, a miss or the fallback answer)."""
    consumed: bool = False
    """Whether serving it advanced the session's place in its recordings."""
    fired: Fired | None = None
    """The fault that transformed the plan."""


@dataclass(frozen=True, slots=True)
class Proxy:
    """Ask the upstream, pass its answer through (record it when `record`), and hand it
    to `Engine.fault_upstream` first when `faultable`."""

    call: ProviderCall
    body: JSON
    """The request as recorded (redacted); None when it is not a JSON object that can be
    keyed (it is forwarded as it is, and neither recorded nor faulted)."""
    digest: str | None
    entry: JournalEntry
    record: bool
    faultable: bool
    headers: Headers = ()
    """Headers chaosllm adds to the answer."""
    drawn: tuple[FaultSpec, ...] = ()
    """Faults that drew (and lost) their probability for this request before it was
    forwarded: `fault_upstream` does not draw them again."""
    turn: int = 0
    """The session's n-th provider request (``match.turn``)."""


Decision = Reply | Proxy


@dataclass(frozen=True, slots=True)
class Prepared:
    """What a request body alone decides (`chaosllm.core.stages.prepare`). Shared by every
    request with the same bytes (the memo keeps it): never mutated."""

    body: JSON
    digest: str
    stream: bool
    model: Any
    findings: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True, slots=True)
class Chosen:
    """The exchange that answers a request, and how it was found."""

    exchange: Exchange
    match: Match | None
    """None: not a recording (a fallback answer, a directive)."""
    headers: Headers
    """What chaosllm's headers say of it (``x-chaosllm-recording``, ``-match``)."""


@dataclass(slots=True)
class Request:
    """What the engine has learnt about a call so far; becomes its journal record."""

    call: ProviderCall
    body: JSON
    digest: str
    stream: bool
    model: Any
    turn: int = 0
    """The session's n-th provider request since the last reset (from 1)."""
    fields: dict[str, Any] = field(default_factory=dict)
    key: Hashable | None = None
    """The memo key of the call's prepared body (None: a proxied request)."""
    keep: bool = True
    """Whether its answer may be kept in the memo for the same call again: a stage that
    decides by anything but the request and the state version says no."""

    def info(self, answer: JSON = None, *, answer_known: bool = True) -> RequestInfo:
        """What the fault board matches this request by, with the `answer` a fault would
        transform (`answer_known` false: not known yet)."""
        model = self.model if isinstance(self.model, str) else None
        call = self.call
        return RequestInfo(
            path=call.path,
            model=model,
            session=call.session,
            stream=self.stream,
            turn=self.turn,
            provider=call.provider,
            body=self.body,
            answer=answer,
            answer_known=answer_known,
            server=call.provider.faults.server_name(self.body),
        )

    def journal_fields(self) -> dict[str, Any]:
        return {**self.call.journal_fields(self.model, self.stream, self.digest), **self.fields}


@dataclass(slots=True)
class Answer:
    """The answer to a request as the stages after `render` shape it."""

    exchange: Exchange
    """The exchange served, as this request gets it (the ``exchange`` hooks applied)."""
    plan: ResponsePlan
    answer: JSON
    """The answer's body, as a fault that transforms it sees it."""
    pieces: tuple[Piece, ...] | None = None
    """The plan's pieces with fresh ids (`chaosllm.core.stages.mint`), if any."""
    fired: Fired | None = None
    limited: RateLimitState | None = None
    """The live rate limit's state after this request was charged, if any."""
    unfaulted: ResponsePlan | None = None
    """The plan before the fault that fired (`fired`), with its fresh ids: the whole
    answer the provider made, of which the client got what the fault left."""
    rendering: Hashable | None = None
    """The memo key of the plan as rendered, when it is a stored recording's (what the
    fresh ids' template is kept under); None: rendered for this request alone."""
