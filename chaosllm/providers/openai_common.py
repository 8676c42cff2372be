"""What the OpenAI protocols (Chat Completions, Responses) share: the error
envelope and its types per status, request-validation helpers, and how
tool-call arguments are split into stream deltas."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar, Final

from chaosllm.errors import InvalidRequest
from chaosllm.model import JSON
from chaosllm.providers.errors import Errors
from chaosllm.providers.failures import ErrorKind, Failure
from chaosllm.providers.ratelimits import RateLimitState, openai_duration
from chaosllm.providers.text import estimated_tokens, type_name

__all__ = [
    "CONTENT_FILTER",
    "KIND_TYPES",
    "argument_pieces",
    "expect",
    "expect_object",
    "expect_role",
    "expect_type",
    "expect_typed_fields",
    "missing",
    "openai_envelope",
    "openai_error_type",
    "require_object_with_model",
    "typed_fields",
]

TypedFields = tuple[tuple[str, str, tuple[type, ...]], ...]
"""Optional top-level fields and their types: (key, how a message names it, types)."""

_TYPE_NAMES: Mapping[type, str] = {
    bool: "a boolean",
    int: "an integer",
    str: "a string",
    list: "an array",
    dict: "an object",
}


def typed_fields(**fields: type) -> TypedFields:
    """`TypedFields` from ``key=type`` (in the order given: the first wrong one is named)."""
    return tuple((key, _TYPE_NAMES[type_], (type_,)) for key, type_ in fields.items())


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


CONTENT_FILTER: Final = "content_filter"
"""Why an answer the content filter cut ended: Chat's ``finish_reason``, the Responses
API's ``incomplete_details.reason``."""

CONTEXT_WINDOW: Final = 128_000
"""The context window the ``context_length_exceeded`` message states (gpt-4o's)."""

_FAILURES: Final[Mapping[Failure, tuple[str, str]]] = {
    Failure.CONTEXT_TOO_LONG: ("invalid_request_error", "context_length_exceeded"),
    Failure.QUOTA_EXHAUSTED: ("insufficient_quota", "insufficient_quota"),
    Failure.KEY_REFUSED: ("invalid_request_error", "invalid_api_key"),
    Failure.NO_SUCH_MODEL: ("invalid_request_error", "model_not_found"),
    Failure.OVERLOADED: ("service_unavailable_error", "server_is_overloaded"),
}
"""Each failure class's error ``type`` and ``code``, as OpenAI answers it."""


def openai_error_type(status: int) -> tuple[str, str | None]:
    """The OpenAI error `type` and `code` a real API uses for an HTTP status."""
    if status in _STATUS_ERROR_TYPES:
        return _STATUS_ERROR_TYPES[status]
    return ("server_error", None) if status >= 500 else ("invalid_request_error", None)


def openai_envelope(
    message: str, type_: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class OpenAIErrors(Errors):
    """An OpenAI protocol's errors: its envelope, its failure classes, its rate-limit headers."""

    def _envelope(
        self, status: int, message: str, kind: str | None, code: str | None, param: str | None
    ) -> dict[str, Any]:
        type_, default_code = openai_error_type(status)
        if kind is not None:
            return openai_envelope(message, KIND_TYPES.get(kind) or type_, code, param)
        return openai_envelope(message, type_, code or default_code, param)

    def failure_message(self, failure: Failure, request: JSON) -> str:
        model = self.codec.model_of(request)
        if failure is Failure.CONTEXT_TOO_LONG:
            tokens = CONTEXT_WINDOW + estimated_tokens(request)
            return (
                f"This model's maximum context length is {CONTEXT_WINDOW} tokens. However, "
                f"your messages resulted in {tokens} tokens. Please reduce the length of the "
                f"messages."
            )
        if failure is Failure.QUOTA_EXHAUSTED:
            return (
                "You exceeded your current quota, please check your plan and billing details. "
                "For more information on this error, read the docs: "
                "https://platform.openai.com/docs/guides/error-codes/api-errors."
            )
        if failure is Failure.KEY_REFUSED:
            return (
                "Incorrect API key provided. You can find your API key at "
                "https://platform.openai.com/account/api-keys."
            )
        if failure is Failure.NO_SUCH_MODEL:
            return f"The model `{model}` does not exist or you do not have access to it."
        return "Our servers are currently overloaded. Please try again later."

    def _failure_body(self, failure: Failure, message: str, *, status: int) -> JSON:
        """``{"error": {"message", "type", "param", "code"}}`` with the class's type and code
        (``param`` names the conversation of a request too long)."""
        type_, code = _FAILURES[failure]
        param = self.codec.turn_key if failure is Failure.CONTEXT_TOO_LONG else None
        return openai_envelope(message, type_, code, param)

    request_id_headers: ClassVar[tuple[str, ...]] = ("x-request-id",)
    request_id_form = "openai"

    def throttle_headers(self, reset: float, wall: float) -> tuple[tuple[str, str], ...]:
        """The requests left (none) and when the bucket is full again."""
        return (
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", openai_duration(reset)),
        )

    def rate_limit_headers(self, state: RateLimitState) -> tuple[tuple[str, str], ...]:
        """``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``, resets as OpenAI
        writes durations (``1s``, ``6m0s``)."""
        headers: list[tuple[str, str]] = []
        for name, meter in (("requests", state.requests), ("tokens", state.tokens)):
            if meter is not None:
                headers += [
                    (f"x-ratelimit-limit-{name}", str(meter.limit)),
                    (f"x-ratelimit-remaining-{name}", str(meter.remaining)),
                    (f"x-ratelimit-reset-{name}", openai_duration(meter.reset)),
                ]
        return tuple(headers)


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


def missing(param: str) -> InvalidRequest:
    return InvalidRequest(
        f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def expect_type(value: object, types: tuple[type, ...], where: str, expected: str) -> None:
    """`value` is one of `types` (a bool is no number), or the API's "Invalid type" 400."""
    expect(
        isinstance(value, types) and not (bool not in types and isinstance(value, bool)),
        f"Invalid type for '{where}': expected {expected}, but got {type_name(value)} instead.",
        where,
    )


def expect_object(value: object, where: str) -> dict[str, Any]:
    expect_type(value, (dict,), where, "an object")
    assert isinstance(value, dict)
    return value


def expect_role(item: Mapping[str, Any], roles: frozenset[str], where: str) -> str:
    """The ``role`` of a message at `where`: present, and one of `roles`."""
    role = item.get("role")
    if role is None:
        raise missing(f"{where}.role")
    expect(
        isinstance(role, str) and role in roles,
        f"Invalid value: {json.dumps(role)[:200]}. Supported values are: "
        + ", ".join(f"'{r}'" for r in sorted(roles))
        + ".",
        f"{where}.role",
        "invalid_value",
    )
    return str(role)


def expect_typed_fields(body: Mapping[str, Any], fields: TypedFields) -> None:
    """Each optional field that is set (not null) has its type (a bool is no number)."""
    for key, kind, types in fields:
        value = body.get(key)
        if value is not None:
            expect_type(value, types, key, kind)


def require_object_with_model(body: JSON, required: str) -> dict[str, Any]:
    """The checks every OpenAI endpoint starts with: a JSON object with a string model, and
    the field holding the conversation (`required`)."""
    expect(
        isinstance(body, dict),
        f"The request body must be a JSON object, but got {type_name(body)} instead.",
        "body",
    )
    assert isinstance(body, dict)
    if "model" not in body:
        raise missing("model")
    expect_type(body["model"], (str,), "model", "a string")
    if required not in body:
        raise missing(required)
    return body
