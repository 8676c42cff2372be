"""Plain data: recorded exchanges and response plans.

Theory of operation
-------------------
An `Exchange` is one recorded request and its answer, as stored on disk
(see README, "Recording format"). A provider renders an exchange into a
`ResponsePlan`: everything the wire must put on the socket, in order, and how
the message ends. Faults are pure functions `ResponsePlan -> ResponsePlan`,
and the wire layer (`chaosllm.wire`) only executes plans. Nothing in this
module does I/O.

A plan is a head (status and headers, optionally delayed), a sequence of body
`Piece`s (each an SSE frame for a stream, or a slice of a JSON body), and an
`Ending`:

- `COMPLETE`: the HTTP message is finished properly (terminating chunk, or
  the full Content-Length); the connection may be reused.
- `CLOSE`: the socket is closed (FIN) right after the last piece, whether or
  not the HTTP message was complete.
- `RESET`: the socket is reset (RST, SO_LINGER 0) after the last piece.
- `STALL`: nothing more is sent until the client goes away or `stall_ms`
  passes; then the socket is closed.

`send_head=False` means no HTTP head at all: the pieces are written to the
socket as raw bytes (garbage) and then the ending applies; with no pieces this
is an empty reply.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "JSON",
    "Ending",
    "Exchange",
    "Framing",
    "Keying",
    "Piece",
    "RecordedChunk",
    "RecordedRequest",
    "RecordedResponse",
    "ResponsePlan",
    "StateVersion",
]

JSON = Any
"""A value as `json.loads` returns it."""


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    method: str
    path: str
    body: JSON


@dataclass(frozen=True, slots=True)
class RecordedChunk:
    """One SSE frame exactly as it was on the wire, with the gap before it."""

    data: str
    """The frame's full text, e.g. ``'data: {...}\\n\\n'`` (field lines and blank line)."""
    delay_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class RecordedResponse:
    status: int
    body: JSON
    """The assembled non-stream body: always present."""
    stream: bool = False
    """Whether the answer was recorded from a stream."""
    chunks: tuple[RecordedChunk, ...] | None = None
    """The exact frames, when recorded from a stream."""
    headers: tuple[tuple[str, str], ...] = ()
    """Upstream headers worth replaying (request ids, rate-limit headers)."""


class Keying:
    """How an exchange is found (`Exchange.keyed_by`)."""

    REQUEST = "request"
    """By the digest of its recorded request (chaosllm's canonicalisation): exact and
    nearest matching, and sequence when its scenario is active."""
    HASH_KEYED = "hash-keyed"
    """By a digest given by the fixture itself, computed with the canonicalisation of
    seeds/hash-keyed-fixtures.md (no tools, no response_format): its request is unknown."""
    SEQUENCE = "sequence"
    """By position only (trace fixtures record answers, not requests): served in order,
    one per request, per session."""

    ALL = (REQUEST, HASH_KEYED, SEQUENCE)


@dataclass(frozen=True, slots=True)
class Exchange:
    provider: str
    request: RecordedRequest
    response: RecordedResponse
    digest: str
    """The digest computed from `request` by the provider (never trusted from the file)."""
    name: str
    """``<scenario>/<file stem>``: how people and the journal refer to it."""
    scenario: str
    meta: Mapping[str, JSON] = field(default_factory=dict)
    source: str | None = None
    """The file it was loaded from, if any."""
    stored_digest: str | None = None
    """The digest written in the file, if any (a stale one is reported by doctor)."""
    keyed_by: str = Keying.REQUEST
    """`Keying`: what `digest` is and which matchers can find the exchange. For
    `Keying.HASH_KEYED` the digest is the fixture's own; for `Keying.SEQUENCE` the
    request is a placeholder and the digest only names it."""

    @property
    def key(self) -> tuple[str | None, str, str]:
        """The exchange's identity as a value (its file, its name, its digest): what a memo
        of its renderings and reviews is keyed by. Two recordings directories may hold
        the same scenario and file name; their files differ."""
        return (self.source, self.name, self.digest)


class Framing(enum.Enum):
    LENGTH = "length"
    """A body with Content-Length (JSON answers)."""
    CHUNKED = "chunked"
    """A chunked body (SSE streams): one chunk per piece."""


class Ending(enum.Enum):
    COMPLETE = "complete"
    CLOSE = "close"
    RESET = "reset"
    STALL = "stall"


@dataclass(frozen=True, slots=True)
class Piece:
    data: bytes
    delay_ms: float = 0.0
    """How long to wait before sending this piece."""
    frame: bool = True
    """Whether this piece is an SSE frame (counted in `frames sent`)."""


class _Compiled:
    """Where a `ResponsePlan` keeps the wire programs it compiled into: one slot, outside
    the dataclass's fields, so it is no argument of the constructor, is not compared,
    hashed, copied by `with_` or pickled, and `dataclasses.fields` does not list it."""

    __slots__ = ("compiled", "stamp", "stamped_from")

    compiled: dict[object, object]
    """By variant (kind of request, kind of server), filled on first use by
    `chaosllm.wire.program` (unset until then), so that a plan kept and served again is
    compiled once."""
    stamp: tuple[tuple[str, ...], tuple[str, ...], tuple[bytes, ...]]
    """The request-id headers a protocol writes on every answer, of them those this plan
    lacks, and each of those as the start of a header line (``name: ``)
    (`chaosllm.providers.errors.Errors.stamped`), worked out once per plan (unset until
    then)."""
    stamped_from: tuple[ResponsePlan, bytes]
    """For a plan that is another plus headers appended and nothing else (an answer's
    request id, different for each answer: `chaosllm.providers.errors.Errors.stamped`):
    that plan and those headers as lines (``name: value\\r\\n`` each), so that its wire
    program is the other's, compiled once, with the lines put in its head (unset
    otherwise)."""


@dataclass(frozen=True, slots=True)
class ResponsePlan(_Compiled):
    status: int
    headers: tuple[tuple[str, str], ...]
    pieces: tuple[Piece, ...]
    framing: Framing = Framing.LENGTH
    ending: Ending = Ending.COMPLETE
    content_length: int | None = None
    """With `Framing.LENGTH`: the declared length; None means the pieces' total."""
    head_delay_ms: float = 0.0
    send_head: bool = True
    stall_ms: float = 0.0
    """With `Ending.STALL`: the longest silence before the socket is closed."""
    close_after: bool = False
    """Close the connection after a complete message (no keep-alive)."""

    @property
    def body_length(self) -> int:
        return sum(len(p.data) for p in self.pieces)

    @property
    def declared_length(self) -> int:
        return self.body_length if self.content_length is None else self.content_length

    @property
    def frame_count(self) -> int:
        return sum(1 for p in self.pieces if p.frame)

    def body(self) -> bytes:
        return b"".join(p.data for p in self.pieces)

    def with_(self, **changes: Any) -> ResponsePlan:
        return replace(self, **changes)

    def with_headers(
        self, headers: tuple[tuple[str, str], ...], pieces: tuple[Piece, ...] | None = None
    ) -> ResponsePlan:
        """``with_(headers=headers)`` (and ``pieces=pieces`` unless None), without
        `dataclasses.replace`'s field walk: what every answer's request id and
        chaosllm's headers cost (`chaosllm.providers.errors.Errors.stamped`,
        `chaosllm.core.stages.shape`)."""
        return ResponsePlan(
            self.status,
            headers,
            self.pieces if pieces is None else pieces,
            self.framing,
            self.ending,
            self.content_length,
            self.head_delay_ms,
            self.send_head,
            self.stall_ms,
            self.close_after,
        )


class StateVersion:
    """A counter that every change of a server's state bumps (faults armed, fired or
    cleared, the rate limit, the workspace, the scenario, recordings reloaded or learned,
    a reset): what the engine's memo (`chaosllm.core.memo`) holds an answer valid for.
    Shared by the engine, its fault board and its matcher."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def bump(self) -> None:
        self.value += 1

    def __repr__(self) -> str:
        return f"StateVersion({self.value})"
