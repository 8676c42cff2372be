"""MCP's older HTTP+SSE transport (the 2024-11-05 revision), for the clients that still
speak it: ``GET /mcp/{server}/sse`` opens the session's SSE stream, whose first event
(``endpoint``) names where the client POSTs its messages,
``/mcp/{server}/messages/?session_id=ID``; each POST is accepted (202) and its answer
comes on the SSE stream as an ``event: message``.

Theory of operation
-------------------
A stream is an MCP client of the engine, as the stdio bridge is
(`chaosllm.http.mcp_bridge.Bridge`): each message POSTed is a call of the ``mcp``
provider to ``/mcp/{server}``, with the ``Mcp-Session-Id`` its ``initialize`` got, so
the recordings, the faults, the session rules and the journal are those of the
streamable HTTP endpoint. The bridge plays each answer (its delays waited, in a worker
thread, after the 202) into the stream as one event per JSON-RPC message. The stream
belongs to the chaosllm session its GET's ``X-Chaosllm-Session`` names; it ends when
the client leaves or ``--mcp-stream-ms`` passes.

In the other modes (record, record-missing, passthrough) a message is POSTed, in
process, to the app's own streamable HTTP endpoint ``/mcp/{server}`` (with the stream's
``Mcp-Session-Id``, chaosllm session and the client's other headers), which proxies it
to the server's upstream and records it as it records a streamable HTTP client; its
answer (JSON or an SSE body) is played into the stream by the bridge. An old client is
recorded, and replayed, as a new one is.
"""

from __future__ import annotations

import asyncio
import io
import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from chaosllm.config import Mode
from chaosllm.core.mcp import sessions_of
from chaosllm.http.mcp_bridge import ACCEPT, Bridge
from chaosllm.http.state import ChaosState
from chaosllm.http.web import SESSION_HEADER as CHAOS_SESSION
from chaosllm.http.web import chaos_state
from chaosllm.model import Piece, ResponsePlan

if TYPE_CHECKING:
    import httpx

from chaosllm.providers.mcp import INVALID_REQUEST, PARSE_ERROR, SESSION_HEADER, error_message
from chaosllm.providers.sse import split_frames

__all__ = ["MESSAGES_PATH", "SSE_PATH", "legacy_routes"]

SSE_PATH = "/mcp/{server}/sse"
MESSAGES_PATH = "/mcp/{server}/messages/"


class _Events(io.StringIO):
    """What the bridge writes (one JSON-RPC message a line), queued for the stream's
    task from the bridge's thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop = loop
        self.queue: asyncio.Queue[str] = asyncio.Queue()

    def write(self, text: str, /) -> int:
        for line in text.splitlines():
            if line.strip():
                self.loop.call_soon_threadsafe(self.queue.put_nowait, line)
        return len(text)


class _Streams:
    """The open streams of a server (by the session id of their endpoint), bounded."""

    def __init__(self) -> None:
        self.open: OrderedDict[str, Bridge] = OrderedDict()
        self.lock = threading.Lock()


_STREAMS: weakref.WeakKeyDictionary[ChaosState, _Streams] = weakref.WeakKeyDictionary()
_STREAMS_LOCK = threading.Lock()


def _streams(state: ChaosState) -> _Streams:
    with _STREAMS_LOCK:
        found = _STREAMS.get(state)
        if found is None:
            found = _STREAMS[state] = _Streams()
        return found


def _refused(status: int, code: int, message: str) -> Response:
    body = json.dumps(error_message(None, code, message))
    return Response(body, status_code=status, media_type="application/json")


async def stream(request: Request) -> Response:
    state = chaos_state(request)
    server = request.path_params["server"]
    session_id = sessions_of(state).mint(server)  # the endpoint's id, from the seed
    events = _Events(asyncio.get_running_loop())
    bridge = Bridge(state, server, events, session=request.headers.get(CHAOS_SESSION))
    streams = _streams(state)
    with streams.lock:
        streams.open[session_id] = bridge
        while len(streams.open) > state.config.max_sessions:
            streams.open.popitem(last=False)

    async def body() -> AsyncIterator[bytes]:
        try:
            endpoint = f"/mcp/{server}/messages/?session_id={session_id}"
            yield f"event: endpoint\ndata: {endpoint}\n\n".encode()
            with anyio.move_on_after(state.config.mcp_stream_ms / 1000):
                while True:
                    line = await events.queue.get()
                    yield f"event: message\ndata: {line}\n\n".encode()
        finally:
            with streams.lock:
                streams.open.pop(session_id, None)

    return StreamingResponse(
        body(), media_type="text/event-stream", headers={"cache-control": "no-cache"}
    )


_NOT_FORWARDED = frozenset(
    {
        "host",
        "content-length",
        "content-type",
        "accept",
        "connection",
        SESSION_HEADER.lower(),
        CHAOS_SESSION.lower(),
    }
)
"""The POST's headers `_forward` does not pass on (it sets its own, the stream's)."""


def _answer_plan(response: httpx.Response) -> ResponsePlan:
    """The endpoint's answer as the plan the bridge plays: each SSE frame a piece, a JSON
    body one piece."""
    headers = tuple(
        (SESSION_HEADER if k.lower() == SESSION_HEADER.lower() else k, v)
        for k, v in response.headers.items()
    )
    body = response.content
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        pieces = tuple(Piece(frame) for frame, _ in split_frames(body))
        return ResponsePlan(response.status_code, headers, pieces)
    return ResponsePlan(response.status_code, headers, (Piece(body, frame=False),))


async def _forward(request: Request, bridge: Bridge, raw: bytes, message: Any) -> None:
    """A message of a stream, in a mode that may proxy: POSTed to the app's streamable
    HTTP endpoint in process, its answer played into the stream."""
    import httpx  # replaying never needs it (chaosllm serve starts without it)

    server = request.path_params["server"]
    headers = [(k, v) for k, v in request.headers.items() if k not in _NOT_FORWARDED]
    headers += [("content-type", "application/json"), ACCEPT]
    if bridge.session is not None:  # the stream's, as in replay
        headers.append((CHAOS_SESSION, bridge.session))
    if bridge.mcp_session is not None:
        headers.append((SESSION_HEADER, bridge.mcp_session))
    client = request.client
    transport = httpx.ASGITransport(
        app=request.scope["app"],
        client=(client.host, client.port) if client is not None else ("127.0.0.1", 0),
    )
    base = f"{request.url.scheme}://{request.headers.get('host', 'localhost')}"
    async with httpx.AsyncClient(transport=transport, base_url=base, timeout=None) as http:
        response = await http.post(f"/mcp/{server}", content=raw, headers=headers)
    bridge.answer(_answer_plan(response), message)


async def message(request: Request) -> Response:
    state = chaos_state(request)
    session_id = request.query_params.get("session_id")
    streams = _streams(state)
    with streams.lock:
        bridge = streams.open.get(session_id or "")
    if bridge is None:
        return _refused(404, INVALID_REQUEST, f"Could not find session {session_id!r}.")
    raw = await request.body()
    try:
        parsed = json.loads(raw)
    except ValueError:
        return _refused(400, PARSE_ERROR, "Parse error: the body is not one JSON-RPC message.")
    if state.config.mode is not Mode.REPLAY:  # the endpoint proxies and records it
        forward = BackgroundTask(_forward, request, bridge, raw, parsed)
        return Response("Accepted", status_code=202, background=forward)
    line = " ".join(raw.decode("utf-8", "replace").splitlines())
    return Response("Accepted", status_code=202, background=BackgroundTask(bridge.handle, line))


def legacy_routes() -> list[Route]:
    return [
        Route(SSE_PATH, stream, methods=["GET"]),
        Route(MESSAGES_PATH, message, methods=["POST"]),
        Route(MESSAGES_PATH.rstrip("/"), message, methods=["POST"]),
    ]
