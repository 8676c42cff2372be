"""The request forms providers document as the same, folded into one: what each
protocol's `Codec.equivalent` is made of. Pure.

Each function folds one documented equivalence and leaves every other value as it is
(idempotent: a folded value folds to itself), so a request already in the folded form
keeps the digest it always had. The rules and their sources are listed in
``docs/background/matching.md``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from chaosllm.model import JSON

__all__ = [
    "function_defaults",
    "one_text",
    "proto_json_name",
    "proto_json_names",
    "text_contents",
    "without_defaults",
    "without_keys",
]

_TEXT_PART_KEYS = frozenset({"type", "text"})
_EMPTY_EXTRAS = ("annotations", "logprobs")
"""Members of a text part that say nothing when empty (an output_text passed back)."""


def one_text(content: JSON, types: Collection[str] = ("text",)) -> JSON:
    """A content array of one text part (``{"type": "text", "text": S}``, of one of
    `types`) as the string ``S`` it is shorthand for; any other content as it is."""
    if not (isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict)):
        return content
    part = content[0]
    if part.get("type") not in types or not isinstance(part.get("text"), str):
        return content
    extras = set(part) - _TEXT_PART_KEYS
    if any(key not in _EMPTY_EXTRAS or part[key] not in ([], None) for key in extras):
        return content
    return part["text"]


def text_contents(messages: JSON) -> JSON:
    """Each message of a list with its content as `one_text` folds it."""
    if not isinstance(messages, list):
        return messages
    return [
        {**m, "content": one_text(m["content"])} if isinstance(m, dict) and "content" in m else m
        for m in messages
    ]


def without_keys(items: JSON, keys: Collection[str]) -> JSON:
    """Each object of a list without `keys` (members that do not change the answer)."""
    if not isinstance(items, list):
        return items
    return [
        {k: v for k, v in item.items() if k not in keys} if isinstance(item, dict) else item
        for item in items
    ]


def without_defaults(value: JSON, defaults: Mapping[str, JSON]) -> JSON:
    """An object without the members that hold their documented default (`defaults`:
    name to default value); any other value as it is."""
    if not isinstance(value, dict):
        return value
    return {k: v for k, v in value.items() if k not in defaults or v != defaults[k]}


def function_defaults(tools: JSON, defaults: Mapping[str, JSON]) -> JSON:
    """Each ``{"type": "function", "function": {...}}`` tool of a list with its function
    `without_defaults` (Chat Completions' tool shape); any other tool as it is."""
    if not isinstance(tools, list):
        return tools
    return [
        {**tool, "function": without_defaults(tool["function"], defaults)}
        if isinstance(tool, dict) and isinstance(tool.get("function"), dict)
        else tool
        for tool in tools
    ]


_SNAKE = re.compile(r"_([a-z0-9])")


def proto_json_name(name: str) -> str:
    """A proto field name in proto3 JSON's lowerCamelCase (``system_instruction`` is
    ``systemInstruction``); a name already in it as it is."""
    return _SNAKE.sub(lambda m: m.group(1).upper(), name) if "_" in name else name


def proto_json_names(value: Any, opaque: Collection[str], maps: Collection[str]) -> Any:
    """`value` with every field name in proto3 JSON's lowerCamelCase (a parser accepts
    the original snake_case name too: ``parameters_json_schema`` is
    ``parametersJsonSchema``), except inside the `opaque` fields (``google.protobuf.Struct``
    and ``Value`` members: a function's arguments, a JSON schema) and for the keys of the
    `maps` fields (a schema's property names), which are the caller's data."""
    if isinstance(value, dict):
        named: dict[str, Any] = {}
        for key, item in value.items():
            name = proto_json_name(key) if isinstance(key, str) else key
            if name in opaque:
                named[name] = item
            elif name in maps and isinstance(item, dict):
                named[name] = {k: proto_json_names(v, opaque, maps) for k, v in item.items()}
            else:
                named[name] = proto_json_names(item, opaque, maps)
        return named
    if isinstance(value, list):
        return [proto_json_names(item, opaque, maps) for item in value]
    return value
