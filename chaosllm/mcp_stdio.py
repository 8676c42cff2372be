"""``chaosllm mcp-stdio``: an MCP server launched as a command, recorded, replayed and
broken over stdio (newline-delimited JSON-RPC messages, as MCP's stdio transport says).

Theory of operation
-------------------
The bridge speaks stdio to the agent and is, to the engine, one more client of the MCP
server ``NAME`` (``/mcp/NAME``): each message the agent writes is a `ProviderCall` of the
``mcp`` provider, with the ``Mcp-Session-Id`` the engine minted at ``initialize`` (so the
session rules, the matching and the journal are the streamable HTTP endpoint's).

- ``--replay`` (no command): the engine answers from ``--recordings`` and the plan is
  played onto stdout: its head delay and piece delays waited, each JSON-RPC message of
  its body (JSON or SSE) written as one line. A plan that stalls writes nothing more (the
  agent's own timeout decides), garbage writes its bytes as a line, a 404 (a lost
  session) or any error status becomes a JSON-RPC error with the request's id.
- with a command (``-- CMD ...``): the command is the real server, launched as a
  subprocess; every message goes to it and every message it writes comes back, and each
  request with its answer (and the progress notifications carrying its progress token,
  as recorded frames) is recorded under ``--record-dir`` (default: the first
  ``--recordings`` DIR), scenario ``--record-scenario``.

Faults: ``--faults FILE`` (a JSON fault spec or array, as ``POST /__fault`` takes) arms
them on the bridge's own board with ``--seed``; they apply in both modes. Recording, as
the HTTP proxy does, a request a fault may break still goes to the server; its progress
and answer are held back until the answer is whole, then played to the agent through
the fault (a fault that answers alone, if any, answers the agent and the server never
gets the request). What is recorded is always the server's answer as it gave it. The
journal is written to ``--journal FILE`` (JSON lines) when the agent closes stdin.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from chaosllm.config import Mode, ServerConfig
from chaosllm.core.call import Proxy
from chaosllm.core.engine import Engine, ProviderCall, Reply
from chaosllm.core.journal import ending_of
from chaosllm.faults import parse_fault_specs
from chaosllm.model import (
    Ending,
    Exchange,
    RecordedChunk,
    RecordedRequest,
    RecordedResponse,
    ResponsePlan,
)
from chaosllm.providers import PROVIDERS
from chaosllm.providers.mcp import (
    INVALID_REQUEST,
    PARSE_ERROR,
    SESSION_HEADER,
    error_message,
    is_request,
    rpc_id,
    sse_frame,
)
from chaosllm.store.recordings import RecordingStore
from chaosllm.store.redact import Redactor
from chaosllm.store.writer import RecordingWriter

__all__ = ["ACCEPT", "Bridge", "Recorder", "plan_messages", "record_engine", "replay_engine"]

ACCEPT = ("accept", "application/json, text/event-stream")
MAX_LINE = 16 * 1024 * 1024
"""The longest message line the bridge reads (the HTTP endpoint's default body limit)."""


def plan_messages(plan: ResponsePlan) -> list[tuple[float, str]]:
    """The JSON-RPC messages a plan's pieces carry, each with the delay before it
    (milliseconds): SSE ``data`` lines, or a JSON body whole."""
    out: list[tuple[float, str]] = []
    if not any(p.frame for p in plan.pieces):  # a JSON body
        body = plan.body().decode("utf-8", "replace").strip()
        if body:
            out.append((sum(p.delay_ms for p in plan.pieces), body))
        return out
    for piece in plan.pieces:
        text = piece.data.decode("utf-8", "replace")
        data = [line[5:].lstrip(" ") for line in text.splitlines() if line.startswith("data:")]
        if data:
            out.append((piece.delay_ms, "\n".join(data).replace("\n", " ")))
        elif text.strip() and not text.startswith((":", "event:", "id:")):
            out.append((piece.delay_ms, text.strip()))  # not SSE: garbage, as it is
    return out


class Bridge:
    """Replays (and breaks) MCP server ``name`` over stdio (see the module doc)."""

    def __init__(self, engine: Engine, name: str, out: IO[str], *, session: str | None = None):
        self.engine = engine
        self.name = name
        self.out = out
        self.session = session
        self.mcp_session: str | None = None
        self._lock = threading.Lock()

    def write(self, line: str) -> None:
        with self._lock:
            self.out.write(line + "\n")
            self.out.flush()

    def _error(self, rpc: Any, code: int, message: str) -> None:
        self.write(json.dumps(error_message(rpc, code, message)))

    def handle(self, line: str) -> None:
        """One message from the agent, answered on stdout as the engine decides."""
        try:
            message = json.loads(line)
        except ValueError:
            self._error(None, PARSE_ERROR, "Parse error: a line that is not JSON.")
            return
        headers: tuple[tuple[str, str], ...] = (ACCEPT,)
        if self.mcp_session is not None:
            headers += ((SESSION_HEADER, self.mcp_session),)
        call = ProviderCall(
            provider=PROVIDERS["mcp"],
            path=f"/mcp/{self.name}",
            body=line.encode("utf-8"),
            session=self.session,
            headers=headers,
        )
        decision = self.engine.handle(call)
        assert isinstance(decision, Reply), "the bridge's engine replays"
        plan = decision.plan
        minted = dict(plan.headers).get(SESSION_HEADER)
        if minted is not None:
            self.mcp_session = minted
        self.play(plan, message)

    def play(self, plan: ResponsePlan, message: Any) -> None:
        if plan.status == 202:
            return
        if plan.head_delay_ms:
            time.sleep(plan.head_delay_ms / 1000)
        rpc = rpc_id(message) if isinstance(message, dict) else None
        if not plan.send_head:  # garbage, a reset, an empty reply: bytes or nothing
            body = plan.body().decode("utf-8", "replace").strip()
            if body:
                self.write(body)
            return
        if plan.status == 404:
            self.mcp_session = None  # the session is gone: the agent initializes again
        for delay, text in plan_messages(plan):
            if delay:
                time.sleep(delay / 1000)
            if plan.status >= 400 and is_request(message):
                try:
                    answer = json.loads(text)
                    answer["id"] = rpc  # as the SDK's HTTP client does
                    text = json.dumps(answer)
                except (ValueError, TypeError):
                    pass
            self.write(text)
        if plan.ending is Ending.STALL:
            return  # no answer: the agent's timeout decides

    def run(self, stdin: IO[str]) -> None:
        for line in stdin:
            if len(line) > MAX_LINE:
                self._error(None, INVALID_REQUEST, "A message longer than the bridge reads.")
            elif line.strip():
                self.handle(line.strip())


class Recorder:
    """Proxies the agent to the server command and records each request and its answer;
    with an `engine`, its faults break what the agent gets (see the module doc)."""

    def __init__(
        self,
        command: Sequence[str],
        name: str,
        writer: RecordingWriter,
        scenario: str,
        out: IO[str],
        *,
        engine: Engine | None = None,
        session: str | None = None,
    ) -> None:
        self.name = name
        self.writer = writer
        self.scenario = scenario
        self.out = out
        self.engine = engine
        self.session = session
        self.provider = PROVIDERS["mcp"]
        self.player = Bridge(engine, name, out, session=session) if engine is not None else None
        self.child = subprocess.Popen(
            list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self._pending: dict[Any, tuple[Any, list[str], Proxy | None]] = {}
        self._tokens: dict[Any, Any] = {}
        self._lock = threading.Lock()
        self._out_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read_child, daemon=True)
        self._reader.start()

    def _bound(self, message: Any) -> Any:
        return self.provider.bind_headers(message, {"server": self.name}, "", (ACCEPT,))

    def _write(self, line: str) -> None:
        if self.player is not None:
            self.player.write(line.rstrip("\n"))
            return
        with self._out_lock:
            self.out.write(line)
            self.out.flush()

    def _decide(self, line: str, message: Any) -> Proxy | None:
        """The engine's decision on a message of the agent: None when a fault answered
        it alone (played to the agent: the server never gets it), else the proxied
        request (its journal entry, whether a fault may break its answer)."""
        assert self.engine is not None and self.player is not None
        call = ProviderCall(
            provider=self.provider,
            path=f"/mcp/{self.name}",
            body=line.encode("utf-8"),
            session=self.session,
            headers=(ACCEPT,),
        )
        decision = self.engine.handle(call)
        if isinstance(decision, Reply):
            self.player.play(decision.plan, message)
            return None
        if not is_request(message):  # a notification: the server answers nothing
            self.engine.amend(decision.entry, status=202, ending="complete")
        return decision

    def send(self, line: str) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        proxied = None
        if self.engine is not None and isinstance(message, dict):
            proxied = self._decide(line, message)
            if proxied is None:
                return  # a fault answered it alone
        if is_request(message):
            meta = (message.get("params") or {}).get("_meta") or {}
            with self._lock:
                self._pending[message["id"]] = (message, [], proxied)
                if "progressToken" in meta:
                    self._tokens[meta["progressToken"]] = message["id"]
        assert self.child.stdin is not None
        self.child.stdin.write(line + "\n")
        self.child.stdin.flush()

    def _read_child(self) -> None:
        assert self.child.stdout is not None
        for line in self.child.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                self._write(line)
                continue
            if not isinstance(message, dict) or not self._seen(message):
                self._write(line)

    def _seen(self, message: dict[str, Any]) -> bool:
        """Note a message of the server; whether it is held back (a faultable request's
        progress and answer, played through its fault once the answer is whole)."""
        with self._lock:
            if message.get("method") == "notifications/progress":
                token = (message.get("params") or {}).get("progressToken")
                waiting = self._pending.get(self._tokens.get(token))
                if waiting is None:
                    return False
                waiting[1].append(sse_frame(message))
                return waiting[2] is not None and waiting[2].faultable
            if "id" not in message or not ("result" in message or "error" in message):
                return False
            found = self._pending.pop(message["id"], None)
        if found is None:
            return False
        request, frames, proxied = found
        exchange = self._record(request, frames, message)
        if proxied is None or self.engine is None or self.player is None:
            return False
        engine = self.engine
        if not proxied.faultable:
            engine.amend(proxied.entry, status=200, ending="complete")
            return False
        plan = self.provider.render(exchange, proxied.body, timing=engine.config.timing)
        plan = engine.fault_upstream(proxied, plan, message)
        engine.amend(proxied.entry, status=plan.status if plan.send_head else None)
        if proxied.entry.record.ending is None:
            engine.amend(proxied.entry, ending=ending_of(plan))
        self.player.play(plan, request)
        return True

    def _record(self, request: Any, frames: list[str], message: dict[str, Any]) -> Exchange:
        """Write the server's answer (as it gave it, never as a fault broke it)."""
        chunks = None
        if frames:
            chunks = tuple(RecordedChunk(f) for f in (*frames, sse_frame(message)))
        body = self._bound(request)
        exchange = Exchange(
            provider="mcp",
            request=RecordedRequest(method="POST", path=f"/mcp/{self.name}", body=body),
            response=RecordedResponse(status=200, body=message, stream=bool(chunks), chunks=chunks),
            digest=self.provider.digest(body),
            name="(unsaved)",
            scenario="(unsaved)",
            meta={"upstream": "stdio"},
        )
        self.writer.write(exchange, self.scenario)
        return exchange

    def run(self, stdin: IO[str]) -> int:
        for line in stdin:
            if line.strip():
                self.send(line.strip())
        assert self.child.stdin is not None
        self.child.stdin.close()
        code = self.child.wait()
        self._reader.join(5)
        return code


def record_engine(seed: int, faults: Any, *, secrets: Sequence[str] = ()) -> Engine:
    """The engine of a recording bridge with `faults` (JSON) armed: it journals the
    agent's messages and breaks the server's answers (nothing is replayed)."""
    config = ServerConfig(mode=Mode.RECORD, seed=seed)
    engine = Engine(config, RecordingStore.load([]), redactor=Redactor(secrets))
    if faults:
        engine.board.arm(parse_fault_specs(faults))
    return engine


def replay_engine(
    recordings: Sequence[Path], *, seed: int, faults: Any = None, secrets: Sequence[str] = ()
) -> Engine:
    """The bridge's engine: replay from `recordings`, `faults` (JSON) armed."""
    config = ServerConfig(recordings=list(recordings), mode=Mode.REPLAY, seed=seed)
    engine = Engine(config, RecordingStore.load(config.recordings), redactor=Redactor(secrets))
    if faults is not None:
        engine.board.arm(parse_fault_specs(faults))
    return engine
