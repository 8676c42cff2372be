"""Stage 3: the request checked against the chosen recording and its answer adapted to
the live run (`chaosllm.core.review`, the ``review`` hooks); a refusal answers instead.
For an exact match of a stored recording the review is a function of the request's
bytes, the recording, the workspace and ``--strict`` alone: the memo keeps it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chaosllm.core.call import Chosen, Reply, Request
from chaosllm.core.oracle import Review
from chaosllm.core.review import review as run_review
from chaosllm.core.stages import finish
from chaosllm.store.matching import Strategy

if TYPE_CHECKING:
    from chaosllm.core.engine import Engine

__all__ = ["review"]

REVIEW_COST = 1024
"""What a kept review holds besides the request's bytes (its findings, an adapted
exchange shares the recording's parts)."""


def review(engine: Engine, request: Request, chosen: Chosen) -> Chosen | Reply:
    match = chosen.match
    if match is None:
        return chosen
    findings: list[dict[str, Any]] = request.fields["findings"]
    workspace, strict = engine.matcher.workspace, engine.config.strict
    key = None
    if match.strategy is Strategy.EXACT and match.request is None and request.key is not None:
        key = ("review", request.key, match.exchange.key, workspace, strict)
        kept: tuple[Review, int] | None = engine.memo.get(key)
        if kept is not None:
            checked, before = kept
            findings.extend(dict(f) for f in checked.findings[before:])
            return _decided(engine, request, chosen, checked)
    before = len(findings)
    checked = run_review(
        request.call.provider,
        request.body,
        match,
        engine.hooks.review,
        workspace=workspace,
        strict=strict,
        findings=findings,
    )
    if key is not None:
        copied = Review(checked.exchange, [dict(f) for f in findings], checked.refusal)
        engine.memo.put(key, (copied, before), len(request.call.body) + REVIEW_COST)
    return _decided(engine, request, chosen, checked)


def _decided(engine: Engine, request: Request, chosen: Chosen, checked: Review) -> Chosen | Reply:
    if checked.refusal is not None:
        return finish.refuse(engine, request, checked.refusal)
    if checked.exchange is chosen.exchange:
        return chosen
    return Chosen(checked.exchange, chosen.match, chosen.headers)
