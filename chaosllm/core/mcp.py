"""The engine's MCP hooks: the streamable HTTP transport's sessions and the answers an
MCP server gives without a recording, registered at the engine's extension points
(`chaosllm.core.hooks`) so that no stage names MCP.

Theory of operation
-------------------
``before_match`` (`admit`): every MCP request is journaled with its JSON-RPC ``method``
(and ``tool`` for ``tools/call``). In the revisions with sessions (2025-03-26 up to
2025-11-25) a request other than ``initialize`` must carry the ``Mcp-Session-Id`` an
``initialize`` answer minted: without one it gets a 400, with one chaosllm never minted
(or that ended: DELETE, ``mcp_session_lost``) a 404, as the transport says. The newest
revision (2026-07-28, ``MCP-Protocol-Version`` naming it, or ``server/discover``) has no
sessions. An ``MCP-Protocol-Version`` that names no revision chaosllm knows is a 400, as
the transport says. Notifications and the client's responses are accepted (202, no body, nothing
to record); ``ping`` is answered ``{}``; a method MCP does not define gets ``-32601``.

A ``notifications/cancelled`` is honoured (`cancel`): the answer to the request it
names, when still going (a stall of ``mcp_timeout``, a delay), is stopped and its
connection closed (outcome ``cancelled``); the notification's journal entry says which
(``cancels``: its seq).

``headers`` (`minted`): an ``initialize`` answer carries a fresh session id, drawn from
the seed and the server's count of sessions (deterministic with ``--seed``).
``exchange`` (`changed_tools`): after ``tools_changed`` fired in a session, its
``tools/list`` answers lose a tool and gain one. ``plan`` (`settled`): a fault that
changes the session (``mcp_session_lost`` ends it, ``tools_changed`` changes its tools)
is written into the session table. ``on_miss`` (`missed`): a request no recording
answers gets a JSON-RPC error (``-32001``, HTTP 200) carrying its own id and naming the
nearest recordings, never a 404, which clients read as a lost session.

The sessions live in a table per engine (`sessions_of`), bounded by ``--max-sessions``
(a session forgotten is a lost session: the client initializes again).
"""

from __future__ import annotations

import hashlib
import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Final

from chaosllm.config import Mode, OnMiss
from chaosllm.core import proxy
from chaosllm.core.call import Answer, Chosen, Decision, Headers, Request
from chaosllm.core.hooks import Hooks
from chaosllm.core.journal import JournalEntry
from chaosllm.core.stages import finish
from chaosllm.errors import NoMatch
from chaosllm.faults import FAULT_TYPES
from chaosllm.model import JSON, Exchange, RecordedRequest, RecordedResponse, ResponsePlan
from chaosllm.providers.mcp import (
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    METHODS,
    MODERN_VERSIONS,
    NO_RECORDING_CODE,
    PROTOCOL_HEADER,
    SESSION_HEADER,
    SESSION_VERSIONS,
    error_message,
    is_request,
    rpc_id,
    server_of,
    sse_frame,
    with_event_id,
)

if TYPE_CHECKING:
    from chaosllm.core.engine import Engine

__all__ = ["ADDED_TOOL", "HOOKS", "McpSession", "McpSessions", "session_problem", "sessions_of"]

ADDED_TOOL: Final = "chaosllm_added_tool"
"""The tool a ``tools_changed`` session's list gains."""


@dataclass(slots=True)
class McpSession:
    server: str
    changed: str | None = None
    """``tools_changed`` fired: the tool its lists lose ("": the first one)."""
    init: bytes = b""
    """The client's ``initialize`` message (record-missing opens the upstream's session
    with it when a request first needs the upstream)."""
    upstream: str | None = None
    """Record-missing: the upstream's ``Mcp-Session-Id`` this session's proxied requests
    carry (None: none, or the upstream keeps no sessions)."""
    upstream_open: bool = False
    """Whether the upstream was initialized for this session (`upstream` its id, if any)."""
    upstream_ready: bool = False
    """Whether the upstream got ``notifications/initialized`` for `upstream`."""
    streams: int = 0
    """How many of its answers' SSE streams got event ids (stream 0: the GET stream)."""
    resumable: OrderedDict[int, list[bytes]] = field(default_factory=OrderedDict)
    """The events a resumable stream did not send (its number: what the GET with
    ``Last-Event-ID`` ``N-k`` resumes), newest last, bounded."""
    outbox: list[tuple[int, bytes]] = field(default_factory=list)
    """The GET stream's events and their numbers (ids ``0-1``, ``0-2``...), bounded."""
    posted: int = 0
    """How many events the GET stream has had."""
    listeners: list[Callable[[], None]] = field(default_factory=list)
    """The open GET streams' wakers (`McpSessions.post`)."""


KEPT_STREAMS: Final = 16
"""How many resumable streams a session keeps."""
KEPT_EVENTS: Final = 256
"""How many GET-stream events a session keeps (a resume from an older one gets those)."""


class McpSessions:
    """The MCP sessions of one engine: minted by ``initialize``, ended by DELETE or a
    lost session, least recently used first, bounded."""

    def __init__(self, max_sessions: int, seed: int) -> None:
        self.max_sessions = max_sessions
        self.seed = seed
        self._sessions: OrderedDict[str, McpSession] = OrderedDict()
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self.tool_errors: OrderedDict[str | None, tuple[int, str]] = OrderedDict()
        """Per chaosllm session: the journal seq and text of the last tool error (an
        ``isError`` result) its next model request should carry."""

    def tool_error(self, session: str | None, seq: int, text: str) -> None:
        with self._lock:
            self.tool_errors[session] = (seq, text)
            self.tool_errors.move_to_end(session)
            while len(self.tool_errors) > self.max_sessions:
                self.tool_errors.popitem(last=False)

    def take_tool_error(self, session: str | None) -> tuple[int, str] | None:
        with self._lock:
            return self.tool_errors.pop(session, None)

    def __len__(self) -> int:
        return len(self._sessions)

    def mint(self, server: str, init: bytes = b"") -> str:
        with self._lock:
            number = self._counts[server] = self._counts.get(server, 0) + 1
            if len(self._counts) > self.max_sessions:
                self._counts.pop(next(iter(self._counts)))
            digest = hashlib.sha256(f"{self.seed}:{server}:{number}".encode()).hexdigest()
            session_id = digest[:32]
            self._sessions[session_id] = McpSession(server, init=init)
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
            return session_id

    def get(self, session_id: str | None, server: str) -> McpSession | None:
        """The live session of `server` with that id (None: none, or ended)."""
        if session_id is None:
            return None
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None or session.server != server:
                return None
            self._sessions.move_to_end(session_id)
            return session

    def end(self, session_id: str | None) -> bool:
        """End a session; whether it was live."""
        with self._lock:
            return self._sessions.pop(session_id or "", None) is not None

    def post(self, session: McpSession, message: JSON) -> None:
        """A server notification on the session's GET stream (its open streams woken)."""
        with self._lock:
            session.posted += 1
            number = session.posted
            frame = with_event_id(sse_frame(message).encode("utf-8"), f"0-{number}")
            session.outbox.append((number, frame))
            del session.outbox[:-KEPT_EVENTS]
            listeners = list(session.listeners)
        for listener in listeners:
            listener()

    def resumable_stream(self, session: McpSession, sent: int, rest: list[bytes]) -> int:
        """A new resumable stream of `session` that sent `sent` events, whose resume gets
        the events `rest` (they get their ids here: ``N-(sent+1)``...); its number N."""
        with self._lock:
            session.streams += 1
            number = session.streams
            session.resumable[number] = [
                with_event_id(data, f"{number}-{sent + i}") for i, data in enumerate(rest, 1)
            ]
            while len(session.resumable) > KEPT_STREAMS:
                session.resumable.popitem(last=False)
            return number

    def change_tools(self, session_id: str | None, tool: str | None) -> None:
        with self._lock:
            session = self._sessions.get(session_id or "")
            if session is not None:
                session.changed = tool or ""


_TABLES: weakref.WeakKeyDictionary[Engine, McpSessions] = weakref.WeakKeyDictionary()
_TABLES_LOCK = threading.Lock()


def sessions_of(engine: Engine) -> McpSessions:
    """The engine's MCP session table (made on first use)."""
    table = _TABLES.get(engine)
    if table is None:
        with _TABLES_LOCK:
            table = _TABLES.get(engine)
            if table is None:
                config = engine.config
                table = _TABLES[engine] = McpSessions(config.max_sessions, config.seed)
    return table


def _is_mcp(request: Request) -> bool:
    return request.call.provider.name == "mcp"


def _header(headers: Headers, name: str) -> str | None:
    return next((value for key, value in headers if key == name), None)


def session_problem(
    engine: Engine, server: str, headers: Headers, method: str | None
) -> tuple[int, str] | None:
    """Why a request to `server` with these headers has no session (the HTTP status and
    the message), or None: it needs none (``initialize``, the newest revision) or has one."""
    version = _header(headers, PROTOCOL_HEADER)
    if version is not None and version not in (*SESSION_VERSIONS, *MODERN_VERSIONS):
        known = ", ".join((*SESSION_VERSIONS, *MODERN_VERSIONS))
        return 400, f"Bad Request: unsupported MCP-Protocol-Version {version!r} (known: {known})."
    if method in ("initialize", "server/discover"):
        return None
    if version in MODERN_VERSIONS:
        return None
    session_id = _header(headers, SESSION_HEADER)
    if session_id is None:
        return 400, "Bad Request: Missing session ID (Mcp-Session-Id): initialize first."
    if sessions_of(engine).get(session_id, server) is None:
        return 404, f"Session not found: {session_id!r} (initialize again for a new session)."
    return None


def _answer(request: Request, message: JSON, status: int = 200, how: str = "mcp") -> Chosen:
    """A made-up answer: `message` (None: an accepted notification, 202)."""
    call = request.call
    exchange = Exchange(
        provider=call.provider.name,
        request=RecordedRequest(method="POST", path=call.path, body=request.body),
        response=RecordedResponse(status=status, body=message),
        digest=request.digest,
        name="(mcp)",
        scenario="(mcp)",
    )
    request.fields["match"] = how
    return Chosen(exchange, None, (("x-chaosllm-match", how),))


def admit(engine: Engine, request: Request) -> Chosen | None:
    """The session's check and the answers that need no recording (see the module doc)."""
    if not _is_mcp(request):
        return None
    request.keep = False  # sessions decide answers
    body = request.body
    method = body.get("method")
    request.fields.update(request.call.provider.journal_fields(body))
    server = server_of(body) or ""
    problem = session_problem(engine, server, request.call.headers, method)
    if problem is not None:
        status, text = problem
        request.fields["error"] = text
        return _answer(request, error_message(None, INVALID_REQUEST, text), status, "session")
    if not is_request(body):
        if method == CANCELLED:
            request.fields["cancels"] = cancel(engine, request)
            target = _cancelled(engine, request)
            if (
                engine.config.mode is Mode.RECORD_MISSING
                and target is not None
                and target.record.match == "upstream"
            ):
                return None  # the upstream runs that call: it is told too (`missed`)
        return _answer(request, None, 202, "accepted")
    if method == "ping":  # the newest revision's results say their resultType
        modern = _header(request.call.headers, PROTOCOL_HEADER) in MODERN_VERSIONS
        result = {"resultType": "complete"} if modern else {}
        return _answer(request, {"jsonrpc": "2.0", "id": rpc_id(body), "result": result})
    if method not in METHODS:
        text = f"Method not found: {method!r} is no MCP method."
        return _answer(request, error_message(None, METHOD_NOT_FOUND, text))
    return None


CANCELLED: Final = "notifications/cancelled"

CANCEL_WITHIN: Final = 256
"""How many of the newest journal entries a cancellation looks through for its request."""


def cancel(engine: Engine, request: Request) -> int:
    """Honour a ``notifications/cancelled``: the answer to the request it names (the
    newest of the session's requests to this server with that id, still being answered)
    is stopped where it is (`PlanReport.stop`: a stall, a delay ends, the connection is
    closed); the ``seq`` of that request (0: none in flight)."""
    entry = _cancelled(engine, request)
    return entry.seq if entry is not None and entry.report.stop() else 0


def _cancelled(engine: Engine, request: Request) -> JournalEntry | None:
    """The entry of the request a ``notifications/cancelled`` names: the newest of the
    session's requests to this server with that id, within `CANCEL_WITHIN`."""
    params = request.body.get("params")
    wanted = params.get("requestId") if isinstance(params, dict) else None
    if wanted is None:
        return None
    call = request.call
    entries = engine.journal.entries(call.session)[-CANCEL_WITHIN:]
    for entry in reversed(entries):
        record = entry.record
        if record.path == call.path and record.rpc_id == wanted:
            return entry
    return None


def minted(engine: Engine, request: Request) -> Headers:
    """A fresh ``Mcp-Session-Id`` on an ``initialize`` answer (the sessions' revisions)."""
    if not _is_mcp(request) or request.body.get("method") != "initialize":
        return ()
    session_id = sessions_of(engine).mint(server_of(request.body) or "", request.call.body)
    return (("mcp-session-id", session_id),)


def changed_tools(engine: Engine, request: Request, exchange: Exchange) -> Exchange:
    """A ``tools/list`` answer after ``tools_changed``: one tool gone, one new."""
    if not _is_mcp(request) or request.body.get("method") != "tools/list":
        return exchange
    session = sessions_of(engine).get(
        _header(request.call.headers, SESSION_HEADER), server_of(request.body) or ""
    )
    answer = exchange.response.body
    result = answer.get("result") if isinstance(answer, dict) else None
    if session is None or session.changed is None or not isinstance(result, dict):
        return exchange
    tools = [t for t in result.get("tools", ()) if isinstance(t, dict)]
    gone = session.changed or (tools[0].get("name") if tools else None)
    kept = [t for t in tools if t.get("name") != gone]
    kept.append(
        {
            "name": ADDED_TOOL,
            "description": "A tool the server added after notifications/tools/list_changed.",
            "inputSchema": {"type": "object", "properties": {}},
        }
    )
    body = {**answer, "result": {**result, "tools": kept}}
    response = replace(exchange.response, body=body, chunks=None)
    return replace(exchange, response=response, name=f"{exchange.name} (tools changed)")


TOOL_ERROR_HIDDEN = "tool_error_hidden_from_model"
"""The finding a model request gets when it does not carry the tool error before it."""


def _error_text(plan: ResponsePlan) -> str | None:
    """The text of a tool error (``isError: true``) a ``tools/call`` answer carries."""
    if plan.body_length > 1 << 20:
        return None
    for line in plan.body().decode("utf-8", "replace").splitlines() or [""]:
        text = line[5:] if line.startswith("data:") else line
        try:
            message = json.loads(text)
        except ValueError:
            continue
        result = message.get("result") if isinstance(message, dict) else None
        if isinstance(result, dict) and result.get("isError") is True:
            parts = [c.get("text") for c in result.get("content", ()) if isinstance(c, dict)]
            return " ".join(p for p in parts if isinstance(p, str)) or None
    return None


def carried(engine: Engine, request: Request) -> Chosen | None:
    """A model request after a tool error of its session: a finding when it does not
    carry the error's text (the agent hid it from the model)."""
    if _is_mcp(request) or not sessions_of(engine).tool_errors:
        return None
    pending = sessions_of(engine).take_tool_error(request.call.session)
    if pending is None:
        return None
    _, text = pending
    calls = [e for e in engine.journal.entries(request.call.session) if e.record.tool]
    seq = calls[-1].seq if calls else 0
    escaped = json.dumps(text)[1:-1]
    raw = request.call.body.decode("utf-8", "replace")
    if text not in raw and escaped not in raw:
        request.fields["findings"].append(
            {
                "name": TOOL_ERROR_HIDDEN,
                "message": f"the tool error of #{seq} ({text[:80]!r}) is not in this request",
                "tool_seq": seq,
            }
        )
    return None


def settled(engine: Engine, request: Request, plan: ResponsePlan) -> ResponsePlan:
    """The session table after a fault that changes the session fired on `request`, and
    a tool error the session's next model request should carry."""
    if _is_mcp(request) and request.body.get("method") == "tools/call":
        text = _error_text(plan)
        if text is not None:
            sessions_of(engine).tool_error(request.call.session, 0, text)
            engine.version.bump()  # the session's next model request is checked
    fault = request.fields.get("fault")
    if not _is_mcp(request) or not isinstance(fault, dict):
        return plan
    entry = FAULT_TYPES.get(str(fault.get("type")))
    effect = entry.mcp_effect if entry is not None else None
    session_id = _header(request.call.headers, SESSION_HEADER)
    if effect == "ends_session":
        sessions_of(engine).end(session_id)
    elif effect == "changes_tools":
        match = fault.get("match")
        tool = match.get("tool") if isinstance(match, dict) else None
        sessions = sessions_of(engine)
        sessions.change_tools(session_id, tool)
        session = sessions.get(session_id, server_of(request.body) or "")
        if session is not None and session.listeners:  # the GET stream carries it
            note = plan.pieces[0] if plan.pieces else None
            if note is not None and LIST_CHANGED.encode() in note.data:
                sessions.post(session, {"jsonrpc": "2.0", "method": LIST_CHANGED})
                plan = plan.with_(pieces=plan.pieces[1:])
    return plan


LIST_CHANGED: Final = "notifications/tools/list_changed"


def resumable(engine: Engine, request: Request, answer: Answer) -> None:
    """An SSE answer a dropping fault (``mcp_stream_drop``) with ``retry_ms`` cut: its
    events get ids (``N-1``, ``N-2``...: the session's stream N), the last a ``retry``
    field, and the events it never sent are kept for a GET with ``Last-Event-ID``
    (`chaosllm.http.mcp`)."""
    fired = answer.fired
    if not _is_mcp(request) or fired is None or fired.spec.entry.mcp_effect != "drops_stream":
        return
    retry_ms = fired.spec.param("retry_ms")
    session = sessions_of(engine).get(
        _header(request.call.headers, SESSION_HEADER), server_of(request.body) or ""
    )
    unfaulted = answer.unfaulted
    if retry_ms is None or session is None or unfaulted is None:
        return
    plan = answer.plan
    sent = sum(1 for p in plan.pieces if p.frame)
    rest = [p.data for p in unfaulted.pieces if p.frame][sent:]
    number = sessions_of(engine).resumable_stream(session, sent, rest)
    pieces, place = [], 0
    for piece in plan.pieces:
        if piece.frame:
            place += 1
            retry = retry_ms if place == sent else None
            piece = replace(piece, data=with_event_id(piece.data, f"{number}-{place}", retry))
        pieces.append(piece)
    answer.plan = plan.with_(pieces=tuple(pieces))


def missed(engine: Engine, request: Request) -> Decision | None:
    """A miss as a JSON-RPC error with the request's id, naming the nearest recordings
    (HTTP 200: a 404 would read as a lost session)."""
    if not _is_mcp(request):
        return None
    call = request.call
    if engine.config.mode is Mode.RECORD_MISSING:
        if is_request(request.body):
            return None  # proxied and recorded
        # a cancellation of a proxied call (`admit`): told to the upstream, not recorded
        return proxy.forward(engine, call, request.body, record=False, miss=True, turn=request.turn)
    if engine.config.on_miss is OnMiss.FALLBACK:
        return None
    try:
        engine.matcher.match(
            call.provider, request.body, request.digest, call.session, consume=False
        )
        explanation = "No recording answers this request."
    except NoMatch as exc:
        explanation = exc.explanation
    message = error_message(
        rpc_id(request.body),
        NO_RECORDING_CODE,
        f"chaosllm: no recording answers {request.body.get('method')} on MCP server "
        f"{server_of(request.body)!r}. {explanation}",
        {"digest": request.digest, "code": "no_recording"},
    )
    exchange = _answer(request, message, how="miss").exchange
    plan = call.provider.render(exchange, request.body, timing=engine.config.timing)
    headers = (("x-chaosllm-match", "miss"), ("x-chaosllm-digest", request.digest))
    return finish.missed(engine, request, plan.with_(headers=plan.headers + headers))


HOOKS: Final = Hooks(
    before_match=(admit, carried),
    on_miss=(missed,),
    exchange=(changed_tools,),
    headers=(minted,),
    plan=(settled,),
    answered=(resumable,),
)
"""The MCP transport's hooks (composed by `chaosllm.core.hooks.default_hooks`)."""
