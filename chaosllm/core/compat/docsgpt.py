"""DocsGPT's mock LLM (`chaosllm.core.mock_llm`), registered at the engine's hooks.

In the hash-keyed mode (hash-keyed fixtures answer the chat protocol's requests) its
in-band directives win over any fixture (``before_match``), a miss first looks for a
``<hash>.json`` saved since the load and logs the stub's two lines (``on_miss``), the
canned answer is the stub's (``fallback``); in any mode a directive answers a chat
request no recording matches, a fixture echoes the request's model (``exchange``), and
the stub's delay headers become the plan's latency (``plan``). (Its permissive CORS is
``--cors '*'``: `chaosllm.http.cors`.)
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from chaosllm.core import mock_llm
from chaosllm.core.call import Chosen, Decision, Headers, Request
from chaosllm.core.hooks import Hooks
from chaosllm.model import Exchange, ResponsePlan

if TYPE_CHECKING:
    from chaosllm.core.engine import Engine

__all__ = ["HOOKS"]

log = logging.getLogger("chaosllm")

CHAT = "openai.chat"
"""The protocol DocsGPT's stub speaks."""

_DIRECTED: Headers = (("x-chaosllm-match", "directive"),)


def _hash_keyed(engine: Engine, request: Request) -> bool:
    return mock_llm.hash_keyed_mode(engine.store.alias_keyings, request.call.provider.name)


def _directed(request: Request) -> Chosen | None:
    """The answer a DocsGPT in-band directive pins, if any."""
    directed = mock_llm.directive_exchange(request.body)
    if directed is None:
        return None
    request.fields.update(match="directive")
    return Chosen(directed, None, _DIRECTED)


def directives(engine: Engine, request: Request) -> Chosen | None:
    """In the hash-keyed mode, a directive wins over any fixture."""
    if mock_llm.MARKER not in request.call.body or not _hash_keyed(engine, request):
        return None
    return _directed(request)


def on_miss(engine: Engine, request: Request) -> Decision | None:
    """A chat request no recording answers, as DocsGPT's stub would answer it: by an
    in-band directive, or by a ``<hash>.json`` saved into a recordings directory since
    the load (learnt, then the request handled again); else the stub's log lines."""
    call = request.call
    if call.provider.name != CHAT:
        return None
    hash_keyed = _hash_keyed(engine, request)
    if mock_llm.MARKER in call.body and not hash_keyed:  # (tried before matching)
        directed = _directed(request)
        if directed is not None:
            return engine.answer(request, directed)
    added = mock_llm.added_fixture(engine.store.dirs, request.body)
    key = (call.provider.name, added[0].keyed_by, added[0].digest) if added else None
    if key is not None and key not in engine.store.by_alias:
        for exchange in added:
            engine.learn(exchange)
        log.info("[mock-llm] loaded fixture %s saved while serving", added[0].source)
        return engine.handle(call, turn=request.turn)
    if hash_keyed:
        mock_llm.log_miss(request.body)
    return None


def fallback(engine: Engine, request: Request) -> Exchange | None:
    """The stub's generic answer, in the hash-keyed mode."""
    if request.call.provider.name != CHAT or not _hash_keyed(engine, request):
        return None
    return mock_llm.fallback_exchange(request.body)


def for_request(engine: Engine, request: Request, exchange: Exchange) -> Exchange:
    return mock_llm.for_request(exchange, request.body)


def delays(engine: Engine, request: Request, plan: ResponsePlan) -> ResponsePlan:
    headers = request.call.headers
    return mock_llm.delayed(plan, headers) if headers else plan


HOOKS = Hooks(
    before_match=(directives,),
    on_miss=(on_miss,),
    fallback=(fallback,),
    exchange=(for_request,),
    plan=(delays,),
)
