"""Recordings on disk, loaded and indexed for matching: `RecordingStore`.

A recordings directory holds one exchange per JSON file,
``<scenario>/<NNNN>.json`` (see README, "Recording format"), and files in the
other formats chaosllm reads (hash-keyed fixtures, trace fixtures, VCR
cassettes), each file into as many exchanges as it holds answers. Which format a
file is in, and how it is read, is the format registry's (`chaosllm.store.formats`;
chaosllm's own format is `chaosllm.store.formats.native`, re-exported here), which
imports nothing of this module. Loading is forgiving: a corrupt file is reported
with its path and what is wrong, and every other file still loads.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaosllm.errors import RecordingError
from chaosllm.model import Exchange, Keying
from chaosllm.paths import safe_child, shipped_dir
from chaosllm.providers import PROVIDERS
from chaosllm.store.cache import CacheSnapshot, RecordingsCache, default_cache
from chaosllm.store.formats import (
    NATIVE,
    RECORDING_SUFFIXES,
    read_file,
    recording_files,
    recording_paths,
)
from chaosllm.store.formats.native import FORMAT_VERSION, exchange_to_json, parse_exchange

__all__ = [
    "FORMAT_VERSION",
    "RECORDING_SUFFIXES",
    "RecordingStore",
    "exchange_to_json",
    "parse_exchange",
    "recording_files",
    "safe_child",
    "shipped_dir",
]


@dataclass
class RecordingStore:
    """Every exchange of one or more recordings directories, indexed for matching."""

    dirs: Sequence[Path]
    exchanges: list[Exchange] = field(default_factory=list)
    errors: list[RecordingError] = field(default_factory=list)
    _models: list[str] | None = field(default=None, init=False, repr=False)
    """The models the exchanges ask for, once `models` has read them (None again after
    each load and `add`: read when asked, not at load, which leaves cached exchanges
    undecoded)."""
    by_digest: dict[tuple[str, str], list[Exchange]] = field(default_factory=dict)
    by_scenario: dict[str, list[Exchange]] = field(default_factory=dict)
    by_alias: dict[tuple[str, str, str], list[Exchange]] = field(default_factory=dict)
    """Exchanges keyed by a digest of their own (`Keying.HASH_KEYED`), by
    ``(provider, keyed_by, digest)``."""
    alias_keyings: dict[str, frozenset[str]] = field(default_factory=dict)
    """The keyings present in `by_alias`, by provider."""
    sequence_scenarios: dict[str, str | None] = field(default_factory=dict)
    """Scenarios whose exchanges can only be served in order (trace fixtures), with the
    model they answer as (a trace's ``model_name``)."""
    scenario_info: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    """What a fixture file says about its whole scenario besides the answers (a trace's
    memory snapshot, HTTP exchanges, expectations), by scenario."""
    cache: RecordingsCache | None = None
    """Where what was loaded before is kept (`chaosllm.store.cache`): files unchanged
    since are not parsed again. None: every file is parsed."""

    @classmethod
    def load(
        cls, dirs: Iterable[Path], *, cache: RecordingsCache | bool | None = True
    ) -> RecordingStore:
        """The exchanges of `dirs`; `cache`: True for the user's load cache
        (`chaosllm.store.cache.default_cache`, off when ``CHAOSLLM_NO_CACHE`` is set), a
        `RecordingsCache`, or False/None to parse every file."""
        chosen = default_cache() if cache is True else cache or None
        store = cls(dirs=[Path(d) for d in dirs], cache=chosen)
        store.reload()
        return store

    def reload(self) -> None:
        # Loading creates many objects and no garbage cycles: the cyclic collector would
        # only walk the growing heap again and again (a fifth of a 10k-file load).
        enabled = gc.isenabled()
        gc.disable()
        try:
            self._reload()
        finally:
            if enabled:
                gc.enable()

    def _reload(self) -> None:
        exchanges: list[Exchange] = []
        errors: list[RecordingError] = []
        for root in self.dirs:
            if not root.is_dir():
                errors.append(RecordingError(str(root), "not a directory"))
                continue
            paths = recording_paths(root)
            snapshot = self._snapshot(root, len(paths))
            if snapshot is None:
                for path in paths:
                    try:
                        exchanges.extend(read_file(Path(path), root=root))
                    except RecordingError as exc:
                        errors.append(exc)
                continue
            for path in paths:
                try:
                    info: os.stat_result | None = os.stat(path)
                except OSError:
                    info = None  # read_file says why
                if info is not None:
                    cached = snapshot.get(path, info)
                    if cached is not None:
                        exchanges.extend(cached)
                        continue
                try:
                    found = read_file(Path(path), root=root)
                except RecordingError as exc:
                    errors.append(exc)
                    continue
                exchanges.extend(found)
                if info is not None:
                    snapshot.add(path, info, found)
            assert self.cache is not None
            self.cache.write(snapshot)
        self._index(exchanges)
        self.errors = errors

    def _snapshot(self, root: Path, files: int) -> CacheSnapshot | None:
        """What the cache holds for `root`; None: no cache for it (none configured, too few
        files to be worth one, or the cache would sit inside the recordings)."""
        cache = self.cache
        if cache is None or files < cache.min_files or not cache.usable_for(str(root)):
            return None
        return cache.read(str(root))

    def _index(self, exchanges: list[Exchange]) -> None:
        by_digest: dict[tuple[str, str], list[Exchange]] = {}
        by_scenario: dict[str, list[Exchange]] = {}
        by_alias: dict[tuple[str, str, str], list[Exchange]] = {}
        info: dict[str, Mapping[str, Any]] = {}
        for exchange in exchanges:
            if exchange.keyed_by == Keying.REQUEST:
                by_digest.setdefault((exchange.provider, exchange.digest), []).append(exchange)
            elif exchange.keyed_by != Keying.SEQUENCE:
                by_alias.setdefault(
                    (exchange.provider, exchange.keyed_by, exchange.digest), []
                ).append(exchange)
            by_scenario.setdefault(exchange.scenario, []).append(exchange)
            scenario_meta = exchange.meta.get("scenario_info")
            if isinstance(scenario_meta, dict):
                info.setdefault(exchange.scenario, scenario_meta)
        self.exchanges = exchanges
        self._models = None
        self.by_digest = by_digest
        self.by_scenario = by_scenario
        self.by_alias = by_alias
        keyings: dict[str, set[str]] = {}
        for provider, keyed_by, _ in by_alias:
            keyings.setdefault(provider, set()).add(keyed_by)
        self.alias_keyings = {p: frozenset(k) for p, k in keyings.items()}
        self.scenario_info = info
        self.sequence_scenarios = {
            scenario: _model(members[0])
            for scenario, members in by_scenario.items()
            if all(e.keyed_by == Keying.SEQUENCE for e in members)
        }

    def add(self, exchange: Exchange) -> None:
        """Add one exchange (a new recording) at the end, without reloading."""
        self.exchanges.append(exchange)
        self._models = None
        if exchange.keyed_by in (Keying.REQUEST, Keying.SEQUENCE):
            self.by_digest.setdefault((exchange.provider, exchange.digest), []).append(exchange)
        else:  # a fixture keyed by its own digest (a hash-keyed one saved while serving)
            key = (exchange.provider, exchange.keyed_by, exchange.digest)
            self.by_alias.setdefault(key, []).append(exchange)
            keyings = self.alias_keyings.get(exchange.provider, frozenset())
            self.alias_keyings[exchange.provider] = keyings | {exchange.keyed_by}
        self.by_scenario.setdefault(exchange.scenario, []).append(exchange)

    def models(self) -> list[str]:
        """The models the recordings ask for (read once per load or `add`, not per ask:
        `/v1/models` is what load balancers and floods ask most)."""
        if self._models is None:
            self._models = sorted({m for m in map(_model, self.exchanges) if m is not None})
        return list(self._models)

    def error_summary(self) -> list[dict[str, str]]:
        return [{"path": e.path, "problem": e.problem} for e in self.errors]

    def summary(self) -> list[Mapping[str, Any]]:
        return [
            {
                "name": e.name,
                "scenario": e.scenario,
                "provider": e.provider,
                "digest": e.digest,
                "model": _model(e),
                "stream": e.response.stream,
                "status": e.response.status,
                "source": e.source,
                "description": e.meta.get("description"),
                "keyed_by": e.keyed_by,
                "format": e.meta.get("format", NATIVE),
            }
            for e in self.exchanges
        ]


def _model(exchange: Exchange) -> str | None:
    """The model a recorded request asks for, as its provider reads it (`model_of`: a
    Bedrock request names it ``modelId``)."""
    provider = PROVIDERS.get(exchange.provider)
    body = exchange.request.body
    if provider is not None:
        model = provider.model_of(body)
    else:
        model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None
