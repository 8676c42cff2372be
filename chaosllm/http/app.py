"""The Starlette app: provider endpoints (here) and the control plane (`control`).

A provider route is a thin adapter over the engine (`chaosllm.core.engine`): it reads
the request into a `ProviderCall`, lets `Engine.handle` decide, and hands the decision
to the wire layer: a plan to execute (`PlanResponse`) or a call to the upstream
(`ProxyCall`, in the proxy modes). No route writes to a socket or to the journal.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from chaosllm.config import ServerConfig
from chaosllm.core.engine import ProviderCall, Proxy, Reply
from chaosllm.core.ratelimit import key_headers
from chaosllm.errors import InvalidRequest
from chaosllm.http.control import ControlGuard, control_routes
from chaosllm.http.cors import Cors
from chaosllm.http.gemini import gemini_routes
from chaosllm.http.guards import BodyLimit, ErrorEnvelope
from chaosllm.http.live import live_routes
from chaosllm.http.mcp import Forwarding, mcp_routes
from chaosllm.http.mcp import forwarding as forwarding_of_mcp
from chaosllm.http.mcp_legacy import legacy_routes
from chaosllm.http.ollama import ollama_routes
from chaosllm.http.state import ChaosState
from chaosllm.http.web import (
    SESSION_HEADER,
    chaos_state,
    error_response,
    json_body,
    mock_llm_headers,
    openai_error,
)
from chaosllm.model import Exchange
from chaosllm.providers import PROVIDERS, Provider, provider_for_client
from chaosllm.providers.base import ErrorKind
from chaosllm.providers.embeddings import PATHS as EMBEDDINGS_PATHS
from chaosllm.providers.embeddings import embeddings_response
from chaosllm.store.redact import credential_values
from chaosllm.wire import PlanResponse

if TYPE_CHECKING:
    from chaosllm.record.proxy import ProxyCall

__all__ = ["create_app", "provider_call"]

MODELS_PATHS = ("/v1/models", "/models")


async def provider_call(request: Request, provider: Provider) -> PlanResponse | ProxyCall:
    """The answer to a provider request: what the engine decides, handed to the wire."""
    state = chaos_state(request)
    scope = request.scope
    headers = mock_llm_headers(request.headers.items())
    if state.limiter is not None:  # the live rate limit's caller: the API key (hashed)
        headers += key_headers(request.headers.items())
    if provider.call_headers:  # what the protocol reads off the request's headers
        headers += tuple((n, v) for n, v in request.headers.items() if n in provider.call_headers)
    call = ProviderCall(
        provider=provider,
        path=scope["path"],
        body=await request.body(),
        session=request.headers.get(SESSION_HEADER),
        method=scope["method"],
        headers=headers,
        query=scope.get("query_string", b""),
        credentials=credential_values(scope["headers"], scope.get("query_string", b"")),
    )
    decision = state.handle(call)
    if isinstance(decision, Reply):
        return PlanResponse(decision.plan, decision.entry.report)
    if state.upstream_for(decision.call)[0] is None:
        named = ", ".join(sorted(state.servers or {})) or "none"
        message = (
            f"chaosllm has no upstream for {call.method} {call.path}: --upstream was not "
            f"given and --mcp-upstream names only these MCP servers: {named}."
        )
        return _unproxied(state, decision, message, "no_upstream")
    way = BEFORE_PROXY.get(provider.name)
    forwarding = await way(state, decision, scope["headers"]) if way is not None else None
    if forwarding is not None and forwarding.problem is not None:
        return _unproxied(state, decision, forwarding.problem, "upstream_session")
    return _proxy_call(state, decision, scope["headers"], forwarding)


BEFORE_PROXY: Final[Mapping[str, Callable[..., Awaitable[Forwarding | None]]]] = {
    "mcp": forwarding_of_mcp
}
"""The HTTP layer's extension point before a request is proxied, by provider: how it
goes to the upstream (its headers, the answer's, a look at the answer's head), or
None: as the client sent it. MCP's carries the upstream's own session id
(`chaosllm.http.mcp.forwarding`)."""


def _unproxied(state: ChaosState, proxy: Proxy, message: str, code: str) -> PlanResponse:
    """A request to be proxied that cannot be (no upstream names it, its upstream
    session could not be opened): a 502 saying so, in the protocol's shape; nothing is
    recorded."""
    call = proxy.call
    plan = call.provider.render_error(502, message, kind=ErrorKind.SERVER_ERROR, code=code)
    state.amend(proxy.entry, status=502, error=message, ending="complete")
    return PlanResponse(plan.with_(headers=plan.headers + proxy.headers), proxy.entry.report)


def _proxy_call(
    state: ChaosState, proxy: Proxy, headers: Any, forwarding: Forwarding | None = None
) -> ProxyCall:
    """The upstream's answer to a proxied request, recorded and faulted as the engine
    decided. (The proxy is imported when first needed: a replaying server never is.)"""
    from chaosllm.record.proxy import ProxyCall

    call, entry = proxy.call, proxy.entry
    upstream, target = state.upstream_for(call)
    assert upstream is not None
    fault_hook = None
    if proxy.faultable:

        def fault_hook(plan: Any, answer: Any) -> Any:
            return state.fault_upstream(proxy, plan, answer)

    recorder = None
    if proxy.record:

        def recorder(exchange: Exchange) -> Exchange:
            return state.record(exchange, call.session)

    def amend(**changes: Any) -> None:
        state.amend(entry, **changes)

    return ProxyCall(
        upstream=upstream,
        provider=call.provider,
        method=call.method,
        path=call.path,
        query=call.query,
        headers=forwarding.headers if forwarding else headers,
        content=call.body,
        body=proxy.body,
        entry=entry,
        amend=amend,
        redactor=state.redactor.carrying(call.credentials),
        fault_hook=fault_hook,
        live_hook=(lambda: state.fault_live(proxy)) if proxy.faultable else None,
        recorder=recorder,
        timing=state.config.timing,
        extra_headers=proxy.headers + (forwarding.answer_headers if forwarding else ()),
        target=target,
        answer_head=forwarding.answer_head if forwarding else None,
    )


def _route(provider: Provider) -> Callable[[Request], Awaitable[PlanResponse | ProxyCall]]:
    async def endpoint(request: Request) -> PlanResponse | ProxyCall:
        return await provider_call(request, provider)

    endpoint.__name__ = provider.name.replace(".", "_")
    return endpoint


async def embeddings(request: Request) -> Response:
    try:
        answer = embeddings_response(await json_body(request))
        return JSONResponse(answer)
    except InvalidRequest as exc:
        return openai_error(400, exc.message, code=exc.code, param=exc.param)


AZURE_EMBEDDINGS_PATHS = ("/openai/deployments/{deployment}/embeddings", "/openai/v1/embeddings")
"""Azure OpenAI's embeddings: the deployment (when the path names one) is the model."""


async def azure_embeddings(request: Request) -> Response:
    try:
        body = await json_body(request)
        deployment = request.path_params.get("deployment")
        if deployment is not None and isinstance(body, dict):
            body = {**body, "model": deployment}
        return JSONResponse(embeddings_response(body))
    except InvalidRequest as exc:
        return openai_error(400, exc.message, code=exc.code, param=exc.param)


async def models(request: Request) -> Response:
    """The models in the recordings, in the list shape of the SDK that asks."""
    provider = provider_for_client(request.headers.keys())
    return JSONResponse(provider.codec.models_body(chaos_state(request).store.models()))


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok", "recordings": len(chaos_state(request).store.exchanges)})


async def healthz(request: Request) -> Response:
    """DocsGPT's mock LLM's liveness probe, as it answers it."""
    return JSONResponse({"ok": True})


def _endpoints() -> list[tuple[str, str]]:
    """(method, path) of every provider endpoint, for routing and for the 404."""
    served = [
        (method, path)
        for provider in PROVIDERS.values()
        for path in (*provider.paths, *provider.path_templates)
        for method in provider.methods_of(path)
    ]
    return [
        *served,
        *(("POST", path) for path in EMBEDDINGS_PATHS),
        *(("POST", path) for path in AZURE_EMBEDDINGS_PATHS),
        *(("GET", path) for path in MODELS_PATHS),
    ]


async def not_found(request: Request, exc: Exception) -> Response:
    path = request.url.path
    if isinstance(exc, HTTPException) and exc.status_code == 405:
        return error_response(
            path,
            405,
            f"Method {request.method} is not allowed on {path}.",
            code="method_not_allowed",
        )
    served = ", ".join(f"{m} {p}" for m, p in _endpoints() if p.startswith("/v1/"))
    return error_response(
        path,
        404,
        f"Unknown request URL: {request.method} {path}. chaosllm serves {served} and the "
        f"control plane under /__.",
        code="unknown_url",
    )


def create_app(config: ServerConfig | None = None, *, state: ChaosState | None = None) -> Starlette:
    """The ASGI app for a configuration (or an existing state, shared with a controller)."""
    chaos = state or ChaosState.from_config(config or ServerConfig())
    routes = [
        *(
            Route(path, _route(provider), methods=list(provider.methods_of(path)))
            for provider in PROVIDERS.values()
            for path in (*provider.paths, *provider.path_templates)
        ),
        *(Route(path, embeddings, methods=["POST"]) for path in EMBEDDINGS_PATHS),
        *(Route(path, azure_embeddings, methods=["POST"]) for path in AZURE_EMBEDDINGS_PATHS),
        *(Route(path, models, methods=["GET"]) for path in MODELS_PATHS),
        *gemini_routes(),
        *ollama_routes(),
        *live_routes(),
        *mcp_routes(),
        *legacy_routes(),
        Route("/health", health, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        *control_routes(),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if chaos.upstream is not None:
                await chaos.upstream.aclose()
            for server in (chaos.servers or {}).values():
                await server.aclose()

    app = Starlette(
        routes=routes,
        exception_handlers={404: not_found, 405: not_found},
        middleware=[
            Middleware(ErrorEnvelope),
            Middleware(BodyLimit, max_body_bytes=chaos.config.max_body_bytes),
            Middleware(
                ControlGuard,
                token=chaos.config.control_token,
                allow_hosts=chaos.config.allow_hosts,
            ),
            Middleware(Cors, origins=chaos.config.cors),
        ],
        lifespan=lifespan,
    )
    app.state.chaos = chaos
    return app
