"""``GET`` and ``DELETE /mcp/{server}``: the streamable HTTP transport's server-to-client
stream and the end of a session (a POST is a provider request: `chaosllm.http.app`).

A GET needs the session an ``initialize`` minted (400 without one, 404 for one that is
unknown or ended, as a POST) and opens an SSE stream that carries nothing chaosllm
initiates (server notifications ride on the answers to POSTs): it stays open until the
client leaves, the session ends, or ``--mcp-stream-ms`` passes, then ends cleanly. A
DELETE ends the session: 200, then every request with its id gets a 404.
"""

from __future__ import annotations

import json

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from chaosllm.core.mcp import session_problem, sessions_of
from chaosllm.http.web import chaos_state
from chaosllm.providers.mcp import INVALID_REQUEST, PATH_TEMPLATE, SESSION_HEADER, error_message

__all__ = ["STREAM_CHECK_S", "mcp_routes"]

STREAM_CHECK_S = 0.25
"""How often an open GET stream looks whether its session still lives."""


def _refused(status: int, message: str) -> Response:
    body = json.dumps(error_message(None, INVALID_REQUEST, message))
    return Response(body, status_code=status, media_type="application/json")


def _headers(request: Request) -> tuple[tuple[str, str], ...]:
    return tuple(request.headers.items())


async def stream(request: Request) -> Response:
    state = chaos_state(request)
    server = request.path_params["server"]
    problem = session_problem(state, server, _headers(request), None)
    if problem is not None:
        return _refused(*problem)
    if "text/event-stream" not in request.headers.get("accept", "text/event-stream"):
        return _refused(406, "Not Acceptable: the GET stream is text/event-stream.")
    session_id = request.headers.get(SESSION_HEADER)
    sessions = sessions_of(state)
    bound_s = state.config.mcp_stream_ms / 1000

    async def events() -> object:
        with anyio.move_on_after(bound_s):
            while sessions.get(session_id, server) is not None:
                await anyio.sleep(STREAM_CHECK_S)
        yield b": chaosllm: the stream ends\n\n"

    return StreamingResponse(
        events(),  # type: ignore[arg-type]
        media_type="text/event-stream",
        headers={"cache-control": "no-cache"},
    )


async def end(request: Request) -> Response:
    state = chaos_state(request)
    server = request.path_params["server"]
    problem = session_problem(state, server, _headers(request), None)
    if problem is not None:
        return _refused(*problem)
    sessions_of(state).end(request.headers.get(SESSION_HEADER))
    return Response(status_code=200)


def mcp_routes() -> list[Route]:
    return [
        Route(PATH_TEMPLATE, stream, methods=["GET"]),
        Route(PATH_TEMPLATE, end, methods=["DELETE"]),
    ]
