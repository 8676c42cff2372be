"""``--gateway``: a Chat Completions answer as an OpenAI-compatible gateway sends it
(`chaosllm.providers.gateways`), registered at the ``plan`` hook, and the parameters
it refuses refused at the ``on_miss`` hook too: a gateway refuses them whether or not a
recording would have answered.

The gateway's extra members on every answer and stream chunk (OpenRouter's ``provider``
and ``usage.cost``), every error in its envelope (OpenRouter's numeric ``code``, vLLM's
``{"object": "error"}``, Groq's ``message`` and ``type`` alone), and the parameters it
refuses answered with its 400 (Groq: ``logprobs``, ``messages[].name``...). The plan
depends on the request and the configuration alone: the memo keeps it as it is.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from chaosllm.core.call import Decision, Request
from chaosllm.core.hooks import Hooks
from chaosllm.core.stages import finish
from chaosllm.model import Framing, Piece, ResponsePlan
from chaosllm.providers.gateways import GATEWAYS, Gateway, dumps, refused_param

if TYPE_CHECKING:
    from chaosllm.core.engine import Engine

__all__ = ["HOOKS"]


def _json(status: int, body: Any, plan: ResponsePlan) -> ResponsePlan:
    data = json.dumps(body, ensure_ascii=False).encode("utf-8")
    return plan.with_(status=status, pieces=(Piece(data, frame=False),), content_length=None)


def _chunk(gateway: Gateway, piece: Piece) -> Piece:
    text = piece.data.decode("utf-8", "replace")
    if not piece.frame or not text.startswith("data: {"):
        return piece
    try:
        chunk = json.loads(text[6:])
    except ValueError:
        return piece
    if not isinstance(chunk, dict) or chunk.get("object") != "chat.completion.chunk":
        return piece
    return Piece(f"data: {dumps(gateway.answer(chunk))}\n\n".encode(), piece.delay_ms)


def _gateway(engine: Engine, request: Request) -> Gateway | None:
    name = engine.config.gateway
    if name is None or not request.call.provider.faults.gateway_compatible:
        return None
    return GATEWAYS[name]


def _refused(gateway: Gateway, request: Request) -> str | None:
    return refused_param(request.body, gateway.refuses) if gateway.refuses else None


def refused_on_miss(engine: Engine, request: Request) -> Decision | None:
    """The gateway's 400 for a refused parameter of a request no recording answers."""
    gateway = _gateway(engine, request)
    refused = None if gateway is None else _refused(gateway, request)
    if gateway is None or refused is None:
        return None
    plan = ResponsePlan(400, (("content-type", "application/json"),), ())
    return finish.refused(
        engine, request.call, _json(400, gateway.error(400, refused), plan), refused
    )


def shaped(engine: Engine, request: Request, plan: ResponsePlan) -> ResponsePlan:
    gateway = _gateway(engine, request)
    if gateway is None:
        return plan
    refused = _refused(gateway, request)
    if refused is not None:
        return _json(400, gateway.error(400, refused), plan)
    if not plan.send_head or not plan.pieces:
        return plan
    if plan.framing is Framing.CHUNKED:
        if plan.status != 200:
            return plan
        return plan.with_(pieces=tuple(_chunk(gateway, p) for p in plan.pieces))
    try:
        body = json.loads(plan.body())
    except ValueError:
        return plan
    if not isinstance(body, dict):
        return plan
    error = body.get("error")
    if plan.status >= 400 and isinstance(error, dict) and isinstance(error.get("message"), str):
        return _json(plan.status, gateway.error(plan.status, error["message"]), plan)
    if plan.status == 200 and body.get("object") == "chat.completion":
        return _json(200, gateway.answer(body), plan)
    return plan


HOOKS = Hooks(on_miss=(refused_on_miss,), plan=(shaped,))
