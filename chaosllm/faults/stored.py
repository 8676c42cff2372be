"""The faults of a stored response's operations (poll, resume, cancel: OpenAI Responses'
background mode), as pure plan transforms. They fire on the next operation on a stored
response, so they can be armed after the create; what they do to the response for good
(it failed, it expired, the cancel was ignored) is their catalogue entry's
``stored_effect``, which `chaosllm.core.background` applies to its store."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from chaosllm.model import JSON, Piece, ResponsePlan
from chaosllm.providers.base import ErrorKind, Provider
from chaosllm.providers.openai_stored import CANCEL, RESUME, not_found, too_old_to_stream

if TYPE_CHECKING:
    from chaosllm.faults.spec import FaultSpec
    from chaosllm.faults.transform import FaultContext

__all__ = [
    "any_operation",
    "background_failed",
    "cancel",
    "cancel_ignored",
    "response_expired",
    "resume",
    "resume_refused",
    "stored",
]


def stored(provider: Provider, answer: JSON) -> bool:
    """An answer to an operation on a stored response."""
    return provider.faults.stores_responses


def any_operation(provider: Provider, request: JSON, stream: bool) -> bool:
    """A poll, resume or cancel of a stored response."""
    return provider.faults.stored_operation(request) is not None


def resume(provider: Provider, request: JSON, stream: bool) -> bool:
    return provider.faults.stored_operation(request) == RESUME


def cancel(provider: Provider, request: JSON, stream: bool) -> bool:
    return provider.faults.stored_operation(request) == CANCEL


def _error(ctx: FaultContext, status: int, message: str) -> ResponsePlan:
    return ctx.provider.render_error(status, message, kind=ErrorKind.INVALID_REQUEST)


def background_failed(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    """The response failed (or stopped short) meanwhile: a poll or cancel sees it so, a
    resumed stream ends with its ``response.failed`` (``.incomplete``) event."""
    faults = ctx.provider.faults
    if plan.status != 200:
        return plan  # the operation itself was refused: the client learns nothing new
    failed = faults.stored_failure(ctx.answer, spec.param("status") or "failed")
    if ctx.stream:
        frame = faults.stored_failure_frame(failed, ctx.request)
        return plan.with_(pieces=(Piece(frame),))
    data = json.dumps(failed, ensure_ascii=False).encode("utf-8")
    return plan.with_(pieces=(Piece(data, frame=False),), content_length=None)


def resume_refused(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    return _error(ctx, 400, too_old_to_stream())


def cancel_ignored(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    """The cancel answers ``cancelled`` as usual; the response goes on (the plan is kept,
    the effect is the catalogue entry's)."""
    return plan


def response_expired(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    request = ctx.request if isinstance(ctx.request, dict) else {}
    return _error(ctx, 404, not_found(str(request.get("response_id"))))
