"""Session faults (WebSocket): each a pure transformation of one turn's steps.

A turn's answer is a tuple of `Step`: the server events the replay sends, each at its
time after the turn ended, and how the session ends if it does. A fault with
``after_events: K`` keeps the turn's first K server events and breaks the rest (0:
before the first): a close frame (`ws_close`), the TCP connection ended with no close
frame (`ws_drop`), an ``error`` event (`session_error`), the protocol's expiry
(`session_expired`) or going-away (`go_away`) then a close, silence with pings
unanswered (`session_stall`), rate limits at zero then an error
(`rate_limits_exhausted`), a text frame that is not JSON inserted (`malformed_event`),
tool-call argument deltas cut to invalid JSON (`malformed_tool_args`). The protocol
(`chaosllm.providers.live.SessionProtocol`) words the events; a fault whose protocol has
no such event (``go_away`` on OpenAI Realtime) does not apply and is not consumed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

from chaosllm.model import JSON, ResponsePlan
from chaosllm.providers.base import Provider
from chaosllm.providers.live import SessionProtocol

if TYPE_CHECKING:
    from chaosllm.faults.spec import FaultSpec
    from chaosllm.faults.transform import FaultContext

__all__ = [
    "CLOSE",
    "DROP",
    "ERROR_TYPES",
    "EVENT",
    "RELAY",
    "STALL",
    "TEXT",
    "SessionTransform",
    "Step",
    "not_http",
    "unchanged",
]

EVENT: Final = "event"
TEXT: Final = "text"
CLOSE: Final = "close"
DROP: Final = "drop"
STALL: Final = "stall"
RELAY: Final = "relay"
"""Not a fault's: the turn has no recording and is relayed to the upstream from here on
(record-missing)."""


@dataclass(frozen=True, slots=True)
class Step:
    kind: str
    """`EVENT` (a JSON event), `TEXT` (a raw text frame), `CLOSE`, `DROP`, `STALL`,
    `RELAY`."""
    at_s: float = 0.0
    """Seconds after the turn ended (the replay's timing applied)."""
    event: dict[str, Any] | None = None
    text: str = ""
    code: int = 1000
    reason: str = ""
    max_s: float = 0.0
    """A stall's bound: the connection is dropped after it."""


SessionTransform = Callable[
    [tuple[Step, ...], "FaultSpec", SessionProtocol], "tuple[Step, ...] | None"
]
"""A turn's steps after the fault; None: the fault does not apply (not consumed)."""


def not_http(provider: Provider, body: JSON, stream: bool) -> bool:
    """A session fault never fires on an HTTP request."""
    return False


def unchanged(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    return plan


def _split(steps: tuple[Step, ...], spec: FaultSpec) -> tuple[tuple[Step, ...], float]:
    k = int(spec.param("after_events"))
    events = [i for i, s in enumerate(steps) if s.kind in (EVENT, TEXT)]
    cut = events[k] if k < len(events) else len(steps)
    kept = steps[:cut]
    at = steps[cut].at_s if cut < len(steps) else (kept[-1].at_s if kept else 0.0)
    return kept, at


def _event(at: float, event: dict[str, Any] | None) -> tuple[Step, ...]:
    return () if event is None else (Step(EVENT, at, event),)


def ws_close(steps: tuple[Step, ...], spec: FaultSpec, p: SessionProtocol) -> tuple[Step, ...]:
    kept, at = _split(steps, spec)
    reason = spec.param("reason")
    return (
        *kept,
        Step(
            CLOSE,
            at,
            code=int(spec.param("code")),
            reason="internal error" if reason is None else str(reason),
        ),
    )


def ws_drop(steps: tuple[Step, ...], spec: FaultSpec, p: SessionProtocol) -> tuple[Step, ...]:
    kept, at = _split(steps, spec)
    return (*kept, Step(DROP, at))


def session_error(
    steps: tuple[Step, ...], spec: FaultSpec, p: SessionProtocol
) -> tuple[Step, ...] | None:
    if p.miss_closes:
        return None  # no error event in the protocol
    kept, at = _split(steps, spec)
    error_type = str(spec.param("error_type") or "server_error")
    message = spec.param("message") or _MESSAGES.get(error_type, _MESSAGES["server_error"])
    code = None if error_type == "server_error" else error_type
    return (*kept, Step(EVENT, at, p.error_event(error_type, message, code)))


def session_expired(
    steps: tuple[Step, ...], spec: FaultSpec, p: SessionProtocol
) -> tuple[Step, ...] | None:
    event = p.expired_event()
    if event is None:
        return None
    kept, at = _split(steps, spec)
    return (*kept, Step(EVENT, at, event), Step(CLOSE, at, code=1001, reason="session expired"))


def go_away(
    steps: tuple[Step, ...], spec: FaultSpec, p: SessionProtocol
) -> tuple[Step, ...] | None:
    left_ms = int(spec.param("time_left_ms"))
    event = p.going_away_event(left_ms)
    if event is None:
        return None
    kept, at = _split(steps, spec)
    end = at + left_ms / 1000.0
    rest = tuple(s for s in steps[len(kept) :] if s.at_s < end)  # served until it ends
    return (
        *kept,
        Step(EVENT, at, event),
        *rest,
        Step(CLOSE, end, code=1001, reason="going away"),
    )


def session_stall(steps: tuple[Step, ...], spec: FaultSpec, p: SessionProtocol) -> tuple[Step, ...]:
    kept, at = _split(steps, spec)
    return (*kept, Step(STALL, at, max_s=float(spec.param("max_ms")) / 1000.0))


def rate_limits_exhausted(
    steps: tuple[Step, ...], spec: FaultSpec, p: SessionProtocol
) -> tuple[Step, ...] | None:
    event = p.rate_limits_event(0)
    if event is None:
        return None
    kept, at = _split(steps, spec)
    error = p.error_event(
        "rate_limit_exceeded", _MESSAGES["rate_limit_exceeded"], "rate_limit_exceeded"
    )
    return (*kept, Step(EVENT, at, event), Step(EVENT, at, error))


def malformed_event(
    steps: tuple[Step, ...], spec: FaultSpec, p: SessionProtocol
) -> tuple[Step, ...]:
    kept, at = _split(steps, spec)
    text = spec.param("text")
    if text is None:
        text = '{"type": "response.output_text.delta", "delta": '
    text = str(text)
    return (*kept, Step(TEXT, at, text=text), *steps[len(kept) :])


def malformed_tool_args(
    steps: tuple[Step, ...], spec: FaultSpec, p: SessionProtocol
) -> tuple[Step, ...] | None:
    """The argument deltas of the turn's tool call cut to half of their JSON (and the
    ``done`` event's arguments the same), so that they never parse."""
    deltas = [
        i
        for i, s in enumerate(steps)
        if s.event is not None and p.argument_delta(s.event) is not None
    ]
    if not deltas:
        return None
    whole = "".join(
        p.argument_delta(steps[i].event) or ""  # type: ignore[arg-type]
        for i in deltas
        if str((steps[i].event or {}).get("type", "")).endswith("delta")
    )
    cut = whole[: max(1, len(whole) // 2)]
    out = list(steps)
    sent = 0
    for i in deltas:
        event = steps[i].event
        assert event is not None
        if not str(event.get("type", "")).endswith("delta"):
            out[i] = replace(steps[i], event=p.with_arguments(event, cut))
            continue
        delta = p.argument_delta(event) or ""
        piece = cut[sent : sent + len(delta)]
        sent += len(delta)
        out[i] = replace(steps[i], event=p.with_arguments(event, piece))
    return tuple(out)


_MESSAGES = {
    "server_error": "The server had an error while processing your request. Sorry about that!",
    "rate_limit_exceeded": "Rate limit reached for requests. Please try again later.",
    "invalid_request_error": "The request was invalid for the session's state.",
}
ERROR_TYPES: Final = tuple(_MESSAGES)
