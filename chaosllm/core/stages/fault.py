"""Stage 7: the first armed fault that fires on a request transforms its plan
(`chaosllm.faults`), consumed from the board; the same for a replayed answer and a live
upstream one (`take`, which `chaosllm.core.proxy` uses too). Only when an armed fault
matches the request is the board asked to fire one (`may_fire`), and such an answer is
not kept in the memo."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from chaosllm.core.call import Answer, Request
from chaosllm.core.journal import answer_facts
from chaosllm.core.stages.render import draw_key, render_answer
from chaosllm.faults import FaultContext, FaultSpec, Fired, apply_fault, fault_applies
from chaosllm.model import JSON, ResponsePlan

if TYPE_CHECKING:
    from chaosllm.core.engine import Engine

__all__ = ["fault", "may_fire", "take"]


def may_fire(engine: Engine, request: Request, answer: Answer) -> bool:
    """Whether an armed fault matches the request (before its draw)."""
    board = engine.board
    if not len(board) or not board.may_fire(request.info(answer.answer)):
        return False
    request.keep = False
    return True


def fault(engine: Engine, request: Request, answer: Answer) -> None:
    """`answer` as the fault that fires on it makes it, if one does."""
    plan = answer.plan
    given = plan if answer.pieces is None else plan.with_(pieces=answer.pieces)
    faulted, fired = take(engine, request, given, answer.answer)
    if fired is not None:
        answer.plan, answer.pieces, answer.fired = faulted, None, fired
        answer.unfaulted = given


def take(
    engine: Engine,
    request: Request,
    plan: ResponsePlan,
    answer: JSON,
    only: Callable[[FaultSpec], bool] | None = None,
    *,
    waits: Callable[[FaultSpec], None] | None = None,
) -> tuple[ResponsePlan, Fired | None]:
    """The plan after the fault that fires on this request (if any), consumed from the
    board. `only`: which of the armed faults may (asked in FIFO order, before each one's
    draw). `waits`: the answer is not known yet (a proxied request before it is
    forwarded); told of a fault that may match the answer (`FaultBoard.take`)."""
    provider, body, stream = request.call.provider, request.body, request.stream
    ctx = FaultContext(
        provider=provider,
        stream=stream,
        answer=answer,
        render=lambda new_answer: render_answer(engine, request, new_answer),
        request=body,
        draw_key=draw_key(engine, request),
        wall=engine.clock.wall(),
    )

    def applies(spec: FaultSpec) -> bool:
        return (only is None or only(spec)) and fault_applies(
            spec, provider, answer, request=body, stream=stream
        )

    info = request.info(answer, answer_known=waits is None)
    fired = engine.board.take(info, applies, waits=waits)
    if fired is None:
        return plan, None
    faulted = apply_fault(fired.spec, plan, ctx)
    assert faulted is not None
    request.fields["fault"] = {
        **fired.spec.to_json(),
        "id": fired.fault_id,
        "params": fired.spec.effective_params(),
    }
    request.fields.update(answer_facts(faulted, request.stream))
    return faulted, fired
