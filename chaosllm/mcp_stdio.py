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
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from chaosllm.config import Mode, ServerConfig
from chaosllm.core.call import Proxy
from chaosllm.core.engine import Engine, ProviderCall, Reply
from chaosllm.core.journal import ending_of
from chaosllm.core.report import Outcome
from chaosllm.faults import parse_fault_specs
from chaosllm.http.mcp_bridge import ACCEPT, Bridge, plan_messages
from chaosllm.model import (
    Ending,
    Exchange,
    RecordedChunk,
    RecordedRequest,
    RecordedResponse,
)
from chaosllm.providers import PROVIDERS
from chaosllm.providers.mcp import (
    is_request,
    sse_frame,
)
from chaosllm.store.recordings import RecordingStore
from chaosllm.store.redact import Redactor
from chaosllm.store.writer import RecordingWriter

__all__ = ["ACCEPT", "Bridge", "Recorder", "plan_messages", "record_engine", "replay_engine"]


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
            decision.entry.report.outcome = Outcome.COMPLETE
            return None
        if not is_request(message):  # a notification: the server answers nothing
            self.engine.amend(decision.entry, status=202, ending="complete")
            decision.entry.report.outcome = Outcome.COMPLETE
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
            proxied.entry.report.outcome = Outcome.COMPLETE
            return False
        plan = self.provider.render(exchange, proxied.body, timing=engine.config.timing)
        plan = engine.fault_upstream(proxied, plan, message)
        engine.amend(proxied.entry, status=plan.status if plan.send_head else None)
        if proxied.entry.record.ending is None:
            engine.amend(proxied.entry, ending=ending_of(plan))
        self.player.play(plan, request)
        if plan.ending is not Ending.STALL:  # a stalled one stays pending, as replayed
            proxied.entry.report.outcome = Outcome.COMPLETE
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
