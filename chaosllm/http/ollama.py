"""Ollama's auxiliary endpoints: the model list, the version, model details and embeddings,
in Ollama's own shapes and ``{"error": ...}`` envelope (`chaosllm.providers.ollama`).

``/api/chat`` and ``/api/generate`` are provider routes (the engine answers them);
these answer from the recordings alone: ``GET /api/tags`` lists the models of the
Ollama recordings, ``POST /api/show`` knows those, ``POST /api/embed`` (and the
legacy ``/api/embeddings``) answer deterministic vectors.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from chaosllm.errors import InvalidRequest
from chaosllm.http.web import chaos_state, json_body
from chaosllm.providers import ollama

__all__ = ["ollama_routes"]


def _models(request: Request) -> list[str]:
    """The models the Ollama recordings ask for."""
    found = {
        exchange.request.body.get("model")
        for exchange in chaos_state(request).store.exchanges
        if exchange.provider.startswith("ollama.")
    }
    return sorted(m for m in found if isinstance(m, str))


def _answer(
    compute: Callable[[Any, Request], dict[str, Any]],
) -> Callable[[Request], Awaitable[Response]]:
    """An endpoint answering `compute(body, request)`, or its refusal in Ollama's envelope
    (404 for an unknown model, else 400)."""

    async def endpoint(request: Request) -> Response:
        try:
            return JSONResponse(compute(await json_body(request), request))
        except InvalidRequest as exc:
            status = 404 if exc.code == "not_found" else 400
            return JSONResponse(ollama.error_envelope(exc.message), status_code=status)

    return endpoint


async def tags(request: Request) -> Response:
    return JSONResponse(ollama.tags_body(_models(request)))


async def version(request: Request) -> Response:
    return JSONResponse(ollama.version_body())


show = _answer(lambda body, request: ollama.show_body(body, _models(request)))
embed = _answer(lambda body, request: ollama.embed_body(body))
embeddings = _answer(lambda body, request: ollama.embeddings_body(body))


def ollama_routes() -> list[Route]:
    """The routes of Ollama's auxiliary endpoints."""
    return [
        Route(ollama.TAGS_PATH, tags, methods=["GET"]),
        Route(ollama.VERSION_PATH, version, methods=["GET"]),
        Route(ollama.SHOW_PATH, show, methods=["POST"]),
        Route(ollama.EMBED_PATH, embed, methods=["POST"]),
        Route(ollama.EMBEDDINGS_PATH, embeddings, methods=["POST"]),
    ]
