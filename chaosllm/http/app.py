"""The Starlette app: provider endpoints (here) and the control plane (`control`).

A provider route turns a request into a `ResponsePlan`: match a recording,
render it through its provider, let the fault board transform it. The plan is
handed to the wire layer with `PlanResponse`; no route writes to a socket.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from chaosllm.config import Mode, OnMiss, ServerConfig
from chaosllm.core.oracle import precheck, review
from chaosllm.core.state import ChaosState
from chaosllm.errors import InvalidRequest, NoMatch
from chaosllm.faults import (
    FAULT_TYPES,
    FaultContext,
    FaultSpec,
    Fired,
    RequestInfo,
    apply_fault,
)
from chaosllm.http.control import ControlGuard, control_routes
from chaosllm.http.web import SESSION_HEADER, chaos_state, json_body, openai_error
from chaosllm.model import JSON, Exchange, RecordedRequest, RecordedResponse, ResponsePlan
from chaosllm.providers import PROVIDERS, Provider
from chaosllm.providers.base import ErrorKind
from chaosllm.providers.embeddings import embeddings_response
from chaosllm.record.proxy import ProxyCall
from chaosllm.store.matching import Match
from chaosllm.wire import PlanResponse

__all__ = ["create_app", "provider_call"]

log = logging.getLogger("chaosllm")

OPENAI = PROVIDERS["openai.chat"]


async def chat_completions(request: Request) -> Response | PlanResponse | ProxyCall:
    return await provider_call(request, OPENAI)


async def openai_responses(request: Request) -> Response | PlanResponse | ProxyCall:
    return await provider_call(request, PROVIDERS["openai.responses"])


async def anthropic_messages(request: Request) -> Response | PlanResponse | ProxyCall:
    return await provider_call(request, PROVIDERS["anthropic.messages"])


def _exchange_for(provider: Provider, body: JSON, answer: JSON, path: str, digest: str) -> Exchange:
    return Exchange(
        provider=provider.name,
        request=RecordedRequest(method="POST", path=path, body=body),
        response=RecordedResponse(status=200, body=answer),
        digest=digest,
        name="(rendered)",
        scenario="(rendered)",
    )


def _take_fault(
    state: ChaosState,
    provider: Provider,
    body: JSON,
    digest: str,
    info: RequestInfo,
    plan: ResponsePlan,
    answer: JSON,
    journal: dict[str, Any],
) -> tuple[ResponsePlan, Fired | None]:
    """The plan after the fault that fires on this request (if any), consumed from the
    board; the same for a replayed answer and a live upstream one."""

    def render(new_answer: JSON) -> ResponsePlan:
        return provider.render(
            _exchange_for(provider, body, new_answer, info.path, digest),
            body,
            timing=state.config.timing,
        )

    ctx = FaultContext(provider=provider, stream=info.stream, answer=answer, render=render)

    def applies(spec: FaultSpec) -> bool:
        if spec.type in ("malformed_tool_args", "empty_response"):
            if not isinstance(answer, dict):
                return False
            return (
                spec.type != "malformed_tool_args"
                or provider.break_tool_arguments(answer) is not None
            )
        return True

    fired = state.board.take(info, applies)
    if fired is None:
        return plan, None
    faulted = apply_fault(fired.spec, plan, ctx)
    assert faulted is not None
    journal["fault"] = {
        **fired.spec.to_json(),
        "id": fired.fault_id,
        "params": fired.spec.effective_params(),
    }
    return faulted, fired


async def provider_call(request: Request, provider: Provider) -> PlanResponse | ProxyCall:
    """Answer a provider request as the mode says: replay a recording (replay), replay
    it or ask the upstream and record the answer when there is none (record-missing),
    always ask the upstream and record (record), or only ask the upstream (passthrough).
    Armed faults apply in every mode."""
    state = chaos_state(request)
    mode = state.config.mode
    if mode is Mode.RECORD or mode is Mode.PASSTHROUGH:
        return await _proxy_call(request, provider, state, record=mode is Mode.RECORD)
    session = request.headers.get(SESSION_HEADER)
    path = request.url.path
    try:
        body = await json_body(request)
        provider.validate(body)
    except InvalidRequest as exc:
        plan = provider.render_error(
            400, exc.message, kind=ErrorKind.INVALID_REQUEST, code=exc.code, param=exc.param
        )
        entry = state.journal.add(
            session=session,
            method=request.method,
            path=path,
            model=None,
            stream=False,
            digest=None,
            status=400,
            error=exc.message,
        )
        return PlanResponse(plan, entry.report)

    # Keys are computed over the redacted request, as the recorder stores it.
    body = state.redactor.request_body(body, await request.body())
    digest = provider.digest(body)
    stream = provider.wants_stream(body)
    model = body.get("model")
    journal: dict[str, Any] = {
        "session": session,
        "method": request.method,
        "path": path,
        "model": model,
        "stream": stream,
        "digest": digest,
    }
    refusal = precheck(state, provider, body, journal)  # the request validator
    if refusal is not None:
        return refusal
    match: Match | None = None
    try:
        match = state.matcher.match(provider, body, digest, session, consume=False)
        exchange = match.exchange
        journal.update(
            recording=exchange.name, match=match.strategy.value, score=round(match.score, 4)
        )
        extra: tuple[tuple[str, str], ...] = (
            ("x-chaosllm-recording", exchange.name),
            ("x-chaosllm-match", match.strategy.value),
        )
    except NoMatch as exc:
        if mode is Mode.RECORD_MISSING:
            return await _proxy_call(request, provider, state, record=True, body=body, miss=True)
        if state.config.on_miss is not OnMiss.FALLBACK:
            log.warning("miss: %s", exc.explanation)
            plan = provider.render_error(
                404, exc.explanation, kind=ErrorKind.NO_MATCH, code="no_recording"
            )
            entry = state.journal.add(**journal, status=404, miss=True, error="no recording")
            return PlanResponse(
                plan.with_(
                    headers=plan.headers
                    + (("x-chaosllm-match", "miss"), ("x-chaosllm-digest", digest))
                ),
                entry.report,
            )
        log.warning(
            "[chaosllm] unknown request digest %s (model %r): serving the fallback answer",
            digest,
            model,
        )
        exchange = _exchange_for(provider, body, provider.fallback(body, digest), path, digest)
        journal.update(miss=True, match="fallback")
        extra = (("x-chaosllm-match", "fallback"),)

    if match is not None:  # trace checks, templating, structured outputs
        exchange, refusal = review(state, provider, body, match, journal)
        if refusal is not None:
            return refusal
    plan = provider.render(exchange, body, timing=state.config.timing)
    fired = None
    if len(state.board):
        plan, fired = _take_fault(
            state,
            provider,
            body,
            digest,
            RequestInfo(path=path, model=model, session=session, stream=stream),
            plan,
            exchange.response.body,
            journal,
        )
    if match is not None and (fired is None or FAULT_TYPES[fired.type].delivers_answer):
        state.matcher.consume(match, session)
    entry = state.journal.add(**journal, status=plan.status)
    if fired is not None:
        fired.request_seq = entry.seq
    plan = plan.with_(headers=plan.headers + extra + (("x-chaosllm-digest", digest),))
    return PlanResponse(plan, entry.report)


_UNPARSED: Any = object()


async def _proxy_call(
    request: Request,
    provider: Provider,
    state: ChaosState,
    *,
    record: bool,
    body: JSON = _UNPARSED,
    miss: bool = False,
) -> ProxyCall:
    """A request answered by the upstream: passed through (and recorded when `record`),
    or, when an armed fault may fire on it, read whole and faulted like a replay."""
    assert state.upstream is not None
    session = request.headers.get(SESSION_HEADER)
    path = request.url.path
    raw = await request.body()
    problem = None
    if body is _UNPARSED:
        # The upstream is the judge of the request: it is forwarded as it is, and only
        # recorded (and faulted) when it is a JSON object that can be keyed.
        try:
            parsed = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            parsed = None
        body = state.redactor.request_body(parsed, raw) if isinstance(parsed, dict) else None
        if body is None:
            problem = "the request body is not a JSON object: forwarded, not recorded"
    digest = provider.digest(body) if body is not None else None
    stream = provider.wants_stream(body)
    model = body.get("model") if body is not None else None
    model = model if isinstance(model, str) else None
    journal: dict[str, Any] = {
        "session": session,
        "method": request.method,
        "path": path,
        "model": model,
        "stream": stream,
        "digest": digest,
        "match": "upstream",
        "miss": miss,
        "error": problem,
    }
    entry = state.journal.add(**journal, status=0)
    info = RequestInfo(path=path, model=model, session=session, stream=stream)

    fault_hook = None
    if body is not None and len(state.board) and state.board.may_fire(info):

        def fault_hook(plan: ResponsePlan, answer: JSON) -> ResponsePlan:
            found: dict[str, Any] = {}
            assert digest is not None
            faulted, fired = _take_fault(state, provider, body, digest, info, plan, answer, found)
            if fired is not None:
                fired.request_seq = entry.seq
                entry.fault = found["fault"]
                entry.status = faulted.status
            return faulted

    recorder = None
    if record and body is not None:

        def recorder(exchange: Exchange) -> Exchange:
            return state.record(exchange, session)

    extra: tuple[tuple[str, str], ...] = (("x-chaosllm-match", "upstream"),)
    if digest is not None:
        extra += (("x-chaosllm-digest", digest),)
    return ProxyCall(
        upstream=state.upstream,
        provider=provider,
        method=request.method,
        path=path,
        query=request.scope.get("query_string", b""),
        headers=request.scope["headers"],
        content=raw,
        body=body,
        entry=entry,
        redactor=state.redactor,
        fault_hook=fault_hook,
        recorder=recorder,
        timing=state.config.timing,
        extra_headers=extra,
    )


async def embeddings(request: Request) -> Response:
    try:
        return JSONResponse(embeddings_response(await json_body(request)))
    except InvalidRequest as exc:
        return openai_error(400, exc.message, code=exc.code, param=exc.param)


async def models(request: Request) -> Response:
    if "anthropic-version" in request.headers:  # the Anthropic SDK: its own list shape
        ids = chaos_state(request).store.models()
        listed = [
            {
                "type": "model",
                "id": model,
                "display_name": model,
                "created_at": "1970-01-01T00:00:00Z",
            }
            for model in ids
        ]
        return JSONResponse(
            {
                "data": listed,
                "has_more": False,
                "first_id": ids[0] if ids else None,
                "last_id": ids[-1] if ids else None,
            }
        )
    data = [
        {"id": model, "object": "model", "created": 0, "owned_by": "chaosllm"}
        for model in chaos_state(request).store.models()
    ]
    return JSONResponse({"object": "list", "data": data})


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok", "recordings": len(chaos_state(request).store.exchanges)})


async def not_found(request: Request, exc: Exception) -> Response:
    if isinstance(exc, HTTPException) and exc.status_code == 405:
        return openai_error(
            405,
            f"Method {request.method} is not allowed on {request.url.path}.",
            code="method_not_allowed",
        )
    return openai_error(
        404,
        f"Unknown request URL: {request.method} {request.url.path}. "
        f"chaosllm serves POST /v1/chat/completions, POST /v1/messages, "
        f"POST /v1/responses, POST /v1/embeddings, GET /v1/models and "
        f"the control plane under /__.",
        code="unknown_url",
    )


def create_app(config: ServerConfig | None = None, *, state: ChaosState | None = None) -> Starlette:
    """The ASGI app for a configuration (or an existing state, shared with a controller)."""
    chaos = state or ChaosState.from_config(config or ServerConfig())
    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/responses", openai_responses, methods=["POST"]),
        Route("/responses", openai_responses, methods=["POST"]),
        Route("/v1/messages", anthropic_messages, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/embeddings", embeddings, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        *control_routes(),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if chaos.upstream is not None:
                await chaos.upstream.aclose()

    app = Starlette(
        routes=routes,
        exception_handlers={404: not_found, 405: not_found},
        middleware=[Middleware(ControlGuard, token=chaos.config.control_token)],
        lifespan=lifespan,
    )
    app.state.chaos = chaos
    return app
