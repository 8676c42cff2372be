"""The WebSocket endpoints (OpenAI Realtime; Gemini Live): the executor of a session's
steps over the ASGI ``websocket`` scope.

The session's decisions are `chaosllm.core.live.LiveSession`'s; this module only moves
frames: it accepts the connection, sends the opening steps, and then reads client frames
(answered by the session) while a sender sends each step at its time (the turn's events
in order, paced by the recorded timing). A step that ends the session ends it: a close
frame, a drop (under chaosllm's own servers the ``chaosllm.websocket.drop`` message;
under another ASGI server, an exception, on which uvicorn closes the transport with no
close frame), a stall (pings unanswered where the server can, then a drop).
"""

from __future__ import annotations

import json
import logging
from collections import deque
from urllib.parse import parse_qsl

import anyio
import anyio.to_thread
from starlette.routing import WebSocketRoute

from chaosllm.core.live import LiveHub, LiveSession
from chaosllm.errors import PlanAborted
from chaosllm.faults.session import CLOSE, DROP, EVENT, STALL, TEXT, Step
from chaosllm.http.state import ChaosState
from chaosllm.http.web import SESSION_HEADER
from chaosllm.providers.live import SessionProtocol
from chaosllm.providers.sessions import SESSION_PROTOCOLS
from chaosllm.wire.asgi import Receive, Scope, Send
from chaosllm.wire.upgrade import DROP as DROP_MESSAGE
from chaosllm.wire.upgrade import STALL as STALL_MESSAGE
from chaosllm.wire.upgrade import WS_EXTENSION

__all__ = ["live_hub", "live_routes"]

logger = logging.getLogger("chaosllm.wire")

_SUBPROTOCOLS = ("realtime",)
"""Subprotocols accepted when offered (OpenAI's browser clients offer ``realtime``)."""


def live_hub(state: ChaosState) -> LiveHub:
    """The state's session hub, made on the first session."""
    hub: LiveHub | None = getattr(state, "_live_hub", None)
    if hub is None:
        config = state.config
        hub = LiveHub(
            config.recordings,
            state.board,
            timing=config.timing,
            nearest_threshold=config.nearest_threshold,
            journal=state.journal,
        )
        state._live_hub = hub  # type: ignore[attr-defined]
    return hub


class SessionEndpoint:
    """The ASGI app of one protocol's WebSocket paths."""

    def __init__(self, protocol: SessionProtocol) -> None:
        self.protocol = protocol

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state: ChaosState = scope["app"].state.chaos
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        session = live_hub(state).session(
            self.protocol, scope["path"], query, headers.get(SESSION_HEADER)
        )
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        origin = headers.get("origin")
        if origin is not None and not _own_origin(origin, headers.get("host")):
            # A browser page of another origin may open a WebSocket to any address (no
            # CORS for WebSockets): refused, as the control plane refuses it.
            await send(
                {
                    "type": "websocket.close",
                    "code": 1008,
                    "reason": f"WebSocket from another origin ({origin}) refused",
                }
            )
            return
        offered = scope.get("subprotocols") or []
        chosen = next((p for p in offered if p in _SUBPROTOCOLS), None)
        if state.upstream is not None:
            await _proxy(state, self.protocol, scope, receive, send, chosen, query)
            return
        await send({"type": "websocket.accept", "subprotocol": chosen})
        await _Run(session, scope, receive, send).run()


_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]", "::1")


def _own_origin(origin: str, host: str | None) -> bool:
    """Whether a browser's Origin is this server's (the Host it asked) or a loopback one."""
    _, sep, rest = origin.strip().lower().partition("://")
    if not sep:
        return False
    name = rest.rsplit(":", 1)[0] if not rest.endswith("]") else rest
    if name in _LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    return host is not None and rest == host.strip().lower()


class _Run:
    """One session's executor: a receiver and a sender in one task group."""

    def __init__(self, session: LiveSession, scope: Scope, receive: Receive, send: Send) -> None:
        self.session = session
        self.receive = receive
        self.send = send
        self.native = WS_EXTENSION in (scope.get("extensions") or {})
        self.queue: deque[tuple[float, Step]] = deque()
        self.ready = anyio.Event()
        self.last_due = 0.0
        self.ended = False
        self.stalled = False

    def put(self, steps: tuple[Step, ...]) -> None:
        now = anyio.current_time()
        for step in steps:
            due = max(now + step.at_s, self.last_due)
            self.last_due = due
            self.queue.append((due, step))
        self.ready.set()

    async def run(self) -> None:
        self.put(self.session.open())
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._sender, tg.cancel_scope)
            await self._receiver()
            tg.cancel_scope.cancel()

    async def _receiver(self) -> None:
        while not self.ended:
            message = await self.receive()
            kind = message["type"]
            if kind == "websocket.disconnect":
                self.ended = True
                return
            if kind != "websocket.receive" or self.stalled:
                continue
            text = message.get("text")
            if text is not None:
                self.put(self.session.receive(text))
            else:
                self.put(self.session.receive_bytes(message.get("bytes") or b""))

    async def _sender(self, scope: anyio.CancelScope) -> None:
        while True:
            if not self.queue:
                self.ready = anyio.Event()
                await self.ready.wait()
                continue
            due, step = self.queue.popleft()
            wait = due - anyio.current_time()
            if wait > 0:
                await anyio.sleep(wait)
            if not await self._execute(step):
                self.ended = True
                scope.cancel()
                return

    async def _execute(self, step: Step) -> bool:
        """Send one step; whether the session goes on."""
        send = self.send
        if step.kind == EVENT:
            await send({"type": "websocket.send", "text": json.dumps(step.event)})
        elif step.kind == TEXT:
            await send({"type": "websocket.send", "text": step.text})
        elif step.kind == CLOSE:
            await send({"type": "websocket.close", "code": step.code, "reason": step.reason})
            return False
        elif step.kind == DROP:
            await self._drop()
            return False
        elif step.kind == STALL:
            self.stalled = True
            self.queue.clear()
            if self.native:
                await send({"type": STALL_MESSAGE})
            await anyio.sleep(step.max_s)
            await self._drop()
            return False
        return True

    async def _drop(self) -> None:
        if self.native:
            await self.send({"type": DROP_MESSAGE})
            return
        logger.warning("ws_drop under another ASGI server: the session is aborted instead")
        raise PlanAborted("the session's connection is dropped (ws_drop)")


async def _proxy(
    state: ChaosState,
    protocol: SessionProtocol,
    scope: Scope,
    receive: Receive,
    send: Send,
    subprotocol: str | None,
    query: dict[str, str],
) -> None:
    """The modes other than replay: the session relayed to the upstream's WebSocket both
    ways as it flows, and (record, record-missing) written as one session recording: the
    events in order with their times, redacted; the credentials (headers, ``key=``) are
    forwarded and never written."""
    from chaosllm.record.ws_client import UpstreamSocket
    from chaosllm.store.sessions import dumps, session_from_events

    assert state.upstream is not None
    try:
        upstream = await UpstreamSocket.open(
            state.upstream.url, scope["path"], scope.get("query_string", b""), scope["headers"]
        )
    except Exception as exc:
        logger.warning("%s", exc)
        await send({"type": "websocket.close", "code": 1011, "reason": "upstream unavailable"})
        return
    await send({"type": "websocket.accept", "subprotocol": subprotocol})
    started = anyio.current_time()
    events: list[tuple[str, float, str]] = []

    def note(source: str, text: str) -> None:
        if len(events) < _MAX_RECORDED_EVENTS:
            events.append((source, (anyio.current_time() - started) * 1000.0, text))

    async with anyio.create_task_group() as tg:

        async def downstream() -> None:
            while True:
                text = await upstream.receive()
                if text is None:
                    code = upstream.close_code or 1000
                    await send(
                        {
                            "type": "websocket.close",
                            "code": 1011 if code in (1005, 1006) else code,
                            "reason": upstream.close_reason,
                        }
                    )
                    tg.cancel_scope.cancel()
                    return
                note("server", text)
                await send({"type": "websocket.send", "text": text})

        tg.start_soon(downstream)
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                await upstream.close(int(message.get("code") or 1000))
                tg.cancel_scope.cancel()
                break
            text = message.get("text")
            if text is None:
                continue
            note("client", text)
            await upstream.send(text)
    if state.writer is None or not events:
        return
    recording = session_from_events(
        protocol,
        scope["path"],
        protocol.model_of(query),
        events,
        state.redactor.body,
        upstream=state.upstream.display,
        no_audio=state.config.no_audio,
    )
    if recording is None:
        return
    scenario = state.recording_scenario(None)
    path = await anyio.to_thread.run_sync(state.writer.write_text, dumps(recording), scenario)
    logger.info("recorded session %s", path)
    live_hub(state).reload()


_MAX_RECORDED_EVENTS = 100_000
"""Events a recorded session keeps at most (the rest are relayed, not written)."""


def live_routes() -> list[WebSocketRoute]:
    return [
        WebSocketRoute(path, SessionEndpoint(protocol))
        for protocol in SESSION_PROTOCOLS.values()
        for path in protocol.paths
    ]
