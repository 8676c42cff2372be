"""Provider requests straight to the engine, without ASGI: the builtin server's hot path.

chaosllm's own server calls `DirectHandler` with each parsed request before it runs the
ASGI app. For a POST to a provider endpoint that the engine answers with a plan (a
replay, a miss, a refusal, a fault), the server executes the plan itself: no Starlette
routing, no `Request` object, no middleware (the control plane's guard concerns
``/__`` paths, which never come this way; its Host rule, `HostRule`, is applied here
too when the server is bound to loopback: a Host it does not plainly pass, and with
``--cors`` a request with an ``Origin``, go to the app, which answers them). Anything
else -- the control plane, the other routes, and every mode but replay, where a
decision may be a call to the upstream (an ASGI response) -- returns None and goes
through the app as usual. The engine call is the same either way, so both paths give
the same bytes and the same journal. An unexpected exception is answered as the app's
`ErrorEnvelope` answers it: the protocol's 500 (``internal_error``, an id the log line
carries), and the connection closed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chaosllm.config import Mode
from chaosllm.core.engine import ProviderCall, Reply
from chaosllm.core.ratelimit import KEY_HEADERS
from chaosllm.core.report import PlanReport
from chaosllm.http.control import HostRule, loopback_bound
from chaosllm.http.guards import internal_error
from chaosllm.http.state import ChaosState
from chaosllm.model import ResponsePlan
from chaosllm.providers import provider_for_path
from chaosllm.providers.base import ErrorKind, Provider
from chaosllm.store.redact import credential_values
from chaosllm.wire.asgi import ASGIApp, Receive, Scope, Send, send_plan

__all__ = ["SESSION_HEADER_BYTES", "DirectFront", "DirectHandler"]

SESSION_HEADER_BYTES = b"x-chaosllm-session"
MOCK_LLM_PREFIX = b"x-mock-llm-"
KEY_HEADER_BYTES = frozenset(name.encode("latin-1") for name in KEY_HEADERS)


class DirectHandler:
    """``handler(method, path, query, headers, body)`` -> ``(plan, report)`` or None."""

    __slots__ = ("cors", "hosts", "state")

    def __init__(self, state: ChaosState, hosts: HostRule | None = None) -> None:
        self.state = state
        self.hosts = hosts
        """The Host rule, when the server is bound to loopback."""
        self.cors = bool(state.config.cors)

    def provider_for(self, method: str, path: str) -> Provider | None:
        """The provider whose request ``method path`` is, when this path answers it (a
        provider POST in replay mode); None: the app's."""
        if method != "POST" or self.state.config.mode is not Mode.REPLAY:
            return None
        return provider_for_path(path)

    def __call__(
        self,
        method: str,
        path: str,
        query: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        kept: Any = None,
        /,
    ) -> tuple[ResponsePlan, PlanReport] | None:
        keyed = self.state.limiter is not None
        derived = kept.derived if kept is not None else None
        if derived is not None and derived[0] is keyed:  # the same request, worked out
            provider, call = derived[1], derived[2]
        else:
            provider = self.provider_for(method, path)
            call = (
                None
                if provider is None
                else self.call_for(provider, method, path, query, headers, body, keyed=keyed)
            )
            if kept is not None:
                kept.derived = (keyed, provider, call)
        if provider is None or call is None:
            return None
        return self.serve(provider, call)

    def call_for(
        self,
        provider: Provider,
        method: str,
        path: str,
        query: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        *,
        keyed: bool | None = None,
    ) -> ProviderCall | None:
        """The engine's call for a request `provider_for` gave `provider` for: a function
        of the request alone, and of whether a live rate limit is on (which keys its
        buckets by the API key's headers); None for one the app must answer (a Host the
        rule does not plainly pass, an Origin with ``--cors``)."""
        session = None
        mocked: list[tuple[str, str]] = []  # DocsGPT's mock LLM's X-Mock-LLM-* delays
        if keyed is None:  # the live rate limit's caller: the API key
            keyed = self.state.limiter is not None
        read = provider.call_headers  # what the protocol reads off the headers
        hosts = self.hosts
        for name, value in headers:
            if len(name) == 4 and hosts is not None and name.lower() == b"host":
                if not hosts.plainly(value):
                    return None  # the app refuses it (or knows the address it names)
            elif len(name) == 6 and self.cors and name.lower() == b"origin":
                return None  # the app answers CORS
            elif len(name) == 18 and name.lower() == SESSION_HEADER_BYTES:
                if session is None:  # the first one, as the app reads it
                    session = value.decode("latin-1")
            elif name[:11].lower() == MOCK_LLM_PREFIX or (
                keyed and name.lower() in KEY_HEADER_BYTES
            ):
                mocked.append((name.decode("latin-1").lower(), value.decode("latin-1")))
            elif read and (lowered := name.decode("latin-1").lower()) in read:
                mocked.append((lowered, value.decode("latin-1")))
        return ProviderCall(
            provider=provider,
            path=path,
            body=body,
            session=session,
            method=method,
            headers=tuple(mocked),
            query=query,
            credentials=credential_values(headers, query),
        )

    def answer(
        self,
        provider: Provider,
        method: str,
        path: str,
        query: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
    ) -> tuple[ResponsePlan, PlanReport] | None:
        """The plan for a request `provider_for` gave `provider` for, and its report;
        None for one the app must answer (a Host to check, an Origin with ``--cors``)."""
        call = self.call_for(provider, method, path, query, headers, body)
        return None if call is None else self.serve(provider, call)

    def serve(self, provider: Provider, call: ProviderCall) -> tuple[ResponsePlan, PlanReport]:
        """The engine's decision on `call` as a plan, and its report."""
        try:
            decision = self.state.handle(call)
        except Exception as exc:
            # As the app's ErrorEnvelope answers: the protocol's 500, an id in the log.
            plan = provider.render_error(
                500,
                internal_error(call.method, call.path, exc),
                kind=ErrorKind.SERVER_ERROR,
                code="internal_error",
            )
            return plan.with_(close_after=True), PlanReport()
        assert isinstance(decision, Reply)  # in replay mode the engine always replies
        return decision.plan, decision.entry.report


class DirectFront:
    """The ASGI app with the builtin server's hot path in front of it, for another ASGI
    server (``--server uvicorn``): a provider POST in replay mode whose body has a
    Content-Length within the body limit is read and answered through `DirectHandler`
    and `send_plan`, without Starlette's routing, `Request` or middleware (the bytes and
    the journal are the app's: the engine call is the same); anything else -- another
    mode, path or method, a chunked or oversized body (the app's `BodyLimit` refuses it
    as always) -- goes to the app as it came."""

    __slots__ = ("app", "direct", "hosts", "max_body_bytes")

    def __init__(self, app: ASGIApp, state: ChaosState, max_body_bytes: int) -> None:
        self.app = app
        self.direct = DirectHandler(state)
        self.hosts = HostRule(state.config.allow_hosts)
        self.max_body_bytes = max_body_bytes

    def _takes(self, scope: Scope) -> Provider | None:
        """The provider that answers the request here (`DirectHandler.provider_for`, with
        a body of a Content-Length within the limit); None: the app's."""
        if scope["type"] != "http":
            return None
        provider = self.direct.provider_for(scope["method"], scope["path"])
        if provider is None:
            return None
        length = -1
        server = scope.get("server")
        guarded = server is not None and loopback_bound(str(server[0]))
        for name, value in scope["headers"]:
            if name == b"host" and guarded and not self.hosts.plainly(value):
                return None
            if name == b"origin" and self.direct.cors:
                return None
            if name == b"content-length":
                if length >= 0 or not value.strip().isdigit():
                    return None  # the app says what is wrong with it
                length = int(value)
            elif name == b"transfer-encoding":
                return None
        return provider if 0 <= length <= self.max_body_bytes else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        provider = self._takes(scope)
        if provider is None:
            await self.app(scope, receive, send)
            return
        parts: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before its body
                return
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        result = self.direct.answer(
            provider,
            "POST",
            scope["path"],
            scope.get("query_string", b""),
            scope["headers"],
            b"".join(parts),
        )
        assert result is not None  # `_takes` sent what it would not answer to the app
        plan, report = result
        await send_plan(scope, receive, send, plan, report)
