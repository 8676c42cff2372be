"""What every provider protocol offers the rest of chaosllm.

A provider is pure: it validates and canonicalises requests, renders
exchanges into response plans, renders its own error envelope, and assembles
a recorded stream back into a non-stream body. Faults and the wire layer only
see plans, so a new protocol never touches them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Protocol

from chaosllm.model import JSON, Exchange, ResponsePlan

__all__ = ["ErrorKind", "Provider", "canonical_json", "sha256_digest"]


def canonical_json(value: JSON) -> str:
    """The one serialisation digests are computed over (sorted keys, compact, UTF-8)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_digest(value: JSON) -> str:
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


class ErrorKind:
    """Provider-neutral names of the errors chaosllm itself produces."""

    INVALID_REQUEST = "invalid_request"
    NOT_FOUND = "not_found"
    NO_MATCH = "no_match"
    SERVER_ERROR = "server_error"


class Provider(Protocol):
    name: str
    """Recording `provider` field, e.g. ``openai.chat``."""

    def validate(self, body: JSON) -> None:
        """Raise `InvalidRequest` for a body the real provider would refuse."""

    def canonical(self, body: JSON) -> JSON:
        """What decides the answer: the digest and nearest matching are computed over it."""

    def digest(self, body: JSON) -> str: ...

    def match_text(self, body: JSON) -> str:
        """The text nearest matching compares (before normalisation)."""

    def turn_text(self, body: JSON) -> str:
        """The latest turn of the conversation (what the answer replies to): nearest
        matching requires it to be near-identical too, so that a long shared prefix
        cannot make a different question look the same."""

    def wants_stream(self, body: JSON) -> bool: ...

    def render(self, exchange: Exchange, body: JSON, *, timing: float) -> ResponsePlan:
        """The plan answering request `body` with `exchange`; `timing` scales recorded gaps
        (0 = as fast as possible, 1 = as recorded)."""

    def render_error(
        self,
        status: int,
        message: str,
        *,
        kind: str,
        code: str | None = None,
        param: str | None = None,
        stream: bool = False,
    ) -> ResponsePlan: ...

    def assemble(self, frames: Sequence[str]) -> JSON:
        """The non-stream body equivalent to recorded SSE frames."""

    def stream_complete(self, frames: Sequence[str]) -> bool:
        """Whether SSE frames make a finished answer (the stream's terminator, or an error
        event, arrived): the recorder never stores a stream cut short."""

    def fallback(self, body: JSON, digest: str) -> JSON:
        """A deterministic canned answer body for `--on-miss fallback`."""

    # -- what faults need: each provider says how its own protocol breaks --------

    def answer_frame_count(self, plan: ResponsePlan) -> int:
        """How many leading frames of a stream plan carry the answer, before the frames
        that finish it (finish chunk, usage chunk, terminator)."""

    def stream_error_frame(self, message: str, *, status: int) -> bytes:
        """An error event inside a stream, in the provider's own format."""

    def error_answer(self, message: str, *, status: int, code: str | None = None) -> JSON:
        """The provider's error envelope for an HTTP status (the body a real error carries)."""

    def empty_answer(self, body: JSON) -> JSON:
        """A well-formed answer body with no content and no tool calls."""

    def break_tool_arguments(self, body: JSON) -> JSON | None:
        """The answer with every tool call's arguments cut into invalid JSON; None when the
        answer has no tool calls."""
