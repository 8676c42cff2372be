"""Between matching and rendering: what chaosllm checks about a request and its answer,
and how it adapts the answer to the live run.

`precheck` runs on every provider request before it is matched: the request
validator, by the provider's own rules (`chaosllm.providers.conversation`).
`review` runs once a recording is matched:

- the system-prompt check, for a recording whose request had one;
- a trace step's ``request_hint`` (soft: a warning; compared case-insensitively, as
  IronClaw's TraceLlm does) and ``expected_tool_results`` (compared with the tool
  messages of the request) (seeds/trace-fixtures.md);
- a trace step's tool-call arguments resolved for the live run: ``$trace_result``
  bindings and ``{{call_id.field}}`` / ``{{tool:NAME.field}}`` templates, from the
  tool results of the request (`chaosllm.store.templating.resolve_trace_arguments`;
  one that cannot be resolved is refused with a 400, the step not consumed);
- workspace templating and id remapping of the answer (`chaosllm.store.templating`);
- the answer re-validated against the request's ``json_schema`` response format
  (`chaosllm.core.structured`): a mismatch is refused with an error saying to re-record.

Findings go to the request's journal entry (``findings``, ``GET /__findings``).
With ``--strict`` a request with any finding is refused with a 400 shaped like
the provider's own (its message and ``param``), before it consumes anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from chaosllm.core.structured import answer_schema_problem
from chaosllm.errors import InvalidRequest
from chaosllm.model import JSON, Exchange, Keying
from chaosllm.providers.base import ErrorKind, Provider
from chaosllm.providers.conversation import Finding
from chaosllm.store.formats.trace import fold
from chaosllm.store.matching import Match, Strategy
from chaosllm.store.templating import adapt, resolve_trace_answer

__all__ = ["Refusal", "Review", "precheck", "review", "strict_refusal", "trace_findings"]


@dataclass(frozen=True, slots=True)
class Refusal:
    """An answer chaosllm gives instead of the recording: an error in the provider's shape."""

    status: int
    message: str
    kind: str
    error: str
    """What the journal says about it."""
    code: str | None = None
    param: str | None = None
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(slots=True)
class Review:
    exchange: Exchange
    """The exchange to serve (adapted to the live run)."""
    findings: list[dict[str, Any]] = field(default_factory=list)
    refusal: Refusal | None = None


def precheck(provider: Provider, body: JSON) -> list[dict[str, Any]]:
    """The request validator's findings about the conversation, by the provider's own
    rules (orphan tool calls and results, role order, doubled messages...)."""
    return [f.to_json() for f in provider.conversation_findings(body)]


def review(
    provider: Provider,
    body: JSON,
    match: Match,
    *,
    workspace: str | None,
    strict: bool,
    findings: list[dict[str, Any]],
) -> Review:
    """Check the request against what the matched recording expects and adapt its answer:
    the exchange to serve, the findings so far plus the new ones, and the refusal to send
    instead, if any."""
    exchange = match.exchange
    found = Review(exchange, findings)
    new: list[Finding] = []
    if (
        exchange.keyed_by == Keying.REQUEST
        and not provider.has_system_prompt(body)
        and provider.has_system_prompt(exchange.request.body)
    ):
        new.extend(
            f
            for f in provider.conversation_findings(body, expects_system=True)
            if f.check == "missing_system_prompt"
        )
    if exchange.meta:
        new.extend(trace_findings(exchange.meta, body))
    findings.extend(f.to_json() for f in new)
    if exchange.meta.get("format") == "trace" and exchange.response.status < 400:
        try:
            answer = resolve_trace_answer(exchange.response.body, body)
        except InvalidRequest as exc:
            message = f"{exchange.meta.get('description') or exchange.name}: {exc.message}"
            findings.append(Finding("trace_binding", message, oracle="trace").to_json())
            found.refusal = Refusal(
                400,
                message,
                ErrorKind.INVALID_REQUEST,
                error="trace binding unresolved",
                code="trace_binding",
                headers=(("x-chaosllm-recording", exchange.name),),
            )
            return found
        if answer is not exchange.response.body:
            response = replace(exchange.response, body=answer, chunks=None)
            exchange = found.exchange = replace(exchange, response=response)

    remap = match.strategy is not Strategy.EXACT and exchange.keyed_by == Keying.REQUEST
    if workspace is not None or remap:
        live = match.request if match.request is not None else body
        exchange, _ = adapt(
            exchange, live, workspace=workspace, remap=remap, assemble=provider.assemble
        )
        found.exchange = exchange

    if exchange.response.status < 400:
        problem = answer_schema_problem(body, exchange.response.body)
        if problem is not None:
            message = (
                f"The recorded answer {exchange.name} "
                f"({exchange.source or 'in memory'}) no longer fits this request: "
                f"{problem}. The schema changed since the answer was recorded: "
                f"re-record it (delete it and run with --mode record-missing)."
            )
            findings.append(
                Finding("schema_mismatch", message, oracle="structured-output").to_json()
            )
            found.refusal = Refusal(
                422,
                message,
                ErrorKind.NO_MATCH,
                error="schema mismatch",
                code="recording_schema_mismatch",
                headers=(("x-chaosllm-recording", exchange.name),),
            )
            return found
    if new and strict:
        found.refusal = strict_refusal(findings)
    return found


def strict_refusal(findings: list[dict[str, Any]]) -> Refusal:
    """`--strict`: the request is refused with its first finding."""
    first = findings[0]
    message = first["message"]
    if len(findings) > 1:
        message += f" (chaosllm --strict: {len(findings)} findings; GET /__findings lists them)"
    return Refusal(
        400,
        message,
        ErrorKind.INVALID_REQUEST,
        error=f"refused by --strict: {first['check']}",
        param=first.get("param"),
        headers=(("x-chaosllm-match", "refused"),),
    )


def _text(content: JSON) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _short(text: str, limit: int = 120) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def trace_findings(meta: Any, body: JSON) -> list[Finding]:
    """A trace step's checks of the request that consumes it: its ``request_hint``
    (warnings: hints are soft) and ``expected_tool_results`` (the tool messages of the
    request must hold those results: a regression otherwise)."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return []
    found: list[Finding] = []
    where = meta.get("description") or "trace step"
    hint = meta.get("request_hint")
    if isinstance(hint, dict):
        contains = hint.get("last_user_message_contains")
        if isinstance(contains, str):
            users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
            last = _text(users[-1].get("content")) if users else ""
            if not users or fold(contains) not in fold(last):
                found.append(
                    Finding(
                        "request_hint",
                        f"{where}: request_hint.last_user_message_contains "
                        f"{contains!r} is not in the last user message "
                        f"({_short(last) if users else 'there is none'})",
                        oracle="trace",
                        severity="warning",
                    )
                )
        least = hint.get("min_message_count")
        if isinstance(least, int) and len(messages) < least:
            found.append(
                Finding(
                    "request_hint",
                    f"{where}: request_hint.min_message_count is {least}, but "
                    f"the request has {len(messages)} messages",
                    oracle="trace",
                    severity="warning",
                )
            )
    expected = meta.get("expected_tool_results")
    if isinstance(expected, list):
        results = {
            m.get("tool_call_id"): m
            for m in messages
            if isinstance(m, dict) and m.get("role") == "tool"
        }
        for item in expected:
            if not isinstance(item, dict):
                continue
            call_id = item.get("tool_call_id")
            actual = results.get(call_id)
            if actual is None:
                found.append(
                    Finding(
                        "expected_tool_result",
                        f"{where}: no tool message answers tool call "
                        f"{call_id!r} ({item.get('name')}), which the "
                        f"trace expects before this call",
                        oracle="trace",
                    )
                )
                continue
            want = item.get("content")
            got = _text(actual.get("content"))
            if isinstance(want, str) and got != want:
                found.append(
                    Finding(
                        "expected_tool_result",
                        f"{where}: the result of tool call {call_id!r} "
                        f"({item.get('name')}) changed: expected "
                        f"{_short(want)}, got {_short(got)}",
                        oracle="trace",
                    )
                )
    return found
