"""Fault profiles on disk: the shipped ones (the files in ``faults/``) and one's own files.

`load_profile` takes a shipped profile's name (``flaky-provider``) or the path of a
``.json`` profile file, reads it and validates it with the pure
`chaosllm.faults.profiles.parse_profile`; a name never reaches outside the profiles
directory (`safe_child`). `Profile` and `parse_profile` are re-exported for callers that
read profiles and take them from the control plane alike.
"""

from __future__ import annotations

import json
from pathlib import Path

from chaosllm.errors import InvalidFaultSpec, UnsafePath
from chaosllm.faults.profiles import Profile, parse_profile
from chaosllm.paths import safe_child, shipped_dir
from chaosllm.suggest import did_you_mean

__all__ = ["Profile", "list_profiles", "load_profile", "parse_profile"]


def list_profiles(directory: Path | None = None) -> list[str]:
    """The names of the profiles in `directory` (default: the shipped ones), sorted."""
    root = directory or shipped_dir("faults")
    return sorted(p.stem for p in root.glob("*.json")) if root.is_dir() else []


def load_profile(name_or_path: str, directory: Path | None = None) -> Profile:
    """A shipped profile by name (``flaky-provider``) or a profile file by path;
    `InvalidFaultSpec` says what is wrong."""
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
            shipped = list_profiles(root)
            raise InvalidFaultSpec(
                f"unknown profile {name_or_path!r}{did_you_mean(name_or_path, shipped)}; "
                f"shipped profiles: {', '.join(shipped) or '(none)'}; or give the path of "
                f"a .json profile file"
            )
    try:
        data = json.loads(target.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidFaultSpec(f"profile {target}: cannot read it: {exc}") from None
    return parse_profile(data, target.stem)
