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
from chaosllm.model import Ending, Framing, ResponsePlan

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

_FRAMING_HEADERS: Final = frozenset({"content-length", "transfer-encoding"})


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


def _degradation(plan: ResponsePlan) -> tuple[str, str] | None:
    """(kind, explanation) when the plan cannot be executed exactly, else None."""
    if not plan.send_head:
        return (
            "no_head",
            "send_head=False (raw bytes or empty reply) is impossible under ASGI: "
            "aborted before the response started (the server answers 500 instead)",
        )
    if plan.ending is Ending.CLOSE:
        return (
            plan.ending.value,
            "ending CLOSE emulated by raising after the partial body "
            "(the ASGI server decides how the connection ends)",
        )
    if plan.ending is Ending.RESET:
        return (
            plan.ending.value,
            "ending RESET impossible under ASGI: emulated by raising after the partial "
            "body (typically a FIN, not an RST)",
        )
    if plan.ending is Ending.STALL:
        return (
            plan.ending.value,
            "ending STALL emulated by sleeping stall_ms, then raising to abort the connection",
        )
    if plan.framing is Framing.LENGTH and plan.body_length != plan.declared_length:
        return (
            "length",
            "a complete message whose Content-Length differs from its body cannot be "
            "sent under ASGI: the real body length is declared",
        )
    return None


_HEADS: dict[int, tuple[ResponsePlan, list[tuple[bytes, bytes]]]] = {}
"""The ASGI headers of recent plans (a replay repeated sends the same plan object), by
plan; bounded to `_MAX_HEADS`, oldest first out."""
_MAX_HEADS = 1024


def _head_headers(plan: ResponsePlan) -> list[tuple[bytes, bytes]]:
    kept = _HEADS.get(id(plan))
    if kept is not None and kept[0] is plan:
        return list(kept[1])
    headers = _built_head_headers(plan)
    if len(_HEADS) >= _MAX_HEADS:
        _HEADS.pop(next(iter(_HEADS)), None)
    _HEADS[id(plan)] = (plan, headers)
    return list(headers)


def _built_head_headers(plan: ResponsePlan) -> list[tuple[bytes, bytes]]:
    headers = [
        (name.lower().encode("latin-1"), value.encode("latin-1"))
        for name, value in plan.headers
        if name.lower() not in _FRAMING_HEADERS
    ]
    if plan.framing is Framing.LENGTH:
        if plan.ending is Ending.COMPLETE:
            headers.append((b"content-length", str(plan.body_length).encode("ascii")))
        elif plan.body_length <= plan.declared_length:
            # The server then sees a short body and drops the connection (uvicorn does).
            headers.append((b"content-length", str(plan.declared_length).encode("ascii")))
    if plan.close_after:
        headers.append((b"connection", b"close"))
    return headers


class _Gone:
    __slots__ = ("finishing", "gone")

    def __init__(self) -> None:
        self.gone = False
        self.finishing = False
        """The last message is being sent: a disconnect from now on is the normal end."""


async def _listen_for_disconnect(receive: Receive, state: _Gone, scope: anyio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if state.finishing:
                return
            state.gone = True
            scope.cancel()
            return


async def _run_degraded(
    send: Send, plan: ResponsePlan, report: PlanReport, state: _Gone
) -> str | None:
    """Send what ASGI can of the plan; return why the connection must be aborted, if so."""
    try:
        return await _run_degraded_steps(send, plan, report, state)
    except OSError:
        # ASGI >= 2.4 servers raise OSError from send() once the client is gone.
        state.gone = True
        return None


async def _run_degraded_steps(
    send: Send, plan: ResponsePlan, report: PlanReport, state: _Gone
) -> str | None:
    if plan.head_delay_ms > 0:
        await anyio.sleep(plan.head_delay_ms / 1000)
    if not plan.send_head:
        return "send_head=False"
    await send(
        {"type": "http.response.start", "status": plan.status, "headers": _head_headers(plan)}
    )
    report.head_sent = True
    complete = plan.ending is Ending.COMPLETE
    pieces = plan.pieces
    if (
        complete
        and plan.framing is Framing.LENGTH
        and len(pieces) > 1
        and not any(piece.delay_ms > 0 for piece in pieces)
    ):
        # A body of known length, all of it at once: one message (the same bytes).
        state.finishing = True
        body = b"".join([piece.data for piece in pieces])
        await send({"type": "http.response.body", "body": body, "more_body": False})
        report.bytes_sent += len(body)
        report.frames_sent += sum(1 for piece in pieces if piece.frame)
        return None
    last = len(pieces) - 1
    for index, piece in enumerate(pieces):
        if piece.delay_ms > 0:
            await anyio.sleep(piece.delay_ms / 1000)
        more = not (complete and index == last)
        state.finishing = not more
        await send({"type": "http.response.body", "body": piece.data, "more_body": more})
        report.bytes_sent += len(piece.data)
        if piece.frame:
            report.frames_sent += 1
    if complete:
        if not pieces:
            state.finishing = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        return None
    if plan.ending is Ending.STALL and plan.stall_ms > 0:
        await anyio.sleep(plan.stall_ms / 1000)
    return f"ending {plan.ending.name}"


async def _send_degraded(
    receive: Receive, send: Send, plan: ResponsePlan, report: PlanReport, *, warn: bool
) -> None:
    problem = _degradation(plan)
    if problem is not None:
        report.degraded = problem[1]
        if warn:
            _warn_once(*problem)
    state = _Gone()
    abort: str | None = None
    waits = (
        plan.head_delay_ms > 0
        or plan.ending is Ending.STALL
        or any(piece.delay_ms > 0 for piece in plan.pieces)
    )
    if waits:
        # Notice a client that goes away during a delay, as Starlette's streams do.
        async with anyio.create_task_group() as tg:
            tg.start_soon(_listen_for_disconnect, receive, state, tg.cancel_scope)
            abort = await _run_degraded(send, plan, report, state)
            tg.cancel_scope.cancel()
    else:
        abort = await _run_degraded(send, plan, report, state)
    if state.gone:
        report.outcome = Outcome.CLIENT_GONE
        return
    report.outcome = Outcome.COMPLETE
    if abort is not None:
        raise PlanAborted(f"chaosllm: aborting the connection to emulate {abort}")
