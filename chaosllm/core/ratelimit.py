"""Live rate limits (``--rate-limit rpm=N,tpm=M``): token buckets, pure, on the engine's
clock.

Theory of operation. Each caller has its own buckets: a caller is the API key the
request carries (`api_key`: ``Authorization: Bearer``, ``x-api-key``, ``api-key``,
``x-goog-api-key`` or the ``key=`` query parameter; hashed with a salt drawn when the
process starts, `key_id`: the key itself is never kept, shown or logged) together with
its session (``X-Chaosllm-Session``), so that two tests sharing a key but not a session
never drain each other's buckets. A bucket holds a minute's worth (``rpm`` requests,
``tpm`` tokens), starts full and refills continuously at a sixtieth of that per second of
the engine's `Clock` (a `ManualClock` in tests: no test sleeps to see a refill).

A request costs one request and its tokens: its prompt's (estimated, `prompt_tokens`:
about four characters a token of the canonical request) plus its answer's completion
tokens (the answer's own usage when it reports one, else the same estimate over the
answer, `completion_tokens`). It is served when the buckets hold one request and its
tokens (a request larger than the whole token bucket waits for a full one, and leaves it
in debt); otherwise it is refused, costs nothing, and is told the exact wait until the
buckets can serve it (`RateLimitState.retry_after`). The input and output tokens are
also counted apart (Anthropic reports them), against the same limit.

Bounded: the buckets of at most `max_buckets` callers are kept, the least recently
seen forgotten first (it starts full if seen again). Thread-safe.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from chaosllm.config import RateLimit
from chaosllm.core.clock import Clock
from chaosllm.providers.base import Provider, canonical_json
from chaosllm.providers.ratelimits import Meter, RateLimitState

__all__ = [
    "KEY_HEADERS",
    "MAX_BUCKETS",
    "Caller",
    "RateLimiter",
    "api_key",
    "completion_tokens",
    "key_headers",
    "key_id",
    "prompt_tokens",
]

KEY_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "x-goog-api-key"})
"""The request headers an API key comes in (names in lower case)."""
MAX_BUCKETS = 10_000
CHARS_PER_TOKEN = 4
_EPSILON = 1e-9
"""Slack on a wait (seconds) for the float arithmetic of refills."""

_SALT = secrets.token_bytes(16)
"""Drawn once per process: a key's id means nothing outside it."""

Caller = tuple[str | None, str | None]
"""(`key_id` of the request's API key, its session); None for either it lacks."""


def key_headers(items: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The request headers an API key may come in (`KEY_HEADERS`), names in lower case:
    what an adapter hands the engine when a live rate limit is on."""
    return tuple((name.lower(), value) for name, value in items if name.lower() in KEY_HEADERS)


def api_key(headers: Iterable[tuple[str, str]], query: bytes = b"") -> str | None:
    """The API key a request carries, in the order `KEY_HEADERS` then ``?key=``: a Bearer
    token, the value of the other headers, the access key id of an AWS signature (it is
    the same key on every request, unlike the signature). None: no key."""
    found: dict[str, str] = {}
    for name, value in headers:
        if name in KEY_HEADERS and name not in found:
            found[name] = value.strip()
    auth = found.get("authorization")
    if auth:
        scheme, _, rest = auth.partition(" ")
        if scheme.lower() == "bearer":
            return rest.strip() or None
        if "Credential=" in rest:  # AWS SigV4: Credential=AKID/date/region/service/...
            return rest.split("Credential=", 1)[1].split("/", 1)[0] or None
        return auth
    for name in ("x-api-key", "api-key", "x-goog-api-key"):
        if found.get(name):
            return found[name]
    if b"key=" in query:
        for name, value in parse_qsl(query.decode("latin-1")):
            if name == "key" and value:
                return value
    return None


def key_id(key: str) -> str:
    """A key's salted hash (hex): the same key gives the same id within the process, and
    the id tells nothing of the key."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), key=_SALT, digest_size=12)
    return digest.hexdigest()


def _estimate(value: Any) -> int:
    return math.ceil(len(canonical_json(value)) / CHARS_PER_TOKEN)


def prompt_tokens(provider: Provider, body: Any, raw: bytes = b"") -> int:
    """A request's prompt tokens, estimated: about four characters a token of its
    canonical form (of its raw bytes when it is not a JSON object)."""
    if not isinstance(body, dict):
        return math.ceil(len(raw) / CHARS_PER_TOKEN)
    try:
        canonical = provider.canonical(body)
    except Exception:  # a body the upstream is the judge of (the proxy modes)
        canonical = body
    return _estimate(canonical)


_USAGE_PATHS: tuple[tuple[str, str], ...] = (
    ("usage", "completion_tokens"),  # OpenAI Chat Completions
    ("usage", "output_tokens"),  # Anthropic Messages, OpenAI Responses
    ("usage", "outputTokens"),  # Bedrock Converse
    ("usageMetadata", "candidatesTokenCount"),  # Gemini
)


def _usage(answer: Mapping[str, Any]) -> int | None:
    for outer, inner in _USAGE_PATHS:
        usage = answer.get(outer)
        if isinstance(usage, dict):
            count = usage.get(inner)
            if type(count) is int and count >= 0:
                return count
    count = answer.get("eval_count")  # Ollama
    return count if type(count) is int and count >= 0 else None


def completion_tokens(provider: Provider, answer: Any, request: Any) -> int:
    """The completion tokens of an answer: its usage, as the client would read it (what
    a recording lacks is estimated as the provider fills it in, `served_answer`), else
    about four characters a token of the answer."""
    if not isinstance(answer, dict):
        return 0
    found = _usage(answer)
    if found is None:
        try:
            served = provider.served_answer(answer, request)
        except Exception:
            served = answer
        found = _usage(served) if isinstance(served, dict) else None
    return found if found is not None else _estimate(answer)


class _Buckets:
    """One caller's levels (requests, tokens, input tokens, output tokens) at `stamp`."""

    __slots__ = ("levels", "stamp")

    def __init__(self, capacities: tuple[float, float, float, float], now: float) -> None:
        self.levels = list(capacities)
        self.stamp = now


@dataclass(frozen=True, slots=True)
class _Shape:
    capacities: tuple[float, float, float, float]
    limited: tuple[bool, bool, bool, bool]


class RateLimiter:
    """The buckets of every caller under one `RateLimit`, on `clock`."""

    def __init__(self, limit: RateLimit, clock: Clock, *, max_buckets: int = MAX_BUCKETS) -> None:
        self.limit = limit
        self.clock = clock
        self.max_buckets = max_buckets
        rpm = float(limit.rpm or 0)
        tpm = float(limit.tpm or 0)
        self._shape = _Shape(
            (rpm, tpm, tpm, tpm),
            (limit.rpm is not None, *(limit.tpm is not None,) * 3),
        )
        self._buckets: OrderedDict[Caller, _Buckets] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, caller: Caller, input_tokens: int, output_tokens: int) -> RateLimitState:
        """Charge `caller` one request and its tokens when its buckets hold them (the state
        after); else charge nothing and say how long until they do."""
        now = self.clock.monotonic()
        shape = self._shape
        caps = shape.capacities
        with self._lock:
            buckets = self._buckets.get(caller)
            if buckets is None:
                buckets = self._buckets[caller] = _Buckets(caps, now)
                while len(self._buckets) > self.max_buckets:
                    self._buckets.popitem(last=False)
            else:
                self._buckets.move_to_end(caller)
                self._refill(buckets, now)
            levels = buckets.levels
            tokens = input_tokens + output_tokens
            waits: list[tuple[float, str]] = []
            if shape.limited[0]:
                waits.append((self._wait(levels[0], 1.0, caps[0]), "requests"))
            if shape.limited[1]:
                waits.append((self._wait(levels[1], float(tokens), caps[1]), "tokens"))
            wait, exhausted = max(waits)
            if wait > _EPSILON:
                return self._state(levels, allowed=False, retry_after=wait, exhausted=exhausted)
            for i, cost in enumerate((1, tokens, input_tokens, output_tokens)):
                if shape.limited[i]:
                    levels[i] -= cost
            return self._state(levels)

    def peek(self, caller: Caller) -> RateLimitState:
        """`caller`'s buckets now, without charging (full when it was never seen)."""
        now = self.clock.monotonic()
        with self._lock:
            buckets = self._buckets.get(caller)
            levels = list(self._shape.capacities)
            if buckets is not None:
                self._refill(buckets, now)
                levels = list(buckets.levels)
        return self._state(levels)

    def callers(self) -> list[Caller]:
        """The callers whose buckets are kept, least recently seen first."""
        with self._lock:
            return list(self._buckets)

    def clear(self) -> None:
        """Every bucket full again (the callers are forgotten)."""
        with self._lock:
            self._buckets.clear()

    # -- the arithmetic ---------------------------------------------------------------

    def _refill(self, buckets: _Buckets, now: float) -> None:
        elapsed = now - buckets.stamp
        if elapsed <= 0:
            return
        levels = buckets.levels
        for i, cap in enumerate(self._shape.capacities):
            levels[i] = min(cap, levels[i] + elapsed * cap / 60.0)
        buckets.stamp = now

    @staticmethod
    def _wait(level: float, cost: float, cap: float) -> float:
        """Seconds until a bucket at `level` holds `cost` (at most a full bucket)."""
        need = min(cost, cap)
        return max(0.0, (need - level) * 60.0 / cap)

    def _state(
        self,
        levels: list[float],
        *,
        allowed: bool = True,
        retry_after: float = 0.0,
        exhausted: str | None = None,
    ) -> RateLimitState:
        shape = self._shape
        meters: list[Meter | None] = []
        for i, cap in enumerate(shape.capacities):
            if not shape.limited[i]:
                meters.append(None)
                continue
            level = levels[i]
            meters.append(
                Meter(
                    limit=int(cap),
                    remaining=max(0, math.floor(level + _EPSILON)),
                    reset=max(0.0, (cap - level) * 60.0 / cap),
                )
            )
        return RateLimitState(
            requests=meters[0],
            tokens=meters[1],
            input_tokens=meters[2],
            output_tokens=meters[3],
            wall=self.clock.wall(),
            allowed=allowed,
            retry_after=retry_after,
            exhausted=exhausted,
        )

    def to_json(self, session: str | None = None) -> dict[str, Any]:
        """``GET /__ratelimit``: the limit and the buckets kept (`session`'s only, when
        given), each caller by its key's id, never the key."""
        callers = [c for c in self.callers() if session is None or c[1] == session]
        return {
            "rate_limit": self.limit.to_json(),
            "buckets": [
                {"key": caller[0], "session": caller[1], **_state_json(self.peek(caller))}
                for caller in callers
            ],
        }


def _meter_json(meter: Meter | None) -> dict[str, Any] | None:
    if meter is None:
        return None
    return {
        "limit": meter.limit,
        "remaining": meter.remaining,
        "reset_ms": math.ceil(meter.reset * 1000 - 1e-6),
    }


def _state_json(state: RateLimitState) -> dict[str, Any]:
    return {
        "requests": _meter_json(state.requests),
        "tokens": _meter_json(state.tokens),
        "input_tokens": _meter_json(state.input_tokens),
        "output_tokens": _meter_json(state.output_tokens),
    }
