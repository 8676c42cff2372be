"""Fault profiles: named schedules of faults, as data.

A profile is ``{"description": "...", "faults": [spec, ...]}``; the specs are
armed in order. It may also set live rate limits, ``"rate_limit": {"rpm": N, "tpm": M}``
(as ``--rate-limit``), applied when it is armed. `parse_profile` validates one already
read; reading them (the shipped profiles in ``faults/``, or a file of one's own) is the
store's: `chaosllm.store.profiles`.
"""

from __future__ import annotations

from typing import Any

from chaosllm.config import RateLimit, parse_rate_limit
from chaosllm.errors import ConfigError, InvalidFaultSpec
from chaosllm.faults.spec import FaultSpec, parse_fault_specs

__all__ = ["Profile", "parse_profile"]


class Profile:
    def __init__(
        self,
        name: str,
        description: str,
        specs: list[FaultSpec],
        rate_limit: RateLimit | None = None,
    ) -> None:
        self.name = name
        self.description = description
        self.specs = specs
        self.rate_limit = rate_limit

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "faults": [s.to_json() for s in self.specs],
        }
        if self.rate_limit is not None:
            data["rate_limit"] = self.rate_limit.to_json()
        return data


def parse_profile(data: Any, name: str) -> Profile:
    """The profile `name` from its parsed JSON; `InvalidFaultSpec` says what is wrong."""
    limits = data.get("rate_limit") if isinstance(data, dict) else None
    faults = (
        data.get("faults", [] if limits is not None else None) if isinstance(data, dict) else None
    )
    if not isinstance(faults, list):
        raise InvalidFaultSpec(
            f"profile {name}: expected an object "
            f'{{"description": ..., "faults": [fault spec, ...]}} (with "rate_limit": '
            f'{{"rpm": N, "tpm": M}}, "faults" may be left out)'
        )
    rate_limit = None
    if limits is not None:
        try:
            rate_limit = parse_rate_limit(limits)
        except ConfigError as exc:
            raise InvalidFaultSpec(f"profile {name}: rate_limit: {exc}") from None
    try:
        specs = parse_fault_specs(faults) if faults or rate_limit is None else []
    except InvalidFaultSpec as exc:
        raise InvalidFaultSpec(f"profile {name}: {exc}") from None
    description = data.get("description", "")
    return Profile(name, description if isinstance(description, str) else "", specs, rate_limit)
