"""Azure OpenAI: the OpenAI Chat Completions and Responses protocols on Azure's paths,
with Azure's error shapes and content-filter results. Pure.

Theory of operation
-------------------
Azure serves the OpenAI protocols under ``/openai``: per deployment
(``/openai/deployments/{deployment}/chat/completions?api-version=...``, the same for
``responses``), and on the v1 paths (``/openai/v1/chat/completions``,
``/openai/v1/responses``) where the body names the model as OpenAI's does. The
official ``openai.AzureOpenAI`` client calls the deployment paths (the deployment from
``azure_deployment=`` or from ``model=``) and ``/openai/responses`` for the Responses
API.

`bind` makes the deployment the model, for matching and recording: a request to a
deployment keys like the same request with ``"model": <deployment>``, whatever its body
says. A deployment path without ``api-version`` is refused, as Azure refuses it.

What differs from OpenAI's answers:

- errors: Azure's own envelope, ``{"error": {"code": "429", "message": ...}}``, with
  its codes (``"429"``, ``"401"``, ``"DeploymentNotFound"``, ``"InternalServerError"``...);
  request-validation errors keep OpenAI's shape (``type``, ``param``), as Azure passes
  them on;
- content filtering: a JSON answer carries ``prompt_filter_results`` and, per choice,
  ``content_filter_results`` (a filtered answer ends with ``finish_reason:
  "content_filter"``); a stream starts with a frame holding only the prompt's filter
  results (``choices: []``, empty id and model) and carries each choice's filter results
  on its chunks. A recorded Azure stream replays as recorded; a stream rendered from a
  JSON answer gets these frames and fields from the answer's results, and a recorded
  stream assembles back into an answer with them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar
from urllib.parse import parse_qs

from chaosllm.errors import InvalidRequest
from chaosllm.model import JSON
from chaosllm.providers.base import Parts, Provider
from chaosllm.providers.failures import Failure
from chaosllm.providers.openai_chat import (
    OpenAIChat,
    OpenAIChatCodec,
    OpenAIChatFaults,
    data_chunks,
)
from chaosllm.providers.openai_common import OpenAIErrors
from chaosllm.providers.openai_responses import (
    OpenAIResponses,
    OpenAIResponsesCodec,
    OpenAIResponsesErrors,
    OpenAIResponsesFaults,
)
from chaosllm.providers.ratelimits import RateLimitState
from chaosllm.providers.sse import data_frame

__all__ = ["AZURE_ERROR_CODES", "AzureChat", "AzureResponses"]

AZURE_ERROR_CODES: Mapping[int, str] = {
    401: "401",
    403: "403",
    404: "DeploymentNotFound",
    408: "Timeout",
    429: "429",
    500: "InternalServerError",
    502: "BadGateway",
    503: "ServiceUnavailable",
    504: "Timeout",
}
"""The ``code`` of Azure's error envelope by HTTP status (any other: the status itself)."""

_FILTERS = "content_filter_results"
_PROMPT_FILTERS = "prompt_filter_results"
_CATEGORIES = ("hate", "self_harm", "sexual", "violence")
"""The content filter's categories (each choice's results name all four)."""
_FILTERED_CATEGORY = "violence"
"""The category a filtered answer is marked as filtered by."""

_FAILURES: Mapping[Failure, tuple[str | None, str | None]] = {
    Failure.QUOTA_EXHAUSTED: (None, None),
    Failure.KEY_REFUSED: (
        "401",
        "Access denied due to invalid subscription key or wrong API endpoint. Make sure to "
        "provide a valid key for an active subscription and use a correct regional API "
        "endpoint for your resource.",
    ),
    Failure.NO_SUCH_MODEL: (
        "DeploymentNotFound",
        "The API deployment for this resource does not exist. If you created the deployment "
        "within the last 5 minutes, please wait a moment and try again.",
    ),
    Failure.OVERLOADED: (
        "ServiceUnavailable",
        "The service is temporarily unable to process your request. Please try again later.",
    ),
}
"""Azure's ``code`` and message of each failure class it answers in its own envelope
(None: OpenAI's; a request too long is OpenAI's 400, passed on)."""


class _AzureErrors(OpenAIErrors):
    """`_Azure`'s errors: its envelope, its failure classes, its rate-limit headers."""

    def _envelope(
        self, status: int, message: str, kind: str | None, code: str | None, param: str | None
    ) -> dict[str, Any]:
        if kind is not None or status == 400:
            # chaosllm's own errors and refused requests: OpenAI's shape, as Azure passes
            # the model's validation errors on.
            return super()._envelope(status, message, kind, code, param)
        return {
            "error": {
                "code": code or AZURE_ERROR_CODES.get(status, str(status)),
                "message": message,
            }
        }

    def failure_message(self, failure: Failure, request: JSON) -> str:
        _, message = _FAILURES.get(failure, (None, None))
        return message or super().failure_message(failure, request)

    def _failure_body(self, failure: Failure, message: str, *, status: int) -> JSON:
        """Azure's envelope (``{"error": {"code", "message"}}``), OpenAI's for a 400."""
        body = super()._failure_body(failure, message, status=status)
        if failure not in _FAILURES:
            return body
        code, _ = _FAILURES[failure]
        error = body.get("error") if isinstance(body, dict) else None
        openai_code = error.get("code") if isinstance(error, dict) else None
        return {"error": {"code": code or openai_code, "message": message}}

    request_id_headers = ("apim-request-id", "x-request-id")
    request_id_form = "uuid"

    def throttle_headers(self, reset: float, wall: float) -> tuple[tuple[str, str], ...]:
        """Azure sends the remaining requests only (none left)."""
        return (("x-ratelimit-remaining-requests", "0"),)

    def rate_limit_headers(self, state: RateLimitState) -> tuple[tuple[str, str], ...]:
        """Azure sends the remaining requests and tokens only."""
        headers: list[tuple[str, str]] = []
        for name, meter in (("requests", state.requests), ("tokens", state.tokens)):
            if meter is not None:
                headers.append((f"x-ratelimit-remaining-{name}", str(meter.remaining)))
        return tuple(headers)


class _Azure(Provider):
    """What every Azure protocol shares: the deployment as the model, Azure's errors."""

    def bind(self, body: JSON, params: Mapping[str, str], query: str) -> JSON:
        deployment = params.get("deployment")
        if deployment is None or not isinstance(body, dict):
            return body  # a v1 path (the body names the model), or a body validate refuses
        if not parse_qs(query).get("api-version"):
            raise InvalidRequest(
                "Missing required query parameter 'api-version': Azure OpenAI's deployment "
                "paths need one (e.g. ?api-version=2024-10-21).",
                code="missing_api_version",
                param="api-version",
            )
        return {**body, "model": deployment}


class AzureChatCodec(OpenAIChatCodec):
    """`AzureChat`'s codec: its requests' canonical form, its answers' framing."""

    def stream_frames(
        self, completion: Mapping[str, Any], *, include_usage: bool = False
    ) -> list[str]:
        """OpenAI's frames with Azure's filter results: a first frame with the prompt's,
        each choice's on its chunks (after the role chunk, which has none)."""
        frames = super().stream_frames(completion, include_usage=include_usage)
        filters = {
            choice.get("index", 0): choice[_FILTERS]
            for choice in completion.get("choices") or []
            if isinstance(choice, dict) and _FILTERS in choice
        }
        if filters:
            frames = [_with_filters(frame, filters) for frame in frames]
        prompt = completion.get(_PROMPT_FILTERS)
        if prompt is not None:
            frames.insert(
                0,
                data_frame(
                    {
                        "choices": [],
                        "created": 0,
                        "id": "",
                        "model": "",
                        "object": "",
                        _PROMPT_FILTERS: prompt,
                    }
                ),
            )
        return frames

    def assemble(self, frames: Sequence[str]) -> JSON:
        """OpenAI's assembly, keeping the prompt's and each choice's filter results."""
        completion = super().assemble(frames)
        if not isinstance(completion, dict) or "choices" not in completion:
            return completion
        prompt: Any = None
        filters: dict[int, Any] = {}
        for chunk in _chunks(frames):
            if _PROMPT_FILTERS in chunk:
                prompt = chunk[_PROMPT_FILTERS]
            for choice in chunk.get("choices") or []:
                if isinstance(choice, dict) and choice.get(_FILTERS):
                    filters[choice.get("index", 0)] = choice[_FILTERS]
        if not completion.get("id") and prompt is not None:
            # The prompt's frame came first: the answer's fields are the next chunk's.
            first = next((c for c in _chunks(frames) if c.get("id")), {})
            for key in ("id", "created", "model", "service_tier", "system_fingerprint"):
                if key in first:
                    completion[key] = first[key]
            completion["object"] = "chat.completion"
        for choice in completion["choices"]:
            if choice.get("index", 0) in filters:
                choice[_FILTERS] = filters[choice.get("index", 0)]
        if prompt is not None:
            completion[_PROMPT_FILTERS] = prompt
        return completion


class AzureChatFaults(OpenAIChatFaults):
    """`AzureChat`'s fault hooks: how its streams end and its answers break."""

    codec: AzureChatCodec
    errors: _AzureErrors

    def filtered_answer(self, answer: JSON) -> JSON | None:
        """OpenAI's cut answer, each choice's filter results marking it filtered (a
        category ``filtered: true``, severity ``high``)."""
        filtered = super().filtered_answer(answer)
        if not isinstance(filtered, dict):
            return filtered
        for choice in filtered.get("choices") or []:
            if isinstance(choice, dict):
                results = choice.get(_FILTERS)
                results = dict(results) if isinstance(results, dict) else {}
                for category in _CATEGORIES:
                    results.setdefault(category, {"filtered": False, "severity": "safe"})
                results[_FILTERED_CATEGORY] = {"filtered": True, "severity": "high"}
                choice[_FILTERS] = results
        return filtered

    def frame_finishes(self, frame: str) -> bool:
        """The prompt's filter frame (``choices: []``) starts a stream: it finishes
        nothing."""
        if _PROMPT_FILTERS in frame and all(
            _PROMPT_FILTERS in chunk and not chunk.get("choices") for chunk in _chunks([frame])
        ):
            return False
        return super().frame_finishes(frame)


class AzureChat(_Azure, OpenAIChat):
    """The `azure.chat` provider: Chat Completions on Azure, with content filtering."""

    parts = Parts(AzureChatCodec, _AzureErrors, AzureChatFaults)

    name = "azure.chat"
    paths: ClassVar[tuple[str, ...]] = ("/openai/v1/chat/completions",)
    path_templates: ClassVar[tuple[str, ...]] = (
        "/openai/deployments/{deployment}/chat/completions",
    )


class AzureResponsesErrors(_AzureErrors, OpenAIResponsesErrors):
    """`AzureResponses`'s errors: its envelope, its failure classes, its rate-limit headers."""

    codec: OpenAIResponsesCodec


class AzureResponses(_Azure, OpenAIResponses):
    """The `azure.responses` provider: the Responses API on Azure."""

    parts = Parts(OpenAIResponsesCodec, AzureResponsesErrors, OpenAIResponsesFaults)

    name = "azure.responses"
    paths: ClassVar[tuple[str, ...]] = ("/openai/v1/responses", "/openai/responses")
    path_templates: ClassVar[tuple[str, ...]] = ("/openai/deployments/{deployment}/responses",)


def _chunks(frames: Sequence[str]) -> list[dict[str, Any]]:
    """The JSON objects of the data lines of `frames` (``[DONE]`` passed over)."""
    return [chunk for chunk in data_chunks(frames) if chunk is not None]


def _with_filters(frame: str, filters: Mapping[int, Any]) -> str:
    """A rendered chunk with its choices' filter results (none on a role chunk)."""
    chunks = _chunks([frame])
    if len(chunks) != 1 or not chunks[0].get("choices"):
        return frame
    chunk = chunks[0]
    for choice in chunk["choices"]:
        index = choice.get("index", 0)
        if index in filters:
            delta = choice.get("delta") or {}
            choice[_FILTERS] = {} if "role" in delta else filters[index]
    return data_frame(chunk)
