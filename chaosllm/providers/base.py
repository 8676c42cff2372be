"""The shared provider base: what every protocol offers the rest of chaosllm. Pure.

Theory of operation
-------------------
A provider validates and canonicalises requests, renders exchanges into
response plans, renders its own error envelope, checks the conversation a
client sends, and assembles a recorded stream back into a non-stream body.
Faults and the wire layer only see plans, so a new protocol never touches
them.

`Provider` holds everything that is the same for every protocol, once:

- the digest and the text nearest matching compares, both derived from the
  provider's `canonical` request;
- rendering: a recorded answer is served as JSON, as its recorded frames
  (gaps scaled by ``timing``, adapted to the request's `stream_variant` options
  by `recorded_frames`), or as frames rendered from its body (`stream_frames`,
  with those options); which of these is the `Variant`. What a recording lacks
  that the real API always sends is filled in by `served_answer` (and named by
  `estimated`, for the journal);
- no cache: `render` is pure, and `render_key` names what of the request and
  the timing a rendering depends on (the `Variant`), so that the engine's one
  memo keeps renderings by value (the exchange, the key);
- the error plan built from the provider's `error_body`, the model list, and
  which frames of a stream finish the answer (`finishing_events`);
- fresh ids (`fresh_ids`): a real API mints new ids (`minted_prefixes`) in every
  answer, so a recording served again to a session gets new ones, derived from a
  key, the same everywhere in the answer (JSON body or frames).

A protocol subclass supplies what differs: validation, the canonical request,
its answer shape, its stream events, its error envelope, its conversation
checks and the answers faults need. The SSE framing itself is
`chaosllm.providers.sse`.
"""

from __future__ import annotations

import abc
import copy
import enum
import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
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
from chaosllm.providers import facts, sse
from chaosllm.providers.conversation import ConversationChecks, Finding
from chaosllm.providers.ratelimits import RateLimitState

__all__ = [
    "FAILURE_STATUSES",
    "JSON_HEADERS",
    "ArgumentCuts",
    "ErrorKind",
    "Failure",
    "FailureReply",
    "FrameSplitting",
    "Provider",
    "canonical_json",
    "cut_json",
    "estimated_tokens",
    "filtered_blocks",
    "filtered_text",
    "sha256_digest",
    "swap_strings",
    "text_pieces",
    "type_name",
]

JSON_HEADERS: Final = (("content-type", "application/json"),)

TEXT_KEYS: Final = frozenset(
    {
        "content",
        "text",
        "arguments",
        "partial_json",
        "thinking",
        "refusal",
        "delta",
        "reasoning",
        "reasoning_content",
        "response",
        "input",
        "args",
    }
)
"""Keys whose string values (anywhere in an answer or a stream payload) are generated
text, what `Provider.text_tokens` counts: chat and Ollama ``content``, Anthropic, Gemini
and Bedrock ``text``, tool-call ``arguments`` / ``partial_json`` / ``input`` / ``args``,
the Responses API's ``delta``, reasoning, Ollama's ``response``."""

# A piece of streamed text: a word with the whitespace before it (how tokens look).
_TEXT_PIECE = re.compile(r"\s*\S+|\s+")


def _keyed_strings(value: JSON) -> Iterator[tuple[str, str]]:
    """``(key, string)`` for each string value of an object anywhere in `value`: an
    object's own strings first, list items in order (without recursion)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                if isinstance(inner, str):
                    yield key, inner
                elif isinstance(inner, (dict, list)):
                    stack.append(inner)
        elif isinstance(item, list):
            stack.extend(reversed(item))


def _text_length(value: JSON) -> int:
    """The characters of the strings under `TEXT_KEYS` anywhere in `value`."""
    return sum(len(text) for key, text in _keyed_strings(value) if key in TEXT_KEYS)


def canonical_json(value: JSON) -> str:
    """The one serialisation digests are computed over (sorted keys, compact, UTF-8)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_digest(value: JSON) -> str:
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def text_pieces(text: str) -> list[str]:
    """Streamed text as deltas: a word each, with the whitespace before it."""
    return _TEXT_PIECE.findall(text) or [text]


def cut_json(text: str) -> str:
    """A prefix of `text` that is not valid JSON (what a cut-off generation looks like)."""
    cut = text[: max(1, len(text) // 2)] if text else "{"
    try:
        json.loads(cut)
    except json.JSONDecodeError:
        return cut
    return cut + '{"'


def filtered_text(text: str) -> str:
    """What a content filter lets through of a text: its first half, in whole words (the
    text streamed before the filter stopped it; empty for a text of one word)."""
    pieces = text_pieces(text)
    return "".join(pieces[: len(pieces) // 2])


def filtered_blocks(
    blocks: Any, is_call: Callable[[dict[str, Any]], bool], *, drop_empty: bool = False
) -> list[dict[str, Any]]:
    """The content blocks (or parts) a content filter leaves of `blocks`: its objects that
    are no tool call (`is_call`), each ``text`` cut in place by `filtered_text` (with
    `drop_empty`, a part whose text is then empty is dropped too)."""
    kept: list[dict[str, Any]] = []
    for block in blocks or ():
        if not isinstance(block, dict) or is_call(block):
            continue
        if isinstance(block.get("text"), str):
            block["text"] = filtered_text(block["text"])
            if drop_empty and not block["text"]:
                continue
        kept.append(block)
    return kept


def type_name(value: object, *, array: str = "an array") -> str:
    """How a validation message names a JSON value's type (`array`: a list's name)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return array
    return "an object"


class FrameSplitting(Protocol):
    """What cuts a stream into frames as its bytes arrive (`sse.FrameSplitter` for SSE)."""

    frames: list[tuple[bytes, float]]
    """(exact bytes, milliseconds since the previous frame or the head)."""

    def feed(self, data: bytes, now: float) -> int:
        """Take the next bytes; how many frames they completed."""
        ...

    def finish(self) -> None:
        """End of stream: bytes after the last whole frame join the last frame."""
        ...


_TEMPLATE_PARAM = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(:path)?\}")


def _compile_template(template: str) -> re.Pattern[str]:
    """A path template (``{name}``: one segment; ``{name:path}``: anything) as a regex."""
    parts: list[str] = []
    at = 0
    for found in _TEMPLATE_PARAM.finditer(template):
        parts.append(re.escape(template[at : found.start()]))
        span = ".+" if found.group(2) else "[^/]+"
        parts.append(f"(?P<{found.group(1)}>{span})")
        at = found.end()
    parts.append(re.escape(template[at:]))
    return re.compile("".join(parts))


class ArgumentCuts(Protocol):
    """What `Provider.break_argument_deltas` breaks one live stream's tool-call arguments
    with (``malformed_tool_args`` on a live stream: `chaosllm.faults.live` holds one per
    stream). `key` names a call: the same for every frame of that call."""

    memo: dict[object, Any]
    """The protocol's own memory across one stream's frames (Gemini: what a candidate's
    finishing frame says of the call it dropped)."""

    @property
    def broken(self) -> bool:
        """Whether some call's arguments were broken so far in this stream."""

    def __call__(self, key: object, text: str) -> str:
        """An argument delta's text, as the fault leaves it."""

    def whole(self, key: object, text: str) -> str:
        """The whole arguments a frame restates (a ``.done`` event, a finished item), as
        the call's deltas left them."""


class ErrorKind:
    """Provider-neutral names of the errors chaosllm itself produces."""

    INVALID_REQUEST = "invalid_request"
    NOT_FOUND = "not_found"
    NO_MATCH = "no_match"
    SERVER_ERROR = "server_error"


class Failure(enum.Enum):
    """The named failure classes a real API answers with, by what they mean (the hook
    vocabulary of the failure-class faults of `chaosllm.faults`): each protocol words
    them in its own shape (`Provider.failure`)."""

    CONTEXT_TOO_LONG = enum.auto()
    """The request is longer than the model's context window."""
    QUOTA_EXHAUSTED = enum.auto()
    """The account's quota or credit is spent: no retry helps until someone pays."""
    KEY_REFUSED = enum.auto()
    """The API key (or credentials) is not valid."""
    NO_SUCH_MODEL = enum.auto()
    """The model asked for does not exist (or the caller has no access to it)."""
    OVERLOADED = enum.auto()
    """The service is overloaded for now: a retry later cures it."""


FAILURE_STATUSES: Final[Mapping[Failure, int]] = MappingProxyType(
    {
        Failure.CONTEXT_TOO_LONG: 400,
        Failure.QUOTA_EXHAUSTED: 429,
        Failure.KEY_REFUSED: 401,
        Failure.NO_SUCH_MODEL: 404,
        Failure.OVERLOADED: 503,
    }
)
"""The HTTP status of each failure class where a protocol says nothing else."""

_FAILURE_MESSAGES: Final[Mapping[Failure, str]] = MappingProxyType(
    {
        Failure.CONTEXT_TOO_LONG: "The input is longer than the model's context window.",
        Failure.QUOTA_EXHAUSTED: "You exceeded your current quota, please check your plan and "
        "billing details.",
        Failure.KEY_REFUSED: "Incorrect API key provided.",
        Failure.NO_SUCH_MODEL: "The model {model} does not exist.",
        Failure.OVERLOADED: "The server is overloaded. Please try again later.",
    }
)


@dataclass(frozen=True, slots=True)
class FailureReply:
    """How a protocol answers a failure class: the status, the error body and the headers
    besides the content type (`Provider.failure`)."""

    status: int
    body: JSON
    headers: tuple[tuple[str, str], ...] = ()


def estimated_tokens(request: JSON) -> int:
    """About four characters a token of a request (what a failure's message counts)."""
    return max(1, -(-len(canonical_json(request)) // 4))


Variant = str | tuple[float, str]
"""Which rendering of a recorded response: ``"json"``, a stream rendered from the body
(`Provider.stream_variant`'s key), or recorded frames at a timing for those options
(the timing and that key)."""
JSON_VARIANT: Final = "json"
SSE_VARIANT: Final[tuple[str, Mapping[str, Any]]] = ("sse", MappingProxyType({}))
"""A stream rendered from the body with no request options (`Provider.stream_variant`)."""


class Provider(abc.ABC):
    """One protocol. Subclasses set the class attributes and implement the abstract
    methods; `chaosllm.providers.PROVIDERS` holds one instance of each."""

    name: ClassVar[str]
    """Recording `provider` field, e.g. ``openai.chat``."""
    paths: ClassVar[tuple[str, ...]] = ()
    """The request paths it serves (``POST``); routes and the wire's envelope use them."""
    client_header: ClassVar[str | None] = None
    """A request header only this protocol's SDK sends (how a shared endpoint such as
    ``GET /v1/models`` tells the protocol asking)."""
    turn_key: ClassVar[str] = "messages"
    """The canonical request's field holding the conversation, turn by turn."""
    finishing_events: ClassVar[frozenset[str]] = frozenset()
    """Stream event types that finish an answer (see `answer_frame_count`)."""
    minted_prefixes: ClassVar[tuple[str, ...]] = ()
    """Prefixes of the ids the API mints in every answer (``chatcmpl-``, ``call_``...):
    the values of an answer's ``id`` and ``call_id`` keys that start with one are what
    `fresh_ids` replaces."""

    def __init__(self) -> None:
        prefixes = b"|".join(re.escape(p.encode("ascii")) for p in self.minted_prefixes)
        self._minted_pattern = (
            re.compile(b'"((?:' + prefixes + b')[A-Za-z0-9_-]+)"') if prefixes else None
        )
        self._templates = tuple(_compile_template(t) for t in self.path_templates)

    # -- requests ---------------------------------------------------------------------

    @abc.abstractmethod
    def validate(self, body: JSON) -> None:
        """Raise `InvalidRequest` for a body the real provider would refuse."""

    @abc.abstractmethod
    def canonical(self, body: JSON) -> Any:
        """What decides the answer: the digest and nearest matching are computed over it
        (a JSON object holding `turn_key`)."""

    def digest(self, body: JSON) -> str:
        return sha256_digest(self.canonical(body))

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

    # -- routes with parameters -------------------------------------------------------

    path_templates: ClassVar[tuple[str, ...]] = ()
    """Request paths with parameters it serves (``POST``), e.g.
    ``/v1beta/models/{model}:generateContent``: ``{name}`` is one path segment,
    ``{name:path}`` any run of characters, slashes too (Starlette's syntax, so the ASGI
    app routes them as they are). What the path and the query carry is folded into the
    request by `bind`."""

    def path_params(self, path: str) -> dict[str, str] | None:
        """The parameters of `path` if one of `path_templates` matches it, else None."""
        for pattern in self._templates:
            found = pattern.fullmatch(path)
            if found is not None:
                return found.groupdict()
        return None

    def bind(self, body: JSON, params: Mapping[str, str], query: str) -> JSON:
        """The request as chaosllm keys, matches and records it: the client's body with what
        the path (`params`) and the query string say about the answer folded in (the
        model a Gemini path names, the deployment of an Azure one, whether a stream is
        asked for), for a provider with `path_templates`. Secrets in the query (``key=``)
        are never folded in. Raises `InvalidRequest` for a path or query the real API
        refuses. The body itself by default."""
        return body

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

    def error_headers(self, status: int) -> tuple[tuple[str, str], ...]:
        """Headers every error answer of the protocol carries besides its content type
        (Bedrock's ``x-amzn-ErrorType``); none by default."""
        return ()

    def rate_limit_headers(self, state: RateLimitState) -> tuple[tuple[str, str], ...]:
        """The live rate-limit headers every answer carries under ``--rate-limit``, as the
        real API writes them (`chaosllm.providers.ratelimits`); none by default (Gemini,
        Bedrock and Ollama send none)."""
        return ()

    def upstream_path(self, path: str) -> str:
        """The path the recording proxy sends upstream for a (decoded) request path: the
        path as the SDK encoded it where that matters (a signed request's path is part of
        its signature: Bedrock's model ids are percent-encoded); itself by default."""
        return path

    def corrupt_frame(self, frame: bytes) -> bytes | None:
        """A stream frame as a checksummed framing garbles it (AWS's event stream: the
        message with a wrong CRC), what ``garbage`` sends mid-stream without ``data``;
        None (the default): the framing has no checksum, the noise is sent instead."""
        return None

    # -- what the pace and the wire quirks need (legal but unusual streams) -----------

    def streams_sse(self, body: JSON) -> bool:
        """Whether a stream answering request `body` is Server-Sent Events (what the SSE
        quirks apply to): its content type says so (not Gemini's JSON array without
        ``alt=sse``, Ollama's NDJSON or Bedrock's event stream)."""
        return any(
            key.lower() == "content-type" and value.lower().startswith("text/event-stream")
            for key, value in self.stream_headers(self.stream_variant(body)[1])
        )

    def text_tokens(self, value: JSON) -> int:
        """Estimated tokens of the text an answer (or a frame's payload) carries, what a
        pace paces: its text's characters / 4, rounded up; by default the strings under
        `TEXT_KEYS` anywhere in it."""
        return -(-_text_length(value) // 4)

    def frame_tokens(self, data: bytes) -> int:
        """Estimated tokens of a stream frame (`text_tokens` of its payloads), at least 1."""
        try:
            text = self.frame_text(data)
        except ValueError:
            return 1
        payloads = list(sse.iter_data([text])) or text.splitlines()
        tokens = 0
        for payload in payloads:
            try:
                tokens += self.text_tokens(json.loads(payload))
            except ValueError:
                continue
        return max(1, tokens)

    def usage_frame(self, answer: JSON) -> bytes | None:
        """A frame carrying only the usage of a stream of `answer` (Chat Completions'
        ``choices: []`` chunk, which some gateways send even when it is not asked for);
        None (the default): the protocol has no such frame."""
        return None

    def carries_usage(self, frame: bytes) -> bool:
        """Whether a stream frame is the usage-only frame of `usage_frame`."""
        return False

    def filter_frames(self, answer: JSON) -> tuple[bytes, bytes] | None:
        """Azure's content-filter frames around a stream of `answer`: the prompt's results
        first (``choices: []``), the choices' asynchronous filter results last;
        None (the default): the protocol has none."""
        return None

    def restated_arguments(self, answer: JSON) -> dict[int, dict[int, str]] | None:
        """Per choice, per tool-call index, the complete arguments of the answer's tool
        calls, for a protocol some gateways restate them for on the finish frame (Chat
        Completions); None (the default): not this protocol, or no tool calls."""
        return None

    def restate_arguments(self, frame: bytes, arguments: Mapping[int, Mapping[int, str]]) -> bytes:
        """`frame` with the complete `arguments` (`restated_arguments`) restated for the
        same tool-call indexes when it finishes a choice that has them; itself otherwise."""
        return frame

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

    def json_answer(self, body: JSON) -> JSON:
        """The body a non-stream request gets for a recorded body (itself by default)."""
        return body

    def json_status(self, body: JSON, status: int) -> int:
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

    def recorded_frames(
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
            data = json.dumps(self.json_answer(answer), ensure_ascii=False)
            return ResponsePlan(
                status=self.json_status(answer, response.status),
                headers=JSON_HEADERS + headers,
                pieces=(Piece(data.encode("utf-8"), frame=False),),
            )
        if isinstance(variant, tuple):
            encode = self.encode_frame
            pieces = tuple(
                Piece(encode(c.data), c.delay_ms * timing)
                for c in self.recorded_frames(response, options, request)
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

    def error_body(
        self,
        status: int,
        message: str,
        *,
        kind: str | None = None,
        code: str | None = None,
        param: str | None = None,
    ) -> dict[str, Any]:
        """The provider's error envelope for an HTTP status. With `kind` (`ErrorKind`) it is
        an error chaosllm itself answers, typed by the kind, with `code` as given;
        without, the error a real API answers with that status (its type and code)."""
        return self.envelope(status, message, kind, code, param)

    @abc.abstractmethod
    def envelope(
        self, status: int, message: str, kind: str | None, code: str | None, param: str | None
    ) -> dict[str, Any]:
        """`error_body`, as each protocol words it."""

    def render_error(
        self,
        status: int,
        message: str,
        *,
        kind: str,
        code: str | None = None,
        param: str | None = None,
        stream: bool = False,
    ) -> ResponsePlan:
        """The plan of an error chaosllm itself answers (a JSON body, whatever was asked)."""
        body = self.error_body(status, message, kind=kind, code=code, param=param)
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        headers = JSON_HEADERS + self.error_headers(status)
        return ResponsePlan(status=status, headers=headers, pieces=(Piece(data, frame=False),))

    def error_answer(self, message: str, *, status: int, code: str | None = None) -> JSON:
        """The body a real error with this status carries (what faults answer with)."""
        return self.error_body(status, message, code=code)

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

    # -- what faults need: each provider says how its own protocol breaks -------------

    def frame_finishes(self, frame: str) -> bool:
        """Whether a frame finishes the answer (one of `finishing_events`)."""
        return any(kind in self.finishing_events for kind in sse.event_types((frame,)))

    def answer_frame_count(self, plan: ResponsePlan) -> int:
        """How many leading frames of a stream plan carry the answer, before the frames
        that finish it (finish chunk, usage chunk, terminator)."""
        for i, piece in enumerate(plan.pieces):
            if self.frame_finishes(piece.data.decode("utf-8", "replace")):
                return i
        return len(plan.pieces)

    @abc.abstractmethod
    def stream_error_frame(self, message: str, *, status: int) -> bytes:
        """An error event inside a stream, in the provider's own format."""

    def framed_error(self, frame: bytes, plan: ResponsePlan, kept: int) -> bytes:
        """An error event (`stream_error_frame`, `failure_frame`: in the protocol's first
        stream framing) as the piece after the first `kept` pieces of the stream `plan`, in
        that stream's own framing (Gemini's JSON array: an element, the array closed); the
        frame itself by default."""
        return frame

    @abc.abstractmethod
    def empty_answer(self, body: JSON) -> JSON:
        """A well-formed answer body with no content and no tool calls."""

    arguments_key: ClassVar[str] = "arguments"
    """The key of a tool call's arguments (in what `tool_calls` yields)."""

    @abc.abstractmethod
    def tool_calls(self, answer: Any) -> Iterator[dict[str, Any]]:
        """The objects of an answer body holding its tool calls' arguments (mutable)."""

    def break_tool_arguments(self, body: JSON) -> JSON | None:
        """The answer with every tool call's arguments cut into invalid JSON (arguments that
        are a JSON value are cut as their text); None when the answer has no tool calls."""
        broken = copy.deepcopy(body)
        calls = list(self.tool_calls(broken))
        for call in calls:
            value = call.get(self.arguments_key)
            text = value if isinstance(value, str) else json.dumps(value) if value else ""
            call[self.arguments_key] = cut_json(text)
        return broken if calls else None

    def break_argument_deltas(self, frame: bytes, cut: ArgumentCuts) -> bytes | None:
        """A stream frame with the text of each tool-call argument delta it carries replaced
        by ``cut(key, text)`` (`key` names the call: the same for every delta of one call)
        and each restatement of a call's whole arguments by ``cut.whole(key, text)``, what
        ``malformed_tool_args`` does to a live stream (`chaosllm.faults.live`), so that the
        client's answer is the one `break_tool_arguments` gives (a protocol whose calls
        come whole breaks them as that does); the frame itself when nothing changed. A
        frame broken into one that finishes the answer (Ollama's parse error) ends the
        client's answer there. None (the default): this protocol's argument deltas cannot
        be broken one frame at a time (the answer is then read whole)."""
        return None

    # -- the named failure classes (`Failure`) ----------------------------------------

    def failure(self, failure: Failure, request: JSON, message: str | None = None) -> FailureReply:
        """The answer of a failure class to `request` in the protocol's shape: by default
        `error_body` for `failure_status`, worded by `failure_message` (or `message`), its
        body from `failure_body` and its headers from `failure_headers`."""
        status = self.failure_status(failure)
        text = message if message is not None else self.failure_message(failure, request)
        body = self.failure_body(failure, text, status=status)
        return FailureReply(status, body, self.failure_headers(failure, status))

    def failure_status(self, failure: Failure) -> int:
        """The HTTP status of a failure class (`FAILURE_STATUSES` by default)."""
        return FAILURE_STATUSES[failure]

    def failure_message(self, failure: Failure, request: JSON) -> str:
        """The message a failure class carries, as the real API words it for `request`."""
        model = self.model_of(request)
        return _FAILURE_MESSAGES[failure].format(model=model if isinstance(model, str) else "")

    def failure_body(self, failure: Failure, message: str, *, status: int) -> JSON:
        """The error body of a failure class: the protocol's error for its status."""
        return self.error_answer(message, status=status)

    def failure_headers(self, failure: Failure, status: int) -> tuple[tuple[str, str], ...]:
        """The headers of a failure class's answer (`error_headers` by default)."""
        return self.error_headers(status)

    def failure_frame(self, failure: Failure, request: JSON, message: str | None = None) -> bytes:
        """A failure class inside a stream that already began (an overload mid-answer):
        `stream_error_frame` of its status by default."""
        text = message if message is not None else self.failure_message(failure, request)
        return self.stream_error_frame(text, status=self.failure_status(failure))

    def filtered_answer(self, answer: JSON) -> JSON | None:
        """The answer as the protocol's content filter cuts it: the text before the filter
        stopped it (`filtered_text`), no tool calls, the finish reason saying why. None
        (the default): the answer is not one this protocol can filter."""
        return None

    # -- what fault matching reads (``match.contains``, ``match.tool``) -----------------

    def last_user_text(self, body: JSON) -> str | None:
        """The text of the request's last user message that holds text (its text parts
        joined by newlines), or None: what ``match.contains`` searches. Never raises (a
        proxied body may hold anything). None by default."""
        return None

    def tool_names(self, body: JSON) -> frozenset[str]:
        """The names of the tools the request offers (``match.tool``); none by default."""
        return frozenset()

    def called_tool_names(self, answer: JSON) -> frozenset[str]:
        """The names of the tools an answer calls (``match.tool``), read without changing
        it: by default the ``name`` of each object `tool_calls` yields (a copy's)."""
        if not isinstance(answer, dict):
            return frozenset()
        try:
            return facts.names_of(self.tool_calls(copy.deepcopy(answer)))
        except (AttributeError, TypeError, KeyError):
            return frozenset()

    # -- fresh ids --------------------------------------------------------------------

    def minted_ids(self, answer: JSON) -> list[str]:
        """The ids the API minted in an answer (values of its ``id`` and ``call_id`` keys
        that start with one of `minted_prefixes`), in order of first appearance."""
        prefixes = self.minted_prefixes
        found: dict[str, None] = {}
        for key, value in _keyed_strings(answer):
            if key in _ID_KEYS and value.startswith(prefixes) and _ID.match(value):
                found.setdefault(value, None)
        return list(found)

    def fresh_ids(
        self, plan: ResponsePlan, answer: JSON, key: str
    ) -> tuple[tuple[Piece, ...], dict[str, str]]:
        """The pieces of `plan` (rendered from `answer`) with every id the API minted in
        `answer` replaced by a fresh one: the same prefix, length and alphabet, derived
        from `key` and the id (the same key gives the same ids), the same everywhere in
        the body or the frames; and the mapping of the recorded ids to the fresh ones
        (empty: nothing to replace, the pieces are the plan's). Where the ids sit in the
        plan is worked out on each call (no cache keyed by the plan)."""
        template = self._id_template(plan, answer)
        if not template.ids:
            return plan.pieces, {}
        seed = key.encode("utf-8", "surrogatepass") + b"\x00"
        fresh = [spec.fresh(seed) for spec in template.ids]
        pieces = tuple(
            piece
            if len(segments) == 1
            else Piece(
                b"".join([fresh[s] if type(s) is int else s for s in segments]),  # type: ignore[misc]
                piece.delay_ms,
                piece.frame,
            )
            for piece, segments in zip(plan.pieces, template.pieces, strict=True)
        )
        return pieces, {
            spec.old: new.decode("ascii") for spec, new in zip(template.ids, fresh, strict=True)
        }

    def _id_template(self, plan: ResponsePlan, answer: JSON) -> _IdTemplate:
        ids = self.minted_ids(answer) if self.minted_prefixes else []
        pieces: tuple[tuple[bytes | int, ...], ...] = ()
        if ids:
            index = {old.encode("ascii"): i for i, old in enumerate(ids)}
            alternatives = b"|".join(re.escape(old) for old in sorted(index, key=len, reverse=True))
            pattern = re.compile(b'(?<=")(' + alternatives + b')(?=")')
            pieces = tuple(
                tuple(
                    index[part] if i % 2 else part
                    for i, part in enumerate(pattern.split(piece.data))
                )
                for piece in plan.pieces
            )
        return _IdTemplate(tuple(_IdSpec.of(old, self.minted_prefixes) for old in ids), pieces)

    def recorded_ids(self, raw: bytes, minted: Mapping[str, str]) -> bytes:
        """A request body with the fresh ids of `minted` (fresh -> recorded) that it
        echoes (a tool call's id, a ``previous_response_id``) turned back into the
        recorded ones, so that it keys like the recorded request."""
        pattern = self._minted_pattern
        if pattern is None or pattern.search(raw) is None:
            return raw

        def replace(found: re.Match[bytes]) -> bytes:
            old = minted.get(found.group(1).decode("ascii"))
            return b'"' + old.encode("ascii") + b'"' if old is not None else found.group(0)

        return pattern.sub(replace, raw)


@dataclass(frozen=True, slots=True)
class _IdTemplate:
    """Where the minted ids sit in a plan: each piece cut at them (an int is the index of
    an id in `ids`, bytes are kept as they are)."""

    ids: tuple[_IdSpec, ...]
    pieces: tuple[tuple[bytes | int, ...], ...]


@dataclass(frozen=True, slots=True)
class _IdSpec:
    """A recorded id, and how a fresh one for it is drawn: its prefix kept, its tail's
    characters drawn from a hash by `table` (its tail's alphabet: hex, lower case and
    digits, or letters and digits), any ``_`` or ``-`` of its tail kept in place."""

    old: str
    prefix: bytes
    tail: str
    table: bytes
    separators: frozenset[str]
    salt: bytes

    @classmethod
    def of(cls, old: str, prefixes: tuple[str, ...]) -> _IdSpec:
        prefix = max((p for p in prefixes if old.startswith(p)), key=len)
        tail = old[len(prefix) :]
        chars = set(tail)
        separators = frozenset(chars & {"_", "-"})
        chars -= separators
        table = next((_TABLES[a] for a in _ALPHABETS if chars <= a), _TABLES[_ALPHABETS[-1]])
        salt = old.encode("ascii") + b"\x00"
        return cls(old, prefix.encode("ascii"), tail, table, separators, salt)

    def fresh(self, seed: bytes) -> bytes:
        """The fresh id for a key (`seed`: the key's bytes and a NUL)."""
        size = len(self.tail)
        stream = hashlib.blake2b(seed + self.salt).digest()
        counter = 1
        while len(stream) < size:
            stream += hashlib.blake2b(seed + self.salt + b"%d" % counter).digest()
            counter += 1
        drawn = stream[:size].translate(self.table)
        if self.separators:
            drawn = bytes(
                ord(c) if c in self.separators else d for c, d in zip(self.tail, drawn, strict=True)
            )
        return self.prefix + drawn


_ID_KEYS = frozenset({"id", "call_id"})
_ID = re.compile(r"[A-Za-z]+[-_][A-Za-z0-9_-]+\Z")
_ALPHABETS = (
    frozenset("0123456789abcdef"),
    frozenset("abcdefghijklmnopqrstuvwxyz0123456789"),
    frozenset("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"),
)
_TABLES = {
    alphabet: bytes(sorted(alphabet)[i % len(alphabet)].encode("ascii")[0] for i in range(256))
    for alphabet in _ALPHABETS
}
"""Per alphabet, a byte -> character table (`bytes.translate` maps hash bytes with it)."""


def swap_strings(value: JSON, swap: Mapping[str, str]) -> JSON:
    """`value` with every string that is a key of `swap` replaced by its value (an answer
    with the fresh ids `Provider.fresh_ids` gave its plan)."""
    if isinstance(value, str):
        return swap.get(value, value)
    if isinstance(value, dict):
        return {k: swap_strings(v, swap) for k, v in value.items()}
    if isinstance(value, list):
        return [swap_strings(v, swap) for v in value]
    return value
