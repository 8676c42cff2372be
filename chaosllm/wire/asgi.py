"""Sending a `ResponsePlan` from an ASGI app.

Under chaosllm's own server (`chaosllm.wire.server.WireServer`) the request
scope carries the ``"chaosllm.plan"`` extension: `send_plan` hands the plan to
the server in one custom ASGI message and the server executes it on the socket
exactly (FIN or RST mid-body, garbage bytes, empty reply, stalls).

Under any other ASGI server (uvicorn, ``httpx.ASGITransport``...) the plan is
degraded to the nearest thing standard ASGI can express: delays are sleeps,
pieces are ``http.response.body`` messages, and an ending that must break the
connection is emulated by raising `PlanAborted` after the partial body, which
makes the hosting server abort the connection (uvicorn closes it; an
in-process transport raises it to the client). Whenever the result is not
exact, ``report.degraded`` says why and a warning is logged once per kind on
the ``chaosllm.wire`` logger.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

import anyio

from chaosllm.core.report import Outcome, PlanReport
from chaosllm.errors import PlanAborted
from chaosllm.model import ResponsePlan
from chaosllm.wire.executor import execute
from chaosllm.wire.program import AsgiPart, AsgiProgram, asgi_program_for

__all__ = [
    "PLAN_EXTENSION",
    "ASGIApp",
    "Message",
    "PlanAborted",
    "PlanResponse",
    "Receive",
    "Scope",
    "Send",
    "send_plan",
]

PLAN_EXTENSION: Final = "chaosllm.plan"
"""The scope extension (and ASGI message type) of chaosllm's own server."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

logger = logging.getLogger("chaosllm.wire")

_warned: set[str] = set()


async def send_plan(
    scope: Scope,
    receive: Receive,
    send: Send,
    plan: ResponsePlan,
    report: PlanReport,
    *,
    warn: bool = True,
) -> None:
    """Execute `plan` as the response to the current request, filling `report`.

    Exact under `WireServer`; degraded (see the module docstring) elsewhere. With
    ``warn`` a degradation is logged once per kind (never through `warnings`).
    Raises `PlanAborted` when a degraded plan must break the connection.
    """
    extensions = scope.get("extensions") or {}
    if PLAN_EXTENSION in extensions:
        await send({"type": PLAN_EXTENSION, "plan": plan, "report": report})
        return
    await _send_degraded(receive, send, plan, report, warn=warn)


class PlanResponse:
    """A Starlette-compatible response (an ASGI callable) that executes a plan.

    Return it from a route: ``return PlanResponse(plan, report)``; read `report`
    once the response has been sent.
    """

    __slots__ = ("plan", "report", "warn")

    def __init__(
        self, plan: ResponsePlan, report: PlanReport | None = None, *, warn: bool = True
    ) -> None:
        self.plan = plan
        self.report = PlanReport() if report is None else report
        self.warn = warn

    @property
    def status_code(self) -> int:
        return self.plan.status

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_plan(scope, receive, send, self.plan, self.report, warn=self.warn)


# -- degraded execution under a plain ASGI server ---------------------------------------


def _warn_once(kind: str, message: str) -> None:
    if kind not in _warned:
        _warned.add(kind)
        logger.warning("chaosllm plan degraded under a plain ASGI server: %s", message)


class _AsgiSink:
    """An `AsgiProgram`'s sink (`chaosllm.wire.executor.Sink`): its messages go to
    ``send``; delays are sleeps; the endings are left to `_send_degraded`, which raises
    `PlanAborted` for them."""

    __slots__ = ("finishing", "gone", "headers", "send", "status")

    def __init__(self, send: Send, program: AsgiProgram) -> None:
        self.send = send
        self.status = program.status
        self.headers = program.headers
        self.gone = False
        self.finishing = False
        """The last message is being sent: a disconnect from now on is the normal end."""

    def open(self) -> bool:
        return True

    async def drain(self) -> None:
        pass

    async def write(self, data: AsgiPart) -> bool:
        if data is None:
            message = {"type": "http.response.start", "status": self.status}
            # A list of its own: middleware may add to it.
            message["headers"] = list(self.headers)
        else:
            body, more = data
            if not more:
                self.finishing = True
            message = {"type": "http.response.body", "body": body, "more_body": more}
        try:
            await self.send(message)
        except OSError:
            # ASGI >= 2.4 servers raise OSError from send() once the client is gone.
            self.gone = True
            return False
        return True

    async def pause(self, seconds: float) -> bool:
        await anyio.sleep(seconds)
        return True

    async def close(self) -> None:
        pass

    async def reset(self) -> None:
        pass


async def _listen_for_disconnect(
    receive: Receive, sink: _AsgiSink, scope: anyio.CancelScope
) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if sink.finishing:
                return
            sink.gone = True
            scope.cancel()
            return


async def _send_degraded(
    receive: Receive, send: Send, plan: ResponsePlan, report: PlanReport, *, warn: bool
) -> None:
    program = asgi_program_for(plan)
    problem = program.degraded
    if problem is not None:
        report.degraded = problem[1]
        if warn:
            _warn_once(*problem)
    sink = _AsgiSink(send, program)
    if program.waits:
        # Notice a client that goes away during a delay, as Starlette's streams do.
        async with anyio.create_task_group() as tg:
            tg.start_soon(_listen_for_disconnect, receive, sink, tg.cancel_scope)
            await execute(program, sink, report)
            tg.cancel_scope.cancel()
    else:
        await execute(program, sink, report)
    if sink.gone:
        report.outcome = Outcome.CLIENT_GONE
        return
    if report.outcome is Outcome.CANCELLED:
        return
    report.outcome = Outcome.COMPLETE
    if program.abort is not None:
        raise PlanAborted(f"chaosllm: aborting the connection to emulate {program.abort}")
