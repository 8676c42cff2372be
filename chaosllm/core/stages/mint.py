"""Stage 6: a recording served to a session again gets fresh ids (seeded by the server
seed, the session, the recording and how often it was served), as a real API mints new
ones in every answer; the session's later requests that echo them are keyed as recorded
(`echoed`). Requests without a session always get the recording as it is."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from chaosllm.core.call import Answer, Chosen, ProviderCall, Request
from chaosllm.providers.base import swap_strings

if TYPE_CHECKING:
    from chaosllm.core.engine import Engine

__all__ = ["echoed", "mint"]


def echoed(engine: Engine, call: ProviderCall) -> ProviderCall:
    """`call` with the fresh ids its session's answers carried turned back into the
    recorded ones."""
    minted = engine.sessions.minted(call.session)
    if not minted:
        return call
    body = call.provider.recorded_ids(call.body, minted)
    return call if body == call.body else replace(call, body=body)


def mint(engine: Engine, request: Request, chosen: Chosen, answer: Answer, faultable: bool) -> None:
    """Fresh ids on `answer` for a recording the session was served before; the answer
    a fault sees carries them too when one may fire (`faultable`)."""
    session = request.call.session
    if session is None:
        return
    request.keep = False  # how often the session was served decides the ids
    match = chosen.match
    if match is None or not match.serves:
        return
    provider = request.call.provider
    template = None
    if answer.rendering is not None:  # a stored recording's rendering: its template kept
        kept = ("ids", answer.rendering)
        template = engine.memo.get(kept)
        if template is None:
            template = provider.id_template(answer.plan, answer.answer)
            engine.memo.put(kept, template, answer.plan.body_length)
    key = f"{engine.config.seed}:{session!r}:{answer.exchange.name}:{match.serves}"
    pieces, fresh = provider.fresh_ids(answer.plan, answer.answer, key, template)
    if not fresh:
        return
    engine.sessions.mint(session, fresh)
    answer.pieces = pieces
    if faultable:
        answer.answer = swap_strings(answer.answer, fresh)
