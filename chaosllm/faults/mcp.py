"""The MCP faults' transforms and predicates (their catalogue entries are in
`chaosllm.faults.catalogue`): JSON-RPC errors, tool errors, silence, a stream ended before
its result, a lost session, a changed tool list, a result its schema refuses. Pure: what
a fault changes in the session (a lost session, a changed tool list) is written by the
engine's MCP hooks (`chaosllm.core.mcp`) once the fault fired."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chaosllm.model import JSON, Ending, Framing, Piece, ResponsePlan
from chaosllm.providers.base import Provider
from chaosllm.providers.mcp import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    error_message,
    is_request,
    rpc_id,
    server_of,
    sse_frame,
    tool_of,
)

if TYPE_CHECKING:
    from chaosllm.faults.spec import FaultSpec
    from chaosllm.faults.transform import FaultContext

__all__ = [
    "SWAPPED",
    "bad_tool_output",
    "has_structured_content",
    "mcp_error",
    "mcp_request",
    "mcp_session_lost",
    "mcp_stream",
    "mcp_stream_drop",
    "mcp_timeout",
    "tool_call",
    "tool_error",
    "tools_changed",
]

SWAPPED: dict[type, Any] = {str: 0, int: "0", float: "0.0", bool: "false", list: {}, dict: []}
"""The value of another JSON type each structured value becomes (`bad_tool_output`)."""


def mcp_request(provider: Provider, request: JSON, stream: bool) -> bool:
    """An MCP request (what the MCP faults fire on)."""
    return server_of(request) is not None and is_request(request)


def mcp_stream(provider: Provider, request: JSON, stream: bool) -> bool:
    """An MCP request answered as an SSE stream."""
    return stream and mcp_request(provider, request, stream)


def tool_call(provider: Provider, request: JSON, stream: bool) -> bool:
    """An MCP ``tools/call``."""
    return mcp_request(provider, request, stream) and tool_of(request) is not None


def has_structured_content(provider: Provider, answer: JSON) -> bool:
    result = answer.get("result") if isinstance(answer, dict) else None
    return isinstance(result, dict) and isinstance(result.get("structuredContent"), dict)


def mcp_error(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    message = spec.param("message") or "chaosllm injected a JSON-RPC error."
    code = spec.param("code")
    code = INTERNAL_ERROR if code is None else code
    return ctx.render(error_message(rpc_id(ctx.request), code, message))


RESULT_PAYLOAD = ("content", "structuredContent", "isError")
"""What a tool's result says; the rest (``resultType``, ``_meta``: the 2026-07-28
revision's envelope) is the server's and a made-up result keeps it."""


def tool_error(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    """A result with ``isError: true`` and the message, in the envelope of the recorded
    result (its ``resultType`` and ``_meta``: a client of the newest revision requires
    ``resultType``)."""
    message = spec.param("message") or f"chaosllm: the tool {tool_of(ctx.request)!r} failed."
    answer = ctx.answer
    recorded = answer.get("result") if isinstance(answer, dict) else None
    envelope = (
        {k: v for k, v in recorded.items() if k not in RESULT_PAYLOAD}
        if isinstance(recorded, dict)
        else {}
    )
    result = {**envelope, "content": [{"type": "text", "text": message}], "isError": True}
    return ctx.render({"jsonrpc": "2.0", "id": rpc_id(ctx.request), "result": result})


def mcp_timeout(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    """The head (an SSE stream's: nothing of it; a JSON answer's: its length), then
    silence until the client gives up (cancels) or max_ms passes."""
    stream = plan.framing is Framing.CHUNKED
    return plan.with_(
        pieces=(),
        content_length=None if stream else plan.declared_length,
        ending=Ending.STALL,
        stall_ms=spec.param("max_ms"),
    )


def mcp_stream_drop(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    """The stream's first after_events events before its response (progress), then the
    stream ends: the result never comes."""
    kept = min(spec.param("after_events"), ctx.provider.faults.answer_frame_count(plan))
    return plan.with_(pieces=plan.pieces[:kept], ending=Ending.COMPLETE)


def mcp_session_lost(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    """404 on the session id (the session is ended too: `chaosllm.core.mcp.settled`)."""
    text = "Session not found (chaosllm: mcp_session_lost): initialize again."
    body = error_message(None, INVALID_REQUEST, text)
    return ctx.render(body).with_(status=404)


def tools_changed(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    """``notifications/tools/list_changed`` before the answer (the session's next lists
    differ: `chaosllm.core.mcp.changed_tools`)."""
    note = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
    return plan.with_(pieces=(Piece(sse_frame(note).encode("utf-8")), *plan.pieces))


def _swapped(value: JSON) -> JSON:
    return SWAPPED.get(type(value), "0")


def bad_tool_output(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    """The result's structuredContent with every value of another JSON type (an empty
    one dropped): what the tool's outputSchema refuses."""
    answer = ctx.answer
    result = dict(answer["result"])
    structured = {key: _swapped(value) for key, value in result["structuredContent"].items()}
    if structured:
        result["structuredContent"] = structured
    else:
        del result["structuredContent"]
    return ctx.render({**answer, "id": rpc_id(ctx.request), "result": result})
