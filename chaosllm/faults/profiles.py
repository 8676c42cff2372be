"""Fault profiles: named schedules of faults, as data.

A profile is ``{"description": "...", "faults": [spec, ...]}``; the specs are
armed in order. `parse_profile` validates one already read; reading them (the
shipped profiles in ``faults/``, or a file of one's own) is the store's:
`chaosllm.store.profiles`.
"""

from __future__ import annotations

from typing import Any

from chaosllm.errors import InvalidFaultSpec
from chaosllm.faults.spec import FaultSpec, parse_fault_specs

__all__ = ["Profile", "parse_profile"]


class Profile:
    def __init__(self, name: str, description: str, specs: list[FaultSpec]) -> None:
        self.name = name
        self.description = description
        self.specs = specs

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "faults": [s.to_json() for s in self.specs],
        }


def parse_profile(data: Any, name: str) -> Profile:
    """The profile `name` from its parsed JSON; `InvalidFaultSpec` says what is wrong."""
    if not isinstance(data, dict) or not isinstance(data.get("faults"), list):
        raise InvalidFaultSpec(
            f"profile {name}: expected an object "
            f'{{"description": ..., "faults": [fault spec, ...]}}'
        )
    try:
        specs = parse_fault_specs(data["faults"])
    except InvalidFaultSpec as exc:
        raise InvalidFaultSpec(f"profile {name}: {exc}") from None
    description = data.get("description", "")
    return Profile(name, description if isinstance(description, str) else "", specs)
