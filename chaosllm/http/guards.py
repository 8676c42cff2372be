"""ASGI middleware that holds under every server: no exception reaches the client as a
bare 500, and no body larger than ``--max-body-bytes`` is read.

- `ErrorEnvelope` (outermost): an exception no route handled is answered, when no
  response has started yet, with a 500 in the envelope of the path's protocol (code
  ``internal_error``) whose message carries a short error id; the log line with the
  traceback carries the same id. The answer says ``Connection: close``, and the server
  then closes the connection (the state of a request that failed half-way is unknown).
  A response that already started cannot be turned into an envelope: the exception goes
  on to the server, which aborts the connection. `PlanAborted` (a fault emulated under a
  plain ASGI server) always goes on, and a client that left while its body was read
  (`ClientDisconnect`) gets nothing.
- `BodyLimit`: a request whose ``Content-Length`` exceeds the limit is answered 413 at
  once, without reading the body; a body that grows beyond it (chunked) is cut off when
  it does, with the same 413. chaosllm's own server refuses such bodies before the app
  sees them; under ``--server uvicorn`` this is what enforces the flag.
"""

from __future__ import annotations

import logging
import secrets

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chaosllm.errors import PlanAborted
from chaosllm.http.web import error_response
from chaosllm.providers.base import ErrorKind

__all__ = ["BodyLimit", "ErrorEnvelope", "internal_error"]

log = logging.getLogger("chaosllm")


def internal_error(method: str, path: str, exc: BaseException) -> str:
    """Log an unexpected `exc` raised answering ``method path`` under a new short error
    id, with its traceback; the message of the 500 that answers it, carrying the id."""
    error_id = secrets.token_hex(4)
    log.error(
        "internal error %s: %s %s raised %s",
        error_id,
        method,
        path[:200],
        type(exc).__name__,
        exc_info=exc,
    )
    return (
        f"chaosllm failed to answer this request: an unexpected {type(exc).__name__} "
        f"(error id {error_id}; the server log has the details under that id)."
    )


class ErrorEnvelope:
    """Unhandled exceptions as the protocol's 500 envelope (module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = True  # http.response.start, or a plan handed to chaosllm's server
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except PlanAborted:
            raise
        except ClientDisconnect:
            return  # nobody to answer
        except Exception as exc:
            if started:
                raise
            path = scope.get("path", "")
            response = error_response(
                path,
                500,
                internal_error(scope.get("method", "?"), path, exc),
                kind=ErrorKind.SERVER_ERROR,
                code="internal_error",
            )
            response.headers["connection"] = "close"
            await response(scope, receive, send)


class _TooLarge(Exception):
    """The body grew beyond the limit while the app read it."""


class BodyLimit:
    """Bodies beyond `max_body_bytes` refused with a 413 (module docstring)."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        declared = chunked = False
        for name, value in scope["headers"]:
            if name == b"content-length" and not declared:  # the first one, as before
                if value.strip().isdigit() and int(value) > limit:
                    await self._refuse(scope, receive, send)
                    return
                declared = True
            elif name == b"transfer-encoding":
                chunked = True
        if declared and not chunked:
            # The server reads no more than the Content-Length it checked above: nothing
            # to count (the wrappers below cost as much as a replay's own work).
            await self.app(scope, receive, send)
            return
        received = 0
        started = False

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _TooLarge
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.app(scope, limited, watched)
        except _TooLarge:
            if started:
                raise
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(
            scope.get("path", ""),
            413,
            f"Request body too large: the limit is {self.max_body_bytes} bytes",
            code="request_too_large",
        )
        response.headers["connection"] = "close"
        await response(scope, receive, send)
