"""Hypothesis strategies for fault specs and fault schedules.

    from hypothesis import given
    from chaosllm.testing.strategies import fault_schedules

    @given(schedule=fault_schedules(max_faults=2, types=["http_503", "dropped_connection"]))
    def test_my_client_recovers(chaosllm, schedule): ...

Every factory takes keyword-only arguments and validates them when it is
called (`hypothesis.errors.InvalidArgument`), not when the first example is
drawn. Examples are fault-spec dicts, ready for ``ChaosServer.arm`` or
``POST /__fault``. They shrink toward shorter schedules, toward the types
listed first, and toward smaller parameters; parameter ranges default to small
values (tens of milliseconds) so that property tests stay fast.

Which parameters are drawn, and how, is the catalogue's (`Param.draw`, one of
`chaosllm.faults.Draw`); the shrink order of the types is its `simplicity`. A
fault type added to the catalogue is drawn here without a line changed.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from chaosllm.faults import FAULT_TYPES, Draw
from chaosllm.faults.session import not_http
from chaosllm.faults.transform import any_request

__all__ = [
    "MCP_FAULTS",
    "RECOVERABLE",
    "SESSION_FAULTS",
    "SIMPLEST_FIRST",
    "fault_schedules",
    "faults",
    "joint_fault_schedules",
    "mcp_faults",
    "resilience_settings",
]

SIMPLEST_FIRST: tuple[str, ...] = tuple(
    sorted(FAULT_TYPES, key=lambda name: FAULT_TYPES[name].simplicity)
)
"""Every fault type, the simplest to reason about first (what examples shrink toward)."""

RECOVERABLE: tuple[str, ...] = tuple(
    name for name in SIMPLEST_FIRST if FAULT_TYPES[name].retryable is not False
)
"""Types a careful client can recover from by retrying (each fault is one-shot unless
armed otherwise, so the next attempt gets the real answer): all but the failure classes
no retry cures (`FaultType.retryable` False: ``insufficient_quota``,
``context_length_exceeded``...), which a careful client does not retry."""
RECOVERABLE = tuple(name for name in RECOVERABLE if FAULT_TYPES[name].on_request is any_request)
"""(Nor the wire quirks, which fire on SSE streams only and break no careful client: drawn
only when named, as ``types=["crlf_frames", ...]``.)"""

SESSION_FAULTS: tuple[str, ...] = tuple(
    name for name in SIMPLEST_FIRST if FAULT_TYPES[name].on_request is not_http
)
"""The faults of WebSocket sessions (never drawn by default: they fire on sessions only):
``faults(types=SESSION_FAULTS)`` draws them, ``after_events`` among their parameters."""
MCP_FAULTS: tuple[str, ...] = tuple(
    name for name in SIMPLEST_FIRST if FAULT_TYPES[name].mcp and not FAULT_TYPES[name].silence_param
)
"""The MCP servers' faults `mcp_faults` draws by default (``mcp_timeout``, which leaves a
client to its own timeout, only when named)."""

_RETRYABLE_STATUSES = (500, 502, 503, 504, 529)

resilience_settings = settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
"""Settings for property tests that talk to a server: fewer examples than the default
(each one makes real requests), no per-example deadline (retries wait), and the
`chaosllm` fixture allowed (call ``chaosllm.reset()`` at the top of the test)."""


def _check_types(types: Sequence[str] | None) -> tuple[str, ...]:
    if types is None:
        return RECOVERABLE
    if isinstance(types, str) or not isinstance(types, Sequence):
        raise InvalidArgument(f"types must be a sequence of fault type names, got {types!r}")
    if not types:
        raise InvalidArgument("types must name at least one fault type")
    unknown = [t for t in types if t not in FAULT_TYPES]
    if unknown:
        raise InvalidArgument(
            f"unknown fault type {unknown[0]!r}; valid types: {', '.join(FAULT_TYPES)}"
        )
    if len(set(types)) != len(types):
        raise InvalidArgument(f"types lists a type twice: {list(types)!r}")
    return tuple(types)


def _check_range(name: str, value: float, *, low: float = 0, integer: bool = False) -> None:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or value != value or value < low:
        kind = "an integer" if integer else "a number"
        raise InvalidArgument(f"{name} must be {kind} >= {low}, got {value!r}")


def _spec(type_: str, common: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    return {"type": type_, **params, **common}


_PLAIN_SCHEDULE = {"after_requests": 0, "every": 1}


def _scheduled(drawn: tuple[dict[str, Any], dict[str, Any]]) -> dict[str, Any]:
    """A drawn spec with its drawn schedule fields, those at their defaults left out."""
    spec, schedule = drawn
    return {**spec, **{k: v for k, v in schedule.items() if v != _PLAIN_SCHEDULE[k]}}


def faults(
    *,
    types: Sequence[str] | None = None,
    max_after_chunks: int = 4,
    max_retry_after: float = 0.05,
    max_delay_ms: float = 30.0,
    stall_ms: float = 2000.0,
    statuses: Sequence[int] = _RETRYABLE_STATUSES,
    remaining: int = 1,
    session: str | None = None,
    max_after_requests: int = 0,
    max_every: int = 1,
) -> st.SearchStrategy[dict[str, Any]]:
    """One fault spec of one of `types` (default: `RECOVERABLE`, simplest first; a type no
    retry cures is drawn only when named).

    - `max_after_chunks`: cuts happen after 0..N frames.
    - `max_retry_after`: Retry-After values drawn from 0..N seconds (429, 503).
    - `max_delay_ms`: latency and slow_stream delays (a tenth of it per piece).
    - `stall_ms`: how long a stall lasts before the server closes (make the client's
      timeout shorter to test that it gives up).
    - `statuses`: the statuses `http_error` draws from (default: retryable 5xx).
    - `remaining`, `session`: set on every spec (`session` becomes ``match.session``).
    - `max_after_requests`, `max_every`: draw the schedule fields ``after_requests``
      (0..N) and ``every`` (1..N); by default neither is drawn. They shrink toward 0 and 1,
      which are left out of the spec: the simplest example is a plain one-shot fault.
    """
    chosen = _check_types(types)
    _check_range("max_after_chunks", max_after_chunks, integer=True)
    _check_range("max_retry_after", max_retry_after)
    _check_range("max_delay_ms", max_delay_ms)
    _check_range("stall_ms", stall_ms)
    _check_range("remaining", remaining, low=1, integer=True)
    _check_range("max_after_requests", max_after_requests, integer=True)
    _check_range("max_every", max_every, low=1, integer=True)
    if (
        isinstance(statuses, (str, bytes))
        or not statuses
        or not all(isinstance(s, int) and 400 <= s <= 599 for s in statuses)
    ):
        raise InvalidArgument(
            f"statuses must be a non-empty sequence of HTTP error statuses "
            f"(400-599), got {statuses!r}"
        )
    if session is not None and not isinstance(session, str):
        raise InvalidArgument(f"session must be a string, got {session!r}")

    draws: dict[Draw, st.SearchStrategy[Any]] = {
        Draw.AFTER_CHUNKS: st.integers(min_value=0, max_value=max_after_chunks),
        # Never 0: clients (the openai SDK among them) ignore a zero Retry-After and fall
        # back to their own, much longer, backoff.
        Draw.RETRY_AFTER: st.sampled_from(sorted({max_retry_after / 2, max_retry_after})),
        Draw.STATUS: st.sampled_from(list(statuses)),
        Draw.DELAY_MS: st.integers(min_value=0, max_value=int(max_delay_ms)),
        Draw.PIECE_DELAY_MS: st.integers(0, max(1, int(max_delay_ms // 10))),
        Draw.STALL_MS: st.just(stall_ms),
    }
    common: dict[str, Any] = {"remaining": remaining}
    if session is not None:
        common["match"] = {"session": session}

    schedule: dict[str, st.SearchStrategy[Any]] = {}
    if max_after_requests:
        schedule["after_requests"] = st.integers(min_value=0, max_value=max_after_requests)
    if max_every > 1:
        schedule["every"] = st.integers(min_value=1, max_value=max_every)

    def build(type_: str) -> st.SearchStrategy[dict[str, Any]]:
        params = {
            name: draws[param.draw]
            for name, param in FAULT_TYPES[type_].params.items()
            if param.draw is not None
        }
        built = st.fixed_dictionaries(params).map(functools.partial(_spec, type_, common))
        if not schedule:
            return built
        return st.tuples(built, st.fixed_dictionaries(schedule)).map(_scheduled)

    # one_of shrinks toward its first branches: the simplest types.
    return st.one_of([build(t) for t in chosen])


def fault_schedules(
    *,
    min_faults: int = 0,
    max_faults: int = 3,
    types: Sequence[str] | None = None,
    **fault_options: Any,
) -> st.SearchStrategy[list[dict[str, Any]]]:
    """A list of fault specs armed in order: each fires on one request (FIFO), so a
    schedule of k faults breaks the next k requests. Shrinks toward fewer, simpler
    faults. `fault_options` are passed to `faults`."""
    _check_range("min_faults", min_faults, integer=True)
    _check_range("max_faults", max_faults, integer=True)
    if min_faults > max_faults:
        raise InvalidArgument(f"min_faults={min_faults} is more than max_faults={max_faults}")
    _check_options(fault_options)
    return st.lists(faults(types=types, **fault_options), min_size=min_faults, max_size=max_faults)


def _check_options(fault_options: dict[str, Any]) -> None:
    unknown = set(fault_options) - {
        "max_after_chunks",
        "max_retry_after",
        "max_delay_ms",
        "stall_ms",
        "statuses",
        "remaining",
        "session",
        "max_after_requests",
        "max_every",
    }
    if unknown:
        raise InvalidArgument(f"unknown option {sorted(unknown)[0]!r} for fault_schedules")


def _at(spec: dict[str, Any], server: str, tool: str | None) -> dict[str, Any]:
    match = {**spec.get("match", {}), "server": server}
    if tool is not None:
        match["tool"] = tool
    return {**spec, "match": match}


def mcp_faults(
    *,
    servers: Sequence[str],
    tools: Sequence[str] = (),
    types: Sequence[str] | None = None,
    **fault_options: Any,
) -> st.SearchStrategy[dict[str, Any]]:
    """One MCP fault (of `types`, default `MCP_FAULTS`) on one of `servers`
    (``match.server``), on any tool or one of `tools` (``match.tool``, shrinking toward any
    tool). `fault_options` as `faults` takes them."""
    if isinstance(servers, str) or not servers or not all(isinstance(s, str) for s in servers):
        raise InvalidArgument(f"servers must be a non-empty sequence of names, got {servers!r}")
    if isinstance(tools, str) or not all(isinstance(t, str) for t in tools):
        raise InvalidArgument(f"tools must be a sequence of tool names, got {tools!r}")
    chosen = _check_types(types if types is not None else MCP_FAULTS)
    tool = st.none() | st.sampled_from(list(tools)) if tools else st.none()
    return st.tuples(
        faults(types=chosen, **fault_options), st.sampled_from(list(servers)), tool
    ).map(lambda drawn: _at(*drawn))


def joint_fault_schedules(
    *,
    servers: Sequence[str],
    tools: Sequence[str] = (),
    min_faults: int = 0,
    max_faults: int = 3,
    model_types: Sequence[str] | None = None,
    mcp_types: Sequence[str] | None = None,
    **fault_options: Any,
) -> st.SearchStrategy[list[dict[str, Any]]]:
    """One schedule over the model and the agent's MCP servers, for one fault board and
    one seed: each spec a model fault (`faults`, of `model_types`) or an MCP fault
    (`mcp_faults` on `servers`, of `mcp_types`). Shrinks toward fewer faults and toward
    model faults first (the simplest)."""
    _check_range("min_faults", min_faults, integer=True)
    _check_range("max_faults", max_faults, integer=True)
    if min_faults > max_faults:
        raise InvalidArgument(f"min_faults={min_faults} is more than max_faults={max_faults}")
    _check_options(fault_options)
    either = st.one_of(
        faults(types=model_types, **fault_options),
        mcp_faults(servers=servers, tools=tools, types=mcp_types, **fault_options),
    )
    return st.lists(either, min_size=min_faults, max_size=max_faults)
