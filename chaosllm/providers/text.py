"""The JSON and text helpers every protocol shares: the digest's serialisation, streamed
text as word pieces, cut and filtered text, how validation names a value's type. Pure."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator
from typing import Any, Final

from chaosllm.model import JSON

__all__ = [
    "JSON_HEADERS",
    "TEXT_KEYS",
    "canonical_json",
    "cut_json",
    "estimated_tokens",
    "filtered_blocks",
    "filtered_text",
    "keyed_strings",
    "sha256_digest",
    "text_length",
    "text_pieces",
    "type_name",
]

JSON_HEADERS: Final = (("content-type", "application/json"),)

TEXT_KEYS: Final = frozenset(
    {
        "content",
        "text",
        "arguments",
        "partial_json",
        "thinking",
        "refusal",
        "delta",
        "reasoning",
        "reasoning_content",
        "response",
        "input",
        "args",
    }
)
"""Keys whose string values (anywhere in an answer or a stream payload) are generated
text, what `FaultHooks.text_tokens` counts: chat and Ollama ``content``, Anthropic, Gemini
and Bedrock ``text``, tool-call ``arguments`` / ``partial_json`` / ``input`` / ``args``,
the Responses API's ``delta``, reasoning, Ollama's ``response``."""

# A piece of streamed text: a word with the whitespace before it (how tokens look).
_TEXT_PIECE = re.compile(r"\s*\S+|\s+")


def keyed_strings(value: JSON) -> Iterator[tuple[str, str]]:
    """``(key, string)`` for each string value of an object anywhere in `value`: an
    object's own strings first, list items in order (without recursion)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                if isinstance(inner, str):
                    yield key, inner
                elif isinstance(inner, (dict, list)):
                    stack.append(inner)
        elif isinstance(item, list):
            stack.extend(reversed(item))


def text_length(value: JSON) -> int:
    """The characters of the strings under `TEXT_KEYS` anywhere in `value`."""
    return sum(len(text) for key, text in keyed_strings(value) if key in TEXT_KEYS)


def canonical_json(value: JSON) -> str:
    """The one serialisation digests are computed over (sorted keys, compact, UTF-8)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_digest(value: JSON) -> str:
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def text_pieces(text: str) -> list[str]:
    """Streamed text as deltas: a word each, with the whitespace before it."""
    return _TEXT_PIECE.findall(text) or [text]


def cut_json(text: str) -> str:
    """A prefix of `text` that is not valid JSON (what a cut-off generation looks like)."""
    cut = text[: max(1, len(text) // 2)] if text else "{"
    try:
        json.loads(cut)
    except json.JSONDecodeError:
        return cut
    return cut + '{"'


def filtered_text(text: str) -> str:
    """What a content filter lets through of a text: its first half, in whole words (the
    text streamed before the filter stopped it; empty for a text of one word)."""
    pieces = text_pieces(text)
    return "".join(pieces[: len(pieces) // 2])


def filtered_blocks(
    blocks: Any, is_call: Callable[[dict[str, Any]], bool], *, drop_empty: bool = False
) -> list[dict[str, Any]]:
    """The content blocks (or parts) a content filter leaves of `blocks`: its objects that
    are no tool call (`is_call`), each ``text`` cut in place by `filtered_text` (with
    `drop_empty`, a part whose text is then empty is dropped too)."""
    kept: list[dict[str, Any]] = []
    for block in blocks or ():
        if not isinstance(block, dict) or is_call(block):
            continue
        if isinstance(block.get("text"), str):
            block["text"] = filtered_text(block["text"])
            if drop_empty and not block["text"]:
                continue
        kept.append(block)
    return kept


def type_name(value: object, *, array: str = "an array") -> str:
    """How a validation message names a JSON value's type (`array`: a list's name)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return array
    return "an object"


def estimated_tokens(request: JSON) -> int:
    """About four characters a token of a request (what a failure's message counts)."""
    return max(1, -(-len(canonical_json(request)) // 4))
