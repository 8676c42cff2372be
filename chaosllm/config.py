"""Server configuration: what `chaosllm serve` flags and `ChaosServer(...)` arguments set."""

from __future__ import annotations

import enum
import hashlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from chaosllm.errors import ConfigError
from chaosllm.paths import shipped_dir

__all__ = [
    "DEFAULT_RECORD_SCENARIO",
    "SECRETS_ENV",
    "Mode",
    "OnMiss",
    "Pace",
    "RateLimit",
    "ServerConfig",
    "Strategy",
    "parse_pace",
    "parse_rate_limit",
    "parse_timing",
    "parse_timing_option",
    "proxy_dirs",
    "secrets_from_env",
    "session_scenario",
]

DEFAULT_RECORD_SCENARIO = "recorded"
SECRETS_ENV = "CHAOSLLM_SECRETS"
"""Comma-separated secret values to redact (besides ``--secret``)."""


_C = TypeVar("_C", bound="_Choice")


class _Choice(str, enum.Enum):
    @classmethod
    def parse(cls: type[_C], value: str) -> _C:
        try:
            return cls(value)
        except ValueError:
            valid = ", ".join(m.value for m in cls)
            raise ConfigError(
                f"invalid {cls.__name__.lower()} {value!r}; valid values: {valid}"
            ) from None


class Strategy(str, enum.Enum):
    EXACT = "exact"
    SEQUENCE = "sequence"
    NEAREST = "nearest"

    @classmethod
    def parse_order(cls, text: str) -> tuple[Strategy, ...]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        valid = ", ".join(s.value for s in cls)
        if not names:
            raise ConfigError(f"empty match order; use a comma-separated list of: {valid}")
        order = []
        for name in names:
            try:
                order.append(cls(name))
            except ValueError:
                raise ConfigError(f"unknown matcher {name!r}; valid matchers: {valid}") from None
        if len(set(order)) != len(order):
            raise ConfigError(f"matcher listed twice in {text!r}")
        return tuple(order)


DEFAULT_ORDER = (Strategy.EXACT, Strategy.SEQUENCE, Strategy.NEAREST)


class Mode(_Choice):
    REPLAY = "replay"
    RECORD = "record"
    RECORD_MISSING = "record-missing"
    PASSTHROUGH = "passthrough"


class OnMiss(_Choice):
    ERROR = "error"
    FALLBACK = "fallback"


def parse_timing(value: str | float) -> float:
    """`fast` → 0 (no gaps), `recorded` → 1 (recorded gaps), a number → that scale."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        scale = float(value)
    elif value == "fast":
        return 0.0
    elif value == "recorded":
        return 1.0
    else:
        try:
            scale = float(value)
        except ValueError:
            raise ConfigError(
                f"invalid timing {value!r}; use fast, recorded, a scale factor such as 0.5 "
                f"or a pace such as ttft=600ms,tps=50,jitter=0.25"
            ) from None
    if not scale >= 0.0 or scale == float("inf"):
        raise ConfigError(f"invalid timing {value!r}: the scale must be a finite number >= 0")
    return scale


@dataclass(frozen=True, slots=True)
class Pace:
    """A streaming pace (``--timing "ttft=600ms,tps=50,jitter=0.25"``): the first frame
    after `ttft_ms`, each later frame after its tokens at `tps` tokens a second (a frame's
    tokens: its text's characters / 4, at least 1), every gap scaled by a factor drawn
    from [1 - `jitter`, 1 + `jitter`] by the server's seeded RNG. A JSON answer's head
    waits the ttft and its whole text's tokens. `tps` None: no rate (only the ttft)."""

    ttft_ms: float = 0.0
    tps: float | None = None
    jitter: float = 0.0

    def to_json(self) -> dict[str, float | None]:
        return {"ttft_ms": self.ttft_ms, "tps": self.tps, "jitter": self.jitter}


_T = TypeVar("_T")


def _key_values(
    given: str,
    keys: Sequence[str],
    number: Callable[[str, str, str], _T],
    what: str,
    shapes: str,
) -> dict[str, _T]:
    """``key=value,...`` (`given`) by key, each value read by ``number(key, text, given)``
    as it comes; `ConfigError` for a part whose key is not one of `keys` or a key given
    twice (``invalid <what> ...: ... is not <shapes>``)."""
    found: dict[str, _T] = {}
    for part in given.split(","):
        key, sep, text = part.partition("=")
        key = key.strip()
        if not sep or key not in keys:
            raise ConfigError(f"invalid {what} {given!r}: {part.strip()!r} is not {shapes}")
        if key in found:
            raise ConfigError(f"invalid {what} {given!r}: {key} is given twice")
        found[key] = number(key, text, given)
    return found


PACE_KEYS = ("ttft", "tps", "jitter")
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s)?\s*\Z")


def _pace_number(key: str, text: str, given: str) -> float:
    found = _DURATION.fullmatch(text)
    unit = found.group(2) if found else None
    if found is None or (unit is not None and key != "ttft"):
        shape = "milliseconds >= 0 (600, 600ms or 0.6s)" if key == "ttft" else "a number >= 0"
        raise ConfigError(f"invalid timing {given!r}: {key} must be {shape}")
    value = float(found.group(1))
    return value * 1000.0 if unit == "s" else value


def parse_pace(value: str | Mapping[str, Any] | Pace) -> Pace:
    """``ttft=600ms,tps=50,jitter=0.25`` (any of them, at least one; ttft in ms or s, a
    bare number is ms), or ``{"ttft_ms": 600, "tps": 50, "jitter": 0.25}``, as a `Pace`;
    `ConfigError` naming what is wrong: an unknown key, one given twice, a negative value,
    tps 0, jitter above 1."""
    if isinstance(value, Pace):
        ttft, tps, jitter, given = value.ttft_ms, value.tps, value.jitter, repr(value)
    elif isinstance(value, str):
        given = value
        found = _key_values(
            value,
            PACE_KEYS,
            _pace_number,
            "timing",
            "ttft=, tps= or jitter= (e.g. ttft=600ms,tps=50,jitter=0.25)",
        )
        ttft, tps, jitter = found.get("ttft", 0.0), found.get("tps"), found.get("jitter", 0.0)
    elif isinstance(value, Mapping):
        given = str(dict(value))
        unknown = sorted(set(value) - {"ttft_ms", "tps", "jitter"})
        if unknown:
            raise ConfigError(
                f"invalid timing {given}: unknown key {unknown[0]!r}; the keys are ttft_ms, "
                f"tps and jitter"
            )
        numbers: dict[str, float | None] = {}
        for key in ("ttft_ms", "tps", "jitter"):
            raw = value.get(key)
            if raw is not None and (isinstance(raw, bool) or not isinstance(raw, (int, float))):
                raise ConfigError(f"invalid timing {given}: {key} must be a number")
            numbers[key] = None if raw is None else float(raw)
        ttft, tps, jitter = numbers["ttft_ms"] or 0.0, numbers["tps"], numbers["jitter"] or 0.0
    else:
        raise ConfigError(f"invalid timing {value!r}: give ttft=600ms,tps=50,jitter=0.25")
    for key, amount in (("ttft", ttft), ("tps", tps), ("jitter", jitter)):
        if amount is not None and not 0.0 <= amount < float("inf"):
            raise ConfigError(f"invalid timing {given!r}: {key} must be a finite number >= 0")
    if tps is not None and tps <= 0:
        raise ConfigError(f"invalid timing {given!r}: tps must be above 0")
    if jitter > 1:
        raise ConfigError(f"invalid timing {given!r}: jitter must be between 0 and 1")
    return Pace(ttft_ms=ttft, tps=tps, jitter=jitter)


def parse_timing_option(value: str | float | Pace) -> tuple[float, Pace | None]:
    """``--timing`` (and ``ChaosServer(timing=)``): ``fast``, ``recorded`` or a scale
    (`parse_timing`: the scale of recorded gaps, no pace), or a pace (`parse_pace`:
    ``ttft=...,tps=...,jitter=...``, rendered gaps replaced by it; scale 0)."""
    if isinstance(value, Pace) or (isinstance(value, str) and "=" in value):
        return 0.0, parse_pace(value)
    return parse_timing(value), None


@dataclass(frozen=True, slots=True)
class RateLimit:
    """Live rate limits (``--rate-limit rpm=N,tpm=M``): requests and tokens per minute,
    each a token bucket per API key and session (`chaosllm.core.ratelimit`); None: that
    one is not limited."""

    rpm: int | None = None
    tpm: int | None = None

    def to_json(self) -> dict[str, int | None]:
        return {"rpm": self.rpm, "tpm": self.tpm}


RATE_LIMIT_KEYS = ("rpm", "tpm")


def _limit_value(key: str, value: Any, given: str) -> int:
    if isinstance(value, str):
        text = value.strip()
        value = int(text) if text.isdigit() else None
    if type(value) is not int or value <= 0:
        raise ConfigError(
            f"invalid rate limit {given!r}: {key} must be a whole number above 0 "
            f"(e.g. rpm=60,tpm=40000)"
        )
    return value


def parse_rate_limit(value: str | Mapping[str, Any] | RateLimit) -> RateLimit:
    """``rpm=N,tpm=M`` (either or both), or ``{"rpm": N, "tpm": M}``, as a `RateLimit`;
    `ConfigError` naming what is wrong: an unknown key, one given twice, a value that is
    not a whole number above 0, neither given."""
    if isinstance(value, RateLimit):
        value = value.to_json()
    found: dict[str, int] = {}
    if isinstance(value, str):
        given = value
        found = _key_values(
            value,
            RATE_LIMIT_KEYS,
            _limit_value,
            "rate limit",
            "rpm=N or tpm=N (e.g. rpm=60,tpm=40000)",
        )
    elif isinstance(value, Mapping):
        given = str(dict(value))
        for key, number in value.items():
            if key not in RATE_LIMIT_KEYS:
                raise ConfigError(
                    f"invalid rate limit {given}: unknown key {key!r}; the keys are rpm and tpm"
                )
            if number is not None:
                found[key] = _limit_value(key, number, given)
    else:
        raise ConfigError(
            f'invalid rate limit {value!r}: give rpm=N,tpm=M or {{"rpm": N, "tpm": M}}'
        )
    if not found:
        raise ConfigError(
            f"invalid rate limit {given!r}: give rpm=N, tpm=M or both (e.g. rpm=60,tpm=40000)"
        )
    return RateLimit(rpm=found.get("rpm"), tpm=found.get("tpm"))


@dataclass
class ServerConfig:
    recordings: Sequence[Path] = field(default_factory=lambda: [shipped_dir("recordings")])
    mode: Mode = Mode.REPLAY
    on_miss: OnMiss = OnMiss.ERROR
    seed: int = 0
    timing: float = 0.0
    pace: Pace | None = None
    """A streaming pace (``--timing "ttft=600ms,tps=50"``) replacing every stream's gaps;
    None: the gaps `timing` gives."""
    match_order: Sequence[Strategy] = DEFAULT_ORDER
    nearest_threshold: float = 0.9
    upstream: str | None = None
    """The real provider (modes record, record-missing, passthrough)."""
    record_dir: Path | None = None
    """Where new recordings go (modes record and record-missing)."""
    certfile: Path | None = None
    """TLS on every protocol (``--tls``, ``--certfile``), with `keyfile`."""
    no_audio: bool = False
    """Recorded sessions keep a digest of each audio delta, not the audio (``--no-audio``)."""
    keyfile: Path | None = None
    record_scenario: str = DEFAULT_RECORD_SCENARIO
    """The scenario new recordings go to when the request's session has no active one."""
    secrets: Sequence[str] = ()
    """Values redacted from recordings and request keys (besides well-known key shapes)."""
    max_body_bytes: int = 16 * 1024 * 1024
    max_connections: int = 10_000
    """Client connections the builtin server holds at once (``--max-connections``): when
    full, the oldest idle keep-alive connection is closed for a new one, and the control
    plane still answers beyond it."""
    journal_size: int = 10_000
    """How many provider requests the journal keeps (the newest)."""
    fault_history_size: int = 1000
    """How many fired faults the fault history keeps (the newest; ``GET /__fault`` counts
    the others)."""
    max_sessions: int = 10_000
    """Of how many sessions the state is kept (sequence cursors, active scenario, fault
    draw ranks): the least recently used is forgotten first, and starts fresh if seen
    again."""
    max_faults: int = 10_000
    """How many faults may be armed at once (``--max-faults``): past it arming is refused
    (`chaosllm.errors.TooManyFaults`, a 429 on the control plane)."""
    control_token: str | None = None
    """Required on control-plane calls when set (and for any non-loopback client)."""
    allow_hosts: Sequence[str] = ()
    """Host names (``NAME`` or ``NAME:PORT``) the control plane answers besides loopback
    names and addresses and the server's own address (``--allow-host``)."""
    cors: Sequence[str] = ()
    """Origins whose web pages may read provider answers (``--cors ORIGIN``, ``*`` for
    any): CORS headers and preflights only for them; none by default."""
    strict: bool = False
    """Refuse (400, as the provider would) a request the oracles find a defect in."""
    scenario_from_session: bool = False
    """A session names its scenario (`session_scenario`): what it records goes there, and
    it replays from there when that scenario is loaded (``--scenario-from-session``)."""
    rate_limit: RateLimit | None = None
    """Live rate limits (``--rate-limit rpm=N,tpm=M``); None: off."""
    memo_bytes: int = 32 << 20
    """What the engine's memo of worked-out answers may hold (``--memo-bytes``; 0: none)."""
    mcp_upstreams: Mapping[str, str] = field(default_factory=dict)
    """Each MCP server's real endpoint in the proxy modes (``--mcp-upstream NAME=URL``); a
    server without one is proxied to `upstream` + ``/mcp/NAME``."""
    mcp_stream_ms: float = 300_000.0
    """How long an MCP GET stream (server-to-client) stays open at most."""
    gateway: str | None = None
    """The OpenAI-compatible gateway whose answers and errors to give (``--gateway``:
    `chaosllm.providers.gateways`); None: OpenAI's own."""


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_SCENARIO_MAX = 120


def session_scenario(session: str) -> str:
    """The scenario a session names (``--scenario-from-session``): the session id made a
    safe directory name: runs of characters other than letters, digits, ``.``, ``_`` and
    ``-`` become ``-`` (``tests/test_a.py::test_b#1`` is ``tests-test_a.py-test_b-1``), no
    leading dot, at most 120 characters (a longer one is cut and ends with a hash of the
    whole id, so that two long ids stay apart)."""
    name = _UNSAFE.sub("-", session).strip("-").lstrip(".") or "session"
    if len(name) > _SCENARIO_MAX:
        tail = hashlib.sha256(session.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        name = name[: _SCENARIO_MAX - 13].rstrip("-.") + "-" + tail
    return name


def secrets_from_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """The secret values of ``CHAOSLLM_SECRETS`` (comma-separated)."""
    raw = (os.environ if environ is None else environ).get(SECRETS_ENV, "")
    return [value.strip() for value in raw.split(",") if value.strip()]


def _same_dir(a: Path, b: Path) -> bool:
    return Path(a).resolve() == Path(b).resolve()


def proxy_dirs(
    mode: Mode,
    *,
    upstream: str | None,
    recordings: Sequence[Path] | None,
    record_dir: Path | None,
    servers: Mapping[str, str] | None = None,
) -> tuple[list[Path], Path | None]:
    """The recordings directories to load and the directory new recordings go to.

    `recordings` is None when not given (the shipped ones are then replayed). Modes other
    than replay need `upstream` or a named server's own (`servers`, ``--mcp-upstream``:
    then only those servers are proxied); record and record-missing write to `record_dir`, by
    default the first of `recordings` -- never the shipped directory unless it is given
    as `record_dir` explicitly. When `recordings` is not given, a record mode loads only
    `record_dir` (the shipped examples are not answers of your upstream). `ConfigError`
    says what is missing.
    """
    shipped = shipped_dir("recordings")
    dirs = [Path(d) for d in recordings] if recordings else [shipped]
    if mode is Mode.REPLAY:
        return dirs, None
    if not upstream and not servers:
        raise ConfigError(
            f"--mode {mode.value} needs --upstream URL: the real provider, "
            f"e.g. --upstream https://api.openai.com (or --mcp-upstream NAME=URL: an "
            f"MCP server's)"
        )
    if mode is Mode.PASSTHROUGH:
        return dirs, None
    if record_dir is None:
        if not recordings:
            raise ConfigError(
                f"--mode {mode.value} writes recordings: give --record-dir DIR "
                f"(or --recordings DIR)"
            )
        record_dir = Path(recordings[0])
        if _same_dir(record_dir, shipped):
            raise ConfigError(
                f"refusing to record into the shipped recordings ({shipped}); "
                f"give --record-dir DIR (naming it explicitly allows it)"
            )
    record_dir = Path(record_dir)
    if not recordings:
        dirs = [record_dir]
    elif not any(_same_dir(d, record_dir) for d in dirs):
        dirs.append(record_dir)
    return dirs, record_dir
