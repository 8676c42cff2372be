"""IronClaw's trace fixtures (seeds/trace-fixtures.md), at the ``review`` hook: what a
trace step checks of the request that consumes it, and its tool-call arguments resolved
for the live run.

- a step's ``request_hint`` (soft: a warning; compared case-insensitively, as IronClaw's
  TraceLlm does) and ``expected_tool_results`` (compared with the tool messages of the
  request);
- its tool-call arguments: ``$trace_result`` bindings and ``{{call_id.field}}`` /
  ``{{tool:NAME.field}}`` templates, from the tool results of the request
  (`chaosllm.store.templating.resolve_trace_answer`; one that cannot be resolved is
  refused with a 400, the step not consumed).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from chaosllm.core.hooks import Hooks
from chaosllm.core.oracle import Refusal
from chaosllm.core.review import Reviewing
from chaosllm.errors import InvalidRequest
from chaosllm.model import JSON
from chaosllm.providers.base import ErrorKind
from chaosllm.providers.conversation import Finding
from chaosllm.store.formats.trace import fold
from chaosllm.store.templating import resolve_trace_answer

__all__ = ["HOOKS", "trace_answer", "trace_checks", "trace_findings"]


def trace_checks(state: Reviewing) -> None:
    """The step's checks of the request (`trace_findings`)."""
    meta = state.exchange.meta
    if meta:
        state.findings.extend(f.to_json() for f in trace_findings(meta, state.body))


def trace_answer(state: Reviewing) -> None:
    """The step's tool-call arguments resolved from the request's tool results; a 400
    when one cannot be."""
    exchange = state.exchange
    if exchange.meta.get("format") != "trace" or exchange.response.status >= 400:
        return
    try:
        answer = resolve_trace_answer(exchange.response.body, state.body)
    except InvalidRequest as exc:
        message = f"{exchange.meta.get('description') or exchange.name}: {exc.message}"
        state.findings.append(Finding("trace_binding", message, oracle="trace").to_json())
        state.refusal = Refusal(
            400,
            message,
            ErrorKind.INVALID_REQUEST,
            error="trace binding unresolved",
            code="trace_binding",
            headers=(("x-chaosllm-recording", exchange.name),),
        )
        return
    if answer is not exchange.response.body:
        response = replace(exchange.response, body=answer, chunks=None)
        state.exchange = replace(exchange, response=response)


HOOKS = Hooks(review=(trace_checks, trace_answer))


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
