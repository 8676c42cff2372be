"""Server configuration: what `chaosllm serve` flags and `ChaosServer(...)` arguments set."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from chaosllm.matching import DEFAULT_ORDER, Strategy
from chaosllm.store import shipped_dir

__all__ = ["Mode", "OnMiss", "ServerConfig", "parse_timing"]


_C = TypeVar("_C", bound="_Choice")


class _Choice(str, enum.Enum):
    @classmethod
    def parse(cls: type[_C], value: str) -> _C:
        try:
            return cls(value)
        except ValueError:
            valid = ", ".join(m.value for m in cls)
            raise ValueError(f"invalid {cls.__name__.lower()} {value!r}; valid values: "
                             f"{valid}") from None


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
            raise ValueError(f"invalid timing {value!r}; use fast, recorded or a scale factor "
                             f"such as 0.5") from None
    if not scale >= 0.0 or scale == float("inf"):
        raise ValueError(f"invalid timing {value!r}: the scale must be a finite number >= 0")
    return scale


@dataclass
class ServerConfig:
    recordings: Sequence[Path] = field(default_factory=lambda: [shipped_dir("recordings")])
    mode: Mode = Mode.REPLAY
    on_miss: OnMiss = OnMiss.ERROR
    seed: int = 0
    timing: float = 0.0
    match_order: Sequence[Strategy] = DEFAULT_ORDER
    nearest_threshold: float = 0.9
    upstream: str | None = None
    max_body_bytes: int = 16 * 1024 * 1024
    control_token: str | None = None
    """Required on control-plane calls when set (and for any non-loopback client)."""
