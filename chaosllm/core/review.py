"""The review stage: once a recording is chosen, the reviewers registered at the
``review`` hook (`chaosllm.core.hooks`) check the request against it and adapt its answer
to the live run, in order:

- the system-prompt check, for a recording whose request had one (here);
- a trace step's request hints, expected tool results and argument bindings
  (`chaosllm.core.compat.ironclaw`);
- workspace templating and id remapping of the answer (here,
  `chaosllm.store.templating`);
- the answer re-validated against the request's ``json_schema`` response format
  (`chaosllm.core.compat.structured`);
- ``--strict``: a request with a finding of the checks above is refused (here).

A reviewer is a function of a `Reviewing`; it adds findings, replaces the exchange to
serve, or refuses (which ends the review).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from chaosllm.core.oracle import Refusal, Review, strict_refusal
from chaosllm.model import JSON, Exchange, Keying
from chaosllm.providers.base import Provider
from chaosllm.store.matching import Match, Strategy
from chaosllm.store.templating import adapt

__all__ = ["Reviewer", "Reviewing", "adapt_answer", "review", "strict", "system_prompt"]


@dataclass(slots=True)
class Reviewing:
    """A review under way: what the reviewers read, and what they decided so far."""

    provider: Provider
    body: JSON
    match: Match
    workspace: str | None
    strict: bool
    exchange: Exchange
    """The exchange to serve (a reviewer may adapt it)."""
    findings: list[dict[str, Any]]
    """The request's findings: the precheck's, then the reviewers'."""
    checked: int = 0
    """How many findings there were before the review (the precheck's)."""
    refusal: Refusal | None = None


Reviewer = Callable[[Reviewing], None]


def review(
    provider: Provider,
    body: JSON,
    match: Match,
    reviewers: tuple[Reviewer, ...],
    *,
    workspace: str | None,
    strict: bool,
    findings: list[dict[str, Any]],
) -> Review:
    """The exchange to serve for `match`, the findings so far plus the new ones, and the
    refusal to send instead, if any: `reviewers` in order, until one refuses."""
    state = Reviewing(
        provider, body, match, workspace, strict, match.exchange, findings, len(findings)
    )
    for reviewer in reviewers:
        reviewer(state)
        if state.refusal is not None:
            break
    return Review(state.exchange, findings, state.refusal)


def system_prompt(state: Reviewing) -> None:
    """A recording whose request had a system prompt, matched by one without."""
    provider, body, exchange = state.provider, state.body, state.exchange
    if (
        exchange.keyed_by == Keying.REQUEST
        and not provider.has_system_prompt(body)
        and provider.has_system_prompt(exchange.request.body)
    ):
        state.findings.extend(
            f.to_json()
            for f in provider.conversation_findings(body, expects_system=True)
            if f.check == "missing_system_prompt"
        )


def adapt_answer(state: Reviewing) -> None:
    """The answer with the live workspace for ``<WORKSPACE>``, and (for a match that is
    not exact) the request's ids for the recorded ones."""
    exchange, match = state.exchange, state.match
    remap = match.strategy is not Strategy.EXACT and exchange.keyed_by == Keying.REQUEST
    if state.workspace is not None or remap:
        live = match.request if match.request is not None else state.body
        state.exchange, _ = adapt(
            exchange,
            live,
            workspace=state.workspace,
            remap=remap,
            assemble=state.provider.assemble,
        )


def strict(state: Reviewing) -> None:
    """``--strict``: refused with the first finding, when the review found one."""
    if state.strict and len(state.findings) > state.checked:
        state.refusal = strict_refusal(state.findings)
