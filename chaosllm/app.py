"""The Starlette app: provider endpoints (here) and the control plane (`control`).

A provider route turns a request into a `ResponsePlan`: match a recording,
render it through its provider, let the fault board transform it. The plan is
handed to the wire layer with `PlanResponse`; no route writes to a socket.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from chaosllm.config import OnMiss, ServerConfig
from chaosllm.control import ControlGuard, control_routes
from chaosllm.embeddings import embeddings_response
from chaosllm.errors import InvalidRequest, NoMatch
from chaosllm.faults import FAULT_TYPES, FaultContext, FaultSpec, RequestInfo, apply_fault
from chaosllm.matching import Match
from chaosllm.model import JSON, Exchange, RecordedRequest, RecordedResponse, ResponsePlan
from chaosllm.providers import PROVIDERS, Provider
from chaosllm.providers.base import ErrorKind
from chaosllm.state import ChaosState
from chaosllm.web import SESSION_HEADER, chaos_state, json_body, openai_error
from chaosllm.wire import PlanResponse

__all__ = ["create_app", "provider_call"]

log = logging.getLogger("chaosllm")

OPENAI = PROVIDERS["openai.chat"]


async def chat_completions(request: Request) -> Response | PlanResponse:
    return await provider_call(request, OPENAI)


def _exchange_for(provider: Provider, body: JSON, answer: JSON, path: str,
                  digest: str) -> Exchange:
    return Exchange(provider=provider.name,
                    request=RecordedRequest(method="POST", path=path, body=body),
                    response=RecordedResponse(status=200, body=answer),
                    digest=digest, name="(rendered)", scenario="(rendered)")


async def provider_call(request: Request, provider: Provider) -> PlanResponse:
    state = chaos_state(request)
    session = request.headers.get(SESSION_HEADER)
    path = request.url.path
    try:
        body = await json_body(request)
        provider.validate(body)
    except InvalidRequest as exc:
        plan = provider.render_error(400, exc.message, kind=ErrorKind.INVALID_REQUEST,
                                     code=exc.code, param=exc.param)
        entry = state.journal.add(session=session, method=request.method, path=path,
                                  model=None, stream=False, digest=None, status=400,
                                  error=exc.message)
        return PlanResponse(plan, entry.report)

    digest = provider.digest(body)
    stream = provider.wants_stream(body)
    model = body.get("model")
    journal: dict[str, Any] = {"session": session, "method": request.method, "path": path,
                               "model": model, "stream": stream, "digest": digest}
    match: Match | None = None
    try:
        match = state.matcher.match(provider, body, digest, session, consume=False)
        exchange = match.exchange
        journal.update(recording=exchange.name, match=match.strategy.value,
                       score=round(match.score, 4))
        extra: tuple[tuple[str, str], ...] = (("x-chaosllm-recording", exchange.name),
                 ("x-chaosllm-match", match.strategy.value))
    except NoMatch as exc:
        if state.config.on_miss is not OnMiss.FALLBACK:
            log.warning("miss: %s", exc.explanation)
            plan = provider.render_error(404, exc.explanation, kind=ErrorKind.NO_MATCH,
                                         code="no_recording")
            entry = state.journal.add(**journal, status=404, miss=True, error="no recording")
            return PlanResponse(plan.with_(headers=plan.headers + (
                ("x-chaosllm-match", "miss"), ("x-chaosllm-digest", digest))), entry.report)
        log.warning("[chaosllm] unknown request digest %s (model %r): serving the fallback "
                    "answer", digest, model)
        exchange = _exchange_for(provider, body, provider.fallback(body, digest), path, digest)
        journal.update(miss=True, match="fallback")
        extra = (("x-chaosllm-match", "fallback"),)

    plan = provider.render(exchange, body, timing=state.config.timing)
    fired = None
    if len(state.board):
        answer = exchange.response.body

        def render(new_answer: JSON) -> ResponsePlan:
            return provider.render(_exchange_for(provider, body, new_answer, path, digest),
                                   body, timing=state.config.timing)

        ctx = FaultContext(provider=provider, stream=stream, answer=answer, render=render)

        def applies(spec: FaultSpec) -> bool:
            return spec.type != "malformed_tool_args" or \
                provider.break_tool_arguments(answer) is not None

        fired = state.board.take(RequestInfo(path=path, model=model, session=session,
                                             stream=stream), applies)
        if fired is not None:
            faulted = apply_fault(fired.spec, plan, ctx)
            assert faulted is not None
            plan = faulted
            journal["fault"] = {**fired.spec.to_json(), "id": fired.fault_id,
                                "params": fired.spec.effective_params()}
    if match is not None and (fired is None or FAULT_TYPES[fired.type].delivers_answer):
        state.matcher.consume(match, session)
    entry = state.journal.add(**journal, status=plan.status)
    if fired is not None:
        fired.request_seq = entry.seq
    plan = plan.with_(headers=plan.headers + extra + (("x-chaosllm-digest", digest),))
    return PlanResponse(plan, entry.report)


async def embeddings(request: Request) -> Response:
    try:
        return JSONResponse(embeddings_response(await json_body(request)))
    except InvalidRequest as exc:
        return openai_error(400, exc.message, code=exc.code, param=exc.param)


async def models(request: Request) -> Response:
    data = [{"id": model, "object": "model", "created": 0, "owned_by": "chaosllm"}
            for model in chaos_state(request).store.models()]
    return JSONResponse({"object": "list", "data": data})


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok", "recordings": len(chaos_state(request).store.exchanges)})


async def not_found(request: Request, exc: Exception) -> Response:
    if isinstance(exc, HTTPException) and exc.status_code == 405:
        return openai_error(405, f"Method {request.method} is not allowed on "
                                 f"{request.url.path}.", code="method_not_allowed")
    return openai_error(404, f"Unknown request URL: {request.method} {request.url.path}. "
                             f"chaosllm serves POST /v1/chat/completions, POST /v1/embeddings, "
                             f"GET /v1/models and the control plane under /__.",
                        code="unknown_url")


def create_app(config: ServerConfig | None = None, *, state: ChaosState | None = None) -> Starlette:
    """The ASGI app for a configuration (or an existing state, shared with a controller)."""
    chaos = state or ChaosState.from_config(config or ServerConfig())
    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/embeddings", embeddings, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        *control_routes(),
    ]
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found},
                    middleware=[Middleware(ControlGuard, token=chaos.config.control_token)])
    app.state.chaos = chaos
    return app
