"""Fault specs: validation against the catalogue (`chaosllm.faults.catalogue`).

A spec arrives as JSON (``POST /__fault``, a profile file, ``ChaosServer.arm``)
or as a query string (``POST /__fault/{type}?k=v``, typed by `spec_from_query`
from the kinds of that type's parameters) and is checked completely before
anything is armed: an unknown type, an unknown or misspelt field, a parameter
that the type does not take, or a value out of range raises `InvalidFaultSpec`
whose message lists the valid types or that type's parameters. Numbers must be finite
and within float range, and text valid Unicode (no lone surrogate such as ``\\ud800``):
an armed fault is always one that can be listed (``GET /__fault``) and rendered.

Besides its type's parameters a spec holds when it fires: ``match`` (which requests:
path, model, session, stream, and ``contains``, ``tool``, ``turn``, facts the provider
reads off the request and its answer) and the schedule (``remaining``, ``probability``,
``after_requests``, ``every``, ``ttl_ms``), which the fault board (`chaosllm.faults.board`)
keeps exactly.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from chaosllm.errors import InvalidFaultSpec
from chaosllm.faults.catalogue import FAULT_TYPES, FaultType, Param

__all__ = [
    "COMMON_FIELDS",
    "FAULT_TYPES",
    "MATCH_FIELDS",
    "SCHEDULE_FIELDS",
    "FaultSpec",
    "FaultType",
    "Match",
    "Param",
    "describe_catalogue",
    "parse_fault_spec",
    "parse_fault_specs",
    "spec_from_query",
]


COMMON_FIELDS: Mapping[str, str] = {
    "type": "one of the fault types",
    "remaining": "how many requests it fires on before it is gone (integer >= 1, default 1)",
    "probability": "chance of firing on a matching request, drawn from the seeded RNG "
    "(0-1, default 1)",
    "match": "which requests it fires on: an object with any of path, model, session, "
    "stream, contains (a substring of the last user message), tool (a tool the request "
    "offers or the answer calls, the tool an MCP tools/call calls), turn (the session's n-th "
    "provider request, from 1), server (the MCP server /mcp/{server}: without it a fault "
    "fires on model requests only, an MCP fault on any MCP server)",
    "after_requests": "let this many matching requests pass before it may fire "
    "(integer >= 0, default 0)",
    "every": "fire only on every n-th matching request (after after_requests): the n-th, "
    "2n-th... (integer >= 1, default 1)",
    "ttl_ms": "disarm it this many milliseconds after it is armed, fired or not (a number "
    "> 0, default: never)",
    "reask": "true: the next request of the session that no recording answers (the client's "
    "re-ask of the broken answer: a retry prompt, the validation error, the tool error) gets "
    "the recording this fault broke, unfaulted (journaled as match reask; default false)",
}
MATCH_FIELDS = ("path", "model", "session", "stream", "contains", "tool", "turn", "server")
SCHEDULE_FIELDS: Mapping[str, type] = {"after_requests": int, "every": int, "ttl_ms": float}
"""The schedule's fields beyond ``remaining`` and ``probability``, and their kinds (the
CLI's ``fault arm`` flags and the query typing follow them)."""


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word.capitalize() for word in rest)


_ALIASES: Mapping[str, str] = {
    _camel(name): name
    for entry in FAULT_TYPES.values()
    for name in entry.params
    if _camel(name) != name
} | {_camel(name): name for name in SCHEDULE_FIELDS if _camel(name) != name}
"""camelCase spellings accepted for every parameter (``afterChunks``) and schedule field
(``afterRequests``, ``ttlMs``)."""


@dataclass(frozen=True, slots=True)
class Match:
    path: str | None = None
    model: str | None = None
    session: str | None = None
    stream: bool | None = None
    contains: str | None = None
    """A substring of the text of the request's last user message (case-sensitive)."""
    tool: str | None = None
    """The name of a tool the request offers or its answer calls."""
    turn: int | None = None
    """The session's n-th provider request since the last reset (from 1)."""
    server: str | None = None
    """The MCP server (``/mcp/{server}``) a request addresses. A fault without one fires on
    model requests only, an MCP fault type on any MCP server."""

    @property
    def reads_body(self) -> bool:
        """Whether matching reads the request body or the answer (`contains`, `tool`)."""
        return self.contains is not None or self.tool is not None

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in MATCH_FIELDS if getattr(self, k) is not None}


@dataclass(frozen=True, slots=True)
class FaultSpec:
    type: str
    params: Mapping[str, Any] = field(default_factory=dict)
    remaining: int = 1
    probability: float = 1.0
    match: Match = field(default_factory=Match)
    reask: bool = False
    """Whether the session's next miss is answered from the recording it broke."""
    after_requests: int = 0
    """How many matching requests it lets pass before it may fire."""
    every: int = 1
    """It may fire only on every n-th matching request (counted after `after_requests`)."""
    ttl_ms: float | None = None
    """Milliseconds after arming when it is disarmed (None: never)."""

    @property
    def counts_requests(self) -> bool:
        """Whether its schedule counts the matching requests (`after_requests`, `every`)."""
        return self.after_requests > 0 or self.every > 1

    @property
    def entry(self) -> FaultType:
        """The catalogue entry of its type."""
        return FAULT_TYPES[self.type]

    def param(self, name: str) -> Any:
        return self.params[name] if name in self.params else self.entry.params[name].default

    def effective_params(self) -> dict[str, Any]:
        """Every parameter of the type, defaults filled in (None: not applicable)."""
        return {name: self.param(name) for name in self.entry.params}

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "type": self.type,
            "remaining": self.remaining,
            "probability": self.probability,
            **self.params,
        }
        if self.match.to_json():
            data["match"] = self.match.to_json()
        if self.reask:
            data["reask"] = True
        if self.after_requests:
            data["after_requests"] = self.after_requests
        if self.every != 1:
            data["every"] = self.every
        if self.ttl_ms is not None:
            data["ttl_ms"] = self.ttl_ms
        return data


def describe_catalogue() -> str:
    lines = ["Valid fault types and their parameters:"]
    for t in FAULT_TYPES.values():
        params = ", ".join(t.params) or "no parameters"
        lines.append(f"  {t.name} ({params}): {t.summary}")
    lines.append(
        "Every type also takes: "
        + ", ".join(f"{k} ({v})" for k, v in COMMON_FIELDS.items() if k != "type")
        + "."
    )
    return "\n".join(lines)


def _describe_type(t: FaultType) -> str:
    if not t.params:
        params = "no parameters of its own"
    else:
        params = "; ".join(f"{name}: {p.doc}" for name, p in t.params.items())
    common = ", ".join(k for k in COMMON_FIELDS if k != "type")
    return f"{t.name} takes {params}; and {common}."


_FLOAT_MAX = sys.float_info.max
_SURROGATE = re.compile("[\ud800-\udfff]")


def _shown(value: Any) -> str:
    """`value` for a message: an integer too long to print (or to read) by its size."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _FLOAT_MAX:
        return f"an integer of {value.bit_length()} bits"
    return repr(value)[:200]


def _out_of_range(value: Any) -> bool:
    """Whether a number is NaN, infinite or beyond float range."""
    if isinstance(value, float):
        return not math.isfinite(value)
    return abs(cast(int, value)) > _FLOAT_MAX


def _text(value: str, what: str, t: FaultType) -> str:
    found = _SURROGATE.search(value)
    if found is not None:
        raise InvalidFaultSpec(
            f"{t.name}: {what} holds a lone UTF-16 surrogate (\\u{ord(found.group()):04x}): "
            "text must be valid Unicode."
        )
    return value


def _number(value: Any, name: str, param: Param, t: FaultType) -> Any:
    ok_types: tuple[type, ...] = (int,) if param.kind is int else (int, float)
    if isinstance(value, bool) or not isinstance(value, ok_types):
        kind = "an integer" if param.kind is int else "a number"
        raise InvalidFaultSpec(
            f"{t.name}: {name} must be {kind}, got {_shown(value)}. " + _describe_type(t)
        )
    number = cast(float, value)
    if (
        _out_of_range(number)
        or (param.minimum is not None and number < param.minimum)
        or (param.maximum is not None and number > param.maximum)
    ):
        bounds = (
            f">= {param.minimum:g}"
            if param.maximum is None
            else f"within {param.minimum:g}..{param.maximum:g}"
        )
        if param.maximum is None and _out_of_range(number):
            bounds += " and a finite number within float range"
        raise InvalidFaultSpec(
            f"{t.name}: {name} must be {bounds}, got {_shown(value)}. " + _describe_type(t)
        )
    return param.kind(value)


def parse_fault_spec(data: Any, *, defaults: Mapping[str, Any] | None = None) -> FaultSpec:
    """A validated `FaultSpec` from JSON; `InvalidFaultSpec` lists what is valid."""
    if not isinstance(data, dict):
        raise InvalidFaultSpec(
            f"a fault spec must be a JSON object, got {type(data).__name__}. "
            + describe_catalogue()
        )
    raw = {**(defaults or {}), **data}
    for alias, name in _ALIASES.items():
        if alias in raw:
            if name in raw:
                raise InvalidFaultSpec(f"both {alias!r} and {name!r} given; use {name!r}")
            raw[name] = raw.pop(alias)
    type_name = raw.pop("type", None)
    if not isinstance(type_name, str) or type_name not in FAULT_TYPES:
        given = "missing" if type_name is None else _shown(type_name)
        raise InvalidFaultSpec(f"unknown fault type {given}. " + describe_catalogue())
    t = FAULT_TYPES[type_name]

    remaining = raw.pop("remaining", 1)
    if (
        isinstance(remaining, bool)
        or not isinstance(remaining, int)
        or remaining < 1
        or _out_of_range(remaining)
    ):
        huge = " within float range" if isinstance(remaining, int) and remaining > 1 else ""
        raise InvalidFaultSpec(
            f"{t.name}: remaining must be an integer >= 1{huge}, got {_shown(remaining)}. "
            + _describe_type(t)
        )
    probability = raw.pop("probability", 1.0)
    if (
        isinstance(probability, bool)
        or not isinstance(probability, (int, float))
        or not 0.0 <= probability <= 1.0
    ):
        raise InvalidFaultSpec(
            f"{t.name}: probability must be a number within 0..1, got "
            f"{_shown(probability)}. " + _describe_type(t)
        )
    match = _parse_match(raw.pop("match", None), t)
    reask = raw.pop("reask", False)
    if not isinstance(reask, bool):
        raise InvalidFaultSpec(
            f"{t.name}: reask must be true or false, got {_shown(reask)}. " + _describe_type(t)
        )
    after_requests = _count(raw.pop("after_requests", 0), "after_requests", 0, t)
    every = _count(raw.pop("every", 1), "every", 1, t)
    ttl_ms = raw.pop("ttl_ms", None)
    if ttl_ms is not None:
        if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, (int, float)):
            raise InvalidFaultSpec(
                f"{t.name}: ttl_ms must be a number, got {_shown(ttl_ms)}. " + _describe_type(t)
            )
        if _out_of_range(ttl_ms) or ttl_ms <= 0:
            raise InvalidFaultSpec(
                f"{t.name}: ttl_ms must be a number > 0 (milliseconds) within float range, "
                f"got {_shown(ttl_ms)}. " + _describe_type(t)
            )
        ttl_ms = float(ttl_ms)
    raw.pop("id", None)  # echoed back by GET /__fault; ignored when re-armed

    params: dict[str, Any] = {}
    for name, value in raw.items():
        if name not in t.params:
            raise InvalidFaultSpec(f"{t.name} has no parameter {name!r}. " + _describe_type(t))
        param = t.params[name]
        if value is None:
            continue
        if param.kind is str:
            if not isinstance(value, str):
                raise InvalidFaultSpec(
                    f"{t.name}: {name} must be a string, got {_shown(value)}. " + _describe_type(t)
                )
            params[name] = _text(value, name, t)
            if param.choices and value not in param.choices:
                raise InvalidFaultSpec(
                    f"{t.name}: {name} must be one of {', '.join(param.choices)}, got "
                    f"{_shown(value)}. " + _describe_type(t)
                )
        else:
            params[name] = _number(value, name, param, t)
    return FaultSpec(
        type=t.name,
        params=params,
        remaining=remaining,
        probability=float(probability),
        match=match,
        reask=reask,
        after_requests=after_requests,
        every=every,
        ttl_ms=ttl_ms,
    )


def _count(value: Any, name: str, low: int, t: FaultType) -> int:
    """A schedule's count (`after_requests`, `every`): an integer >= `low`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or _out_of_range(value):
        huge = " within float range" if isinstance(value, int) and value > low else ""
        raise InvalidFaultSpec(
            f"{t.name}: {name} must be an integer >= {low}{huge}, got {_shown(value)}. "
            + _describe_type(t)
        )
    return value


def _parse_match(value: Any, t: FaultType) -> Match:
    if value is None:
        return Match()
    if not isinstance(value, dict):
        raise InvalidFaultSpec(
            f"{t.name}: match must be an object with any of "
            f"{', '.join(MATCH_FIELDS)}, got {_shown(value)}."
        )
    unknown = set(value) - set(MATCH_FIELDS)
    if unknown:
        raise InvalidFaultSpec(
            f"{t.name}: match has no field {sorted(unknown)[0]!r}; valid "
            f"fields: {', '.join(MATCH_FIELDS)}."
        )
    for key in ("path", "model", "session", "contains", "tool", "server"):
        if value.get(key) is not None:
            if not isinstance(value[key], str):
                raise InvalidFaultSpec(
                    f"{t.name}: match.{key} must be a string, got {_shown(value[key])}."
                )
            _text(value[key], f"match.{key}", t)
    for key in ("contains", "tool"):
        if value.get(key) == "":
            raise InvalidFaultSpec(
                f"{t.name}: match.{key} must not be empty (leave it out to match any request)."
            )
    if value.get("stream") is not None and not isinstance(value["stream"], bool):
        raise InvalidFaultSpec(f"{t.name}: match.stream must be true or false.")
    turn = value.get("turn")
    if turn is not None and (
        isinstance(turn, bool) or not isinstance(turn, int) or turn < 1 or _out_of_range(turn)
    ):
        raise InvalidFaultSpec(
            f"{t.name}: match.turn must be an integer >= 1 (the session's n-th provider "
            f"request, counting from 1), got {_shown(turn)}."
        )
    return Match(**{k: value.get(k) for k in MATCH_FIELDS})


def parse_fault_specs(data: Any) -> list[FaultSpec]:
    """One spec (an object) or several in order (an array); all valid or none."""
    items = data if isinstance(data, list) else [data]
    if not items:
        raise InvalidFaultSpec(
            "an empty array arms nothing; send a fault spec object or a non-empty array of them"
        )
    specs = []
    for i, item in enumerate(items):
        try:
            specs.append(parse_fault_spec(item))
        except InvalidFaultSpec as exc:
            if isinstance(data, list):
                raise InvalidFaultSpec(f"fault [{i}]: {exc}") from None
            raise
    return specs


def _scalar(text: str) -> Any:
    """A query value whose kind is not known: true/false, an integer, a number, or text
    (then validation says what was expected)."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def _typed(text: str, kind: type) -> Any:
    if kind is str:
        return text
    if kind is bool:
        return {"true": True, "false": False}.get(text.lower(), text)
    try:
        return kind(text)
    except ValueError:
        return _scalar(text)  # "1.5" for an integer: refused as 1.5, as in a JSON spec


_COMMON_KINDS: Mapping[str, type] = {
    "remaining": int,
    "probability": float,
    "reask": bool,
    **SCHEDULE_FIELDS,
}
_MATCH_KINDS: Mapping[str, type] = {"stream": bool, "turn": int}


def spec_from_query(type_name: str, query: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """The JSON spec that ``POST /__fault/{type}?k=v&...`` stands for, each value typed
    by the kind of the parameter it sets (text parameters stay strings: ``message=404``).
    ``session``, ``model``, ``path``, ``stream``, ``contains``, ``tool`` and ``turn``
    (or ``match.NAME``) fill ``match``.
    Values that fit no kind are passed on as they are, for `parse_fault_spec` to refuse."""
    entry = FAULT_TYPES.get(type_name)
    spec: dict[str, Any] = {"type": type_name}
    match: dict[str, Any] = {}
    for key, text in query:
        name = key.removeprefix("match.")
        if name in MATCH_FIELDS:
            match[name] = _typed(text, _MATCH_KINDS.get(name, str))
            continue
        param = entry.params.get(_ALIASES.get(name, name)) if entry is not None else None
        if param is not None:
            spec[name] = _typed(text, param.kind)
        elif _ALIASES.get(name, name) in _COMMON_KINDS:
            spec[name] = _typed(text, _COMMON_KINDS[_ALIASES.get(name, name)])
        else:
            spec[name] = _scalar(text)
    if match:
        spec["match"] = match
    return spec
