"""Fault profiles: named schedules of faults kept as JSON files.

A profile file holds ``{"description": "...", "faults": [spec, ...]}``; the
specs are armed in order. `load_profile` takes a shipped profile's name (the
files in `faults/`) or a path to a file of one's own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaosllm.errors import InvalidFaultSpec, UnsafePath
from chaosllm.faults.spec import FaultSpec, parse_fault_specs
from chaosllm.store.recordings import safe_child, shipped_dir

__all__ = ["Profile", "list_profiles", "load_profile", "parse_profile"]


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


def list_profiles(directory: Path | None = None) -> list[str]:
    root = directory or shipped_dir("faults")
    return sorted(p.stem for p in root.glob("*.json")) if root.is_dir() else []


def load_profile(name_or_path: str, directory: Path | None = None) -> Profile:
    """A shipped profile by name (``flaky-provider``) or a profile file by path."""
    root = directory or shipped_dir("faults")
    path = Path(name_or_path)
    if path.suffix == ".json" and path.is_file():
        target = path
    else:
        try:
            target = safe_child(root, f"{name_or_path}.json")
        except UnsafePath as exc:
            raise InvalidFaultSpec(f"bad profile name: {exc}") from None
        if not target.is_file():
            known = ", ".join(list_profiles(root)) or "(none)"
            raise InvalidFaultSpec(
                f"unknown profile {name_or_path!r}; shipped profiles: "
                f"{known}; or give the path of a .json profile file"
            )
    try:
        data = json.loads(target.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidFaultSpec(f"profile {target}: cannot read it: {exc}") from None
    return parse_profile(data, target.stem)
