"""OpenAI Responses' operations on a stored response: ``GET /v1/responses/{id}`` (poll;
``?stream=true&starting_after=N``: resume its events) and ``POST /v1/responses/{id}/cancel``.

Theory of operation
-------------------
These requests carry no body: the path and the query say everything. `bind` folds them
into one (``{"response_id", "operation", "stream", "starting_after"}``), so that the
engine keys, matches, journals and faults them as any other request (a recorded poll
from a real upstream replays by its digest). What a stored response answers -- its
status as the engine's clock advances, its events after a cursor -- is worked out by
`chaosllm.core.background`, which keeps the responses; this module holds the protocol:
the operation's request, its errors as the API words them, and the events of a response
that fails while a client waits on it (`OpenAIStoredFaults`).

The errors, as the API answers them (the openai SDK raises `NotFoundError` and
`BadRequestError`):

- an unknown (or expired) id: 404 ``invalid_request_error``, "Response with id '...' not
  found." (the wording of the API's ``previous_response_not_found``, param and code
  ``null`` as a retrieve answers it);
- a response that can no longer be streamed: 400 ``invalid_request_error``, "This
  response can no longer be streamed because it is more than 5 minutes old" (captured
  in openai-python #2828);
- a response created without ``stream: true``, and a cursor past its last event: 400
  ``invalid_request_error`` naming the parameter (chaosllm's wording: no capture of
  the API's was found; the type and status are the API's for a bad parameter).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Final
from urllib.parse import parse_qsl

from chaosllm.errors import InvalidRequest
from chaosllm.model import JSON
from chaosllm.providers.base import Parts, Provider
from chaosllm.providers.openai_responses import (
    OpenAIResponses,
    OpenAIResponsesCodec,
    OpenAIResponsesErrors,
    OpenAIResponsesFaults,
)
from chaosllm.providers.sse import event_frame, iter_events

__all__ = [
    "ANSWERS",
    "CANCEL",
    "POLL",
    "RESUME",
    "OpenAIStoredResponses",
    "cursor_past_end",
    "not_found",
    "not_streamable",
    "too_old_to_stream",
]

ANSWERS: Final = OpenAIResponses.name
"""The provider whose answers are stored and operated on here."""
POLL: Final = "poll"
RESUME: Final = "resume"
CANCEL: Final = "cancel"
OPERATIONS: Final = (POLL, RESUME, CANCEL)

_OPERATION_KEYS = frozenset({"response_id", "operation", "stream", "starting_after"})


def not_found(response_id: str) -> str:
    return f"Response with id '{response_id}' not found."


def too_old_to_stream() -> str:
    return "This response can no longer be streamed because it is more than 5 minutes old"


def not_streamable(response_id: str) -> str:
    return (
        f"Response '{response_id}' cannot be streamed: it was not created with "
        "background=true and stream=true. Retrieve it without stream=true."
    )


def cursor_past_end(after: int, last: int) -> str:
    return (
        f"starting_after={after} is past the last event of this response (sequence_number "
        f"{last}); resume from a sequence_number you received."
    )


def _flag(value: str, name: str) -> bool:
    if value in ("true", "True", "1"):
        return True
    if value in ("false", "False", "0"):
        return False
    raise InvalidRequest(
        f"Invalid value for '{name}': expected a boolean, got '{value}'.", param=name
    )


class OpenAIStoredCodec(OpenAIResponsesCodec):
    """An operation on a stored response, as `OpenAIStoredResponses.bind` makes it."""

    def validate(self, body: JSON) -> None:
        if not isinstance(body, dict) or set(body) - _OPERATION_KEYS:
            raise InvalidRequest("This operation on a stored response takes no body.")

    def canonical(self, body: JSON) -> JSON:
        return {"input": [body.get("operation"), body.get("response_id")], **body}

    def wants_stream(self, body: JSON) -> bool:
        return isinstance(body, dict) and body.get("operation") == RESUME

    def model_of(self, body: JSON) -> Any:
        return None

    def assemble(self, frames: Sequence[str]) -> JSON:
        """A resumed stream's response: its terminal event's, else what its events build
        (they may continue items whose start the client had before the cursor)."""
        try:
            return super().assemble(frames)
        except (KeyError, IndexError, TypeError):
            last: JSON = {"object": "response", "status": "in_progress", "output": []}
            for _, data in iter_events(frames):
                event = json.loads(data)
                if isinstance(event, dict) and isinstance(event.get("response"), dict):
                    last = event["response"]
            return last


class OpenAIStoredFaults(OpenAIResponsesFaults):
    """What faults need of a stored response's operations."""

    stores_responses = True

    def stored_operation(self, request: JSON) -> str | None:
        operation = request.get("operation") if isinstance(request, dict) else None
        return operation if operation in OPERATIONS else None

    def stored_failure(self, answer: JSON, status: str) -> JSON:
        """The response `answer` as it ends when it fails in the background (``failed``,
        with the API's ``server_error`` object) or stops short (``incomplete``)."""
        failed = dict(answer) if isinstance(answer, Mapping) else {}
        if status == "incomplete":
            failed.update(status="incomplete", incomplete_details={"reason": "max_output_tokens"})
        else:
            failed.update(
                status="failed",
                error={
                    "code": "server_error",
                    "message": "An error occurred while processing your request. You can "
                    "retry your request, or contact us through our help center if the "
                    "error persists.",
                },
                incomplete_details=None,
            )
        return failed

    def stored_failure_frame(self, answer: JSON, request: JSON) -> bytes:
        """The terminal event of a resumed stream whose response failed meanwhile, numbered
        after the client's cursor."""
        after = request.get("starting_after") if isinstance(request, dict) else None
        kind = "response.incomplete" if answer.get("status") == "incomplete" else "response.failed"
        seq = after + 1 if isinstance(after, int) else 0
        return event_frame({"type": kind, "sequence_number": seq, "response": answer}).encode()


class OpenAIStoredResponses(Provider):
    """The ``openai.responses.stored`` provider: operations on a stored response."""

    parts = Parts(OpenAIStoredCodec, OpenAIResponsesErrors, OpenAIStoredFaults)

    name = "openai.responses.stored"
    path_templates: ClassVar[tuple[str, ...]] = (
        "/v1/responses/{response_id}",
        "/v1/responses/{response_id}/cancel",
        "/responses/{response_id}",
        "/responses/{response_id}/cancel",
    )
    methods: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "/v1/responses/{response_id}": ("GET",),
        "/responses/{response_id}": ("GET",),
    }
    bodiless = True
    model_protocol = False

    def bind(self, body: JSON, params: Mapping[str, str], query: str) -> JSON:
        response_id = params["response_id"]
        bound: dict[str, Any] = {"response_id": response_id}
        if isinstance(body, dict):
            bound.update({k: v for k, v in body.items() if k != "response_id"})
        args = dict(parse_qsl(query))
        stream = _flag(args["stream"], "stream") if "stream" in args else False
        after = None
        if "starting_after" in args:
            try:
                after = int(args["starting_after"])
            except ValueError:
                raise InvalidRequest(
                    "Invalid 'starting_after': expected an integer, got "
                    f"{json.dumps(args['starting_after'])}.",
                    param="starting_after",
                ) from None
            if after < 0:
                raise InvalidRequest(
                    f"Invalid 'starting_after': expected an integer >= 0, got {after}.",
                    param="starting_after",
                )
        bound.pop("cancel", None)
        cancels = bool(params.get("_cancel"))
        bound["operation"] = CANCEL if cancels else RESUME if stream else POLL
        if stream:
            bound["stream"] = True
            bound["starting_after"] = after
        return bound

    def path_params(self, path: str) -> dict[str, str] | None:
        params = super().path_params(path)
        if params is not None and path.endswith("/cancel"):
            params["_cancel"] = "1"
        return params
