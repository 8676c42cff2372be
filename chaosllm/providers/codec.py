"""A protocol's codec: its requests' canonical form and its answers' framing. Pure.

Theory of operation
-------------------
The codec is the part of a provider (`chaosllm.providers.base.Provider`) that reads
requests and writes answers, what replay needs when nothing fails:

- a request: `validate` (what the real API refuses), `canonical` (what decides the
  answer: `written`, the fields that matter as sent, with the forms the provider
  documents as equivalent folded into one by `equivalent`; the digest, `match_text`
  and `turn_text` of nearest matching derive from it; `earlier_forms` and
  `earlier_digests`, what files recorded under earlier rules store), `wants_stream`,
  `model_of`, `thread`, and its conversation checks (`conversation`, the
  request-validator oracle's);
- an answer: a recorded answer is served as JSON, as its recorded frames (gaps scaled
  by ``timing``, adapted to the request's `stream_variant` options by
  `_recorded_frames`), or as frames rendered from its body (`stream_frames`, with those
  options); which of these is the `Variant`, what `render_key` returns. What a
  recording lacks that the real API always sends is filled in by `served_answer` (and
  named by `estimated`, for the journal). `render` is pure and uncached: the engine
  memoises renderings by (the exchange, `render_key`);
- a stream: its framing on the wire (`encode_frame`, `frame_text`, `frame_splitter`:
  SSE by default, `chaosllm.providers.sse`), its headers, and how recorded frames
  `assemble` back into a body and whether they make a `stream_complete` answer;
- fresh ids (`fresh_ids`, `recorded_ids`: `chaosllm.providers.ids`), the model list,
  the `--on-miss fallback` answer.

A protocol writes `validate`, `written` (and `equivalent`, its folding rules, with
`earlier_forms` once a rule is added),
`is_answer`, `stream_frames`, `assemble`, `stream_complete` and `fallback`; the rest has
defaults.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar, Final, Protocol

from chaosllm.model import (
    JSON,
    Exchange,
    Framing,
    Piece,
    RecordedChunk,
    RecordedResponse,
    ResponsePlan,
)
from chaosllm.providers import sse
from chaosllm.providers.conversation import ConversationChecks, Finding
from chaosllm.providers.ids import IdTemplate, MintedIds
from chaosllm.providers.text import JSON_HEADERS, canonical_json, sha256_digest

__all__ = ["JSON_VARIANT", "SSE_VARIANT", "Codec", "FrameSplitting", "Variant"]


class FrameSplitting(Protocol):
    """What cuts a stream into frames as its bytes arrive (`sse.FrameSplitter` for SSE)."""

    frames: list[tuple[bytes, float]]
    """(exact bytes, milliseconds since the previous frame or the head)."""
    keep: bool
    """Whether frames are kept (False: only counted)."""
    overflow: str | None
    """Why the frames are not the stream's own (an unfinished frame cut at its bound)."""

    def feed(self, data: bytes, now: float) -> int:
        """Take the next bytes; how many frames they completed."""
        ...

    def finish(self) -> None:
        """End of stream: bytes after the last whole frame join the last frame."""
        ...


Variant = str | tuple[float, str]
"""Which rendering of a recorded response: ``"json"``, a stream rendered from the body
(`Codec.stream_variant`'s key), or recorded frames at a timing for those options
(the timing and that key)."""
JSON_VARIANT: Final = "json"
SSE_VARIANT: Final[tuple[str, Mapping[str, Any]]] = ("sse", MappingProxyType({}))
"""A stream rendered from the body with no request options (`Codec.stream_variant`)."""


class Codec(abc.ABC):
    """A protocol's requests and answers (see the module's docstring). Subclasses set the
    class attributes and write the abstract methods."""

    turn_key: ClassVar[str] = "messages"
    """The canonical request's field holding the conversation, turn by turn."""
    minted_prefixes: ClassVar[tuple[str, ...]] = ()
    """Prefixes of the ids the API mints in every answer (``chatcmpl-``, ``call_``...):
    the values of an answer's ``id`` and ``call_id`` keys that start with one are what
    `fresh_ids` replaces."""

    def __init__(self) -> None:
        self._ids = MintedIds(self.minted_prefixes)

    # -- requests ---------------------------------------------------------------------

    @abc.abstractmethod
    def validate(self, body: JSON) -> None:
        """Raise `InvalidRequest` for a body the real provider would refuse."""

    @abc.abstractmethod
    def written(self, body: JSON) -> Any:
        """What decides the answer, as the client wrote it (a JSON object holding
        `turn_key`): the fields that matter, each as sent."""

    def equivalent(self, written: Any) -> Any:
        """`written` with the forms the provider documents as the same folded into one
        (a string for a single text block, a documented default for its absence...):
        the protocol's rules, each named with its source in ``docs/background/matching.md``.
        Itself by default (Bedrock, Ollama: no rule)."""
        return written

    def canonical(self, body: JSON) -> Any:
        """What decides the answer, one form for all the equivalent ones (`equivalent`
        of `written`): the digest and nearest matching are computed over it."""
        return self.equivalent(self.written(body))

    def digest(self, body: JSON) -> str:
        return sha256_digest(self.canonical(body))

    def written_digest(self, body: JSON) -> str:
        """The digest of `written` alone: what a recording written before its protocol
        folded a form stores as its ``digest`` (`chaosllm doctor` accepts it; the
        recording is keyed by `digest`, so no file needs rewriting)."""
        return sha256_digest(self.written(body))

    def earlier_forms(self, written: Any) -> Sequence[Any]:
        """`written` as earlier releases folded it, one form for each set of rules since
        replaced by a larger one (none by default): a file recorded then stores the digest
        of one of them, or of `written` itself (`earlier_digests`)."""
        return ()

    def earlier_digests(self, body: JSON) -> frozenset[str]:
        """The digests a file recorded by an earlier release may store for `body` (its
        request as written, and as each earlier set of rules folded it): `chaosllm doctor`
        accepts them, and the recording is keyed by `digest`, so no file needs rewriting."""
        written = self.written(body)
        return frozenset(sha256_digest(form) for form in (written, *self.earlier_forms(written)))

    def match_text(self, body: JSON) -> str:
        """The text nearest matching compares (before normalisation)."""
        return canonical_json(self.canonical(body))

    def turn_text(self, body: JSON) -> str:
        """The latest turn of the conversation (what the answer replies to): nearest
        matching requires it to be near-identical too, so that a long shared prefix
        cannot make a different question look the same."""
        turns = self.canonical(body)[self.turn_key]
        if isinstance(turns, list):
            return canonical_json(turns[-1] if turns else None)
        return canonical_json(turns)

    def wants_stream(self, body: JSON) -> bool:
        return bool(isinstance(body, dict) and body.get("stream") is True)

    def thread(self, body: JSON) -> Any:
        """The server-side conversation a request continues (None: it carries its whole
        conversation). Part of `canonical`; nearest matching, which normalises ids away,
        never pairs requests of different threads."""
        return None

    def stream_variant(self, body: JSON) -> tuple[str, Mapping[str, Any]]:
        """What of the request shapes a stream rendered from a body: a cache key naming it
        (a constant string, cheap to hash) and the keyword arguments of `stream_frames`."""
        return SSE_VARIANT

    def model_of(self, body: JSON) -> Any:
        """The model a (bound) request asks for: what the journal, fault matching and the
        model list name."""
        return body.get("model") if isinstance(body, dict) else None

    # -- stream framing (SSE unless a protocol says otherwise) --------------------------

    def stream_headers(self, options: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
        """The headers a stream is served with (before the recorded ones), for the request
        options `stream_variant` gave."""
        return sse.SSE_HEADERS

    def encode_frame(self, text: str) -> bytes:
        """The bytes on the wire of a frame, from its text (a `RecordedChunk`'s data, or
        one of `stream_frames`)."""
        return text.encode("utf-8")

    def frame_text(self, data: bytes) -> str:
        """A frame's text (what a recording stores) from its bytes on the wire; raises
        `ValueError` (`UnicodeDecodeError` included) for bytes that are not a frame."""
        return data.decode("utf-8")

    def is_stream(self, content_type: str) -> bool:
        """Whether an upstream answer with this content type is a stream of frames."""
        return content_type.lower().startswith("text/event-stream")

    def frame_splitter(self, start: float, *, keep: bool = True) -> FrameSplitting:
        """A splitter cutting the protocol's stream into frames as it arrives (the
        recorder's)."""
        return sse.FrameSplitter(start, keep=keep)

    def split_frames(self, data: bytes) -> list[tuple[bytes, float]]:
        """A whole stream body as frames (no gaps: all arrived at once)."""
        splitter = self.frame_splitter(0.0)
        splitter.feed(data, 0.0)
        splitter.finish()
        return splitter.frames

    # -- the conversation (the request-validator oracle) ------------------------------

    conversation: ClassVar[ConversationChecks]
    """The protocol's conversation checks (`chaosllm.providers.conversation`)."""

    def conversation_findings(self, body: JSON, *, expects_system: bool = False) -> list[Finding]:
        """The defects of the conversation a request carries (orphan tool calls and
        results, role order, ...); `expects_system`: the recording answering it had a
        system prompt."""
        return self.conversation.findings(body, expects_system=expects_system)

    def has_system_prompt(self, body: JSON) -> bool:
        """Whether a request carries a system prompt."""
        return self.conversation.has_system_prompt(body)

    # -- responses --------------------------------------------------------------------

    @abc.abstractmethod
    def is_answer(self, body: JSON) -> bool:
        """Whether a body is this protocol's answer (what a stream can be rendered from)."""

    @abc.abstractmethod
    def stream_frames(self, answer: Mapping[str, Any]) -> list[str]:
        """SSE frames equivalent to an answer body, as the API would stream it."""

    def _json_answer(self, body: JSON) -> JSON:
        """The body a non-stream request gets for a recorded body (itself by default)."""
        return body

    def _json_status(self, body: JSON, status: int) -> int:
        """The status a non-stream request gets for a recorded answer `body` with `status`
        (`status` by default; Ollama answers a tool call it cannot parse with a 500)."""
        return status

    def served_answer(self, answer: JSON, request: JSON) -> JSON:
        """A recorded answer as the API would send it, for the recorded `request`: what a
        recording lacks that every real answer has is filled in (estimated; `estimated`
        names it). Itself by default."""
        return answer

    def estimated(self, response: RecordedResponse, body: JSON) -> tuple[str, ...]:
        """The fields of `response` that `render` estimates for request `body` (the
        journal's ``estimated``); none by default."""
        return ()

    def journal_fields(self, body: JSON) -> dict[str, Any]:
        """What the journal record of request `body` says besides its head, replayed or
        proxied (an MCP request's JSON-RPC ``method``, ``tool``, ``rpc_id``); nothing by
        default."""
        return {}

    def _recorded_frames(
        self, response: RecordedResponse, options: Mapping[str, Any], request: JSON
    ) -> Sequence[RecordedChunk]:
        """The recorded frames a stream request with `options` (`stream_variant`) gets:
        all of them, by default."""
        assert response.chunks is not None
        return response.chunks

    def render_key(self, exchange: Exchange, body: JSON, *, timing: float) -> Variant:
        """What of request `body` and `timing` the rendering of `exchange` depends on (its
        `Variant`): two calls with the same exchange and equal keys render equal plans, so
        a memo of renderings may key on (the exchange, this)."""
        return self._variant(exchange.response, body, timing)[0]

    def _variant(
        self, response: RecordedResponse, body: JSON, timing: float
    ) -> tuple[Variant, Mapping[str, Any]]:
        """The `Variant` answering `body` with `response`, and the options of its stream."""
        if (
            response.status >= 400
            or not self.wants_stream(body)
            or not self.is_answer(response.body)
        ):
            # A JSON answer (or a recorded error answer, whatever was asked).
            return JSON_VARIANT, SSE_VARIANT[1]
        key, options = self.stream_variant(body)
        if response.chunks is not None:
            return (float(timing), key), options
        return key, options

    def render(self, exchange: Exchange, body: JSON, *, timing: float) -> ResponsePlan:
        """The plan answering request `body` with `exchange`; `timing` scales recorded gaps
        (0 = as fast as possible, 1 = as recorded). Pure and uncached: the engine memoises
        renderings by `render_key`."""
        response = exchange.response
        variant, options = self._variant(response, body, timing)
        return self._render(response, variant, options, timing, exchange.request.body)

    def _render(
        self,
        response: RecordedResponse,
        variant: Variant,
        options: Mapping[str, Any],
        timing: float,
        request: JSON,
    ) -> ResponsePlan:
        headers = tuple(response.headers)
        if variant == JSON_VARIANT:
            answer = response.body
            if response.status < 400:
                answer = self.served_answer(answer, request)
            data = json.dumps(self._json_answer(answer), ensure_ascii=False)
            return ResponsePlan(
                status=self._json_status(answer, response.status),
                headers=JSON_HEADERS + headers,
                pieces=(Piece(data.encode("utf-8"), frame=False),),
            )
        if isinstance(variant, tuple):
            encode = self.encode_frame
            pieces = tuple(
                Piece(encode(c.data), c.delay_ms * timing)
                for c in self._recorded_frames(response, options, request)
            )
        else:
            frames = self.stream_frames(self.served_answer(response.body, request), **options)
            pieces = tuple(Piece(self.encode_frame(f)) for f in frames)
        return ResponsePlan(
            status=response.status,
            headers=self.stream_headers(options) + headers,
            pieces=pieces,
            framing=Framing.CHUNKED,
        )

    def models_body(self, model_ids: Sequence[str]) -> JSON:
        """The ``GET /v1/models`` answer listing `model_ids` (OpenAI's list shape)."""
        return {
            "object": "list",
            "data": [
                {"id": model, "object": "model", "created": 0, "owned_by": "chaosllm"}
                for model in model_ids
            ],
        }

    # -- assembly ---------------------------------------------------------------------

    @abc.abstractmethod
    def assemble(self, frames: Sequence[str]) -> JSON:
        """The non-stream body equivalent to recorded SSE frames."""

    @abc.abstractmethod
    def stream_complete(self, frames: Sequence[str]) -> bool:
        """Whether SSE frames make a finished answer (the stream's terminator, or an error
        event, arrived): the recorder never stores a stream cut short."""

    @abc.abstractmethod
    def fallback(self, body: JSON, digest: str) -> JSON:
        """A deterministic canned answer body for `--on-miss fallback`."""

    # -- fresh ids (`chaosllm.providers.ids`) -----------------------------------------

    def fresh_ids(
        self, plan: ResponsePlan, answer: JSON, key: str, template: IdTemplate | None = None
    ) -> tuple[tuple[Piece, ...], dict[str, str]]:
        """The pieces of `plan` (rendered from `answer`) with every id the API minted in
        `answer` (`minted_prefixes`) replaced by a fresh one derived from `key` and the id,
        and the mapping of the recorded ids to the fresh ones (`MintedIds.fresh`), from
        `template` when given (`id_template`)."""
        return self._ids.fresh(plan, answer, key, template)

    def id_template(self, plan: ResponsePlan, answer: JSON) -> IdTemplate:
        """Where the ids the API minted in `answer` sit in `plan` (`MintedIds.template`):
        a value the engine's memo keeps with the rendering."""
        return self._ids.template(plan, answer)

    def recorded_ids(self, raw: bytes, minted: Mapping[str, str]) -> bytes:
        """A request body with the fresh ids of `minted` (fresh -> recorded) it echoes
        turned back into the recorded ones (`MintedIds.recorded`)."""
        return self._ids.recorded(raw, minted)
