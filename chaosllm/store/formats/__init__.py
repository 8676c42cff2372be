"""The fixture formats chaosllm reads: detection and loading.

==============  =============================================  ==========================
format          a file is                                      its exchanges are found by
==============  =============================================  ==========================
``chaosllm``    ``{"chaosllm": 1, "request", "response"}``     the request digest
``hash-keyed``  ``<sha256>.json``: ``{"response": {...}}``     the file's hash (`hashkeyed`)
``trace``       ``{"model_name", "turns" | "steps"}``          their order (`trace`)
``vcr``         ``{"interactions": [...], "version": 1}``,     the request digest (`vcr`)
                YAML (``.yaml``/``.yml``) or JSON
==============  =============================================  ==========================

A recordings directory may mix them: `RecordingStore` loads every ``.json``,
``.yaml`` and ``.yml`` file through `read_file`, which detects the format from
the content (and, for a hash-keyed fixture, the name). A file in none of them
is an `UnknownFormat` error, reported like any unreadable file.

Names: a file holding one answer (native, hash-keyed) is
``<dir scenario>/<file stem>`` like a native recording; a file holding a run
(a trace, a cassette) is a scenario of its own, named by its path without the
suffix (``advanced/steering``), its exchanges ``<scenario>/<NNNN>`` in order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

from chaosllm.errors import RecordingError, UnknownFormat
from chaosllm.model import JSON, Exchange, Keying
from chaosllm.store.formats import hashkeyed, trace, vcr
from chaosllm.store.recordings import RECORDING_SUFFIXES, parse_exchange, recording_files

__all__ = [
    "ALIAS_DIGESTS",
    "FORMATS",
    "IMPORTABLE",
    "NATIVE",
    "UNKNOWN",
    "detect",
    "load_any",
    "load_tree",
    "read_data",
    "read_file",
]

NATIVE = "chaosllm"
UNKNOWN = "unknown"
FORMATS = (NATIVE, "hash-keyed", "trace", "vcr")
IMPORTABLE = ("hash-keyed", "trace", "vcr")
"""What ``chaosllm import FORMAT SRC DEST`` converts."""

ALIAS_DIGESTS: Mapping[str, Callable[[JSON], str]] = {
    Keying.HASH_KEYED: hashkeyed.request_digest,
}
"""For each `Keying` whose digest is not chaosllm's: the digest of an incoming request
under that keying (the exact matcher looks it up when such exchanges are loaded)."""

_YAML = (".yaml", ".yml")

_UNKNOWN_HINT = (
    "unknown format: this is not a chaosllm recording (a JSON object with "
    '"chaosllm": 1), a hash-keyed fixture (<sha256>.json holding a "response" '
    'object), a trace fixture ("model_name" with "turns" or "steps") or a VCR '
    'cassette ("interactions")'
)


def read_data(path: Path) -> JSON:
    """A file's parsed content (YAML for ``.yaml``/``.yml``, else JSON); `RecordingError`
    says why it cannot be read."""
    if path.suffix.lower() in _YAML:
        return _read_yaml(path)
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
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


def detect(path: Path, data: JSON) -> str:
    """The format of a file's parsed content: one of `FORMATS`, or `UNKNOWN`."""
    if not isinstance(data, dict):
        return UNKNOWN if path.suffix.lower() in _YAML else NATIVE
    if "chaosllm" in data or "request" in data:
        return NATIVE
    if vcr.looks_like(data):
        return "vcr"
    if trace.looks_like(data):
        return "trace"
    if hashkeyed.looks_like(data):
        return "hash-keyed"
    return UNKNOWN


def _scenarios(path: Path, root: Path) -> tuple[str, str]:
    """(the scenario of a one-answer file, the scenario of a whole-run file)."""
    rel = path.relative_to(root)
    in_dir = (
        rel.parent.as_posix() if rel.parent != Path(".") else (root.name or root.resolve().name)
    )
    return in_dir, rel.with_suffix("").as_posix()


def read_file(path: Path, *, root: Path, fmt: str | None = None) -> list[Exchange]:
    """The exchanges of one file under recordings directory `root`; with `fmt`, the file
    must be in that format. `RecordingError` (`UnknownFormat`) says what is wrong."""
    data = read_data(path)
    found = detect(path, data)
    source = str(path)
    if fmt is not None and found != fmt:
        if found == UNKNOWN:
            raise UnknownFormat(source, f"not a {fmt} file: {_UNKNOWN_HINT}")
        raise RecordingError(source, f"not a {fmt} file (it looks like a {found} file)")
    in_dir, whole = _scenarios(path, root)
    if found == NATIVE:
        return [parse_exchange(data, source=source, scenario=in_dir, name=f"{in_dir}/{path.stem}")]
    if found == "hash-keyed":
        return [hashkeyed.parse(data, source=source, scenario=in_dir, stem=path.stem)]
    if found == "trace":
        return trace.parse(data, source=source, scenario=whole)
    if found == "vcr":
        return vcr.parse(data, source=source, scenario=whole)
    raise UnknownFormat(source, _UNKNOWN_HINT)


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
            errors.append(UnknownFormat(str(file), _UNKNOWN_HINT))
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
