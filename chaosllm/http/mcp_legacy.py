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
the client leaves or ``--mcp-stream-ms`` passes. Served in replay mode: record a server
over streamable HTTP or stdio.
"""

from __future__ import annotations

import asyncio
import io
import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator

import anyio
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from chaosllm.config import Mode
from chaosllm.core.mcp import sessions_of
from chaosllm.http.mcp_bridge import Bridge
from chaosllm.http.state import ChaosState
from chaosllm.http.web import SESSION_HEADER as CHAOS_SESSION
from chaosllm.http.web import chaos_state
from chaosllm.providers.mcp import INVALID_REQUEST, PARSE_ERROR, error_message

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


async def message(request: Request) -> Response:
    state = chaos_state(request)
    if state.config.mode is not Mode.REPLAY:
        return _refused(
            501,
            INVALID_REQUEST,
            "chaosllm serves the HTTP+SSE transport in replay mode only: record the server "
            "over streamable HTTP (/mcp/NAME) or stdio (chaosllm mcp-stdio).",
        )
    session_id = request.query_params.get("session_id")
    streams = _streams(state)
    with streams.lock:
        bridge = streams.open.get(session_id or "")
    if bridge is None:
        return _refused(404, INVALID_REQUEST, f"Could not find session {session_id!r}.")
    raw = (await request.body()).decode("utf-8", "replace")
    try:
        json.loads(raw)
    except ValueError:
        return _refused(400, PARSE_ERROR, "Parse error: the body is not one JSON-RPC message.")
    line = " ".join(raw.splitlines())
    return Response("Accepted", status_code=202, background=BackgroundTask(bridge.handle, line))


def legacy_routes() -> list[Route]:
    return [
        Route(SSE_PATH, stream, methods=["GET"]),
        Route(MESSAGES_PATH, message, methods=["POST"]),
        Route(MESSAGES_PATH.rstrip("/"), message, methods=["POST"]),
    ]
