"""``chaosllm import FORMAT SRC DEST``: other fixture formats converted to native recordings.

Each exchange read from `SRC` (a file or a directory, in `FORMAT`) is written
as ``DEST/<its name>.json`` -- a hash-keyed fixture as ``<scenario>/<hash>.json``
keyed by its hash, a trace as ``<trace path>/<NNNN>.json`` served in order, a
cassette as ``<cassette path>/<NNNN>.json`` -- so that `DEST` replays exactly
as `SRC` did. Files are written atomically (a hidden temporary file renamed
into place), redacted (key-shaped secrets become ``[REDACTED]``), never outside
`DEST`, and never over an existing file unless asked.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from chaosllm.errors import RecordingError, UnknownFormat, UnsafePath
from chaosllm.paths import safe_child
from chaosllm.store.formats import IMPORTABLE, load_tree
from chaosllm.store.redact import Redactor
from chaosllm.store.writer import serialise

__all__ = ["ImportResult", "import_recordings", "write_atomic"]


@dataclass
class ImportResult:
    written: list[Path] = field(default_factory=list)
    existing: list[Path] = field(default_factory=list)
    """Files left alone because they exist (without ``overwrite``)."""
    errors: list[RecordingError] = field(default_factory=list)


def write_atomic(target: Path, text: str) -> None:
    """Write `text` to `target` whole or not at all (temporary file, fsync, rename)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.parent / f".chaosllm-import-{os.getpid()}-{secrets.token_hex(6)}.tmp"
    try:
        with open(temp, "x", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)


def import_recordings(fmt: str, src: Path, dest: Path, *, overwrite: bool = False) -> ImportResult:
    """Convert `src` (in `fmt`, one of `IMPORTABLE`) into native recordings under `dest`."""
    if fmt not in IMPORTABLE:
        raise UnknownFormat(
            str(src), f"unknown format {fmt!r}; chaosllm imports: {', '.join(IMPORTABLE)}"
        )
    result = ImportResult()
    exchanges, result.errors = load_tree(Path(src), fmt=fmt)
    redactor = Redactor()
    for exchange in exchanges:
        try:
            target = safe_child(Path(dest), exchange.name + ".json")
        except UnsafePath as exc:
            result.errors.append(RecordingError(exchange.source or exchange.name, str(exc)))
            continue
        if target.exists() and not overwrite:
            result.existing.append(target)
            continue
        write_atomic(target, serialise(exchange, redactor))
        result.written.append(target)
    return result
