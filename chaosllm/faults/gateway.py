"""The OpenAI-compatible gateways' own failures (`chaosllm.providers.gateways`) as pure
plan transforms of a Chat Completions answer: OpenRouter's 402 and its mid-stream error
chunk, vLLM's mid-stream ``{"object": "error"}``, DeepSeek's leading
``reasoning_content`` deltas, Groq's 400 naming a parameter the request carries."""

from __future__ import annotations

import copy
import json
from typing import TYPE_CHECKING, Any

from chaosllm.model import JSON, Framing, Piece, ResponsePlan
from chaosllm.providers.base import Provider, text_pieces
from chaosllm.providers.gateways import GATEWAYS, dumps, refused_param

if TYPE_CHECKING:
    from chaosllm.faults.spec import FaultSpec
    from chaosllm.faults.transform import FaultContext

__all__ = [
    "carries_unsupported",
    "chat_answer",
    "chat_any",
    "chat_request",
    "openrouter_credits",
    "openrouter_midstream_error",
    "reasoning_preamble",
    "unsupported",
    "vllm_stream_error",
]

CREDITS = (
    "This request requires more credits, or fewer max_tokens. You requested up to {tokens} "
    "tokens, but can only afford 0. To increase, visit https://openrouter.ai/settings/credits "
    "and add more credits"
)
"""OpenRouter's 402 as users capture it (the affordability check before the call)."""
MIDSTREAM = "Provider disconnected unexpectedly"
REASONING = "Let me think about this first."


def chat_answer(provider: Provider, answer: JSON) -> bool:
    """A Chat Completions answer (what the gateways speak)."""
    return provider.faults.gateway_compatible and isinstance(answer, dict)


def chat_any(provider: Provider, answer: JSON) -> bool:
    """Any answer of the protocol the gateways speak."""
    return provider.faults.gateway_compatible


def chat_request(provider: Provider, request: JSON, stream: bool) -> bool:
    """A Chat Completions request (drawn by the strategies only when named)."""
    return provider.faults.gateway_compatible


def carries_unsupported(provider: Provider, request: JSON, stream: bool) -> bool:
    return provider.faults.gateway_compatible and refused_param(request) is not None


def _json(status: int, body: Any, plan: ResponsePlan) -> ResponsePlan:
    data = json.dumps(body, ensure_ascii=False).encode("utf-8")
    return ResponsePlan(
        status=status,
        headers=(("content-type", "application/json"),),
        pieces=(Piece(data, frame=False),),
        head_delay_ms=plan.head_delay_ms,
    )


def _chunk(piece: Piece) -> dict[str, Any]:
    text = piece.data.decode("utf-8", "replace")
    for line in text.splitlines():
        if line.startswith("data:"):
            try:
                value = json.loads(line[5:].strip())
            except ValueError:
                return {}
            return value if isinstance(value, dict) else {}
    return {}


def _frame(value: Any) -> Piece:
    return Piece(f"data: {dumps(value)}\n\n".encode())


def _streaming(plan: ResponsePlan, ctx: FaultContext) -> bool:
    return ctx.stream and plan.framing is Framing.CHUNKED


def _cut(plan: ResponsePlan, ctx: FaultContext, after: int) -> tuple[Piece, ...]:
    return plan.pieces[: min(after, ctx.provider.faults.answer_frame_count(plan))]


def openrouter_credits(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    request = ctx.request if isinstance(ctx.request, dict) else {}
    tokens = request.get("max_tokens") or request.get("max_completion_tokens") or 4096
    message = spec.param("message") or CREDITS.format(tokens=tokens)
    return _json(402, GATEWAYS["openrouter"].error(402, message), plan)


def _midstream(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext, name: str) -> ResponsePlan:
    gateway = GATEWAYS[name]
    assert gateway.stream_error is not None
    message = spec.param("message") or MIDSTREAM
    if not _streaming(plan, ctx):
        if name == "openrouter":  # an upstream's failure, in a 200 (its errors page)
            return _json(200, gateway.error(502, message), plan)
        return _json(400, gateway.error(400, message), plan)  # the stream's object, as a 400
    kept = _cut(plan, ctx, spec.param("after_chunks"))
    chunk = _chunk(plan.pieces[0]) if plan.pieces else {}
    pieces = (*kept, _frame(gateway.stream_error(message, chunk)))
    if gateway.done_after_error:
        pieces += (Piece(b"data: [DONE]\n\n"),)
    return plan.with_(status=200, pieces=pieces)


def openrouter_midstream_error(
    plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext
) -> ResponsePlan:
    return _midstream(plan, spec, ctx, "openrouter")


def vllm_stream_error(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    return _midstream(plan, spec, ctx, "vllm")


def reasoning_preamble(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    """DeepSeek's reasoning first: ``reasoning_content`` deltas (``content: null``) after
    the role chunk, before any content; a JSON answer's message carries it whole."""
    reasoning = spec.param("reasoning") or REASONING
    if not _streaming(plan, ctx):
        answer = copy.deepcopy(ctx.answer)
        for choice in answer.get("choices") or []:
            if isinstance(choice, dict) and isinstance(choice.get("message"), dict):
                choice["message"]["reasoning_content"] = reasoning
        data = json.dumps(answer, ensure_ascii=False).encode("utf-8")
        return plan.with_(pieces=(Piece(data, frame=False),), content_length=None)
    if not plan.pieces:
        return plan
    head = _chunk(plan.pieces[0])
    frames = []
    for piece in text_pieces(reasoning):
        chunk = {k: v for k, v in head.items() if k not in ("choices", "usage")}
        delta = {"content": None, "reasoning_content": piece}
        chunk["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]
        frames.append(_frame(chunk))
    return plan.with_(pieces=(plan.pieces[0], *frames, *plan.pieces[1:]))


def unsupported(plan: ResponsePlan, spec: FaultSpec, ctx: FaultContext) -> ResponsePlan:
    message = refused_param(ctx.request) or "property is unsupported"
    return _json(400, GATEWAYS["groq"].error(400, message), plan)
