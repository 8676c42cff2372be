"""Structured outputs, at the ``review`` hook: the answer to serve re-validated against the
request's ``json_schema`` response format (`chaosllm.core.structured`); a mismatch is
refused with a 422 saying to re-record (the schema changed since the recording)."""

from __future__ import annotations

from chaosllm.core.hooks import Hooks
from chaosllm.core.oracle import Refusal
from chaosllm.core.review import Reviewing
from chaosllm.core.structured import answer_schema_problem
from chaosllm.providers.base import ErrorKind
from chaosllm.providers.conversation import Finding

__all__ = ["HOOKS", "schema_check"]


def schema_check(state: Reviewing) -> None:
    exchange = state.exchange
    if exchange.response.status >= 400:
        return
    problem = answer_schema_problem(state.body, exchange.response.body)
    if problem is None:
        return
    message = (
        f"The recorded answer {exchange.name} "
        f"({exchange.source or 'in memory'}) no longer fits this request: "
        f"{problem}. The schema changed since the answer was recorded: "
        f"re-record it (delete it and run with --mode record-missing)."
    )
    state.findings.append(Finding("schema_mismatch", message, oracle="structured-output").to_json())
    state.refusal = Refusal(
        422,
        message,
        ErrorKind.NO_MATCH,
        error="schema mismatch",
        code="recording_schema_mismatch",
        headers=(("x-chaosllm-recording", exchange.name),),
    )


HOOKS = Hooks(review=(schema_check,))
