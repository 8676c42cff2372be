"""Small helpers shared by the provider routes and the control plane."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from chaosllm.core.engine import BAD_JSON, parse_json
from chaosllm.http.state import ChaosState
from chaosllm.providers import DEFAULT_PROVIDER, provider_for_path
from chaosllm.providers.base import ErrorKind
from chaosllm.providers.openai_common import openai_envelope

__all__ = [
    "BAD_JSON",
    "SESSION_HEADER",
    "chaos_state",
    "error_response",
    "json_body",
    "mock_llm_headers",
    "openai_error",
]

SESSION_HEADER = "x-chaosllm-session"


def mock_llm_headers(items: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The request headers the engine reads (DocsGPT's mock LLM's ``X-Mock-LLM-*``
    delays), names in lower case; the others are not passed on."""
    return tuple(
        (name.lower(), value) for name, value in items if name.lower().startswith("x-mock-llm-")
    )


def openai_error(
    status: int,
    message: str,
    type_: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
) -> JSONResponse:
    """An error in OpenAI's envelope (the control plane's, whatever the client)."""
    return JSONResponse(openai_envelope(message, type_, code, param), status_code=status)


def error_response(
    path: str,
    status: int,
    message: str,
    *,
    kind: str = ErrorKind.INVALID_REQUEST,
    code: str | None = None,
    param: str | None = None,
) -> JSONResponse:
    """An error chaosllm answers on `path`, in the envelope of the protocol served there
    (OpenAI's on any other path): a 404/405 on a provider path, say."""
    provider = provider_for_path(path) or DEFAULT_PROVIDER
    body = provider.error_body(status, message, kind=kind, code=code, param=param)
    return JSONResponse(body, status_code=status)


async def json_body(request: Request) -> Any:
    """The JSON of a control or embeddings body, read as strictly as a provider body
    (`parse_json`): `InvalidRequest` saying what is wrong, before anything is changed."""
    return parse_json(await request.body())


def chaos_state(request: Request) -> ChaosState:
    state: ChaosState = request.app.state.chaos
    return state
