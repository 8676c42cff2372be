"""An MCP client of the engine that plays its answers as JSON-RPC messages, one a line:
what the stdio bridge (`chaosllm.mcp_stdio`) writes to the agent's stdin and the older
HTTP+SSE transport (`chaosllm.http.mcp_legacy`) sends as SSE events.

Each message is a `ProviderCall` of the ``mcp`` provider to ``/mcp/NAME`` with the
``Mcp-Session-Id`` the engine minted at ``initialize`` (so the session rules, the
matching and the journal are the streamable HTTP endpoint's). A plan is played: its
head delay and piece delays waited, each JSON-RPC message of its body (JSON or SSE)
written as one line. A plan that stalls writes nothing more (the agent's own timeout
decides), garbage writes its bytes as a line, a 404 (a lost session) or any error
status becomes a JSON-RPC error with the request's id. The journal entry's outcome is
``complete`` once played; a stalled one's stays pending until the agent cancels the
request (``notifications/cancelled``: ``cancelled``).
"""

from __future__ import annotations

import json
import threading
import time
from typing import IO, Any

from chaosllm.core.engine import Engine, ProviderCall, Reply
from chaosllm.core.report import Outcome
from chaosllm.model import Ending, ResponsePlan
from chaosllm.providers import PROVIDERS
from chaosllm.providers.mcp import (
    INVALID_REQUEST,
    PARSE_ERROR,
    SESSION_HEADER,
    error_message,
    is_request,
    rpc_id,
)

__all__ = ["ACCEPT", "MAX_LINE", "Bridge", "plan_messages"]

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
        self.answer(plan, message)
        report = decision.entry.report
        report.head_sent = plan.send_head
        if plan.ending is not Ending.STALL:
            report.outcome = Outcome.COMPLETE
        else:  # silent until the agent cancels it (or forever: the agent's timeout)
            report.on_stop(lambda: setattr(report, "outcome", Outcome.CANCELLED))

    def answer(self, plan: ResponsePlan, message: Any) -> None:
        """`plan`, the answer to `message`, played; the session id it mints kept for the
        messages after it."""
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
