"""Where chaosllm's own files are, and the one check every user-given file name passes."""

from __future__ import annotations

from pathlib import Path

from chaosllm.errors import UnsafePath

__all__ = ["safe_child", "shipped_dir"]


def shipped_dir(kind: str) -> Path:
    """The shipped `recordings` or `faults` directory: package data in a wheel, the
    repository's top-level directory in a source checkout."""
    installed = Path(__file__).parent / "_shipped" / kind
    if installed.is_dir():
        return installed
    return Path(__file__).resolve().parent.parent / kind


def safe_child(root: Path, name: str) -> Path:
    """`root / name`, refusing names that are absolute or climb out of `root`."""
    if not name or "\x00" in name:
        raise UnsafePath(f"invalid name {name!r}")
    candidate = Path(name)
    if candidate.is_absolute() or ".." in candidate.parts or candidate.drive:
        raise UnsafePath(f"{name!r} is not a plain relative name inside {root}")
    resolved_root = root.resolve()
    target = (resolved_root / candidate).resolve()
    if target != resolved_root and resolved_root not in target.parents:
        raise UnsafePath(f"{name!r} escapes {root}")
    return target
