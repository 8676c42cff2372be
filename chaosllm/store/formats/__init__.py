"""The fixture formats chaosllm reads: the registry, detection and loading.

==============  =============================================  ==========================
format          a file is                                      its exchanges are found by
==============  =============================================  ==========================
``session``     ``{"chaosllm": 1, "session": {"events"}}``     turns (`chaosllm.store.sessions`)
``chaosllm``    ``{"chaosllm": 1, "request", "response"}``     the request digest
``hash-keyed``  ``<sha256>.json``: ``{"response": {...}}``     the file's hash (`hashkeyed`)
``trace``       ``{"model_name", "turns" | "steps"}``          their order (`trace`)
``vcr``         ``{"interactions": [...], "version": 1}``,     the request digest (`vcr`)
                YAML (``.yaml``/``.yml``) or JSON
==============  =============================================  ==========================

Each format is one module with one `FixtureFormat` entry (``FORMAT``: its name, how a
file is detected and parsed, its keying and alias digest, whether ``chaosllm import``
takes it), and `FORMATS` lists the entries; everything else here -- `detect`,
`read_file`, `IMPORTABLE`, `ALIAS_DIGESTS`, `RECORDING_SUFFIXES`, the error of a file in
none of them -- is derived from that list. Adding a format is one module and one line in
`FORMATS`. A file is in the format of the first entry whose ``detect`` accepts it, so an
entry goes after the ones whose files it could be mistaken for.

A recordings directory may mix them: `chaosllm.store.recordings.RecordingStore` loads
every file `recording_files` finds through `read_file`, which detects the format from
the content. A file in none of them is an `UnknownFormat` error, reported with its path
like any unreadable file.

Names: a file holding one answer (native, hash-keyed) is
``<dir scenario>/<file stem>`` like a native recording; a file holding a run
(a trace, a cassette: `FixtureFormat.holds_run`) is a scenario of its own, named by its
path without the suffix (``advanced/steering``), its exchanges ``<scenario>/<NNNN>`` in
order.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import MappingProxyType

from chaosllm.errors import RecordingError, UnknownFormat
from chaosllm.model import JSON, Exchange
from chaosllm.store.formats import hashkeyed, native, session, trace, vcr
from chaosllm.store.formats.base import YAML_SUFFIXES, FixtureFormat, Location

__all__ = [
    "ALIAS_DIGESTS",
    "FORMATS",
    "IMPORTABLE",
    "NATIVE",
    "RECORDING_SUFFIXES",
    "UNKNOWN",
    "UNKNOWN_HINT",
    "FixtureFormat",
    "Location",
    "detect",
    "format_of",
    "load_any",
    "load_tree",
    "parse_data",
    "read_data",
    "read_file",
    "recording_files",
    "recording_paths",
]


def _registry(*entries: FixtureFormat) -> Mapping[str, FixtureFormat]:
    return MappingProxyType({entry.name: entry for entry in entries})


FORMATS: Mapping[str, FixtureFormat] = _registry(
    session.FORMAT,
    native.FORMAT,
    vcr.FORMAT,
    trace.FORMAT,
    hashkeyed.FORMAT,
)
"""Every format chaosllm reads, by name, in the order files are detected."""

NATIVE = native.FORMAT.name
UNKNOWN = "unknown"
"""What `detect` says of a file in none of `FORMATS`."""

IMPORTABLE = tuple(sorted(name for name, entry in FORMATS.items() if entry.importable))
"""What ``chaosllm import FORMAT SRC DEST`` converts."""

ALIAS_DIGESTS: Mapping[str, Callable[[JSON], str]] = MappingProxyType(
    {
        entry.keying: entry.alias_digest
        for entry in FORMATS.values()
        if entry.alias_digest is not None
    }
)
"""For each `Keying` whose digest is not chaosllm's: the digest of an incoming request
under that keying (the exact matcher looks it up when such exchanges are loaded)."""

RECORDING_SUFFIXES = tuple(dict.fromkeys(s for entry in FORMATS.values() for s in entry.suffixes))
"""Files a recordings directory is searched for (``.json``, and YAML cassettes)."""


def _either(shapes: Iterable[str]) -> str:
    *rest, last = shapes
    return f"{', '.join(rest)} or {last}" if rest else last


UNKNOWN_HINT = "unknown format: this is not " + _either(e.shape for e in FORMATS.values())
"""The problem of a file in none of `FORMATS`."""


def read_data(path: Path) -> JSON:
    """A file's parsed content (YAML for ``.yaml``/``.yml``, else JSON); `RecordingError`
    says why it cannot be read."""
    if path.suffix.lower() in YAML_SUFFIXES:
        return _read_yaml(path)
    try:
        with open(path, "rb") as fh:
            return json.loads(fh.read())
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordingError(str(path), f"cannot read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise RecordingError(
            str(path), f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc


def _read_yaml(path: Path) -> JSON:
    # Imported on use: only cassettes are YAML, and the import costs start-up time.
    import yaml  # type: ignore[import-untyped, unused-ignore]

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # a safe loader
    try:
        with open(path, encoding="utf-8") as fh:
            return yaml.load(fh, Loader=loader)
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordingError(str(path), f"cannot read: {exc}") from exc
    except yaml.YAMLError as exc:
        raise RecordingError(str(path), f"not valid YAML: {exc}") from exc


def format_of(path: Path, data: JSON) -> FixtureFormat | None:
    """The entry of the first format of `FORMATS` a file (its path, its parsed content) is
    in, or None."""
    return next((entry for entry in FORMATS.values() if entry.detect(path, data)), None)


def detect(path: Path, data: JSON) -> str:
    """The format of a file's parsed content: one of `FORMATS`, or `UNKNOWN`."""
    entry = format_of(path, data)
    return UNKNOWN if entry is None else entry.name


def parse_data(path: Path, data: JSON, *, root: Path, fmt: str | None = None) -> list[Exchange]:
    """The exchanges of file `path` under recordings directory `root`, given its parsed
    content (`read_data`); with `fmt`, the file must be in that format.
    `RecordingError` (`UnknownFormat`) says what is wrong."""
    entry = format_of(path, data)
    source = str(path)
    if fmt is not None and (entry is None or entry.name != fmt):
        if entry is None:
            raise UnknownFormat(source, f"not a {fmt} file: {UNKNOWN_HINT}")
        raise RecordingError(source, f"not a {fmt} file (it looks like a {entry.name} file)")
    if entry is None:
        raise UnknownFormat(source, UNKNOWN_HINT)
    return entry.parse(data, Location.of(path, root=root, holds_run=entry.holds_run))


def read_file(path: Path, *, root: Path, fmt: str | None = None) -> list[Exchange]:
    """The exchanges of one file under recordings directory `root`; with `fmt`, the file
    must be in that format. `RecordingError` (`UnknownFormat`) says what is wrong."""
    return parse_data(path, read_data(path), root=root, fmt=fmt)


def recording_files(root: Path) -> list[Path]:
    """The files under `root` in any of `RECORDING_SUFFIXES` (hidden ones and those in
    hidden directories left out), in a stable order."""
    return [Path(p) for p in recording_paths(root)]


def recording_paths(root: Path) -> list[str]:
    """`recording_files` as strings, spelt as ``str()`` of those paths (pathlib's paths
    cost a fifth of a 10k-file load)."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        names = [f for f in filenames if f.endswith(RECORDING_SUFFIXES) and not f.startswith(".")]
        if not names:
            continue
        top = str(Path(dirpath))
        prefix = "" if top == "." else top if top.endswith(os.sep) else top + os.sep
        found.extend(prefix + f for f in sorted(names))
    return found


def load_tree(path: Path, *, fmt: str | None = None) -> tuple[list[Exchange], list[RecordingError]]:
    """Every exchange of a file or a directory tree (in `fmt`, when given), and the
    errors of the files that could not be read."""
    path = Path(path)
    if path.is_file():
        files, root = [path], path.parent
    elif path.is_dir():
        files, root = recording_files(path), path
    else:
        return [], [RecordingError(str(path), "no such file or directory")]
    exchanges: list[Exchange] = []
    errors: list[RecordingError] = []
    for file in files:
        if file.suffix.lower() not in RECORDING_SUFFIXES:
            errors.append(UnknownFormat(str(file), UNKNOWN_HINT))
            continue
        try:
            exchanges.extend(read_file(file, root=root, fmt=fmt))
        except RecordingError as exc:
            errors.append(exc)
    return exchanges, errors


def load_any(path: Path, *, fmt: str | None = None) -> list[Exchange]:
    """Every exchange of a file or directory in any format chaosllm reads (or in `fmt`);
    `RecordingError` for the first file that cannot be read."""
    exchanges, errors = load_tree(path, fmt=fmt)
    if errors:
        raise errors[0]
    return exchanges
