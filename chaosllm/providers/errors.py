"""A protocol's errors: its error envelope, its failure classes, its rate-limit headers.
Pure.

The errors part of a provider (`chaosllm.providers.base.Provider`) words every error
in the protocol's own shape: the errors chaosllm itself answers (`error_body` with an
`ErrorKind`, `render_error`), the errors a real API answers with a status
(`error_body` without one, `error_answer`), the named failure classes (`failure`: its
status, message, body and headers, each with a default), the headers every error
carries (`error_headers`) and the live rate-limit headers (`rate_limit_headers`).

A protocol writes `_envelope`; the rest has defaults.
"""

from __future__ import annotations

import abc
import json
from typing import Any, ClassVar

from chaosllm.model import JSON, Piece, ResponsePlan
from chaosllm.providers.codec import Codec
from chaosllm.providers.failures import FAILURE_MESSAGES, FAILURE_STATUSES, Failure, FailureReply
from chaosllm.providers.ids import request_id
from chaosllm.providers.ratelimits import RateLimitState
from chaosllm.providers.text import JSON_HEADERS

__all__ = ["Errors"]


class Errors(abc.ABC):
    """A protocol's errors (see the module's docstring), reading requests with its `codec`."""

    request_id_headers: ClassVar[tuple[str, ...]] = ()
    """The headers every answer of the API carries its request's id in (OpenAI's
    ``x-request-id``...); none by default (Gemini and Ollama send none)."""
    request_id_form: ClassVar[str] = "uuid"
    """How the API spells a request id (`chaosllm.providers.ids.REQUEST_ID_FORMS`)."""

    def __init__(self, codec: Codec) -> None:
        self.codec = codec

    def stamped(self, plan: ResponsePlan, key: str) -> ResponsePlan:
        """`plan` carrying its request's id (derived from `key`) in `request_id_headers`,
        where it does not already (a recorded answer keeps the id it was recorded
        with), and in its body where the API writes it there too (`_stamp_body`)."""
        names = self.request_id_headers
        if not names:
            return plan
        try:
            known, missing, heads = plan.stamp
        except AttributeError:
            known = None
        if known is not names:
            present = {name.lower() for name, _ in plan.headers}
            missing = tuple(name for name in names if name.lower() not in present)
            heads = tuple(name.encode("latin-1") + b": " for name in missing)
            object.__setattr__(plan, "stamp", (names, missing, heads))  # a cache, not the value
        if not missing:
            return plan
        ident = request_id(key, self.request_id_form)
        added = tuple([(name, ident) for name in missing])  # a list: no generator frame
        value = ident.encode("latin-1") + b"\r\n"
        lines = b"".join([head + value for head in heads])
        stamped = plan.with_headers(plan.headers + added)
        bodied = self._stamp_body(stamped, ident)
        if bodied is stamped:  # only headers added: its program is the plan's, re-headed
            object.__setattr__(stamped, "stamped_from", (plan, lines))
        return bodied

    def _stamp_body(self, plan: ResponsePlan, ident: str) -> ResponsePlan:
        """`plan` with request id `ident` in its body, where the API writes one (Anthropic's
        error bodies); itself by default."""
        return plan

    def error_headers(self, status: int) -> tuple[tuple[str, str], ...]:
        """Headers every error answer of the protocol carries besides its content type
        (Bedrock's ``x-amzn-ErrorType``); none by default."""
        return ()

    def rate_limit_headers(self, state: RateLimitState) -> tuple[tuple[str, str], ...]:
        """The live rate-limit headers every answer carries under ``--rate-limit``, as the
        real API writes them (`chaosllm.providers.ratelimits`); none by default (Gemini,
        Bedrock and Ollama send none)."""
        return ()

    def throttle_headers(self, reset: float, wall: float) -> tuple[tuple[str, str], ...]:
        """The rate-limit headers of a 429 that tells its caller to wait `reset` seconds
        (`wall`: the time of the request, for absolute resets), as the real API sends
        them on a refusal; none by default (Gemini, Bedrock and Ollama send none)."""
        return ()

    def throttled_answer(self, message: str, *, retry_after: float) -> JSON:
        """The body of a 429 that tells its caller to wait `retry_after` seconds: the
        protocol's 429 by default (Gemini's says the wait in ``details`` too)."""
        return self.error_answer(message, status=429)

    def error_body(
        self,
        status: int,
        message: str,
        *,
        kind: str | None = None,
        code: str | None = None,
        param: str | None = None,
    ) -> dict[str, Any]:
        """The provider's error envelope for an HTTP status. With `kind` (`ErrorKind`) it is
        an error chaosllm itself answers, typed by the kind, with `code` as given;
        without, the error a real API answers with that status (its type and code)."""
        return self._envelope(status, message, kind, code, param)

    @abc.abstractmethod
    def _envelope(
        self, status: int, message: str, kind: str | None, code: str | None, param: str | None
    ) -> dict[str, Any]:
        """`error_body`, as each protocol words it."""

    def render_error(
        self,
        status: int,
        message: str,
        *,
        kind: str,
        code: str | None = None,
        param: str | None = None,
        stream: bool = False,
    ) -> ResponsePlan:
        """The plan of an error chaosllm itself answers (a JSON body, whatever was asked)."""
        body = self.error_body(status, message, kind=kind, code=code, param=param)
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        headers = JSON_HEADERS + self.error_headers(status)
        return ResponsePlan(status=status, headers=headers, pieces=(Piece(data, frame=False),))

    def error_answer(self, message: str, *, status: int, code: str | None = None) -> JSON:
        """The body a real error with this status carries (what faults answer with)."""
        return self.error_body(status, message, code=code)

    # -- the named failure classes (`Failure`) ----------------------------------------

    def failure(self, failure: Failure, request: JSON, message: str | None = None) -> FailureReply:
        """The answer of a failure class to `request` in the protocol's shape: by default
        `error_body` for `failure_status`, worded by `failure_message` (or `message`), its
        body from `_failure_body` and its headers from `_failure_headers`."""
        status = self.failure_status(failure)
        text = message if message is not None else self.failure_message(failure, request)
        body = self._failure_body(failure, text, status=status)
        return FailureReply(status, body, self._failure_headers(failure, status))

    def failure_status(self, failure: Failure) -> int:
        """The HTTP status of a failure class (`FAILURE_STATUSES` by default)."""
        return FAILURE_STATUSES[failure]

    def failure_message(self, failure: Failure, request: JSON) -> str:
        """The message a failure class carries, as the real API words it for `request`."""
        model = self.codec.model_of(request)
        return FAILURE_MESSAGES[failure].format(model=model if isinstance(model, str) else "")

    def _failure_body(self, failure: Failure, message: str, *, status: int) -> JSON:
        """The error body of a failure class: the protocol's error for its status."""
        return self.error_answer(message, status=status)

    def _failure_headers(self, failure: Failure, status: int) -> tuple[tuple[str, str], ...]:
        """The headers of a failure class's answer (`error_headers` by default)."""
        return self.error_headers(status)
