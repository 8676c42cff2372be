"""The WebSocket endpoints (OpenAI Realtime; Gemini Live): the executor of a session's
steps over the ASGI ``websocket`` scope.

The session's decisions are `chaosllm.core.live.LiveSession`'s; this module only moves
frames: it accepts the connection, sends the opening steps, and then reads client frames
(answered by the session) while a sender sends each step at its time (the turn's events
in order, paced by the recorded timing). A step that ends the session ends it: a close
frame, a drop (under chaosllm's own servers the ``chaosllm.websocket.drop`` message;
under another ASGI server, an exception, on which uvicorn closes the transport with no
close frame), a stall (pings unanswered where the server can, then a drop).

In record and passthrough modes the session is relayed to the upstream's WebSocket from
the start; in record-missing it is replayed until a turn has no recording (a `RELAY`
step), then the upstream is brought to where the session is and the session relayed
from there. A relayed session's faults are `chaosllm.core.live.relay.Relay`'s: its steps
go through the same sender. `_Recorder` writes the session (record: always;
record-missing: when a turn was relayed).
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

import anyio
import anyio.abc
import anyio.to_thread
from starlette.routing import WebSocketRoute

from chaosllm.config import Mode
from chaosllm.core.live import LiveHub, LiveSession
from chaosllm.core.live.relay import Relay
from chaosllm.errors import PlanAborted
from chaosllm.faults.session import CLOSE, DROP, EVENT, RELAY, STALL, TEXT, Step
from chaosllm.http.state import ChaosState
from chaosllm.http.web import SESSION_HEADER
from chaosllm.providers.live import SessionProtocol
from chaosllm.providers.sessions import SESSION_PROTOCOLS
from chaosllm.wire.asgi import Receive, Scope, Send
from chaosllm.wire.upgrade import DROP as DROP_MESSAGE
from chaosllm.wire.upgrade import STALL as STALL_MESSAGE
from chaosllm.wire.upgrade import WS_EXTENSION

if TYPE_CHECKING:
    from chaosllm.record.ws_client import UpstreamSocket

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
            relay_misses=config.mode is Mode.RECORD_MISSING and state.upstream is not None,
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
        recorder = None
        if state.writer is not None:
            recorder = _Recorder(state, self.protocol, scope["path"], query)
        run = _Run(session, scope, receive, send, state, recorder)
        if state.upstream is not None and state.config.mode is not Mode.RECORD_MISSING:
            # Record, passthrough: the whole session relayed (refused when the upstream
            # cannot be reached, before the client is accepted).
            upstream = await run.dial()
            if upstream is None:
                await send(
                    {"type": "websocket.close", "code": 1011, "reason": "upstream unavailable"}
                )
                return
            await send({"type": "websocket.accept", "subprotocol": chosen})
            run.relay_to(upstream, session.turns)
        else:
            await send({"type": "websocket.accept", "subprotocol": chosen})
        await run.run()
        if recorder is not None:
            await recorder.write()


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


class _Recorder:
    """A recorded session's frames both ways with their times (record: all of the
    session's; record-missing: written only when a turn was relayed), written as one
    session recording, redacted; the credentials (headers, ``key=``) are forwarded and
    never written. A last turn whose answer never ended (a fault, the client leaving
    mid-answer) is left out (`whole_turns`); a session with no whole turn is not
    written."""

    def __init__(
        self, state: ChaosState, protocol: SessionProtocol, path: str, query: dict[str, str]
    ) -> None:
        self.state = state
        self.protocol = protocol
        self.path = path
        self.query = query
        self.started = anyio.current_time()
        self.events: list[tuple[str, float, str]] = []
        self.relayed = False

    def note(self, source: str, text: str, later_s: float = 0.0) -> None:
        if len(self.events) < _MAX_RECORDED_EVENTS:
            ms = (anyio.current_time() + later_s - self.started) * 1000.0
            self.events.append((source, ms, text))

    async def write(self) -> None:
        from chaosllm.store.sessions import dumps, session_from_events, whole_turns

        state = self.state
        if state.writer is None or state.upstream is None or not self.relayed:
            return
        self.events.sort(key=lambda e: e[1])  # replayed steps are noted when due
        recording = session_from_events(
            self.protocol,
            self.path,
            self.protocol.model_of(self.query),
            whole_turns(self.protocol, self.events),
            state.redactor.body,
            upstream=state.upstream.display,
            no_audio=state.config.no_audio,
        )
        if recording is None or not recording.turns:
            logger.info("session not recorded: it has no turn answered whole")
            return
        scenario = state.recording_scenario(None)
        path = await anyio.to_thread.run_sync(state.writer.write_text, dumps(recording), scenario)
        logger.info("recorded session %s", path)
        live_hub(state).reload()


_CATCH_UP_S = 60.0
"""How long an upstream opened mid-session (record-missing) has to answer the turns the
session had replayed before the relayed one."""


class _Run:
    """One session's executor: a receiver and a sender in one task group; relayed, also
    a reader of the upstream."""

    def __init__(
        self,
        session: LiveSession,
        scope: Scope,
        receive: Receive,
        send: Send,
        state: ChaosState | None = None,
        recorder: _Recorder | None = None,
    ) -> None:
        self.session = session
        self.scope = scope
        self.receive = receive
        self.send = send
        self.state = state
        self.recorder = recorder
        self.native = WS_EXTENSION in (scope.get("extensions") or {})
        self.queue: deque[tuple[float, Step]] = deque()
        self.ready = anyio.Event()
        self.last_due = 0.0
        self.ended = False
        self.stalled = False
        self.relay: Relay | None = None
        self.upstream: UpstreamSocket | None = None
        self.upstream_gone = False
        self.tg: anyio.abc.TaskGroup | None = None

    def put(self, steps: tuple[Step, ...]) -> None:
        now = anyio.current_time()
        recorder = self.recorder if self.relay is None else None
        for step in steps:
            if self.relay is not None and step.at_s > 0 and self.tg is not None:
                self.tg.start_soon(self._later, step)  # a goAway's close, while events pass
                continue
            due = max(now + step.at_s, self.last_due)
            self.last_due = due
            self.queue.append((due, step))
            if recorder is not None and step.kind in (EVENT, TEXT):
                text = json.dumps(step.event) if step.kind == EVENT else step.text
                recorder.note("server", text, due - now)
        self.ready.set()

    async def _later(self, step: Step) -> None:
        await anyio.sleep(step.at_s)
        self.put((replace(step, at_s=0.0),))

    async def dial(self) -> UpstreamSocket | None:
        """The upstream's WebSocket at the session's path (None: it cannot be reached)."""
        from chaosllm.record.ws_client import UpstreamSocket

        state, scope = self.state, self.scope
        assert state is not None and state.upstream is not None
        try:
            return await UpstreamSocket.open(
                state.upstream.url, scope["path"], scope.get("query_string", b""), scope["headers"]
            )
        except Exception as exc:
            logger.warning("%s", exc)
            return None

    def relay_to(self, upstream: UpstreamSocket, turns: int) -> Relay:
        """From now on the session is relayed to `upstream` (its faults: `Relay`)."""
        state, session = self.state, self.session
        assert state is not None
        self.relay = Relay(
            state.board,
            session.protocol,
            session.path,
            session.model,
            session.session,
            journal=state.journal,
            turns=turns,
            log=session.log,
        )
        self.upstream = upstream
        if self.recorder is not None:
            self.recorder.relayed = True
        if self.tg is not None:
            self.tg.start_soon(self._downstream)
        return self.relay

    async def run(self) -> None:
        try:
            async with anyio.create_task_group() as tg:
                self.tg = tg
                if self.upstream is None:
                    self.put(self.session.open())
                else:
                    tg.start_soon(self._downstream)
                tg.start_soon(self._sender, tg.cancel_scope)
                await self._receiver()
                tg.cancel_scope.cancel()
        finally:
            self.tg = None
            with anyio.CancelScope(shield=True):
                await self._close_upstream()

    async def _close_upstream(self) -> None:
        # (What the upstream had still to send of a turn a fault broke is not read on:
        # the client's connection ends only when this session's app returns.)
        if self.upstream is not None:
            await self.upstream.close(1000)

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
            if self.relay is not None and self.upstream is not None:
                if text is None:
                    continue  # the upstream sessions speak text
                if self.recorder is not None:
                    self.recorder.note("client", text)
                self.put(self.relay.client(text))
                await self.upstream.send(text)
                continue
            if text is not None:
                if self.recorder is not None:
                    self.recorder.note("client", text)
                steps = self.session.receive(text)
            else:
                steps = self.session.receive_bytes(message.get("bytes") or b"")
            if steps and steps[0].kind == RELAY:
                await self._relay_from_here()
            else:
                self.put(steps)

    async def _relay_from_here(self) -> None:
        """Record-missing, at a turn no recording has: the upstream opened and brought to
        where the session is (its client events so far sent, each earlier turn's answer
        read and dropped: the client had the recorded one), then this turn relayed, and
        every turn after it (the upstream holds the conversation now)."""
        session = self.session
        protocol = session.protocol
        history = session.history or []
        upstream = await self.dial()
        if upstream is None:
            self.put((Step(CLOSE, code=1011, reason="upstream unavailable"),))
            return
        first: str | None = None
        with anyio.move_on_after(_CATCH_UP_S):
            for i, text in enumerate(history):
                await upstream.send(text)
                event = _event(text)
                earlier = i < len(history) - 1 and event is not None and protocol.ends_turn(event)
                if earlier and await _until(upstream, protocol.answer_done) is None:
                    break  # the upstream closed
            else:
                first = await _until(upstream, protocol.answer_starts)
        if first is None:
            await upstream.close(1011)
            reason = "the upstream did not answer the session's earlier turns"
            self.put((Step(CLOSE, code=1011, reason=reason),))
            return
        relay = self.relay_to(upstream, session.turns - 1)
        relay.begin(miss=True)
        if self.recorder is not None:
            self.recorder.note("server", first)
        self.put(relay.server(first))

    async def _downstream(self) -> None:
        upstream, relay = self.upstream, self.relay
        assert upstream is not None and relay is not None
        while True:
            text = await upstream.receive()
            if text is None:
                self.upstream_gone = True
                code = upstream.close_code or 1000
                end = Step(
                    CLOSE,
                    code=1011 if code in (1005, 1006) else code,
                    reason=upstream.close_reason,
                )
                self.put((*relay.upstream_closed(), end))
                return
            if self.recorder is not None:
                self.recorder.note("server", text)
            self.put(relay.server(text))

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


def _event(text: str) -> dict[str, Any] | None:
    try:
        event = json.loads(text)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


async def _until(upstream: UpstreamSocket, found: Callable[[dict[str, Any]], bool]) -> str | None:
    """The upstream's frames read up to the first event `found` (its text; None: the
    upstream closed first)."""
    while (text := await upstream.receive()) is not None:
        event = _event(text)
        if event is not None and found(event):
            return text
    return None


_MAX_RECORDED_EVENTS = 100_000
"""Events a recorded session keeps at most (the rest are relayed, not written)."""


def live_routes() -> list[WebSocketRoute]:
    return [
        WebSocketRoute(path, SessionEndpoint(protocol))
        for protocol in SESSION_PROTOCOLS.values()
        for path in protocol.paths
    ]
