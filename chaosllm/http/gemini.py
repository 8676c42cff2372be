"""Gemini's other model methods: ``:countTokens``, ``:embedContent``, ``:batchEmbedContents``
(and Vertex AI's ``:predict`` for embedding models), on every model path the Gemini
provider serves, and ``GET /v1beta/models`` (the model list of a client on ``v1beta``;
``/v1/models`` answers in Gemini's shape when ``google-genai`` asks). Answers are
computed, never recorded (as ``/v1/embeddings`` is): deterministic vectors, about four
characters a token; a bad body is Gemini's own 400 envelope."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from chaosllm.errors import InvalidRequest
from chaosllm.http.web import chaos_state, json_body
from chaosllm.providers import PROVIDERS
from chaosllm.providers.base import ErrorKind
from chaosllm.providers.gemini import (
    batch_embed_answer,
    count_tokens_answer,
    embed_answer,
    model_prefixes,
    predict_answer,
)

__all__ = ["gemini_routes"]

_PROVIDER = "gemini.generate_content"


def _vertex(path: str) -> bool:
    return "/publishers/" in path


_ANSWERS: dict[str, Callable[[Any, str, str], dict[str, Any]]] = {
    "countTokens": lambda body, model, path: count_tokens_answer(body, vertex=_vertex(path)),
    "embedContent": lambda body, model, path: embed_answer(body, model),
    "batchEmbedContents": lambda body, model, path: batch_embed_answer(body, model),
    "predict": lambda body, model, path: predict_answer(body, model),
}


def _endpoint(method: str) -> Callable[[Request], Any]:
    answer = _ANSWERS[method]

    async def endpoint(request: Request) -> Response:
        model = str(request.path_params["model"]).removeprefix("models/")
        try:
            return JSONResponse(answer(await json_body(request), model, request.url.path))
        except InvalidRequest as exc:
            body = PROVIDERS[_PROVIDER].error_body(
                400, exc.message, kind=ErrorKind.INVALID_REQUEST, code=exc.code, param=exc.param
            )
            return JSONResponse(body, status_code=400)

    endpoint.__name__ = f"gemini_{method}"
    return endpoint


async def models_v1beta(request: Request) -> Response:
    """The models of the recordings, in Gemini's list shape."""
    provider = PROVIDERS[_PROVIDER]
    return JSONResponse(provider.codec.models_body(chaos_state(request).store.models()))


def gemini_routes() -> list[Route]:
    """The routes (for `chaosllm.http.app.create_app`)."""
    posts = [
        Route(f"{prefix}/{{model}}:{method}", _endpoint(method), methods=["POST"])
        for prefix in model_prefixes()
        for method in _ANSWERS
        if method != "predict" or "/publishers/" in prefix
    ]
    return [*posts, Route("/v1beta/models", models_v1beta, methods=["GET"])]
