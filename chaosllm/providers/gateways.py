"""The OpenAI-compatible gateways (``--gateway``): how each answers and fails where it
is not OpenAI, as data. Pure.

Each `Gateway` says what it adds to a Chat Completions answer, its error envelope, its
mid-stream error frame and the request parameters it refuses, with the source each shape
is taken from; `GATEWAYS` is the registry (`chaosllm.core.compat.gateway` applies a
profile, `chaosllm.faults.gateway` injects its failures). Sources:

- OpenRouter: https://openrouter.ai/docs/api/reference/errors-and-debugging (error
  shape ``{"error": {"code": <number>, "message", "metadata"}}``, status = code; 402 when
  credits run out; errors after the stream started are a 200 ``data:`` chunk with an
  ``error`` member and ``finish_reason: "error"``); ``provider`` and ``usage.cost`` on
  every answer (https://openrouter.ai/docs/api/reference/overview, usage accounting).
- vLLM: ``OpenAIServing.create_streaming_error_response`` in
  ``vllm/entrypoints/openai/serving_engine.py`` (``ErrorResponse``: ``{"object":
  "error", "message", "type": "BadRequestError", "param": null, "code": 400}``, written
  as a ``data:`` line, then ``data: [DONE]``).
- DeepSeek: https://api-docs.deepseek.com/guides/reasoning_model (``deepseek-reasoner``
  streams ``delta.reasoning_content`` before ``delta.content``; the message carries
  ``reasoning_content``); clients that read only ``content`` break (CopilotKit #4581).
- Groq: https://console.groq.com/docs/openai ("logprobs, logit_bias, top_logprobs,
  messages[].name ... not supported ... will result in a 400 error"; ``n`` must be 1);
  the messages as captured in users' threads (fanenr/chatbot #21: "property 'store' is
  unsupported, did you mean 'stop'?"; run-llama/llama_index #14701 and
  ServiceStack/llms #17: "'messages.0' : for 'role:user' the following must be
  satisfied[('messages.0' : property 'name' is unsupported)]"), type
  ``invalid_request_error``, no ``code`` or ``param``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from chaosllm.model import JSON

__all__ = ["GATEWAYS", "GATEWAY_NAMES", "Gateway", "refused_param"]


def _openrouter_error(status: int, message: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "metadata": {}}}


def _openrouter_stream_error(message: str, chunk: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": chunk.get("id"),
        "object": "chat.completion.chunk",
        "created": chunk.get("created"),
        "model": chunk.get("model"),
        "provider": "OpenAI",
        "error": {"code": "server_error", "message": message},
        "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}],
    }


def _openrouter_answer(answer: dict[str, Any]) -> dict[str, Any]:
    answer = {**answer, "provider": "OpenAI"}
    usage = answer.get("usage")
    if isinstance(usage, dict):
        tokens = usage.get("total_tokens")
        cost = round((tokens if isinstance(tokens, int) else 0) * 2e-7, 8)
        answer["usage"] = {**usage, "cost": cost, "is_byok": False}
    return answer


def _vllm_error(status: int, message: str) -> dict[str, Any]:
    kind = "BadRequestError" if status < 500 else "InternalServerError"
    return {"object": "error", "message": message, "type": kind, "param": None, "code": status}


def _vllm_stream_error(message: str, chunk: Mapping[str, Any]) -> dict[str, Any]:
    return _vllm_error(400, message)


def _openai_error(status: int, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None}}


def _groq_error(status: int, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error"}}


def _same(answer: dict[str, Any]) -> dict[str, Any]:
    return answer


@dataclass(frozen=True, slots=True)
class Gateway:
    name: str
    error: Callable[[int, str], dict[str, Any]]
    """Its error envelope for a status and a message."""
    stream_error: Callable[[str, Mapping[str, Any]], dict[str, Any]] | None = None
    """Its error after the stream started, given a chunk of the stream (id, model)."""
    answer: Callable[[dict[str, Any]], dict[str, Any]] = _same
    """A Chat Completions answer (or chunk) as it sends it: its extra members."""
    refuses: tuple[str, ...] = ()
    """Request parameters it answers 400 to (``messages[].name``: any message's)."""
    done_after_error: bool = False
    """Whether ``data: [DONE]`` follows its mid-stream error."""
    sources: tuple[str, ...] = field(default=())


GATEWAYS: Mapping[str, Gateway] = {
    gateway.name: gateway
    for gateway in (
        Gateway(
            "openrouter",
            _openrouter_error,
            _openrouter_stream_error,
            _openrouter_answer,
            sources=("https://openrouter.ai/docs/api/reference/errors-and-debugging",),
        ),
        Gateway(
            "vllm",
            _vllm_error,
            _vllm_stream_error,
            done_after_error=True,
            sources=("vllm/entrypoints/openai/serving_engine.py",),
        ),
        Gateway(
            "deepseek",
            _openai_error,
            sources=("https://api-docs.deepseek.com/guides/reasoning_model",),
        ),
        Gateway(
            "groq",
            _groq_error,
            refuses=("logprobs", "top_logprobs", "logit_bias", "messages[].name", "n"),
            sources=("https://console.groq.com/docs/openai",),
        ),
    )
}
GATEWAY_NAMES: Final = tuple(GATEWAYS)


def refused_param(body: JSON, refuses: tuple[str, ...] = GATEWAYS["groq"].refuses) -> str | None:
    """Groq's 400 message for the first refused parameter the request carries (None: it
    carries none)."""
    if not isinstance(body, dict):
        return None
    for name in refuses:
        if name == "messages[].name":
            for i, message in enumerate(body.get("messages") or []):
                if isinstance(message, dict) and "name" in message:
                    role = message.get("role")
                    return (
                        f"'messages.{i}' : for 'role:{role}' the following must be satisfied"
                        f"[('messages.{i}' : property 'name' is unsupported)]"
                    )
        elif name == "n":
            if body.get("n") not in (None, 1):
                return "'n' : number must be at most 1"
        elif body.get(name) not in (None, False):
            return f"property '{name}' is unsupported"
    return None


def dumps(value: JSON) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
