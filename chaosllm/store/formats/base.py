"""What a fixture format is, described once as data: `FixtureFormat`.

The registry (`chaosllm.store.formats`) holds one entry per format and does all the
dispatching -- detection, parsing, the alias digests of the exact matcher, the choices of
``chaosllm import`` -- from these entries, so adding a format is one module (with its
``FORMAT`` entry) and one line in the registry. This module imports nothing of the store:
every format module and the registry build on it, and it on none of them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from chaosllm.model import JSON, Exchange, Keying

__all__ = ["YAML_SUFFIXES", "FixtureFormat", "Location"]

YAML_SUFFIXES = (".yaml", ".yml")
"""Files read as YAML (every other fixture file is JSON)."""


@dataclass(frozen=True, slots=True)
class Location:
    """Where a fixture file is, as the names its exchanges take."""

    path: Path
    source: str
    """The file as errors and exchanges name it."""
    stem: str
    """The file name without its suffix."""
    scenario: str
    """The scenario of the file's exchanges: its directory's (relative to the recordings
    directory, or the directory's own name at the top) for a format holding one answer a
    file, the file's relative path without the suffix for one holding a whole run."""

    @classmethod
    def of(cls, path: Path, *, root: Path, holds_run: bool) -> Location:
        # String operations: pathlib's relative_to and with_suffix were a fifth of the
        # time it takes to load 10k recordings.
        source = str(path)
        top = str(root)
        rel = source[len(top) :].lstrip(os.sep) if source.startswith(top) else ""
        if not rel:
            rel = path.relative_to(root).as_posix()  # not under root as spelt: let it say so
        rel = rel.replace(os.sep, "/")
        folder, _, filename = rel.rpartition("/")
        stem = filename.rpartition(".")[0] or filename
        if holds_run:
            scenario = f"{folder}/{stem}" if folder else stem
        elif folder:
            scenario = folder
        else:
            scenario = root.name or root.resolve().name
        return cls(path=path, source=source, stem=stem, scenario=scenario)


Detect = Callable[[Path, JSON], bool]
"""Whether a file (its path, its parsed content) is in the format."""

Parse = Callable[[JSON, Location], list[Exchange]]
"""The exchanges of a file in the format; `RecordingError` says what is wrong."""


def by_content(looks_like: Callable[[JSON], bool]) -> Detect:
    """A `Detect` that looks at a file's content only."""
    return lambda path, data: looks_like(data)


def run_parser(parse: Callable[..., list[Exchange]]) -> Parse:
    """A `Parse` for a format whose files each hold a run: ``parse(data, source=...,
    scenario=...)``."""
    return lambda data, at: parse(data, source=at.source, scenario=at.scenario)


@dataclass(frozen=True, slots=True)
class FixtureFormat:
    """One fixture format chaosllm reads."""

    name: str
    """What ``chaosllm import`` and the exchanges' ``meta["format"]`` call it."""
    shape: str
    """What a file in the format looks like, for the error of a file in none
    (``a VCR cassette ("interactions")``)."""
    detect: Detect
    parse: Parse
    keying: str = Keying.REQUEST
    """How its exchanges are found (`Keying`)."""
    alias_digest: Callable[[JSON], str] | None = None
    """For a keying by a digest of the format's own (`Keying.HASH_KEYED`): that digest of
    an incoming request, which the exact matcher looks up when such exchanges are loaded."""
    holds_run: bool = False
    """Whether a file holds a whole run (a scenario of its own, its exchanges
    ``<scenario>/<NNNN>`` in order) rather than one answer."""
    importable: bool = True
    """Whether ``chaosllm import NAME`` converts it to native recordings."""
    suffixes: tuple[str, ...] = (".json",)
    """The file names a recordings directory is searched for, for this format."""
