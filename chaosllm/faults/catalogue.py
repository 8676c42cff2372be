"""The fault catalogue: one entry per fault type, and everything else derived from it.

Theory of operation. A fault type is data, as h11 keeps its state machine: an
entry (`FaultType`) holds the type's name and summary, its parameters (kind,
default, doc, bounds, and how ``chaosllm.strategies`` draws it), the pure
function that transforms a response plan, the predicate saying which answers it
applies to, whether the client still gets the answer, and its place in the
strategies' shrink order. Spec validation (`chaosllm.faults.spec`), dispatch
(`apply_fault`), the CLI's ``fault arm`` flags, the control plane's query typing,
the hypothesis strategies and the probe read the entry; tests check the README's
table against it. Adding a fault type is one entry in `CATALOGUE` (and its
transform in `chaosllm.faults.transform`): its name appears in no other module.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from chaosllm.faults import gateway as gw
from chaosllm.faults import live as lv
from chaosllm.faults import mcp
from chaosllm.faults import session as ws
from chaosllm.faults import stored as sr
from chaosllm.faults import transform as t
from chaosllm.model import JSON, ResponsePlan
from chaosllm.providers.base import Provider

if TYPE_CHECKING:
    from chaosllm.faults.spec import FaultSpec
    from chaosllm.faults.transform import FaultContext

__all__ = [
    "CATALOGUE",
    "FAULT_TYPES",
    "MALFORMED_TOOL_ARGS",
    "NON_RETRYABLE_CLASSES",
    "Draw",
    "FaultType",
    "Param",
    "retryable_type",
]


class Draw(enum.Enum):
    """How ``chaosllm.strategies`` draws a parameter (each is bounded by the option of
    `chaosllm.strategies.faults` named in its doc); a parameter without one keeps its
    default in drawn specs."""

    AFTER_CHUNKS = "after_chunks"
    """0..`max_after_chunks` frames."""
    RETRY_AFTER = "retry_after"
    """`max_retry_after` or half of it, never 0 (clients ignore a zero Retry-After)."""
    STATUS = "status"
    """one of `statuses`."""
    DELAY_MS = "delay_ms"
    """0..`max_delay_ms` whole milliseconds."""
    PIECE_DELAY_MS = "piece_delay_ms"
    """0..`max_delay_ms` / 10 whole milliseconds (it is paid once per piece)."""
    STALL_MS = "stall_ms"
    """exactly `stall_ms`."""


@dataclass(frozen=True, slots=True)
class Param:
    kind: type
    """int, float or str: validation, the CLI flag and query-string typing follow it."""
    default: Any
    """None: the type's own behaviour (documented in `doc`)."""
    doc: str
    minimum: float | None = None
    maximum: float | None = None
    draw: Draw | None = None
    """How ``chaosllm.strategies`` draws it (None: drawn specs keep the default)."""
    choices: tuple[str, ...] = ()
    """The values a text parameter may take (none: any text)."""

    @property
    def text(self) -> bool:
        """Whether values are text: a query string keeps them strings even when they
        look like numbers (``message=404``)."""
        return self.kind is str


Transform = Callable[[ResponsePlan, "FaultSpec", "FaultContext"], ResponsePlan]
Applies = Callable[[Provider, JSON], bool]
OnRequest = Callable[[Provider, JSON, bool], bool]
"""Whether a fault can fire on a request: (provider, bound request body, stream)."""
Alone = Callable[["FaultSpec", bool], bool]
"""Whether a fault's answer to a request (streaming or not) owes nothing to the answer it
replaces (see `FaultType.answers_alone`)."""


def _never(spec: FaultSpec, stream: bool) -> bool:
    return False


def _always(spec: FaultSpec, stream: bool) -> bool:
    return True


def _before_any_byte(spec: FaultSpec, stream: bool) -> bool:
    """A non-streaming request reset with ``after_bytes: 0``: no head, no byte."""
    return not stream and spec.param("after_bytes") == 0


def _before_a_head(spec: FaultSpec, stream: bool) -> bool:
    """Garbage instead of an answer (a streaming request gets it after the head)."""
    return not stream


def _before_any_frame(spec: FaultSpec, stream: bool) -> bool:
    """An error status, unless a stream is to break after ``after_chunks`` frames."""
    return not stream or spec.param("after_chunks") is None


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultType:
    name: str
    summary: str
    transform: Transform
    """The pure plan transformation (`chaosllm.faults.transform`)."""
    live: lv.LiveFactory | None = None
    """Its streaming counterpart (`chaosllm.faults.live`): applied to a proxied stream
    frame by frame as it arrives; None: the proxy reads the answer whole first."""
    simplicity: int
    """Rank in ``chaosllm.strategies.SIMPLEST_FIRST``: drawn examples shrink toward
    lower ranks (the simplest faults to reason about)."""
    params: Mapping[str, Param] = field(default_factory=dict)
    applies: Applies = t.always
    """Whether it can fire on an answer; when not, the fault is not consumed."""
    on_request: OnRequest = t.any_request
    """Whether it can fire on a request (``(provider, body, stream)``: the SSE quirks on
    SSE streams only); when not, the fault is not consumed."""
    delivers_answer: bool = False
    """Whether the client still gets the whole answer (only slower)."""
    silence_param: str | None = None
    """The parameter bounding how long the client is left with nothing arriving: a
    probe sets it beyond its time limit, so that a client without a timeout hangs."""
    answers_alone: Alone = _never
    """Whether its answer to a request (``(spec, stream)``) owes nothing to the answer
    it replaces: no status, header, frame or byte of it (an error status, a reset or
    garbage before any head, an empty reply). The proxy modes then answer it without
    asking the upstream, and nothing is recorded."""
    session: ws.SessionTransform | None = None
    """Its transformation of a WebSocket session's turn (`chaosllm.faults.session`); None:
    it never fires on a session."""
    session_whole: bool = False
    """Its session transformation needs the turn's whole answer (what it does depends on
    the events to come): on a proxied session the turn is read to its end first, then
    transformed; the others fire on the upstream's events as they arrive."""
    mcp: bool = False
    """An MCP fault: it fires on MCP requests (any server, or ``match.server``'s); any
    other type fires on an MCP request only when its ``match.server`` names the server."""
    mcp_effect: str | None = None
    """What firing does to the MCP session (``ends_session``, ``changes_tools``,
    ``drops_stream``: a stream its ``retry_ms`` makes resumable; the engine's MCP hooks,
    `chaosllm.core.mcp`, write it); None: nothing."""
    stored_effect: str | None = None
    """What it does for good to the stored response it fires on (`chaosllm.core.background`:
    ``failed``, ``expired``, ``keep_running``); None: nothing."""
    retryable: bool | None = None
    """Whether a client should send the request it broke again (the verdicts of
    `chaosllm.core.verdict`): True for a transient failure that a retry cures (not
    retrying is ``gave_up_early``), False for one no retry cures (retrying is
    ``retried_non_retryable``); None: the status of its answer decides (``http_error``),
    or neither (an answer came, damaged: a client may ask again or fail cleanly)."""


def _chunks(default: int) -> Param:
    doc = "SSE frames sent before the fault (streaming requests)"
    return Param(int, default, doc, 0, draw=Draw.AFTER_CHUNKS)


_BYTES = Param(
    int,
    None,
    "body bytes sent before the fault (non-streaming requests; default: half the body; "
    "in a stream, bytes of the frame after the K frames: a cut inside a frame)",
    0,
)
_MESSAGE = Param(str, None, "the error message (default: a realistic one)")


def _retry(default: float | None, draw: Draw | None) -> Param:
    return Param(float, default, "seconds for the Retry-After header", 0, 86_400, draw=draw)


def _session(
    name: str,
    summary: str,
    transform: ws.SessionTransform,
    simplicity: int,
    after: int,
    *,
    silence: str | None = None,
    **params: Param,
) -> FaultType:
    """A fault of WebSocket sessions only (`chaosllm.faults.session`)."""
    return FaultType(
        name=name,
        summary=summary,
        transform=ws.unchanged,
        session=transform,
        on_request=ws.not_http,
        params={"after_events": _events(after), **params},
        simplicity=simplicity,
        silence_param=silence,
    )


def _events(default: int) -> Param:
    doc = "server events of the session's turn sent before the fault (0: before the first)"
    return Param(int, default, doc, 0, draw=Draw.AFTER_CHUNKS)


_SESSION_FAULTS = (
    _session(
        "ws_close",
        "the WebSocket closed with a close frame (code, reason)",
        ws.ws_close,
        50,
        2,
        code=Param(int, 1011, "the close code (1000, 1001, 1011, 4000-4999)", 1000, 4999),
        reason=Param(str, None, "the close reason (default: internal error)"),
    ),
    _session("ws_drop", "the TCP connection ends with no close frame", ws.ws_drop, 51, 2),
    _session(
        "session_error",
        "an error event mid-response (OpenAI Realtime)",
        ws.session_error,
        52,
        2,
        error_type=Param(
            str, None, "server_error (default), rate_limit_exceeded or invalid_request_error"
        ),
        message=_MESSAGE,
    ),
    _session(
        "session_expired",
        "the session expired: the protocol's event, then a close",
        ws.session_expired,
        53,
        0,
    ),
    _session(
        "go_away",
        "Gemini Live's goAway, then a close time_left_ms later",
        ws.go_away,
        54,
        0,
        time_left_ms=Param(int, 1000, "milliseconds until the close", 0, 3_600_000),
    ),
    _session(
        "session_stall",
        "no more events and pings unanswered, then the connection dropped after max_ms",
        ws.session_stall,
        55,
        2,
        silence="max_ms",
        max_ms=Param(float, 30_000.0, "milliseconds of silence", 0, 3_600_000, draw=Draw.STALL_MS),
    ),
    _session(
        "rate_limits_exhausted",
        "rate_limits.updated at zero, then a rate_limit_exceeded error (OpenAI Realtime)",
        ws.rate_limits_exhausted,
        56,
        0,
    ),
    _session(
        "malformed_event",
        "a text frame that is not JSON among the turn's events",
        ws.malformed_event,
        57,
        2,
        text=Param(str, None, "the frame's text (default: a JSON event cut short)"),
    ),
)

_ENDS = ("failed", "incomplete")

CATALOGUE: tuple[FaultType, ...] = (
    FaultType(
        name="empty_response",
        summary="200 with a well-formed answer that has no content",
        transform=t.empty_response,
        applies=t.is_object,
        simplicity=8,
    ),
    FaultType(
        name="truncated_stream",
        summary="the body ends early but cleanly: no finish chunk, no [DONE]",
        params={"after_chunks": _chunks(2)},
        transform=t.truncated_stream,
        live=lv.truncated_stream,
        retryable=True,
        simplicity=6,
    ),
    FaultType(
        name="dropped_connection",
        summary="part of the body, then the socket is closed (FIN)",
        params={"after_chunks": _chunks(2), "after_bytes": _BYTES},
        transform=t.dropped_connection,
        live=lv.dropped_connection,
        retryable=True,
        simplicity=5,
    ),
    FaultType(
        name="error_in_200",
        summary="status 200 whose body (or a stream frame) is an error",
        params={"after_chunks": _chunks(0), "message": _MESSAGE},
        transform=t.error_in_200,
        live=lv.error_in_200,
        simplicity=7,
    ),
    FaultType(
        name="http_503",
        summary="503 with the provider's error envelope",
        params={"retry_after": _retry(None, Draw.RETRY_AFTER), "message": _MESSAGE},
        transform=t.http_503,
        answers_alone=_always,
        retryable=True,
        simplicity=0,
    ),
    FaultType(
        name="malformed_tool_args",
        summary="tool-call arguments cut into invalid JSON (fires only on answers with tool calls)",
        transform=t.malformed_tool_args,
        live=lv.malformed_tool_args,
        session=ws.malformed_tool_args,
        session_whole=True,
        applies=t.has_tool_arguments,
        simplicity=9,
    ),
    FaultType(
        name="http_429",
        summary="429 rate limit with Retry-After",
        params={"retry_after": _retry(1.0, Draw.RETRY_AFTER), "message": _MESSAGE},
        transform=t.http_429,
        answers_alone=_always,
        retryable=True,
        simplicity=1,
    ),
    FaultType(
        name="http_error",
        summary="any error status with the provider's matching error type",
        params={
            "status": Param(int, 500, "the HTTP status (400-599)", 400, 599, draw=Draw.STATUS),
            "retry_after": _retry(None, None),
            "message": _MESSAGE,
        },
        transform=t.http_error,
        answers_alone=_always,
        simplicity=2,
    ),
    FaultType(
        name="connection_reset",
        summary="TCP RST (SO_LINGER 0) mid-response",
        params={
            "after_chunks": _chunks(0),
            "after_bytes": Param(
                int,
                0,
                "body bytes sent before the reset (non-streaming requests; 0 resets before "
                "any byte; in a stream, bytes of the frame after the K frames)",
                0,
            ),
        },
        transform=t.connection_reset,
        live=lv.connection_reset,
        answers_alone=_before_any_byte,
        retryable=True,
        simplicity=4,
    ),
    FaultType(
        name="empty_reply",
        summary="the connection is closed with no bytes at all",
        transform=t.empty_reply,
        answers_alone=_always,
        retryable=True,
        simplicity=3,
    ),
    FaultType(
        name="latency",
        summary="a delay before the response headers",
        params={
            "delay_ms": Param(
                float, 1000.0, "milliseconds before the headers", 0, 3_600_000, draw=Draw.DELAY_MS
            )
        },
        transform=t.latency,
        delivers_answer=True,
        simplicity=11,
    ),
    FaultType(
        name="slow_stream",
        summary="the body dribbled out with a delay before each piece",
        params={
            "delay_ms": Param(
                float,
                100.0,
                "milliseconds before each frame or piece",
                0,
                600_000,
                draw=Draw.PIECE_DELAY_MS,
            ),
            "piece_bytes": Param(int, 64, "bytes per piece (non-streaming requests)", 1),
        },
        transform=t.slow_stream,
        delivers_answer=True,
        simplicity=12,
    ),
    FaultType(
        name="stall",
        summary="headers (and after_chunks frames), then silence until the client gives up "
        "or max_ms passes",
        params={
            "after_chunks": _chunks(0),
            "max_ms": Param(
                float,
                30_000.0,
                "longest silence before the socket is closed",
                0,
                3_600_000,
                draw=Draw.STALL_MS,
            ),
        },
        transform=t.stall,
        live=lv.stall,
        silence_param="max_ms",
        retryable=True,
        simplicity=13,
    ),
    FaultType(
        name="garbage",
        summary="bytes that are not HTTP (or, mid-stream, not SSE)",
        params={
            "after_chunks": _chunks(0),
            "data": Param(str, None, "the garbage to send (default: binary noise)"),
        },
        transform=t.garbage,
        live=lv.garbage,
        answers_alone=_before_a_head,
        retryable=True,
        simplicity=10,
    ),
    FaultType(
        name="context_length_exceeded",
        summary="the provider's 400 for a request longer than the model's context window",
        params={"message": _MESSAGE},
        transform=t.context_length_exceeded,
        answers_alone=_always,
        retryable=False,
        simplicity=20,
    ),
    FaultType(
        name="insufficient_quota",
        summary="the provider's answer to an account whose quota or credit is spent (OpenAI: "
        "a 429 without Retry-After)",
        params={"message": _MESSAGE},
        transform=t.insufficient_quota,
        answers_alone=_always,
        retryable=False,
        simplicity=21,
    ),
    FaultType(
        name="content_filter",
        summary="200, the answer cut by the provider's content filter, its finish reason "
        "saying so (JSON and stream)",
        transform=t.content_filter,
        applies=t.can_filter,
        retryable=False,
        simplicity=22,
    ),
    FaultType(
        name="invalid_api_key",
        summary="the provider's answer to an API key (or credentials) it does not know",
        params={"message": _MESSAGE},
        transform=t.invalid_api_key,
        answers_alone=_always,
        retryable=False,
        simplicity=23,
    ),
    FaultType(
        name="model_not_found",
        summary="the provider's 404 for a model it does not have",
        params={"message": _MESSAGE},
        transform=t.model_not_found,
        answers_alone=_always,
        retryable=False,
        simplicity=24,
    ),
    FaultType(
        name="overloaded",
        summary="the provider's overload (Anthropic 529, others 503); with after_chunks, a "
        "stream's error event after K frames",
        params={
            "after_chunks": Param(
                int,
                None,
                "SSE frames sent before the error event (streaming requests; default: the "
                "error status before any frame)",
                0,
            ),
            "retry_after": _retry(None, Draw.RETRY_AFTER),
            "message": _MESSAGE,
        },
        transform=t.overloaded,
        live=lv.overloaded,
        answers_alone=_before_any_frame,
        retryable=True,
        simplicity=25,
    ),
    FaultType(
        name="keepalive_comments",
        summary="SSE comment lines (`: PROCESSING`) between frames, as OpenRouter sends",
        params={
            "every_frames": Param(int, 1, "a comment after every this many frames", 1),
            "comment": Param(str, None, "the comment's text (default: PROCESSING)"),
        },
        transform=t.keepalive_comments,
        on_request=t.sse_stream,
        delivers_answer=True,
        simplicity=31,
    ),
    FaultType(
        name="crlf_frames",
        summary="SSE lines ended with CRLF",
        transform=t.crlf_frames,
        on_request=t.sse_stream,
        delivers_answer=True,
        simplicity=32,
    ),
    FaultType(
        name="data_no_space",
        summary="SSE data lines with no space after the colon (`data:{...}`)",
        transform=t.data_no_space,
        on_request=t.sse_stream,
        delivers_answer=True,
        simplicity=33,
    ),
    FaultType(
        name="split_utf8",
        summary="a multi-byte UTF-8 character split across two writes, gap_ms apart "
        "(fires only on answers with non-ASCII text)",
        params={
            "gap_ms": Param(float, 50.0, "milliseconds between the two writes", 0, 60_000),
        },
        transform=t.split_utf8,
        applies=t.has_non_ascii,
        on_request=t.sse_stream,
        delivers_answer=True,
        simplicity=34,
    ),
    FaultType(
        name="restated_tool_args",
        summary="the complete tool-call arguments sent again on the finish frame (Chat "
        "Completions; fires only on answers with tool calls)",
        transform=t.restated_tool_args,
        applies=t.restates_arguments,
        on_request=t.sse_stream,
        delivers_answer=True,
        simplicity=35,
    ),
    FaultType(
        name="filter_frames",
        summary="Azure's content-filter frames: the prompt's first (`choices: []`), the "
        "choices' asynchronous results last (Chat Completions)",
        transform=t.filter_frames,
        applies=t.has_filter_frames,
        on_request=t.sse_stream,
        delivers_answer=True,
        simplicity=36,
    ),
    FaultType(
        name="usage_only_frame",
        summary="a last usage frame with `choices: []` even when not asked for (Chat Completions)",
        transform=t.usage_only_frame,
        applies=t.has_usage_frame,
        on_request=t.sse_stream,
        delivers_answer=True,
        simplicity=37,
    ),
    FaultType(
        name="pace",
        summary="the answer paced: the first frame after ttft_ms, then tps tokens a second, "
        "with seeded jitter (a JSON answer's head after all of it)",
        params={
            "ttft_ms": Param(
                float,
                600.0,
                "milliseconds before the first frame",
                0,
                3_600_000,
                draw=Draw.DELAY_MS,
            ),
            "tps": Param(float, 50.0, "tokens a second after it (0: no rate)", 0, 1_000_000),
            "jitter": Param(float, 0.0, "each gap scaled by a seeded draw in [1-j, 1+j]", 0, 1),
        },
        transform=t.pace,
        delivers_answer=True,
        simplicity=30,
    ),
    *_SESSION_FAULTS,
    # -- MCP servers (`chaosllm.faults.mcp`; match.server, match.tool) --
    FaultType(
        name="mcp_error",
        summary="a JSON-RPC error answers the MCP request (-32600..-32603, -32002, any code)",
        params={
            "code": Param(
                int, None, "the JSON-RPC error code (default -32603, internal error)", -(2**31)
            ),
            "message": _MESSAGE,
        },
        transform=mcp.mcp_error,
        on_request=mcp.mcp_request,
        mcp=True,
        simplicity=40,
    ),
    FaultType(
        name="tool_error",
        summary="the tools/call result is a tool error (isError: true)",
        params={"message": _MESSAGE},
        transform=mcp.tool_error,
        on_request=mcp.tool_call,
        mcp=True,
        simplicity=41,
    ),
    FaultType(
        name="mcp_timeout",
        summary="the MCP answer's head, then no answer until the client cancels or max_ms",
        params={
            "max_ms": Param(float, 30_000.0, "longest silence", 0, 3_600_000, draw=Draw.STALL_MS)
        },
        transform=mcp.mcp_timeout,
        on_request=mcp.mcp_request,
        silence_param="max_ms",
        retryable=True,
        mcp=True,
        simplicity=42,
    ),
    FaultType(
        name="mcp_stream_drop",
        summary="the call's SSE stream ends after after_events events: progress, no result",
        params={
            "after_events": Param(int, 0, "events sent before the stream ends", 0),
            "retry_ms": Param(
                int,
                None,
                "set: the stream is resumable (its events carry ids, the last a retry field "
                "of retry_ms): a GET with Last-Event-ID gets the rest, the result too; "
                "unset: the result never comes",
                0,
            ),
        },
        transform=mcp.mcp_stream_drop,
        on_request=mcp.mcp_stream,
        mcp_effect="drops_stream",
        retryable=True,
        mcp=True,
        simplicity=43,
    ),
    FaultType(
        name="mcp_session_lost",
        summary="404 on the Mcp-Session-Id: the session is gone, initialize again",
        transform=mcp.mcp_session_lost,
        on_request=mcp.mcp_request,
        mcp_effect="ends_session",
        mcp=True,
        simplicity=44,
    ),
    FaultType(
        name="tools_changed",
        summary="notifications/tools/list_changed before the answer, then another tool list",
        transform=mcp.tools_changed,
        on_request=mcp.mcp_stream,
        mcp_effect="changes_tools",
        delivers_answer=True,
        mcp=True,
        simplicity=45,
    ),
    FaultType(
        name="bad_tool_output",
        summary="the tools/call result's structuredContent does not match its outputSchema",
        transform=mcp.bad_tool_output,
        applies=mcp.has_structured_content,
        on_request=mcp.tool_call,
        mcp=True,
        simplicity=46,
    ),
    # Background responses (`chaosllm.faults.stored`): on the next poll, resume or cancel.
    FaultType(
        name="background_failed",
        summary="the stored response fails meanwhile: `status` failed (with the API's "
        "server_error object) or incomplete, on the next poll, resume or cancel",
        params={"status": Param(str, None, "failed or incomplete (default failed)", choices=_ENDS)},
        transform=sr.background_failed,
        applies=sr.stored,
        on_request=sr.any_operation,
        stored_effect="failed",
        simplicity=60,
    ),
    FaultType(
        name="resume_refused",
        summary="a resumed stream refused: 400, the API's 'can no longer be streamed'",
        transform=sr.resume_refused,
        applies=sr.stored,
        on_request=sr.resume,
        retryable=False,
        simplicity=61,
    ),
    FaultType(
        name="cancel_ignored",
        summary="a cancel answers cancelled, and the response runs on to its end",
        transform=sr.cancel_ignored,
        applies=sr.stored,
        on_request=sr.cancel,
        delivers_answer=True,
        stored_effect="keep_running",
        simplicity=62,
    ),
    FaultType(
        name="response_expired",
        summary="the stored response is gone: 404 for its id from now on",
        transform=sr.response_expired,
        applies=sr.stored,
        on_request=sr.any_operation,
        stored_effect="expired",
        retryable=False,
        simplicity=63,
    ),
    # Gateways (`chaosllm.faults.gateway`, `--gateway`): Chat Completions answers only.
    FaultType(
        name="openrouter_credits",
        summary="OpenRouter's 402: the account or key is out of credits",
        params={"message": _MESSAGE},
        transform=gw.openrouter_credits,
        applies=gw.chat_answer,
        on_request=gw.chat_request,
        answers_alone=_always,
        retryable=False,
        simplicity=64,
    ),
    FaultType(
        name="openrouter_midstream_error",
        summary="OpenRouter's error after the stream started: a 200 chunk with an error "
        "member and finish_reason error",
        params={"after_chunks": _chunks(2), "message": _MESSAGE},
        transform=gw.openrouter_midstream_error,
        applies=gw.chat_answer,
        on_request=gw.chat_request,
        simplicity=65,
    ),
    FaultType(
        name="vllm_stream_error",
        summary='vLLM\'s error after the stream started: data: {"object": "error", ...}, '
        "then [DONE]",
        params={"after_chunks": _chunks(2), "message": _MESSAGE},
        transform=gw.vllm_stream_error,
        applies=gw.chat_answer,
        on_request=gw.chat_request,
        simplicity=66,
    ),
    FaultType(
        name="reasoning_preamble",
        summary="DeepSeek's leading reasoning_content deltas (content null) before the answer",
        params={"reasoning": Param(str, None, "the reasoning text (default: a sentence)")},
        transform=gw.reasoning_preamble,
        applies=gw.chat_answer,
        on_request=gw.chat_request,
        delivers_answer=True,
        simplicity=67,
    ),
    FaultType(
        name="unsupported_param",
        summary="Groq's 400 naming a parameter the request carries (logprobs, logit_bias, "
        "top_logprobs, messages[].name, n > 1)",
        transform=gw.unsupported,
        applies=gw.chat_any,
        on_request=gw.carries_unsupported,
        answers_alone=_always,
        retryable=False,
        simplicity=68,
    ),
)
"""Every fault type, in the spec's order (the order listings and errors use)."""

FAULT_TYPES: Mapping[str, FaultType] = {entry.name: entry for entry in CATALOGUE}

NON_RETRYABLE_CLASSES = frozenset({"insufficient_quota", "context_length_exceeded"})
"""Named failure classes (SPEC §5) that no retry cures, by fault type name and by the
error ``code`` an answer carries (a recorded answer's too): a retry after one is
``retried_non_retryable`` whatever its status (``insufficient_quota`` is a 429), whether
or not the catalogue has an entry of that name yet."""


def retryable_type(type_name: str) -> bool | None:
    """`FaultType.retryable` of a type by name: False for the `NON_RETRYABLE_CLASSES`
    (entry or not), None for a name the catalogue does not have."""
    if type_name in NON_RETRYABLE_CLASSES:
        return False
    entry = FAULT_TYPES.get(type_name)
    return entry.retryable if entry is not None else None


MALFORMED_TOOL_ARGS = FAULT_TYPES["malformed_tool_args"]
"""Named for ``chaosllm doctor``, whose check for recorded tool-call arguments that are
not JSON bears the name of the fault that injects that damage."""
