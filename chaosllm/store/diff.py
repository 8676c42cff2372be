"""Say, in a few lines, where two JSON values differ.

Why
---
When a request matches no recording, the error names the nearest recordings
(SPEC §4); a bare similarity score does not tell the user what changed, a
list like ::

    messages[1].content: '…the capital of France?' != '…the capital of Spain?'
    temperature: 0.2 != 0.7
    tools: missing != present

does. `json_differences` walks both values in the same order every time (object
keys sorted, array items by index) and stops after `limit` differences, so it
is cheap on large bodies and its output is stable enough to assert on.

Format of a line: ``<path>: <left> != <right>``.

- Paths: ``model``, ``messages[1].content``; a key that is not a plain
  identifier is quoted, ``headers["x-trace-id"]``; the root itself is ``$``.
- Strings are ``repr``-quoted; when longer than 60 characters they are cut to
  ~30 characters either side of the first difference, ``…`` marking cuts.
- Numbers and ``true``/``false``/``null`` as in JSON (``1 == 1.0``; ``true`` is
  not ``1``); an array or object where the other side has something else is
  shown compactly when short, else as ``[3 items]`` / ``{2 keys}``.
- An object key on one side only: ``key: missing != present`` (or the
  reverse), not descended into.
- Arrays of different lengths: ``path: 3 items != 2 items``, then the
  differences among the items both have.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from itertools import islice
from typing import Any, TypeAlias

__all__ = ["JSON", "json_differences"]

JSON: TypeAlias = Any
"""A value as `json.loads` returns it."""

_CONTEXT = 30
_LONG = 2 * _CONTEXT
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def json_differences(a: JSON, b: JSON, *, limit: int = 5) -> list[str]:
    """Up to `limit` lines saying where `a` and `b` differ, in a stable order.

    Empty when they are equal (as JSON: ``1 == 1.0``, ``True != 1``).
    """
    if limit <= 0:
        return []
    return list(islice(_walk(a, b), limit))


_MISSING: Any = object()


def _walk(a: JSON, b: JSON) -> Iterator[str]:
    # Depth-first, pre-order, with an explicit stack (no recursion limit).
    stack: list[tuple[str, JSON, JSON]] = [("", a, b)]
    while stack:
        path, left, right = stack.pop()
        if left is _MISSING:
            yield f"{path}: missing != present"
        elif right is _MISSING:
            yield f"{path}: present != missing"
        elif isinstance(left, dict) and isinstance(right, dict):
            keys = sorted(left.keys() | right.keys(), key=str)
            stack.extend(
                (_key_path(path, key), left.get(key, _MISSING), right.get(key, _MISSING))
                for key in reversed(keys)
            )
        elif isinstance(left, list) and isinstance(right, list):
            if len(left) != len(right):
                yield f"{path or '$'}: {_items(len(left))} != {_items(len(right))}"
            stack.extend(
                (f"{path}[{i}]", left[i], right[i])
                for i in reversed(range(min(len(left), len(right))))
            )
        elif not _same_scalar(left, right):
            yield _scalar_line(path or "$", left, right)


def _same_scalar(a: JSON, b: JSON) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or (a != a and b != b)  # NaN equals NaN here
    if isinstance(a, (dict, list)) or isinstance(b, (dict, list)):
        return False  # a container against something else
    return type(a) is type(b) and a == b


def _key_path(path: str, key: object) -> str:
    name = str(key)
    if _IDENTIFIER.match(name):
        return f"{path}.{name}" if path else name
    return f"{path}[{json.dumps(name, ensure_ascii=False)}]"


def _items(n: int) -> str:
    return f"{n} item" if n == 1 else f"{n} items"


def _scalar_line(path: str, a: JSON, b: JSON) -> str:
    if isinstance(a, str) and isinstance(b, str):
        left, right = _shorten_pair(a, b)
        return f"{path}: {left} != {right}"
    return f"{path}: {_show(a)} != {_show(b)}"


def _shorten_pair(a: str, b: str) -> tuple[str, str]:
    """Both strings, each cut around their first difference if long."""
    start = 0
    limit = min(len(a), len(b))
    while start < limit and a[start] == b[start]:
        start += 1
    return _window(a, start), _window(b, start)


def _window(s: str, at: int) -> str:
    if len(s) <= _LONG:
        return repr(s)
    lo = max(0, at - _CONTEXT)
    hi = min(len(s), at + _CONTEXT)
    shown = repr(s[lo:hi])
    quote, body = shown[0], shown[1:-1]
    return f"{quote}{'…' if lo > 0 else ''}{body}{'…' if hi < len(s) else ''}{quote}"


def _show(value: JSON) -> str:
    if isinstance(value, str):
        return _window(value, 0)
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, dict)):
        try:
            compact = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        except (TypeError, ValueError):
            compact = ""
        if compact and len(compact) <= _LONG:
            return compact
        if isinstance(value, list):
            return f"[{_items(len(value))}]"
        return f"{{{len(value)} key{'' if len(value) == 1 else 's'}}}"
    return repr(value)
