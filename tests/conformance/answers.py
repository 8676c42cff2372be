"""Everything chaosllm answers, gathered in memory for the conformance tests: every
shipped recording served as JSON and streamed, and every fault of the catalogue armed
(its defaults, or the parameters it needs) on a JSON and a streamed request, per
provider. Each answer is split into what a client parses: a JSON body, or the payloads
of a stream's whole frames, each marked as an answer or an error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from chaosllm.config import ServerConfig
from chaosllm.core.clock import ManualClock
from chaosllm.core.engine import Engine, ProviderCall, Reply
from chaosllm.faults import FAULT_TYPES, parse_fault_specs
from chaosllm.model import Exchange
from chaosllm.paths import shipped_dir
from chaosllm.providers import PROVIDERS
from chaosllm.providers.sse import iter_events
from chaosllm.store.recordings import RecordingStore

__all__ = ["Payload", "payloads"]

STORE = RecordingStore.load([shipped_dir("recordings")])

FAULT_PARAMS: dict[str, dict[str, Any]] = {
    "http_error": {"status": 500},
    "error_in_200": {"after_chunks": 2},
    "overloaded": {"after_chunks": 2},
}
"""Parameters a fault needs to render its error in a stream (or at all)."""
GATEWAY_FAULTS = frozenset(
    {"openrouter_credits", "openrouter_midstream_error", "vllm_stream_error"}
)
"""Faults that answer as a gateway in front of the provider does (OpenRouter, vLLM:
`chaosllm.faults.gateway`), in the gateway's shape: not the provider's description."""
EXTRA_FAULTS: tuple[dict[str, Any], ...] = (
    {"type": "http_error", "status": 400},
    {"type": "http_error", "status": 401},
    {"type": "http_error", "status": 404},
    {"type": "http_error", "status": 501},
    {"type": "http_429", "retry_after": 7},
    {"type": "overloaded"},
    {"type": "error_in_200"},
)


@dataclass(frozen=True)
class Payload:
    provider: str
    source: str
    """The recording and the fault (if any) that made it."""
    kind: str
    """``answer``, ``chunk`` (a frame of a stream), ``error`` (a JSON error body) or
    ``error_event`` (an error inside a stream)."""
    event: str | None
    """The frame's ``event:`` name (SSE), None otherwise."""
    data: Any
    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()


def _paths(exchange: Exchange) -> tuple[str, str, str, str]:
    """(JSON path, its query, stream path, its query) of the recorded request."""
    path = exchange.request.path
    query = "api-version=2024-10-21" if "/deployments/" in path else ""
    if exchange.provider == "gemini.generate_content":
        path = path.replace(":streamGenerateContent", ":generateContent")
        return path, "", path.replace(":generateContent", ":streamGenerateContent"), "alt=sse"
    if exchange.provider == "bedrock.converse":
        return path, "", path.replace("/converse", "/converse-stream"), ""
    return path, query, path, query


def _call(exchange: Exchange, stream: bool) -> ProviderCall:
    json_path, json_query, stream_path, stream_query = _paths(exchange)
    body = dict(exchange.request.body)
    body["stream"] = stream
    if stream and exchange.provider in ("openai.chat", "azure.chat"):
        body["stream_options"] = {"include_usage": True}
    if exchange.provider == "bedrock.converse":
        body.pop("stream")
    return ProviderCall(
        provider=PROVIDERS[exchange.provider],
        path=stream_path if stream else json_path,
        query=(stream_query if stream else json_query).encode(),
        body=json.dumps(body).encode(),
    )


def _frames(provider: str, reply: Reply) -> Iterator[tuple[str | None, Any]]:
    codec = PROVIDERS[provider].codec
    for piece in reply.plan.pieces:
        if not piece.frame:
            continue
        text = codec.frame_text(piece.data)
        if provider.startswith("ollama."):
            yield None, json.loads(text)
        elif provider == "bedrock.converse":
            yield _bedrock_event(piece.data)
        else:
            for name, data in iter_events([text]):
                if data.strip() != "[DONE]":
                    yield name, json.loads(data)


def _bedrock_event(data: bytes) -> tuple[str | None, Any]:
    from chaosllm.providers import eventstream as es

    message, _ = es.decode_message(data)
    headers = {h.name: h.value for h in message.headers}
    name = headers.get(":event-type") or headers.get(":exception-type")
    return str(name), json.loads(message.payload or b"{}")


def _is_error(provider: str, name: str | None, data: Any) -> bool:
    if not isinstance(data, dict):
        return False
    if provider == "bedrock.converse":
        return "xception" in str(name) or set(data) == {"message"}
    return data.get("type") == "error" or ("error" in data and len(data) <= 2)


def _split(provider: str, source: str, reply: Reply, stream: bool) -> Iterator[Payload]:
    plan = reply.plan
    if not plan.send_head:
        return
    if stream and any(p.frame for p in plan.pieces) and plan.status < 400:
        try:
            frames = list(_frames(provider, reply))
        except ValueError:
            return  # a fault that garbles the frames (garbage, split bytes): not an answer
        for name, data in frames:
            kind = "error_event" if _is_error(provider, name, data) else "chunk"
            yield Payload(provider, source, kind, name, data, plan.status, plan.headers)
        return
    if plan.ending.name != "COMPLETE" or plan.close_after:
        return  # the client gets part of the body: nothing whole to parse
    try:
        data = json.loads(plan.body())
    except ValueError:
        return  # a fault that breaks the body (truncated, garbage): nothing to parse
    kind = "error" if plan.status >= 400 or _is_error(provider, None, data) else "answer"
    yield Payload(provider, source, kind, None, data, plan.status, plan.headers)


def _reply(engine: Engine, exchange: Exchange, stream: bool) -> Reply:
    reply = engine.handle(_call(exchange, stream))
    assert isinstance(reply, Reply), reply
    return reply


@cache
def payloads(provider: str) -> tuple[Payload, ...]:
    """Every payload chaosllm answers a client of `provider` with (see the module doc)."""
    out: list[Payload] = []
    exchanges = [e for group in STORE.by_digest.values() for e in group if e.provider == provider]
    specs: list[dict[str, Any]] = [
        {"type": name, **FAULT_PARAMS.get(name, {})}
        for name in sorted(FAULT_TYPES)
        if name not in GATEWAY_FAULTS
    ]
    specs += EXTRA_FAULTS
    for exchange in exchanges:
        for stream in (False, True):
            engine = Engine(ServerConfig(recordings=[]), STORE, clock=ManualClock())
            out += _split(provider, exchange.name, _reply(engine, exchange, stream), stream)
    first = exchanges[0]
    tool = next((e for e in exchanges if "tool" in e.name), first)
    for spec in specs:
        for exchange in {first.name: first, tool.name: tool}.values():
            for stream in (False, True):
                engine = Engine(ServerConfig(recordings=[]), STORE, clock=ManualClock())
                try:
                    engine.board.arm(parse_fault_specs(spec))
                except ValueError:
                    continue  # a fault that needs parameters this table does not give
                reply = engine.handle(_call(exchange, stream))
                if not isinstance(reply, Reply) or reply.fired is None:
                    continue
                source = f"{exchange.name} + {spec['type']}"
                out += _split(provider, source, reply, stream)
    # chaosllm's own: a miss (404) and a body the API refuses (400).
    engine = Engine(ServerConfig(recordings=[]), STORE, clock=ManualClock())
    miss = engine.handle(_call_with(first, {"model": first.request.body.get("model")}))
    if isinstance(miss, Reply):
        out += _split(provider, "a miss", miss, False)
    return tuple(out)


def _call_with(exchange: Exchange, body: dict[str, Any]) -> ProviderCall:
    call = _call(exchange, False)
    return ProviderCall(
        provider=call.provider, path=call.path, query=call.query, body=json.dumps(body).encode()
    )
