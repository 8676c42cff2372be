"""MCP servers over streamable HTTP: JSON-RPC 2.0 requests to ``/mcp/{server}``. Pure.

Theory of operation
-------------------
An MCP server is one more protocol of the registry (`Mcp`, recording name ``mcp``): a
POST to ``/mcp/{server}`` carries one JSON-RPC message, and `bind` folds the server's
name (from the path) and whether the client accepts an SSE answer (its ``Accept``
header, one of `Mcp.call_headers`) into the request, so a recording's request reads
``{"server": "search", "stream": true, "jsonrpc": "2.0", "id": 3, "method":
"tools/call", "params": {...}}``. What decides the answer (`McpCodec.canonical`) is the
server, the method and its params without ``_meta`` (a progress token, trace context):
model requests are keyed the same way, so exact, sequence and nearest matching apply
as they are. The JSON-RPC ``id`` and the progress token are the request's own: a
replayed answer carries the live request's (`McpCodec.render`), never the recorded ones.

Answers are a JSON body or an SSE stream of JSON-RPC messages (``event: message``; the
progress notifications of a call, then its response), as the transport's 2025-11-25
revision (and the newest, 2026-07-28) specify. Errors are JSON-RPC error objects
(`McpErrors`): a body that is not JSON is ``-32700``, a batch or a message that is no
JSON-RPC request ``-32600``, a method MCP does not define ``-32601``. The session
(``Mcp-Session-Id``), the answers that need no recording (notifications, ``ping``)
and the miss naming the nearest recordings are the engine's MCP hooks
(`chaosllm.core.mcp`); the fault hooks (`McpFaultHooks`) give the server and the tool a
request addresses, which ``match.server`` and ``match.tool`` read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar, Final

from chaosllm.errors import InvalidRequest
from chaosllm.model import JSON, Exchange, RecordedChunk, RecordedResponse, ResponsePlan
from chaosllm.providers.base import Parts, Provider
from chaosllm.providers.codec import Codec, Variant
from chaosllm.providers.conversation import ConversationChecks, Finding
from chaosllm.providers.errors import Errors
from chaosllm.providers.faulthooks import FaultHooks
from chaosllm.providers.text import canonical_json

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "LATEST_VERSION",
    "METHODS",
    "METHOD_NOT_FOUND",
    "MODERN_VERSIONS",
    "NO_RECORDING_CODE",
    "PARSE_ERROR",
    "PATH_TEMPLATE",
    "PROTOCOL_HEADER",
    "RESOURCE_NOT_FOUND",
    "SESSION_HEADER",
    "SESSION_VERSIONS",
    "Mcp",
    "error_message",
    "is_request",
    "rpc_id",
    "server_of",
    "sse_frame",
    "tool_of",
    "with_event_id",
]

PATH_TEMPLATE: Final = "/mcp/{server}"
SESSION_HEADER: Final = "mcp-session-id"
PROTOCOL_HEADER: Final = "mcp-protocol-version"
SESSION_VERSIONS: Final = ("2025-03-26", "2025-06-18", "2025-11-25")
"""The revisions with an ``initialize`` handshake and ``Mcp-Session-Id`` sessions."""
MODERN_VERSIONS: Final = ("2026-07-28",)
"""The revisions without sessions: every POST is a request of its own (``server/discover``
instead of ``initialize``)."""
LATEST_VERSION: Final = "2025-11-25"
"""The revision an ``initialize`` answer made up by chaosllm names."""

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
RESOURCE_NOT_FOUND: Final = -32002
NO_RECORDING_CODE: Final = -32001
"""chaosllm's own code (the implementation range) of a request no recording answers."""

METHODS: Final = frozenset(
    {
        "initialize",
        "server/discover",
        "ping",
        "tools/list",
        "tools/call",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "resources/subscribe",
        "resources/unsubscribe",
        "prompts/list",
        "prompts/get",
        "completion/complete",
        "logging/setLevel",
        "tasks/get",
        "tasks/result",
        "tasks/list",
        "tasks/cancel",
    }
)
"""The requests a client sends an MCP server (notifications are ``notifications/*``)."""

_CODES: Final[Mapping[str, int]] = {
    "invalid_json": PARSE_ERROR,
    "parse_error": PARSE_ERROR,
    "invalid_request": INVALID_REQUEST,
    "method_not_found": METHOD_NOT_FOUND,
    "invalid_params": INVALID_PARAMS,
    "resource_not_found": RESOURCE_NOT_FOUND,
}
"""JSON-RPC codes of chaosllm's error codes (any other: internal error)."""

_TRANSPORT: Final = ("server", "stream")
"""What `Mcp.bind` adds to the client's message."""


def server_of(body: JSON) -> str | None:
    """The server a (bound) request addresses."""
    server = body.get("server") if isinstance(body, dict) else None
    return server if isinstance(server, str) else None


def tool_of(body: JSON) -> str | None:
    """The tool a (bound) ``tools/call`` calls."""
    if not isinstance(body, dict) or body.get("method") != "tools/call":
        return None
    params = body.get("params")
    name = params.get("name") if isinstance(params, dict) else None
    return name if isinstance(name, str) else None


def rpc_id(body: JSON) -> Any:
    """The JSON-RPC id of a message (None: a notification, or not a message)."""
    return body.get("id") if isinstance(body, dict) else None


def is_request(body: JSON) -> bool:
    """Whether a message is a JSON-RPC request (a method and an id): what gets an answer."""
    return isinstance(body, dict) and "method" in body and "id" in body


def _token(body: JSON) -> Any:
    """The progress token a request asks its progress notifications to carry."""
    params = body.get("params") if isinstance(body, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta.get("progressToken") if isinstance(meta, dict) else None


def error_message(rpc: Any, code: int, message: str, data: JSON = None) -> dict[str, Any]:
    """A JSON-RPC error answering the request with id `rpc`."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": rpc, "error": error}


def sse_frame(message: JSON) -> str:
    """One JSON-RPC message as an SSE event, as the MCP SDK's servers send it."""
    return f"event: message\ndata: {json.dumps(message, ensure_ascii=False)}\n\n"


def with_event_id(frame: bytes, event_id: str, retry_ms: int | None = None) -> bytes:
    """An SSE event with an ``id`` field (its place in its stream, what a client resumes
    from with ``Last-Event-ID``) and, when given, a ``retry`` field."""
    head = f"id: {event_id}\n" + (f"retry: {retry_ms}\n" if retry_ms is not None else "")
    return head.encode("ascii") + frame


def _frame_messages(frame: str) -> list[JSON]:
    """The JSON-RPC messages an SSE frame's ``data`` carries (none: a comment, a ping)."""
    data = [line[5:].lstrip(" ") for line in frame.splitlines() if line.startswith("data:")]
    if not data:
        return []
    try:
        return [json.loads("\n".join(data))]
    except ValueError:
        return []


def _live(message: JSON, rpc: Any, token: Any) -> JSON:
    """A recorded message with the live request's id (a response) or progress token (a
    progress notification)."""
    if not isinstance(message, dict):
        return message
    if "id" in message and ("result" in message or "error" in message):
        return {**message, "id": rpc}
    params = message.get("params")
    if (
        token is not None
        and message.get("method") == "notifications/progress"
        and isinstance(params, dict)
    ):
        return {**message, "params": {**params, "progressToken": token}}
    return message


def _live_frame(frame: str, rpc: Any, token: Any) -> str:
    """A recorded SSE frame carrying the live request's id and progress token."""
    messages = _frame_messages(frame)
    if len(messages) != 1:
        return frame
    lines = [line for line in frame.splitlines() if not line.startswith("data:")]
    fields = [line for line in lines if line]
    payload = json.dumps(_live(messages[0], rpc, token), ensure_ascii=False)
    return "\n".join([*fields, f"data: {payload}"]) + "\n\n"


def _no_findings(body: JSON, *, expects_system: bool = False) -> list[Finding]:
    return []


class McpCodec(Codec):
    """JSON-RPC messages in, JSON-RPC messages (JSON or SSE) out."""

    turn_key = "params"
    conversation: ClassVar[ConversationChecks] = ConversationChecks(
        _no_findings, lambda body: False
    )

    def validate(self, body: JSON) -> None:
        if not isinstance(body, dict):
            raise InvalidRequest("An MCP message must be a JSON object.", code="invalid_request")
        if body.get("jsonrpc") != "2.0":
            raise InvalidRequest(
                'A JSON-RPC 2.0 message needs "jsonrpc": "2.0".', code="invalid_request"
            )
        if "method" not in body:
            if "id" in body and ("result" in body or "error" in body):
                return  # the client's answer to a server's request
            raise InvalidRequest(
                "A JSON-RPC message is a request (method, id), a notification (method) or a "
                "response (id, result or error).",
                code="invalid_request",
            )
        method = body["method"]
        if not isinstance(method, str) or not method:
            raise InvalidRequest("method must be a non-empty string.", code="invalid_request")
        if "id" in body:
            rpc = body["id"]
            if isinstance(rpc, bool) or not isinstance(rpc, (str, int)):
                raise InvalidRequest(
                    f"A request id must be a string or an integer, got {json.dumps(rpc)}.",
                    code="invalid_request",
                )
        params = body.get("params")
        if params is not None and not isinstance(params, dict):
            raise InvalidRequest("params must be an object.", code="invalid_request")
        if method == "tools/call" and not isinstance(tool_of(body), str):
            raise InvalidRequest("tools/call needs params.name, the tool.", code="invalid_params")

    def written(self, body: JSON) -> Any:
        params = body.get("params") if isinstance(body, dict) else None
        if isinstance(params, dict) or params is None:  # no params: as {}
            params = {k: v for k, v in (params or {}).items() if k != "_meta"}
        return {
            "server": server_of(body),
            "method": body.get("method") if isinstance(body, dict) else None,
            "params": params,
        }

    def model_of(self, body: JSON) -> Any:
        return None

    def wants_stream(self, body: JSON) -> bool:
        return bool(isinstance(body, dict) and body.get("stream") is True)

    def is_answer(self, body: JSON) -> bool:
        return isinstance(body, dict) and ("result" in body or "error" in body)

    def stream_frames(self, answer: Mapping[str, Any]) -> list[str]:
        return [sse_frame(dict(answer))]

    def assemble(self, frames: Sequence[str]) -> JSON:
        answers = [m for frame in frames for m in _frame_messages(frame) if self.is_answer(m)]
        return answers[-1] if answers else None

    def stream_complete(self, frames: Sequence[str]) -> bool:
        return self.assemble(frames) is not None

    def fallback(self, body: JSON, digest: str) -> JSON:
        result: dict[str, Any] = {}
        if body.get("method") == "tools/call":
            text = f"chaosllm fallback answer ({digest[:12]})"
            result = {"content": [{"type": "text", "text": text}], "isError": False}
        return {"jsonrpc": "2.0", "id": rpc_id(body), "result": result}

    def render_key(self, exchange: Exchange, body: JSON, *, timing: float) -> Variant:
        variant = super().render_key(exchange, body, timing=timing)
        return f"{variant}|{canonical_json([rpc_id(body), _token(body)])}"

    def render(self, exchange: Exchange, body: JSON, *, timing: float) -> ResponsePlan:
        """The recorded answer with the live request's id and progress token; an
        accepted notification (202) has no body."""
        response = exchange.response
        if response.status == 202:
            return ResponsePlan(status=202, headers=(), pieces=())
        rpc, token = rpc_id(body), _token(body)
        live = replace(
            response,
            body=_live(response.body, rpc, token),
            chunks=(
                tuple(RecordedChunk(_live_frame(c.data, rpc, token), c.delay_ms) for c in chunks)
                if (chunks := response.chunks) is not None
                else None
            ),
        )
        return super().render(replace(exchange, response=live), body, timing=timing)

    def estimated(self, response: RecordedResponse, body: JSON) -> tuple[str, ...]:
        return ()

    def journal_fields(self, body: JSON) -> dict[str, Any]:
        method = body.get("method") if isinstance(body, dict) else None
        fields: dict[str, Any] = {"method": method if isinstance(method, str) else "(response)"}
        tool = tool_of(body)
        if tool is not None:
            fields["tool"] = tool
        rpc = rpc_id(body)
        if isinstance(rpc, (str, int)) and not isinstance(rpc, bool):
            fields["rpc_id"] = rpc
        return fields


class McpErrors(Errors):
    """JSON-RPC error objects; the HTTP status is the transport's."""

    def _envelope(
        self, status: int, message: str, kind: str | None, code: str | None, param: str | None
    ) -> dict[str, Any]:
        rpc = _CODES.get(code or "", INVALID_REQUEST if 400 <= status < 500 else INTERNAL_ERROR)
        if rpc == PARSE_ERROR:
            message = "Parse error: the body of the POST is not one JSON-RPC message in JSON."
        return error_message(None, rpc, message)


class McpFaultHooks(FaultHooks):
    """What faults read off MCP requests: the server, the tool; a JSON-RPC error frame."""

    def frame_finishes(self, frame: str) -> bool:
        """The frame of the response (its result or error) finishes an answer."""
        return any(self.codec.is_answer(m) for m in _frame_messages(frame))

    def stream_error_frame(self, message: str, *, status: int) -> bytes:
        return sse_frame(error_message(None, INTERNAL_ERROR, message)).encode("utf-8")

    def empty_answer(self, body: JSON) -> JSON:
        return {"jsonrpc": "2.0", "id": rpc_id(body), "result": {}}

    def tool_calls(self, answer: Any) -> Iterator[dict[str, Any]]:
        return iter(())

    def last_user_text(self, body: JSON) -> str | None:
        params = body.get("params") if isinstance(body, dict) else None
        return canonical_json(params) if params is not None else None

    def tool_names(self, body: JSON) -> frozenset[str]:
        tool = tool_of(body)
        return frozenset((tool,)) if tool is not None else frozenset()

    def called_tool_names(self, answer: JSON) -> frozenset[str]:
        return frozenset()

    def server_name(self, body: JSON) -> str | None:
        return server_of(body)


_Params = Mapping[str, str]
_Headers = Sequence[tuple[str, str]]


def _accepts_sse(headers: Sequence[tuple[str, str]]) -> bool:
    return any(
        name == "accept" and ("text/event-stream" in value or "*/*" in value)
        for name, value in headers
    )


class Mcp(Provider):
    """An MCP server (``/mcp/{server}``, streamable HTTP), any number of them by name."""

    name = "mcp"
    model_protocol = False
    path_templates = (PATH_TEMPLATE,)
    call_headers = frozenset({"accept", SESSION_HEADER, PROTOCOL_HEADER, "last-event-id"})
    parts = Parts(McpCodec, McpErrors, McpFaultHooks)

    def bind(self, body: JSON, params: Mapping[str, str], query: str) -> JSON:
        return self.bind_headers(body, params, query, ())

    def bind_headers(self, body: JSON, params: _Params, query: str, headers: _Headers) -> JSON:
        if isinstance(body, list):
            raise InvalidRequest(
                "A JSON-RPC batch (an array) is not accepted: the 2025-06-18 revision and "
                "later send one message per POST.",
                code="invalid_request",
            )
        if not isinstance(body, dict):
            raise InvalidRequest("An MCP message must be a JSON object.", code="invalid_request")
        server = params.get("server", "")
        message = {k: v for k, v in body.items() if k not in _TRANSPORT}
        return {"server": server, "stream": _accepts_sse(headers), **message}
