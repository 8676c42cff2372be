"""Stage 1: a request body parsed, bound to its path (`Provider.bind`), validated,
redacted and digested, as the recorder keys it; what follows from the body alone
(`Prepared`) is kept in the memo for the same bytes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from chaosllm.core.call import Prepared, ProviderCall, Reply, Request
from chaosllm.core.oracle import precheck, strict_refusal
from chaosllm.core.parse import parse_json
from chaosllm.core.stages import finish
from chaosllm.errors import InvalidRequest
from chaosllm.model import JSON
from chaosllm.providers.base import ErrorKind, Provider

if TYPE_CHECKING:
    from chaosllm.core.engine import Engine

__all__ = ["bind", "carried", "prepare"]

PARSED_COST = 4
"""What a parsed body is taken to hold, per byte of its JSON (the memo's size)."""


def bind(provider: Provider, body: JSON, call: ProviderCall) -> JSON:
    """`body` with what the call's path and query say folded in (`Provider.bind`), for a
    provider with path parameters (the body itself otherwise)."""
    if not provider.path_templates:
        return body
    params = provider.path_params(call.path)
    if params is None:
        if call.path not in provider.paths:
            raise InvalidRequest(f"{call.path} is not a path {provider.name} serves.")
        params = {}
    query = call.query.decode("latin-1")
    if provider.call_headers:
        return provider.bind_headers(body, params, query, call.headers)
    return provider.bind(body, params, query)


def carried(call: ProviderCall) -> tuple[str, ...]:
    """The call's credentials that its body may hold (all of them when it has an escape
    that could hide one): what its keying must redact besides the engine's secrets."""
    if not call.credentials:
        return ()
    raw = call.body
    if raw.find(b"\\") >= 0:
        return call.credentials
    return tuple(c for c in call.credentials if raw.find(c.encode("utf-8")) >= 0)


def _prepared(engine: Engine, call: ProviderCall) -> Prepared:
    provider, raw = call.provider, call.body
    parsed = {} if not raw and provider.bodiless else parse_json(raw)
    body = bind(provider, parsed, call)
    provider.validate(body)
    body = engine.redactor.carrying(carried(call)).request_body(body, raw)
    return Prepared(
        body,
        provider.digest(body),
        provider.wants_stream(body),
        provider.model_of(body),
        tuple(precheck(provider, body)),
    )


def prepare(engine: Engine, call: ProviderCall, turn: int) -> Request | Reply:
    """The request as the engine knows it from its body, or the provider's 400 for a
    body it refuses (and, with ``--strict``, for one the request validator finds a defect
    in)."""
    key: tuple[object, ...] = (call.provider.name, call.path, call.query, call.body, carried(call))
    if call.provider.call_headers:  # what they say is bound into the request
        key += (call.headers,)
    prepared: Prepared | None = engine.memo.get(key)
    if prepared is None:
        try:
            prepared = _prepared(engine, call)
        except InvalidRequest as exc:
            plan = call.provider.render_error(
                400, exc.message, kind=ErrorKind.INVALID_REQUEST, code=exc.code, param=exc.param
            )
            return finish.refused(engine, call, plan, exc.message)
        engine.memo.put(key, prepared, PARSED_COST * len(call.body))
    request = Request(
        call, prepared.body, prepared.digest, prepared.stream, prepared.model, turn, key=key
    )
    findings = [dict(f) for f in prepared.findings]
    request.fields["findings"] = findings
    if findings and engine.config.strict:
        return finish.refuse(engine, request, strict_refusal(findings))
    return request
