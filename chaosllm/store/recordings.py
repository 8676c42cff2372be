"""Recordings on disk: parse, load, serialise.

A recordings directory holds one exchange per JSON file,
``<scenario>/<NNNN>.json`` (see README, "Recording format"). Loading is
forgiving: a corrupt file is reported with its path and what is wrong, and
every other file still loads. The digest is always computed from the request
by its provider; the one written in the file is only kept for `doctor`.

Files in the other formats chaosllm reads (hash-keyed fixtures, trace fixtures,
VCR cassettes: `chaosllm.store.formats`) load from the same directories, each file
into as many exchanges as it holds answers.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaosllm.errors import RecordingError
from chaosllm.model import (
    JSON,
    Exchange,
    Keying,
    RecordedChunk,
    RecordedRequest,
    RecordedResponse,
)
from chaosllm.paths import safe_child, shipped_dir
from chaosllm.providers import PROVIDERS

__all__ = [
    "FORMAT_VERSION",
    "RecordingStore",
    "exchange_to_json",
    "parse_exchange",
    "recording_files",
    "safe_child",
    "shipped_dir",
]

FORMAT_VERSION = 1

RECORDING_SUFFIXES = (".json", ".yaml", ".yml")
"""Files a recordings directory is searched for: native recordings and the other formats
`chaosllm.store.formats` reads (hash-keyed fixtures, traces, VCR cassettes)."""

_SHA256 = frozenset("0123456789abcdef")


def _require(cond: bool, source: str, problem: str) -> None:
    if not cond:
        raise RecordingError(source, problem)


def parse_exchange(data: JSON, *, source: str, scenario: str, name: str) -> Exchange:
    """An `Exchange` from the JSON of a recording file; `RecordingError` says what is wrong."""
    _require(isinstance(data, dict), source, "a recording must be a JSON object")
    version = data.get("chaosllm")
    _require(
        version is not None, source, 'missing "chaosllm" format version (expected "chaosllm": 1)'
    )
    _require(
        isinstance(version, int) and 1 <= version <= FORMAT_VERSION,
        source,
        f"unsupported format version {version!r}: this chaosllm reads version {FORMAT_VERSION}",
    )
    provider_name = data.get("provider", "openai.chat")
    _require(
        provider_name in PROVIDERS,
        source,
        f"unknown provider {provider_name!r}; known: {', '.join(sorted(PROVIDERS))}",
    )
    provider = PROVIDERS[provider_name]

    keyed_by = data.get("keyed_by", Keying.REQUEST)
    _require(
        keyed_by in Keying.ALL,
        source,
        f'"keyed_by" must be one of {", ".join(Keying.ALL)}, got {keyed_by!r}',
    )
    request = data.get("request")
    if request is None and keyed_by != Keying.REQUEST:
        request = {"body": {"messages": []}}  # answers only: no request was recorded
    _require(isinstance(request, dict), source, '"request" must be an object')
    body = request.get("body")
    _require(isinstance(body, dict), source, '"request.body" must be an object')
    path = request.get("path", "/v1/chat/completions")
    method = request.get("method", "POST")
    _require(
        isinstance(path, str) and isinstance(method, str),
        source,
        '"request.path" and "request.method" must be strings',
    )

    response = data.get("response")
    _require(isinstance(response, dict), source, '"response" must be an object')
    status = response.get("status", 200)
    _require(
        isinstance(status, int) and not isinstance(status, bool) and 100 <= status <= 599,
        source,
        f'"response.status" must be an HTTP status code, got {status!r}',
    )
    chunks = _parse_chunks(response.get("chunks"), source)
    headers = response.get("headers") or {}
    _require(
        isinstance(headers, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()),
        source,
        '"response.headers" must map header names to strings',
    )
    response_body = response.get("body")
    if response_body is None:
        _require(
            chunks is not None,
            source,
            '"response.body" is missing (and there are no "chunks" to assemble it from)',
        )
        assert chunks is not None
        try:
            response_body = provider.assemble([c.data for c in chunks])
        except (ValueError, TypeError, AttributeError) as exc:
            raise RecordingError(source, f'"response.chunks" cannot be assembled: {exc}') from exc
    stream = response.get("stream", chunks is not None)
    _require(isinstance(stream, bool), source, '"response.stream" must be true or false')

    stored = data.get("digest")
    if keyed_by == Keying.HASH_KEYED:
        _require(
            isinstance(stored, str) and len(stored) == 64 and set(stored) <= _SHA256,
            source,
            '"keyed_by": "hash-keyed" needs the fixture hash as "digest" '
            "(64 lower-case hex digits)",
        )
        digest = stored
    else:
        try:
            digest = provider.digest(body)
        except (TypeError, ValueError, AttributeError) as exc:
            raise RecordingError(source, f"cannot compute the request digest: {exc}") from exc
    meta = data.get("meta") or {}
    _require(isinstance(meta, dict), source, '"meta" must be an object')
    return Exchange(
        provider=provider_name,
        request=RecordedRequest(method=method.upper(), path=path, body=body),
        response=RecordedResponse(
            status=status,
            body=response_body,
            stream=stream,
            chunks=chunks,
            headers=tuple(sorted(headers.items())),
        ),
        digest=digest,
        name=name,
        scenario=scenario,
        meta=meta,
        source=source,
        stored_digest=stored if isinstance(stored, str) else None,
        keyed_by=keyed_by,
    )


def _parse_chunks(raw: Any, source: str) -> tuple[RecordedChunk, ...] | None:
    if raw is None:
        return None
    _require(isinstance(raw, list), source, '"response.chunks" must be an array')
    chunks = []
    for i, item in enumerate(raw):
        _require(
            isinstance(item, dict) and isinstance(item.get("data"), str),
            source,
            f'"response.chunks[{i}]" must be an object with a string "data"',
        )
        delay = item.get("delay_ms", 0.0)
        _require(
            isinstance(delay, (int, float)) and not isinstance(delay, bool) and delay >= 0,
            source,
            f'"response.chunks[{i}].delay_ms" must be a number >= 0',
        )
        chunks.append(RecordedChunk(data=item["data"], delay_ms=float(delay)))
    return tuple(chunks)


def exchange_to_json(exchange: Exchange) -> dict[str, Any]:
    """The recording-file JSON of an exchange (the inverse of `parse_exchange`)."""
    response: dict[str, Any] = {
        "status": exchange.response.status,
        "stream": exchange.response.stream,
        "body": exchange.response.body,
    }
    if exchange.response.chunks is not None:
        response["chunks"] = [
            {"data": c.data, "delay_ms": c.delay_ms} for c in exchange.response.chunks
        ]
    if exchange.response.headers:
        response["headers"] = dict(exchange.response.headers)
    data: dict[str, Any] = {
        "chaosllm": FORMAT_VERSION,
        "provider": exchange.provider,
        "request": {
            "method": exchange.request.method,
            "path": exchange.request.path,
            "body": exchange.request.body,
        },
        "response": response,
        "digest": exchange.digest,
    }
    if exchange.keyed_by != Keying.REQUEST:
        data["keyed_by"] = exchange.keyed_by
    if exchange.meta:
        data["meta"] = dict(exchange.meta)
    return data


@dataclass
class RecordingStore:
    """Every exchange of one or more recordings directories, indexed for matching."""

    dirs: Sequence[Path]
    exchanges: list[Exchange] = field(default_factory=list)
    errors: list[RecordingError] = field(default_factory=list)
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

    @classmethod
    def load(cls, dirs: Iterable[Path]) -> RecordingStore:
        store = cls(dirs=[Path(d) for d in dirs])
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
        # `formats` builds on this module (parse_exchange), so it is imported here.
        from chaosllm.store.formats import read_file

        exchanges: list[Exchange] = []
        errors: list[RecordingError] = []
        for root in self.dirs:
            if not root.is_dir():
                errors.append(RecordingError(str(root), "not a directory"))
                continue
            for path in recording_files(root):
                try:
                    exchanges.extend(read_file(path, root=root))
                except RecordingError as exc:
                    errors.append(exc)
        self._index(exchanges)
        self.errors = errors

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
        self.by_digest.setdefault((exchange.provider, exchange.digest), []).append(exchange)
        self.by_scenario.setdefault(exchange.scenario, []).append(exchange)

    def models(self) -> list[str]:
        found: set[str] = set()
        for exchange in self.exchanges:
            model = exchange.request.body.get("model")
            if isinstance(model, str):
                found.add(model)
        return sorted(found)

    def error_summary(self) -> list[dict[str, str]]:
        return [{"path": e.path, "problem": e.problem} for e in self.errors]

    def summary(self) -> list[Mapping[str, Any]]:
        return [
            {
                "name": e.name,
                "scenario": e.scenario,
                "provider": e.provider,
                "digest": e.digest,
                "model": e.request.body.get("model"),
                "stream": e.response.stream,
                "status": e.response.status,
                "source": e.source,
                "description": e.meta.get("description"),
                "keyed_by": e.keyed_by,
                "format": e.meta.get("format", "chaosllm"),
            }
            for e in self.exchanges
        ]


def _model(exchange: Exchange) -> str | None:
    model = exchange.request.body.get("model") if isinstance(exchange.request.body, dict) else None
    return model if isinstance(model, str) else None


def recording_files(root: Path) -> list[Path]:
    """The recording files under `root` (JSON, and YAML cassettes), in a stable order."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found.extend(
            Path(dirpath) / f
            for f in sorted(filenames)
            if f.endswith(RECORDING_SUFFIXES) and not f.startswith(".")
        )
    return found
