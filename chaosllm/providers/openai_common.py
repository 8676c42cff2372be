"""What the OpenAI protocols (Chat Completions, Responses) share: the error
envelope and its types per status, request-validation helpers, and how text
and tool-call arguments are split into stream deltas."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from chaosllm.errors import InvalidRequest
from chaosllm.model import JSON
from chaosllm.providers.base import ErrorKind

__all__ = [
    "KIND_TYPES",
    "argument_pieces",
    "cut_json",
    "error_body",
    "error_type_for_status",
    "expect",
    "require_object_with_model",
    "text_pieces",
    "type_name",
]

_STATUS_ERROR_TYPES: Mapping[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("permission_error", None),
    404: ("invalid_request_error", "not_found"),
    408: ("timeout", None),
    409: ("invalid_request_error", "conflict"),
    413: ("invalid_request_error", "request_too_large"),
    422: ("invalid_request_error", None),
    429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", None),
    502: ("server_error", "bad_gateway"),
    503: ("server_error", "service_unavailable"),
    504: ("timeout", "gateway_timeout"),
    529: ("server_error", "overloaded"),
}

KIND_TYPES = {
    ErrorKind.INVALID_REQUEST: "invalid_request_error",
    ErrorKind.NOT_FOUND: "invalid_request_error",
    ErrorKind.NO_MATCH: "invalid_request_error",
    ErrorKind.SERVER_ERROR: "server_error",
}

# A piece of streamed text: a word with the whitespace before it (how tokens look).
_TEXT_PIECE = re.compile(r"\s*\S+|\s+")


def error_type_for_status(status: int) -> tuple[str, str | None]:
    """The OpenAI error `type` and `code` a real API uses for an HTTP status."""
    if status in _STATUS_ERROR_TYPES:
        return _STATUS_ERROR_TYPES[status]
    return ("server_error", None) if status >= 500 else ("invalid_request_error", None)


def error_body(
    message: str, type_: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def text_pieces(text: str) -> list[str]:
    return _TEXT_PIECE.findall(text) or [text]


def argument_pieces(arguments: str) -> list[str]:
    """Tool-call arguments split as the API streams them: a few characters at a time."""
    if not arguments:
        return []
    pieces: list[str] = []
    start = 0
    # Break after structural characters, like the tokenizer does, in pieces of <= 12 chars.
    for i, ch in enumerate(arguments):
        if (ch in ',:{}[]"' and i + 1 - start >= 3) or i + 1 - start >= 12:
            pieces.append(arguments[start : i + 1])
            start = i + 1
    if start < len(arguments):
        pieces.append(arguments[start:])
    return pieces


def expect(cond: bool, message: str, param: str, code: str = "invalid_type") -> None:
    if not cond:
        raise InvalidRequest(message, param=param, code=code)


def type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def cut_json(text: str) -> str:
    """A prefix of `text` that is not valid JSON (what a cut-off generation looks like)."""
    cut = text[: max(1, len(text) // 2)] if text else "{"
    try:
        json.loads(cut)
    except json.JSONDecodeError:
        return cut
    return cut + '{"'


def require_object_with_model(body: JSON) -> dict[str, Any]:
    """The checks every OpenAI endpoint starts with: a JSON object with a string model."""
    expect(
        isinstance(body, dict),
        f"The request body must be a JSON object, but got {type_name(body)} instead.",
        "body",
    )
    assert isinstance(body, dict)
    if "model" not in body:
        raise InvalidRequest(
            "Missing required parameter: 'model'.", param="model", code="missing_required_parameter"
        )
    expect(
        isinstance(body["model"], str),
        f"Invalid type for 'model': expected a string, but got {type_name(body['model'])} instead.",
        "model",
    )
    return body
