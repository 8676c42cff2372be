"""The errors every protocol words in its own shape: the kinds of error chaosllm itself
answers (`ErrorKind`) and the named failure classes a real API answers with
(`Failure`), with their default statuses and messages. Pure data."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from chaosllm.model import JSON

__all__ = ["FAILURE_MESSAGES", "FAILURE_STATUSES", "ErrorKind", "Failure", "FailureReply"]


class ErrorKind:
    """Provider-neutral names of the errors chaosllm itself produces."""

    INVALID_REQUEST = "invalid_request"
    NOT_FOUND = "not_found"
    NO_MATCH = "no_match"
    SERVER_ERROR = "server_error"


class Failure(enum.Enum):
    """The named failure classes a real API answers with, by what they mean (the hook
    vocabulary of the failure-class faults of `chaosllm.faults`): each protocol words
    them in its own shape (`Errors.failure`)."""

    CONTEXT_TOO_LONG = enum.auto()
    """The request is longer than the model's context window."""
    QUOTA_EXHAUSTED = enum.auto()
    """The account's quota or credit is spent: no retry helps until someone pays."""
    KEY_REFUSED = enum.auto()
    """The API key (or credentials) is not valid."""
    NO_SUCH_MODEL = enum.auto()
    """The model asked for does not exist (or the caller has no access to it)."""
    OVERLOADED = enum.auto()
    """The service is overloaded for now: a retry later cures it."""


FAILURE_STATUSES: Final[Mapping[Failure, int]] = MappingProxyType(
    {
        Failure.CONTEXT_TOO_LONG: 400,
        Failure.QUOTA_EXHAUSTED: 429,
        Failure.KEY_REFUSED: 401,
        Failure.NO_SUCH_MODEL: 404,
        Failure.OVERLOADED: 503,
    }
)
"""The HTTP status of each failure class where a protocol says nothing else."""

FAILURE_MESSAGES: Final[Mapping[Failure, str]] = MappingProxyType(
    {
        Failure.CONTEXT_TOO_LONG: "The input is longer than the model's context window.",
        Failure.QUOTA_EXHAUSTED: "You exceeded your current quota, please check your plan and "
        "billing details.",
        Failure.KEY_REFUSED: "Incorrect API key provided.",
        Failure.NO_SUCH_MODEL: "The model {model} does not exist.",
        Failure.OVERLOADED: "The server is overloaded. Please try again later.",
    }
)


@dataclass(frozen=True, slots=True)
class FailureReply:
    """How a protocol answers a failure class: the status, the error body and the headers
    besides the content type (`Errors.failure`)."""

    status: int
    body: JSON
    headers: tuple[tuple[str, str], ...] = ()
