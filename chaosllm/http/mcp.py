"""``GET`` and ``DELETE /mcp/{server}``: the streamable HTTP transport's server-to-client
stream and the end of a session (a POST is a provider request: `chaosllm.http.app`).

A GET needs the session an ``initialize`` minted (400 without one, 404 for one that is
unknown or ended, as a POST) and opens the session's SSE stream of server notifications
(``notifications/tools/list_changed`` when ``tools_changed`` fires while it is open),
each event with an id ``0-k``: it stays open until the client leaves, the session ends,
or ``--mcp-stream-ms`` passes, then ends cleanly. A GET with ``Last-Event-ID`` resumes:
``0-k`` the GET stream after event k; ``N-k`` the session's stream N (a POST's answer
an ``mcp_stream_drop`` with ``retry_ms`` cut) with the events it never sent, its result
too; any other id is a 400. It waits on the session's posts, checking every
`STREAM_CHECK_S` whether the session still lives. A
DELETE ends the session: 200, then every request with its id gets a 404.

In record-missing mode the client's session is chaosllm's (what is recorded is replayed
within it) and a request no recording answers goes to the upstream within an upstream
session of its own (`forwarding`): a proxied ``initialize`` opens it (the client gets
chaosllm's session id, the upstream's is kept), else the first request that needs the
upstream opens it with the client's ``initialize`` (and ``notifications/initialized``,
which chaosllm answered itself), and every proxied request carries the upstream's id
(none, when the upstream keeps no sessions); a DELETE of the client's session ends the
upstream's too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from chaosllm.config import Mode
from chaosllm.core.call import ProviderCall, Proxy
from chaosllm.core.mcp import McpSession, McpSessions, session_problem, sessions_of
from chaosllm.errors import UpstreamError
from chaosllm.http.state import ChaosState
from chaosllm.http.web import chaos_state
from chaosllm.providers import PROVIDERS
from chaosllm.providers.mcp import (
    INVALID_REQUEST,
    PATH_TEMPLATE,
    SESSION_HEADER,
    error_message,
    server_of,
)

__all__ = ["STREAM_CHECK_S", "Forwarding", "forwarding", "mcp_routes"]

RawHeaders = Sequence[tuple[bytes, bytes]]

_SESSION = SESSION_HEADER.encode("latin-1")
_INITIALIZED = b'{"jsonrpc": "2.0", "method": "notifications/initialized"}'


@dataclass(frozen=True, slots=True)
class Forwarding:
    """How a proxied MCP request goes to the upstream (record-missing)."""

    headers: list[tuple[bytes, bytes]]
    """The client's headers, with the upstream's session id for chaosllm's."""
    answer_headers: tuple[tuple[str, str], ...] = ()
    """Headers replacing the upstream's on the answer (chaosllm's session id)."""
    answer_head: Callable[[RawHeaders], None] | None = None
    problem: str | None = None
    """Set when the upstream's session could not be opened (the client gets a 502)."""


def _with_session(headers: RawHeaders, session_id: str | None) -> list[tuple[bytes, bytes]]:
    kept = [(k, v) for k, v in headers if k.lower() != _SESSION]
    if session_id is not None:
        kept.append((_SESSION, session_id.encode("latin-1")))
    return kept


def _session_of(headers: RawHeaders) -> str | None:
    return next((v.decode("latin-1") for k, v in headers if k.lower() == _SESSION), None)


async def _ask(
    state: ChaosState, call: ProviderCall, method: str, headers: RawHeaders, body: bytes = b""
) -> tuple[int, str | None]:
    """Send `method` with `body` to `call`'s upstream: its status and its session id
    header (502 and why, when it cannot be reached)."""
    upstream, target = state.upstream_for(call)
    if upstream is None:
        return 502, "no upstream"
    path = call.provider.upstream_path(call.path) if target is None else target
    try:
        answer = await upstream.send(method, path, b"", headers, body)
    except UpstreamError as exc:
        return 502, f"{exc}"
    try:
        return answer.status, answer.header(SESSION_HEADER)
    finally:
        await answer.aclose()


async def _open(
    state: ChaosState, proxy: Proxy, headers: RawHeaders, session: McpSession
) -> str | None:
    """The upstream session of `session`, opened now if need be (None: it is; else why
    it could not be)."""
    if not session.upstream_open:
        if not session.init:
            return "the session's initialize was not kept"
        status, opened = await _ask(
            state, proxy.call, "POST", _with_session(headers, None), session.init
        )
        if status != 200:
            return f"its initialize got HTTP {status}"
        session.upstream, session.upstream_open, session.upstream_ready = opened, True, False
    if not session.upstream_ready:
        status, _ = await _ask(
            state, proxy.call, "POST", _with_session(headers, session.upstream), _INITIALIZED
        )
        session.upstream_ready = status < 300
    return None


async def forwarding(state: ChaosState, proxy: Proxy, headers: RawHeaders) -> Forwarding | None:
    """A proxied MCP request's way to the upstream in record-missing mode (see the
    module doc); None: as the client sent it (the other modes, the newest revision)."""
    body = proxy.body
    if state.config.mode is not Mode.RECORD_MISSING or not isinstance(body, dict):
        return None
    sessions = sessions_of(state)
    server = server_of(body) or ""
    if body.get("method") == "initialize":
        ours = sessions.mint(server, proxy.call.body)

        def learn(head: RawHeaders) -> None:
            session = sessions.get(ours, server)
            if session is not None:
                session.upstream, session.upstream_ready = _session_of(head), False
                session.upstream_open = True

        return Forwarding(_with_session(headers, None), ((SESSION_HEADER, ours),), learn)
    session = sessions.get(_session_of(headers), server)
    if session is None:
        return None
    problem = await _open(state, proxy, headers, session)
    if problem is not None:
        return Forwarding(list(headers), problem=f"the upstream's MCP session: {problem}")
    return Forwarding(_with_session(headers, session.upstream))


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
    session = sessions.get(session_id, server)
    last = request.headers.get("last-event-id")
    stream_no, after = _cursor(last) if last is not None else (0, 0)
    if stream_no is None or (session is None and last is not None):
        return _refused(
            400, f"Bad Request: Last-Event-ID {last!r} names no stream of this session."
        )
    if stream_no > 0:
        assert session is not None
        rest = session.resumable.get(stream_no)
        if rest is None:
            return _refused(
                400, f"Bad Request: the stream of Last-Event-ID {last!r} cannot be resumed."
            )
        return _sse(_resumed(rest))
    return _sse(_listening(state, sessions, session, session_id, server, after))


def _cursor(event_id: str) -> tuple[int | None, int]:
    """The stream and the place in it an event id (``N-k``) names (None: not one)."""
    stream_no, _, place = event_id.partition("-")
    if not (stream_no.isdigit() and place.isdigit()):
        return None, 0
    return int(stream_no), int(place)


def _sse(events: AsyncIterator[bytes]) -> Response:
    return StreamingResponse(
        events, media_type="text/event-stream", headers={"cache-control": "no-cache"}
    )


async def _resumed(rest: list[bytes]) -> AsyncIterator[bytes]:
    """A resumed stream: the events its connection lost (the rest of the answer)."""
    for frame in rest:
        yield frame


async def _listening(
    state: ChaosState,
    sessions: McpSessions,
    session: McpSession | None,
    session_id: str | None,
    server: str,
    after: int,
) -> AsyncIterator[bytes]:
    """The GET stream: the session's server notifications after event ``0-after``, as
    they are posted (`McpSessions.post`), until the client leaves, the session ends or
    ``--mcp-stream-ms`` passes."""
    if session is None:  # the newest revision: no session, nothing of its own to send
        with anyio.move_on_after(state.config.mcp_stream_ms / 1000):
            await anyio.sleep_forever()
        yield b": chaosllm: the stream ends\n\n"
        return
    loop = asyncio.get_running_loop()
    posted = asyncio.Event()

    def wake() -> None:
        loop.call_soon_threadsafe(posted.set)

    session.listeners.append(wake)
    try:
        with anyio.move_on_after(state.config.mcp_stream_ms / 1000):
            while sessions.get(session_id, server) is not None:
                for number, frame in list(session.outbox):
                    if number > after:
                        after = number
                        yield frame
                posted.clear()
                if any(number > after for number, _ in list(session.outbox)):
                    continue
                with anyio.move_on_after(STREAM_CHECK_S):
                    await posted.wait()
        yield b": chaosllm: the stream ends\n\n"
    finally:
        session.listeners.remove(wake)


async def end(request: Request) -> Response:
    state = chaos_state(request)
    server = request.path_params["server"]
    problem = session_problem(state, server, _headers(request), None)
    if problem is not None:
        return _refused(*problem)
    sessions = sessions_of(state)
    ours = request.headers.get(SESSION_HEADER)
    session = sessions.get(ours, server)
    sessions.end(ours)
    if state.config.mode is Mode.RECORD_MISSING and session is not None:
        await _end_upstream(state, request, server, session)
    return Response(status_code=200)


async def _end_upstream(
    state: ChaosState, request: Request, server: str, session: McpSession
) -> None:
    """In record-missing mode, the upstream's session a session opened ends with it (a
    DELETE with the upstream's id; one it refuses, or an upstream gone, changes nothing
    for the client: its session has ended)."""
    if not session.upstream_open or session.upstream is None:
        return  # none opened, or an upstream that keeps no sessions
    call = ProviderCall(provider=PROVIDERS["mcp"], path=f"/mcp/{server}", body=b"")
    await _ask(state, call, "DELETE", _with_session(request.headers.raw, session.upstream))


def mcp_routes() -> list[Route]:
    return [
        Route(PATH_TEMPLATE, stream, methods=["GET"]),
        Route(PATH_TEMPLATE, end, methods=["DELETE"]),
    ]
