"""DocsGPT's mock LLM (``scripts/e2e/mock_llm.py``), feature for feature, over hash-keyed
fixtures: what a request gets that the fixture alone cannot say.

A hash-keyed fixture is built at load time (`chaosllm.store.formats.hashkeyed`), before
any request is known. The stub answers with the request's model and, when the fixture
gives no usage, estimates it from the request (`for_request`). Its in-band directives
pin an answer without a fixture (`directive_exchange`), because a hash fixture rots when
the system prompt embeds today's date:

- ``[[MOCK_LLM_EMIT:<base64url>]]`` anywhere in the messages' text: the decoded text is
  the reply (the last directive wins);
- ``[[MOCK_LLM_TOOLCALL:<action>:<mode>[:<base64url JSON args>]]]``: when the request
  offers tools, a call of ``action`` (arguments ``{}`` by default), streamed as `mode`
  says (`arg_frames`): ``once`` (one frame), ``repeat`` (the complete arguments twice
  for one index), ``delta`` (two halves), ``truncated`` (a prefix that cannot parse).
  A request without tools gets the text answer instead (DocsGPT's finalize round).

A payload that does not decode is logged (``[mock-llm] bad MOCK_LLM_EMIT payload ...``)
and ignored, as the stub does. The engine consults the directives only in the
hash-keyed mode: they win over any fixture when hash-keyed fixtures are loaded (as in
the stub), and otherwise answer only a request that no recording matches.

On a miss the stub's generic answer is `fallback_exchange` (``--on-miss fallback``), and
`added_fixture` finds a ``<hash>.json`` written into a recordings directory while the
server runs (one ``stat`` per directory and miss). The stub's delay headers map onto
the plan's own latency (`delayed`): ``X-Mock-LLM-Total-Delay-Ms`` before the head,
``X-Mock-LLM-Stream-Chunk-Delay-Ms`` before each frame of a stream. The stub's
permissive CORS is chaosllm's ``--cors '*'`` (`chaosllm.http.cors`).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from chaosllm.errors import RecordingError
from chaosllm.model import (
    JSON,
    Exchange,
    Keying,
    Piece,
    RecordedChunk,
    RecordedRequest,
    RecordedResponse,
    ResponsePlan,
)
from chaosllm.providers.openai_chat import DONE_FRAME, sse_frame
from chaosllm.store.formats import read_file
from chaosllm.store.formats.hashkeyed import (
    completion,
    estimate_tokens,
    messages_text,
    request_digest,
    stream_frames,
)

__all__ = [
    "CHUNK_DELAY_HEADER",
    "DEFAULT_MODEL",
    "FALLBACK_TEXT",
    "MARKER",
    "MAX_DELAY_MS",
    "TOTAL_DELAY_HEADER",
    "added_fixture",
    "arg_frames",
    "delayed",
    "delays",
    "directive_exchange",
    "emit_directive",
    "fallback_exchange",
    "for_request",
    "hash_keyed_mode",
    "log_miss",
    "toolcall_directive",
    "usage",
]

log = logging.getLogger("chaosllm")

MARKER = b"[[MOCK_LLM_"
"""What a raw body holds when it may carry a directive (JSON never escapes it)."""
EMIT = re.compile(r"\[\[MOCK_LLM_EMIT:([A-Za-z0-9_=\-]+)\]\]")
TOOLCALL = re.compile(
    r"\[\[MOCK_LLM_TOOLCALL:([A-Za-z0-9_\-]+):(once|repeat|delta|truncated)"
    r"(?::([A-Za-z0-9_=\-]+))?\]\]"
)
FALLBACK_TEXT = "I don't have enough information to answer that from the provided sources."
"""The stub's answer to a request no fixture answers."""
DEFAULT_MODEL = "gpt-4o-mini"
"""The model the stub answers as when the request names none."""
TOOLCALL_COMPLETION_TOKENS = 8
TOTAL_DELAY_HEADER = "x-mock-llm-total-delay-ms"
CHUNK_DELAY_HEADER = "x-mock-llm-stream-chunk-delay-ms"
MAX_DELAY_MS = 600_000
"""The longest delay a header asks for that is honoured (the stub's ten minutes)."""


def hash_keyed_mode(alias_keyings: Mapping[str, frozenset[str]], provider: str) -> bool:
    """Whether hash-keyed fixtures answer `provider`'s requests (DocsGPT's stub's mode)."""
    return Keying.HASH_KEYED in alias_keyings.get(provider, ())


# -- usage and the request's model ----------------------------------------------------


def usage(body: JSON, content: str, given: dict[str, Any] | None = None) -> dict[str, int]:
    """The stub's usage: what the fixture gave, else estimated (prompt tokens over the
    messages' text, completion tokens over `content`), the total always the sum."""
    given = given or {}
    prompt = given.get("prompt_tokens")
    if not isinstance(prompt, int):
        messages = body.get("messages") if isinstance(body, dict) else None
        prompt = estimate_tokens(messages_text(messages))
    done = given.get("completion_tokens")
    if not isinstance(done, int):
        done = estimate_tokens(content)
    return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}


def _model(body: JSON) -> str:
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) and model else DEFAULT_MODEL


def _exchange(answer: dict[str, Any], frames: list[str], name: str, digest: str) -> Exchange:
    return Exchange(
        provider="openai.chat",
        request=RecordedRequest(method="POST", path="/v1/chat/completions", body={}),
        response=RecordedResponse(
            status=200, body=answer, stream=True, chunks=tuple(RecordedChunk(f) for f in frames)
        ),
        digest=digest,
        name=name,
        scenario="(mock-llm)",
        meta={"format": "hash-keyed"},
    )


def _model_field(model: Any) -> str:
    return '"model":' + json.dumps(model, ensure_ascii=False)


def for_request(exchange: Exchange, body: JSON) -> Exchange:
    """A hash-keyed fixture's answer to `body`: the request's model echoed (JSON and
    stream: the recorded frames keep their bytes but for the model), and the usage the
    fixture does not give estimated from the request (``meta["usage"]``: what the fixture
    file gave; an exchange without it keeps its recorded usage)."""
    answer = exchange.response.body
    if exchange.keyed_by != Keying.HASH_KEYED or not isinstance(answer, dict):
        return exchange
    message = answer["choices"][0]["message"]
    given = exchange.meta.get("usage")
    if not isinstance(given, dict):
        given = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
    counted = usage(body, message.get("content") or "", given)
    model, recorded = _model(body), answer.get("model")
    if recorded == model and answer.get("usage") == counted:
        return exchange
    chunks = exchange.response.chunks
    if recorded != model and chunks:
        old, new = _model_field(recorded), _model_field(model)
        chunks = tuple(replace(c, data=c.data.replace(old, new, 1)) for c in chunks)
    response = replace(
        exchange.response, body={**answer, "model": model, "usage": counted}, chunks=chunks
    )
    return replace(exchange, response=response)


# -- directives -----------------------------------------------------------------------


def _decode(raw: str) -> str:
    padded = raw + "=" * (-len(raw) % 4)
    return base64.urlsafe_b64decode(padded.encode("ascii")).decode("utf-8")


def emit_directive(body: JSON) -> str | None:
    """The text the last decodable ``[[MOCK_LLM_EMIT:...]]`` of the messages pins."""
    found: str | None = None
    messages = body.get("messages") if isinstance(body, dict) else None
    for match in EMIT.finditer(messages_text(messages)):
        raw = match.group(1)
        try:
            found = _decode(raw)
        except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
            log.warning("[mock-llm] bad MOCK_LLM_EMIT payload %r: %s", raw, exc)
    return found


def toolcall_directive(body: JSON) -> tuple[str, str, str] | None:
    """``(action, mode, arguments)`` of the last ``[[MOCK_LLM_TOOLCALL:...]]`` of the
    messages; arguments that do not decode are logged and ``{}`` is sent."""
    found: tuple[str, str, str] | None = None
    messages = body.get("messages") if isinstance(body, dict) else None
    for match in TOOLCALL.finditer(messages_text(messages)):
        action, mode, raw = match.group(1), match.group(2), match.group(3)
        arguments = "{}"
        if raw:
            try:
                arguments = _decode(raw)
            except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
                log.warning("[mock-llm] bad MOCK_LLM_TOOLCALL args %r: %s", raw, exc)
        found = (action, mode, arguments)
    return found


def arg_frames(arguments: str, mode: str) -> list[str]:
    """The pieces of a call's arguments, one a frame, as `mode` frames them."""
    if mode == "repeat":
        return [arguments, arguments]
    if mode == "truncated":
        stripped = arguments.rstrip()
        return [stripped[:-1]] if len(stripped) >= 2 else ['{"']
    if mode == "delta" and len(arguments) >= 2:
        middle = len(arguments) // 2
        return [arguments[:middle], arguments[middle:]]
    return [arguments]


def _chunk(answer: dict[str, Any], delta: dict[str, Any], finish: str | None = None) -> str:
    return sse_frame(
        {
            "id": answer["id"],
            "object": "chat.completion.chunk",
            "created": answer["created"],
            "model": answer["model"],
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
    )


def _toolcall_exchange(body: JSON, digest: str, action: str, mode: str, args: str) -> Exchange:
    call = {
        "id": f"call_e2e_{digest[:12]}",
        "type": "function",
        "function": {"name": action, "arguments": args},
    }
    prompt = usage(body, "")["prompt_tokens"]
    answer = completion(
        {
            "content": "",
            "tool_calls": [call],
            "finish_reason": "tool_calls",
            "usage": {"prompt_tokens": prompt, "completion_tokens": TOOLCALL_COMPLETION_TOKENS},
        },
        digest,
    )
    answer["model"] = _model(body)
    frames = [_chunk(answer, {"role": "assistant", "content": ""})]
    for position, piece in enumerate(arg_frames(args, mode)):
        if position == 0:
            delta: dict[str, Any] = {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": action, "arguments": piece},
                    }
                ]
            }
        else:  # continuations carry only the index, as OpenAI streams them
            delta = {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
        frames.append(_chunk(answer, delta))
    frames += [_chunk(answer, {}, "tool_calls"), DONE_FRAME]
    return _exchange(answer, frames, f"(mock-llm)/toolcall:{action}:{mode}", digest)


def _text_exchange(body: JSON, digest: str, text: str, name: str) -> Exchange:
    answer = completion({"content": text, "usage": usage(body, text)}, digest)
    answer["model"] = _model(body)
    return _exchange(answer, stream_frames(answer), name, digest)


def directive_exchange(body: JSON) -> Exchange | None:
    """The answer an in-band directive of `body` pins (None: it carries none that
    applies): a tool call when the request offers tools, else the emitted text."""
    if not isinstance(body, dict):
        return None
    digest = request_digest(body)
    toolcall = toolcall_directive(body)
    if toolcall is not None and body.get("tools"):
        return _toolcall_exchange(body, digest, *toolcall)
    text = emit_directive(body)
    if text is not None:
        return _text_exchange(body, digest, text, "(mock-llm)/emit")
    return None


# -- misses ---------------------------------------------------------------------------


def fallback_exchange(body: JSON) -> Exchange:
    """The stub's generic answer to a request no fixture answers."""
    return _text_exchange(body, request_digest(body), FALLBACK_TEXT, "(mock-llm)/fallback")


def log_miss(body: JSON) -> None:
    """The stub's two lines for a request no fixture answers: its fixture hash, then the
    request as sorted JSON."""
    try:
        alias = request_digest(body)
    except (TypeError, ValueError, AttributeError):
        return
    log.warning("[mock-llm] unknown fixture hash %s", alias)
    try:
        dumped = json.dumps(body, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        dumped = "<unserializable>"
    log.warning("[mock-llm] request: %s", dumped)


def added_fixture(dirs: Iterable[Path], body: JSON) -> list[Exchange]:
    """The exchanges of ``<hash>.json`` (the request's fixture hash) if it now sits at the
    top of one of the recordings directories `dirs`: a fixture saved while the server
    runs, used without a reload. One ``stat`` per directory; a bad file is logged."""
    if not isinstance(body, dict):
        return []
    try:
        alias = request_digest(body)
    except (TypeError, ValueError):
        return []
    for root in dirs:
        path = root / f"{alias}.json"
        if not path.is_file():
            continue
        try:
            found = read_file(path, root=root, fmt="hash-keyed")
        except RecordingError as exc:
            log.warning("[mock-llm] failed to load fixture %s: %s", path, exc.problem)
            continue
        return [e for e in found if e.keyed_by == Keying.HASH_KEYED]
    return []


# -- delays ---------------------------------------------------------------------------


def _milliseconds(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        return 0
    return min(number, MAX_DELAY_MS) if number > 0 else 0


def delays(headers: Iterable[tuple[str, str]]) -> tuple[int, int]:
    """``(total, per frame)`` milliseconds the stub's delay headers ask for (names in
    lower case; a value that is no positive integer is none, a long one is capped)."""
    total = chunk = 0
    for name, value in headers:
        if name == TOTAL_DELAY_HEADER:
            total = _milliseconds(value)
        elif name == CHUNK_DELAY_HEADER:
            chunk = _milliseconds(value)
    return total, chunk


def delayed(plan: ResponsePlan, headers: Iterable[tuple[str, str]]) -> ResponsePlan:
    """`plan` with the latency the stub's delay headers ask for: the total before the
    head, the per-frame delay before each SSE frame of a stream (not before ``[DONE]``,
    which the stub sends at once)."""
    total, chunk = delays(headers)
    if not total and not chunk:
        return plan
    pieces = plan.pieces
    if chunk:
        pieces = tuple(
            Piece(p.data, p.delay_ms + chunk, p.frame)
            if p.frame and p.data.strip() != DONE_FRAME.strip().encode()
            else p
            for p in pieces
        )
    return plan.with_(head_delay_ms=plan.head_delay_ms + total, pieces=pieces)
