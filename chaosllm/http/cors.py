"""CORS, only when asked (``--cors ORIGIN``, repeatable, or ``*``): without it no answer
carries ``Access-Control-Allow-Origin`` and no preflight is granted, so a web page of
another origin cannot read what chaosllm answers (recorded answers, miss messages that
quote recorded prompts). With it, provider endpoints (never the control plane under
``/__``) grant the preflight of an allowed origin (204) and add the allowing headers to
every answer to it, plans executed by chaosllm's own server included. DocsGPT's stub
answers every origin: its recipe starts chaosllm with ``--cors '*'``."""

from __future__ import annotations

import re
from collections.abc import Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chaosllm.errors import ConfigError
from chaosllm.wire.asgi import PLAN_EXTENSION

__all__ = ["ALLOWED_METHODS", "Cors", "parse_cors"]

ALLOWED_METHODS = "GET, POST, OPTIONS"
_CONTROL_PREFIX = "/__"


_ORIGIN = re.compile(r"https?://[^/\s?#]+")


def parse_cors(origins: Sequence[str]) -> list[str]:
    """``--cors`` values: ``*`` or origins (``SCHEME://HOST[:PORT]``); `ConfigError` for
    another value."""
    for origin in origins:
        if origin != "*" and not _ORIGIN.fullmatch(origin.strip().rstrip("/")):
            raise ConfigError(
                f"--cors {origin!r} is not an origin: give '*' or e.g. "
                f"http://localhost:5173 (a scheme, a host and an optional port)"
            )
    return list(origins)


class Cors:
    """ASGI middleware: CORS for the `origins` given, none for others (module doc)."""

    def __init__(self, app: ASGIApp, origins: Sequence[str] = ()) -> None:
        self.app = app
        self.any = "*" in origins
        self.origins = frozenset(o.strip().rstrip("/").lower() for o in origins if o != "*")

    def _allowed(self, origin: str | None) -> bool:
        return origin is not None and (self.any or origin.strip().lower() in self.origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or not (self.any or self.origins)
            or scope["path"].startswith(_CONTROL_PREFIX)
        ):
            await self.app(scope, receive, send)
            return
        origin = asked = asked_headers = None
        for name, value in scope["headers"]:
            if name == b"origin":
                origin = value.decode("latin-1")
            elif name == b"access-control-request-method":
                asked = value
            elif name == b"access-control-request-headers":
                asked_headers = value.decode("latin-1")
        if not self._allowed(origin):
            await self.app(scope, receive, send)
            return
        assert origin is not None
        allow = [
            ("access-control-allow-origin", "*" if self.any else origin),
            ("vary", "Origin"),
        ]
        if scope["method"] == "OPTIONS" and asked is not None:
            headers = [
                *allow,
                ("access-control-allow-methods", ALLOWED_METHODS),
                ("access-control-allow-headers", asked_headers or "*"),
                ("access-control-max-age", "600"),
                ("content-length", "0"),
            ]
            await send(
                {
                    "type": "http.response.start",
                    "status": 204,
                    "headers": [(k.encode(), v.encode("latin-1")) for k, v in headers],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        raw = [(k.encode(), v.encode("latin-1")) for k, v in allow]

        async def allowing(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *raw]}
            elif message["type"] == PLAN_EXTENSION:
                plan = message["plan"]
                message = {**message, "plan": plan.with_(headers=(*plan.headers, *allow))}
            await send(message)

        await self.app(scope, receive, allowing)
