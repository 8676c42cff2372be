"""Trace fixtures (seeds/trace-fixtures.md): ordered LLM answers, replayed in order.

A trace is ``{"model_name": ..., "turns": [{"user_input": ..., "steps": [...]}]}``
or, in the legacy flat format, ``{"model_name": ..., "steps": [...]}`` (one turn
with a placeholder user message). Each step's ``response`` is ``text``,
``tool_calls`` or ``user_input``; ``user_input`` steps are markers of what the
user said, not LLM calls, and are skipped. Every other step becomes one
exchange, and the file one scenario whose exchanges are in call order
(`Keying.SEQUENCE`: a trace records answers, not requests, so only the sequence
matcher serves them -- the next unserved step of the session's trace, chosen
without ``POST /__scenario`` when the request's model is the trace's
``model_name`` or when only one trace is loaded). Which step is "next" is
`next_step`'s, as IronClaw's ``TraceLlm`` picks it: a later step whose
``request_hint`` fits serves a thread interleaved with another, and a request
that offers no tools gets the next ``text`` step. A flat trace's ``user_input``
markers split it into turns (as ``TraceLlm`` does), and a top-level ``usage``
object is kept with the trace's context.

What a step says about the request it answers is kept in the exchange's meta
and checked on replay (`chaosllm.core.oracle`): ``request_hint`` (soft: a warning
finding in the journal) and ``expected_tool_results`` (compared with the tool
messages of the request: a finding when one is missing or changed). What the
trace says about the whole run -- ``memory_snapshot``, ``http_exchanges``,
``expects`` and each turn's ``user_input`` and ``expects`` -- is kept in the
first exchange's ``meta["scenario_info"]`` (`RecordingStore.scenario_info`,
``GET /__recordings``), and so survives ``chaosllm import``.

Answers are ``chat.completion`` bodies: ``text`` as the message content with
``finish_reason: "stop"``, ``tool_calls`` as OpenAI tool calls (arguments
serialised to a JSON string) with ``finish_reason: "tool_calls"``, and
``input_tokens``/``output_tokens`` as the usage.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from chaosllm.errors import RecordingError
from chaosllm.model import JSON, Exchange, Keying, RecordedRequest, RecordedResponse
from chaosllm.store.formats.base import FixtureFormat, by_content, run_parser

__all__ = ["FORMAT", "hint_fits", "last_user_text", "looks_like", "next_step", "parse"]

PLAYABLE = ("text", "tool_calls")

LEGACY_INPUT = "(test input)"
"""The user input of a flat trace's steps before its first ``user_input`` marker
(TraceLlm's own placeholder)."""


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def fold(text: str) -> str:
    """`text` with ASCII letters lowercased, as TraceLlm compares hints."""
    return text.translate(_ASCII_LOWER)


def message_text(content: JSON) -> str:
    """The text of a chat message's content (a string, or its text parts joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


def last_user_text(body: JSON) -> str | None:
    """The text of the request's last user message (None: it has none)."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return None
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return message_text(message.get("content"))
    return None


def hint_fits(meta: Any, last_user: str | None) -> bool:
    """Whether a step's ``request_hint.last_user_message_contains`` (if any) is in the
    last user message, compared as TraceLlm does (ASCII case folded)."""
    hint = meta.get("request_hint") if isinstance(meta, dict) else None
    contains = hint.get("last_user_message_contains") if isinstance(hint, dict) else None
    if not isinstance(contains, str):
        return True
    return last_user is not None and fold(contains) in fold(last_user)


def _has_hint(meta: Any) -> bool:
    hint = meta.get("request_hint") if isinstance(meta, dict) else None
    return isinstance(hint, dict) and isinstance(hint.get("last_user_message_contains"), str)


def _is_tool_step(exchange: Exchange) -> bool:
    body = exchange.response.body
    choices = body.get("choices") if isinstance(body, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    return isinstance(first, dict) and first.get("finish_reason") == "tool_calls"


def _offers_tools(body: JSON) -> bool:
    return isinstance(body, dict) and bool(body.get("tools") or body.get("functions"))


def next_step(steps: Sequence[Exchange], body: JSON) -> tuple[Exchange, tuple[str, ...]] | None:
    """The step of a trace that answers `body`, given the steps not served yet (in
    order), as IronClaw's ``TraceLlm`` picks it; and the names of the steps it passes
    over for good (consumed with it). None: no step can answer.

    The head step, when it has no hint or its hint fits the request's last user
    message; else the first later step that has a hint and whose hint fits (threads
    sharing one trace interleave their calls); else the head, its mismatch a warning
    finding. (TraceLlm's scan would also take a later step without a hint; a step
    without one says nothing about which thread it answers, so it is not taken out of
    turn here.) A request that offers no tools skips tool
    steps to the next text step (``TraceLlm::complete``), the skipped steps consumed.
    Exchanges of other formats are served strictly in order."""
    if not steps:
        return None
    if steps[0].meta.get("format") != "trace":
        return steps[0], ()
    remaining = list(steps)
    last = last_user_text(body)
    tools = _offers_tools(body)
    skipped: list[str] = []
    while remaining:
        index = 0
        if not hint_fits(remaining[0].meta, last):
            index = next(
                (
                    i
                    for i, step in enumerate(remaining)
                    if i and _has_hint(step.meta) and hint_fits(step.meta, last)
                ),
                0,
            )
        step = remaining.pop(index)
        if tools or not _is_tool_step(step):
            return step, tuple(skipped)
        skipped.append(step.name)
    return None


def looks_like(data: JSON) -> bool:
    return (
        isinstance(data, dict)
        and "chaosllm" not in data
        and "request" not in data
        and (isinstance(data.get("turns"), list) or isinstance(data.get("steps"), list))
    )


def _require(cond: bool, source: str, problem: str) -> None:
    if not cond:
        raise RecordingError(source, problem)


def _tool_calls(calls: Any, source: str, where: str) -> list[dict[str, Any]]:
    _require(
        isinstance(calls, list) and bool(calls),
        source,
        f"{where}.tool_calls must be a non-empty array",
    )
    result = []
    for i, call in enumerate(calls):
        at = f"{where}.tool_calls[{i}]"
        _require(isinstance(call, dict), source, f"{at} must be an object")
        _require(
            isinstance(call.get("id"), str) and bool(call["id"]),
            source,
            f"{at}.id must be a string",
        )
        _require(
            isinstance(call.get("name"), str) and bool(call["name"]),
            source,
            f"{at}.name must be a string",
        )
        arguments = call.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)
        result.append(
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": call["name"], "arguments": arguments},
            }
        )
    return result


def _tokens(response: dict[str, Any], key: str, source: str, where: str) -> int:
    value = response.get(key, 0)
    _require(
        isinstance(value, int) and not isinstance(value, bool) and value >= 0,
        source,
        f"{where}.{key} must be a non-negative integer",
    )
    assert isinstance(value, int)
    return value


def _answer(
    response: dict[str, Any], *, model: str, answer_id: str, source: str, where: str
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if response["type"] == "text":
        content = response.get("content")
        _require(isinstance(content, str), source, f"{where}.content must be a string")
        message["content"] = content
        finish = "stop"
    else:
        message["tool_calls"] = _tool_calls(response.get("tool_calls"), source, where)
        finish = "tool_calls"
    prompt = _tokens(response, "input_tokens", source, where)
    completion = _tokens(response, "output_tokens", source, where)
    return {
        "id": answer_id,
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def parse(data: JSON, *, source: str, scenario: str) -> list[Exchange]:
    """The exchanges of one trace file, in call order: one per ``text``/``tool_calls`` step."""
    _require(
        looks_like(data),
        source,
        'a trace fixture is an object with "model_name" and "turns" (or "steps")',
    )
    model = data.get("model_name")
    _require(
        isinstance(model, str) and bool(model),
        source,
        '"model_name" is required (a string, e.g. "spot-tool-echo")',
    )
    assert isinstance(model, str)
    legacy = "turns" not in data
    if legacy:
        turns: Any = [{"user_input": None, "steps": data["steps"]}]
        _require(isinstance(data["steps"], list), source, '"steps" must be an array')
    else:
        turns = data["turns"]
        _require(isinstance(turns, list), source, '"turns" must be an array')
    for key in ("memory_snapshot", "http_exchanges"):
        _require(isinstance(data.get(key, []), list), source, f'"{key}" must be an array')
    _require(isinstance(data.get("expects", {}), dict), source, '"expects" must be an object')
    usage = data.get("usage")
    _require(usage is None or isinstance(usage, dict), source, '"usage" must be an object')

    exchanges: list[Exchange] = []
    turn_info: list[dict[str, Any]] = []
    stem = hashlib.sha256(f"{scenario}\0{model}".encode()).hexdigest()[:16]
    for t, turn in enumerate(turns):
        where_turn = "steps" if legacy else f"turns[{t}]"
        _require(isinstance(turn, dict), source, f"{where_turn} must be an object")
        user_input = turn.get("user_input")
        _require(
            legacy or isinstance(user_input, str),
            source,
            f"{where_turn}.user_input must be a string",
        )
        steps = turn.get("steps")
        _require(isinstance(steps, list), source, f"{where_turn}.steps must be an array")
        _require(
            isinstance(turn.get("expects", {}), dict),
            source,
            f"{where_turn}.expects must be an object",
        )
        if not legacy:
            turn_info.append({"user_input": user_input, "expects": turn.get("expects"), "calls": 0})
        said = user_input
        marker = False
        for s, step in enumerate(steps):
            where = f"{where_turn}[{s}]" if legacy else f"{where_turn}.steps[{s}]"
            _require(
                isinstance(step, dict) and isinstance(step.get("response"), dict),
                source,
                f'{where} must be an object with a "response" object',
            )
            response = step["response"]
            kind = response.get("type")
            _require(
                kind in (*PLAYABLE, "user_input"),
                source,
                f'{where}.response.type must be "text", "tool_calls" or "user_input", got {kind!r}',
            )
            if kind == "user_input":
                said = response.get("content") if isinstance(response.get("content"), str) else said
                marker = True
                continue
            if legacy and (marker or not turn_info):
                marker = False
                # TraceLlm splits a flat trace into turns at its user_input markers.
                turn_info.append({"user_input": said or LEGACY_INPUT, "expects": None, "calls": 0})
            call = len(exchanges) + 1
            hint = step.get("request_hint")
            _require(
                hint is None or isinstance(hint, dict),
                source,
                f"{where}.request_hint must be an object",
            )
            expected = step.get("expected_tool_results")
            _require(
                expected is None
                or (
                    isinstance(expected, list)
                    and all(
                        isinstance(e, dict) and isinstance(e.get("tool_call_id"), str)
                        for e in expected
                    )
                ),
                source,
                f"{where}.expected_tool_results must be an array of objects with a tool_call_id",
            )
            answer = _answer(
                response,
                model=model,
                answer_id=f"chatcmpl-trace-{stem}-{call}",
                source=source,
                where=f"{where}.response",
            )
            messages = [{"role": "user", "content": said}] if said is not None else []
            meta: dict[str, Any] = {
                "format": "trace",
                "description": f"trace {model}: LLM call {call} (turn {t + 1}, step {s + 1})",
                "trace": {
                    "model_name": model,
                    "turn": t,
                    "step": s,
                    "call": call,
                    "user_input": said,
                },
            }
            if hint is not None:
                meta["request_hint"] = hint
            if expected is not None:
                meta["expected_tool_results"] = expected
            turn_info[-1]["calls"] += 1
            exchanges.append(
                Exchange(
                    provider="openai.chat",
                    request=RecordedRequest(
                        method="POST",
                        path="/v1/chat/completions",
                        body={"model": model, "messages": messages},
                    ),
                    response=RecordedResponse(status=200, body=answer),
                    digest=hashlib.sha256(f"{stem}\0{call}".encode()).hexdigest(),
                    name=f"{scenario}/{call:04d}",
                    scenario=scenario,
                    meta=meta,
                    source=source,
                    keyed_by=Keying.SEQUENCE,
                )
            )
    _require(
        bool(exchanges), source, 'the trace has no "text" or "tool_calls" step: nothing to replay'
    )
    info = {
        "format": "trace",
        "model_name": model,
        "layout": "steps" if legacy else "turns",
        "calls": len(exchanges),
        "turns": turn_info,
        "memory_snapshot": data.get("memory_snapshot", []),
        "http_exchanges": data.get("http_exchanges", []),
        "expects": data.get("expects"),
    }
    if usage is not None:
        info["usage"] = usage
    exchanges[0] = replace(exchanges[0], meta={**exchanges[0].meta, "scenario_info": info})
    return exchanges


FORMAT = FixtureFormat(
    name="trace",
    shape='a trace fixture ("model_name" with "turns" or "steps")',
    detect=by_content(looks_like),
    parse=run_parser(parse),
    keying=Keying.SEQUENCE,
    holds_run=True,
)
