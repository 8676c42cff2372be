"""Checks that a resilience property test asserts, from the server's journal and
the client's result.

    result = call_within(10, my_client.ask, "What is the capital of France?")
    assert_recovered(result, expected)
    journal = chaosllm.requests()
    assert_attempts(journal, len(schedule) + 1)
    assert_retry_after_honoured(journal)

Each check raises `ResilienceViolation` (an `AssertionError`) whose message
says what was seen and, where it helps, prints the journal.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from chaosllm.errors import Hung, ResilienceViolation

__all__ = [
    "Hung",
    "ResilienceViolation",
    "assert_attempts",
    "assert_no_duplicate_tool_execution",
    "assert_no_silent_truncation",
    "assert_recovered",
    "assert_retry_after_honoured",
    "attempts",
    "call_within",
    "format_journal",
    "retry_after_of",
]

T = TypeVar("T")
Journal = Sequence[Mapping[str, Any]]


def format_journal(journal: Journal) -> str:
    """The journal as short lines: seq, session, status, recording, fault, frames, outcome."""
    lines = []
    for e in journal:
        fault = e.get("fault")
        label = (
            f"{fault['type']}{json.dumps(fault.get('params') or {}, sort_keys=True)}"
            if fault
            else "-"
        )
        lines.append(
            f"  #{e['seq']} session={e.get('session')} status={e['status']} "
            f"recording={e.get('recording')} fault={label} "
            f"frames={e.get('frames_sent')} outcome={e.get('outcome')}"
        )
    return "\n".join(lines) or "  (no requests)"


def attempts(journal: Journal, *, session: str | None = None) -> int:
    """How many provider requests the server saw (of one session, if given)."""
    return sum(1 for e in journal if session is None or e.get("session") == session)


def assert_attempts(journal: Journal, expected: int, *, session: str | None = None) -> None:
    seen = attempts(journal, session=session)
    if seen != expected:
        raise ResilienceViolation(
            f"the server saw {seen} attempts, expected {expected}:\n" + format_journal(journal)
        )


def assert_recovered(result: Any, expected: Any) -> None:
    """The call returned exactly the fault-free answer."""
    if result != expected:
        raise ResilienceViolation(
            f"the call did not recover the fault-free answer:\n"
            f"  got:      {result!r}\n  expected: {expected!r}"
        )


def retry_after_of(entry: Mapping[str, Any]) -> float | None:
    """The Retry-After (seconds) a journal entry's answer carried, if any."""
    fault = entry.get("fault")
    if not fault:
        return None
    value = (fault.get("params") or {}).get("retry_after")
    return float(value) if isinstance(value, (int, float)) else None


def assert_retry_after_honoured(journal: Journal, *, tolerance: float = 0.01) -> None:
    """Every answer with Retry-After was followed, in its session, by an attempt no sooner
    than that many seconds later (minus `tolerance` for clock granularity)."""
    by_session: dict[Any, list[Mapping[str, Any]]] = {}
    for entry in journal:
        by_session.setdefault(entry.get("session"), []).append(entry)
    for entries in by_session.values():
        for before, after in itertools.pairwise(entries):
            wait = retry_after_of(before)
            if wait is None:
                continue
            gap = after["monotonic"] - before["monotonic"]
            if gap + tolerance < wait:
                raise ResilienceViolation(
                    f"request #{after['seq']} came {gap:.3f} s after #{before['seq']}, whose "
                    f"answer said Retry-After {wait:g} s:\n" + format_journal(journal)
                )


def assert_no_silent_truncation(chunks: Iterable[Any], *, accepted: bool = True) -> None:
    """A stream that the client accepted (returned as an answer) must have ended with a
    finish reason. `chunks` are the SDK's chunk objects or chunk dicts."""
    if not accepted:
        return
    finish = None
    for chunk in chunks:
        choices = (
            chunk.get("choices") if isinstance(chunk, Mapping) else getattr(chunk, "choices", None)
        )
        for choice in choices or []:
            reason = (
                choice.get("finish_reason")
                if isinstance(choice, Mapping)
                else getattr(choice, "finish_reason", None)
            )
            finish = reason or finish
    if finish is None:
        raise ResilienceViolation(
            "the client accepted a stream that ended without a finish "
            "reason: a truncated answer was taken for a whole one"
        )


def assert_no_duplicate_tool_execution(executed_tool_call_ids: Iterable[str]) -> None:
    """Each tool call (by id) was executed at most once."""
    counts = Counter(executed_tool_call_ids)
    doubled = {call_id: n for call_id, n in counts.items() if n > 1}
    if doubled:
        raise ResilienceViolation(f"tool calls executed more than once: {doubled}")


def call_within(seconds: float, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` in a helper thread, or `Hung` after `seconds`.

    The call's exception, if any, is re-raised here. A hung call's thread is left
    behind (daemon): Python cannot stop it, and the point is to report the hang.
    """
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # re-raised in the caller
            outcome["error"] = exc
        finally:
            done.set()

    thread = threading.Thread(target=run, name="chaosllm-call-within", daemon=True)
    thread.start()
    if not done.wait(seconds):
        raise Hung(f"the call did not finish within {seconds:g} s")
    if "error" in outcome:
        raise outcome["error"]
    value: T = outcome["value"]
    return value
