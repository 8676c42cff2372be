"""Small helpers shared by the provider routes and the control plane."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from chaosllm.errors import InvalidRequest
from chaosllm.http.state import ChaosState
from chaosllm.providers.openai_chat import error_body

__all__ = ["BAD_JSON", "SESSION_HEADER", "chaos_state", "json_body", "openai_error"]

SESSION_HEADER = "x-chaosllm-session"

BAD_JSON = (
    "We could not parse the JSON body of your request. (HINT: This likely means you "
    "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, "
    "but what was sent was not valid JSON.)"
)


def openai_error(
    status: int,
    message: str,
    type_: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(message, type_, code, param), status_code=status)


async def json_body(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise InvalidRequest(BAD_JSON, code="invalid_json") from None


def chaos_state(request: Request) -> ChaosState:
    state: ChaosState = request.app.state.chaos
    return state
