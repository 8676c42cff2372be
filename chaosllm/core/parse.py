"""Request bodies read as JSON, and refused in the provider's 400 envelope
(`InvalidRequest`) when they are not JSON anything later could digest, render or log."""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

from chaosllm.errors import InvalidRequest

__all__ = ["BAD_JSON", "MAX_DEPTH", "parse_json"]

BAD_JSON = (
    "We could not parse the JSON body of your request. (HINT: This likely means you "
    "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, "
    "but what was sent was not valid JSON.)"
)


MAX_DEPTH = 128
"""The deepest nesting of arrays and objects a body may have (`parse_json`): deeper ones are
refused before anything recursive (validation, redaction, digests, rendering) sees them."""

_FLOAT_MAX = sys.float_info.max
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
_ENCODED_SURROGATE = re.compile(rb"\xed[\xa0-\xbf]")
"""A surrogate escape (``\\ud800``), or one encoded as UTF-8 (which `json.loads` lets
through): the only ways a lone surrogate gets into a decoded string."""
_SURROGATE = re.compile("[\ud800-\udfff]")
_FLOAT_DIGITS = len(str(int(_FLOAT_MAX)))
"""Digits of the largest float (309): an integer with more is beyond float range."""


def parse_json(raw: bytes) -> Any:
    """The JSON value of a body; `InvalidRequest` saying what is wrong when it is not JSON,
    nests deeper than `MAX_DEPTH`, holds a number that is no finite 64-bit float (NaN,
    Infinity, 1e999, an integer too long for one) or a lone UTF-16 surrogate (``\\ud800``,
    which no UTF-8 encoder can write back): nothing that would fail later to digest,
    render or log. Numbers are checked as they are read; the value is walked only when
    its bytes allow a refusal (deep nesting, a surrogate)."""
    try:
        encoding = json.detect_encoding(raw)  # as json.loads: UTF-8, -16 or -32
        value = _DECODER.decode(raw.decode(encoding, "surrogatepass"))
    except InvalidRequest:
        raise
    except RecursionError:
        raise _too_deep() from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise InvalidRequest(BAD_JSON, code="invalid_json") from None
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and _deeper_than(value, MAX_DEPTH):
        raise _too_deep()
    if (
        encoding != "utf-8"
        or (b"\\u" in raw and _ESCAPED_SURROGATE.search(raw))
        or (b"\xed" in raw and _ENCODED_SURROGATE.search(raw))
    ):
        _check_values(value)
    return value


def _too_deep() -> InvalidRequest:
    return InvalidRequest(
        f"The request body nests arrays and objects deeper than {MAX_DEPTH} levels, "
        "which chaosllm does not read.",
        code="invalid_json",
    )


def _non_finite(literal: str) -> Any:
    raise InvalidRequest(
        f"The request body holds {literal}, which is not JSON: numbers must be finite.",
        code="invalid_json",
    )


def _finite_float(literal: str) -> float:
    number = float(literal)
    if not math.isfinite(number):
        raise InvalidRequest(
            f"The request body holds the number {literal[:40]}, beyond the range of a "
            "64-bit float.",
            code="invalid_json",
        )
    return number


def _float_range_int(literal: str) -> int:
    digits = len(literal) - literal.startswith("-")
    if digits >= _FLOAT_DIGITS and (digits > _FLOAT_DIGITS or abs(int(literal)) > _FLOAT_MAX):
        raise InvalidRequest(
            f"The request body holds an integer of {digits} digits, beyond the range of a "
            "64-bit float.",
            code="invalid_json",
        )
    return int(literal)


_DECODER = json.JSONDecoder(
    parse_constant=_non_finite, parse_float=_finite_float, parse_int=_float_range_int
)


def _deeper_than(value: Any, limit: int) -> bool:
    if type(value) is not dict and type(value) is not list:
        return False
    stack = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        item, depth = pop()
        if depth > limit:
            return True
        for child in item.values() if type(item) is dict else item:
            kind = type(child)
            if kind is dict or kind is list:
                push((child, depth + 1))
    return False


def _check_values(value: Any) -> None:
    """`InvalidRequest` naming the first lone surrogate in `value` (in a key or a string),
    and where it is (``messages[0].content``)."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            found = _SURROGATE.search(item)
            if found is not None:
                where = _shown(path)
                raise InvalidRequest(
                    f"The request body holds a lone UTF-16 surrogate "
                    f"(\\u{ord(found.group()):04x}) at {where or 'the top level'}: a JSON "
                    "string must be valid Unicode (a surrogate escape needs its pair).",
                    param=where or None,
                    code="invalid_json",
                )
        elif isinstance(item, dict):
            for key, child in item.items():
                inner = f"{path}.{key}" if path else key
                stack.append((child, inner))
                stack.append((key, inner))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))


def _shown(path: str) -> str:
    """A place in a body, printable: a key may hold the surrogate itself (escaped here),
    and a long one is cut."""
    return path.encode("utf-8", "backslashreplace").decode("utf-8")[:200]
