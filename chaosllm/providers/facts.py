"""Request facts fault matching reads (``match.contains``, ``match.tool``), shared by the
protocols: the text of a conversation's last user message, the names of a list of tools.

Pure and forgiving: a body the upstream is the judge of (the proxy modes forward any JSON
object) may hold anything, so every reader takes what it finds and never raises.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = [
    "called_names",
    "content_text",
    "last_user_text",
    "names_of",
    "offered_tool_names",
    "tool_names",
]


def content_text(content: Any, text_types: frozenset[str]) -> str | None:
    """The text of a message's content: a string as it is, or the ``text`` of its parts
    whose ``type`` is one of `text_types`, joined by newlines (None: no text at all)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts = [
        part["text"]
        for part in content
        if isinstance(part, dict)
        and part.get("type") in text_types
        and isinstance(part.get("text"), str)
    ]
    return "\n".join(texts) if texts else None


def last_user_text(messages: Any, text_types: frozenset[str]) -> str | None:
    """The text of the last ``role: user`` message of `messages` that holds text (a user
    message of tool results only, as Anthropic sends them, is skipped: nobody wrote it)."""
    if not isinstance(messages, list):
        return None
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            text = content_text(message.get("content"), text_types)
            if text is not None:
                return text
    return None


def tool_names(*tool_lists: Any) -> frozenset[str]:
    """The names of the tools in lists of tool definitions: each one's ``name``, else the
    ``name`` of the object its ``type`` names (OpenAI chat's ``{"type": "function",
    "function": {"name": ...}}``), else, for a hosted tool without a name, its ``type``
    (``web_search``)."""
    names: set[str] = set()
    for tools in tool_lists:
        if not isinstance(tools, list):
            continue
        for tool in tools:
            name = _name(tool)
            if name is not None:
                names.add(name)
    return frozenset(names)


def offered_tool_names(body: Any) -> frozenset[str]:
    """`tool_names` of a request body's ``tools`` list (none for a body that is no object)."""
    return tool_names(body.get("tools")) if isinstance(body, dict) else frozenset()


def _name(tool: Any) -> str | None:
    if not isinstance(tool, dict):
        return None
    name = tool.get("name")
    if isinstance(name, str):
        return name
    kind = tool.get("type")
    inner = tool.get(kind) if isinstance(kind, str) else None
    if isinstance(inner, dict) and isinstance(inner.get("name"), str):
        named: str = inner["name"]
        return named
    return kind if isinstance(kind, str) else None


def names_of(items: Iterable[Any]) -> frozenset[str]:
    """The string ``name`` of each object among `items`."""
    return frozenset(
        item["name"]
        for item in items
        if isinstance(item, dict) and isinstance(item.get("name"), str)
    )


def called_names(answer: Any, key: str, call_types: frozenset[str]) -> frozenset[str]:
    """`names_of` the objects in an answer's `key` list whose ``type`` is one of
    `call_types` (the tool calls among its content blocks or output items)."""
    items = answer.get(key) if isinstance(answer, dict) else None
    return names_of(
        item
        for item in (items if isinstance(items, list) else ())
        if isinstance(item, dict) and item.get("type") in call_types
    )
