"""Recordings on disk: parse, load, serialise.

A recordings directory holds one exchange per JSON file,
``<scenario>/<NNNN>.json`` (see README, "Recording format"). Loading is
forgiving: a corrupt file is reported with its path and what is wrong, and
every other file still loads. The digest is always computed from the request
by its provider; the one written in the file is only kept for `doctor`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaosllm.errors import RecordingError, UnsafePath
from chaosllm.model import JSON, Exchange, RecordedChunk, RecordedRequest, RecordedResponse
from chaosllm.providers import PROVIDERS

__all__ = [
    "FORMAT_VERSION",
    "RecordingStore",
    "exchange_to_json",
    "parse_exchange",
    "safe_child",
    "shipped_dir",
]

FORMAT_VERSION = 1


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


def _require(cond: bool, source: str, problem: str) -> None:
    if not cond:
        raise RecordingError(source, problem)


def parse_exchange(data: JSON, *, source: str, scenario: str, name: str) -> Exchange:
    """An `Exchange` from the JSON of a recording file; `RecordingError` says what is wrong."""
    _require(isinstance(data, dict), source, "a recording must be a JSON object")
    version = data.get("chaosllm")
    _require(version is not None, source,
             'missing "chaosllm" format version (expected "chaosllm": 1)')
    _require(isinstance(version, int) and 1 <= version <= FORMAT_VERSION, source,
             f'unsupported format version {version!r}: this chaosllm reads version '
             f'{FORMAT_VERSION}')
    provider_name = data.get("provider", "openai.chat")
    _require(provider_name in PROVIDERS, source,
             f"unknown provider {provider_name!r}; known: {', '.join(sorted(PROVIDERS))}")
    provider = PROVIDERS[provider_name]

    request = data.get("request")
    _require(isinstance(request, dict), source, '"request" must be an object')
    body = request.get("body")
    _require(isinstance(body, dict), source, '"request.body" must be an object')
    path = request.get("path", "/v1/chat/completions")
    method = request.get("method", "POST")
    _require(isinstance(path, str) and isinstance(method, str), source,
             '"request.path" and "request.method" must be strings')

    response = data.get("response")
    _require(isinstance(response, dict), source, '"response" must be an object')
    status = response.get("status", 200)
    _require(isinstance(status, int) and not isinstance(status, bool) and 100 <= status <= 599,
             source, f'"response.status" must be an HTTP status code, got {status!r}')
    chunks = _parse_chunks(response.get("chunks"), source)
    headers = response.get("headers") or {}
    _require(isinstance(headers, dict) and all(isinstance(k, str) and isinstance(v, str)
                                               for k, v in headers.items()),
             source, '"response.headers" must map header names to strings')
    response_body = response.get("body")
    if response_body is None:
        _require(chunks is not None, source,
                 '"response.body" is missing (and there are no "chunks" to assemble it from)')
        assert chunks is not None
        try:
            response_body = provider.assemble([c.data for c in chunks])
        except (ValueError, TypeError, AttributeError) as exc:
            raise RecordingError(source, f'"response.chunks" cannot be assembled: {exc}') from exc
    stream = response.get("stream", chunks is not None)
    _require(isinstance(stream, bool), source, '"response.stream" must be true or false')

    try:
        digest = provider.digest(body)
    except (TypeError, ValueError, AttributeError) as exc:
        raise RecordingError(source, f"cannot compute the request digest: {exc}") from exc
    meta = data.get("meta") or {}
    _require(isinstance(meta, dict), source, '"meta" must be an object')
    stored = data.get("digest")
    return Exchange(
        provider=provider_name,
        request=RecordedRequest(method=method.upper(), path=path, body=body),
        response=RecordedResponse(status=status, body=response_body, stream=stream,
                                  chunks=chunks, headers=tuple(sorted(headers.items()))),
        digest=digest,
        name=name,
        scenario=scenario,
        meta=meta,
        source=source,
        stored_digest=stored if isinstance(stored, str) else None,
    )


def _parse_chunks(raw: Any, source: str) -> tuple[RecordedChunk, ...] | None:
    if raw is None:
        return None
    _require(isinstance(raw, list), source, '"response.chunks" must be an array')
    chunks = []
    for i, item in enumerate(raw):
        _require(isinstance(item, dict) and isinstance(item.get("data"), str), source,
                 f'"response.chunks[{i}]" must be an object with a string "data"')
        delay = item.get("delay_ms", 0.0)
        _require(isinstance(delay, (int, float)) and not isinstance(delay, bool) and delay >= 0,
                 source, f'"response.chunks[{i}].delay_ms" must be a number >= 0')
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
        response["chunks"] = [{"data": c.data, "delay_ms": c.delay_ms}
                              for c in exchange.response.chunks]
    if exchange.response.headers:
        response["headers"] = dict(exchange.response.headers)
    data: dict[str, Any] = {
        "chaosllm": FORMAT_VERSION,
        "provider": exchange.provider,
        "request": {"method": exchange.request.method, "path": exchange.request.path,
                    "body": exchange.request.body},
        "response": response,
        "digest": exchange.digest,
    }
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

    @classmethod
    def load(cls, dirs: Iterable[Path]) -> RecordingStore:
        store = cls(dirs=[Path(d) for d in dirs])
        store.reload()
        return store

    def reload(self) -> None:
        exchanges: list[Exchange] = []
        errors: list[RecordingError] = []
        for root in self.dirs:
            if not root.is_dir():
                errors.append(RecordingError(str(root), "not a directory"))
                continue
            for path in _json_files(root):
                rel = path.relative_to(root)
                scenario = rel.parent.as_posix() if rel.parent != Path(".") else root.name
                name = f"{scenario}/{path.stem}"
                try:
                    with open(path, encoding="utf-8") as fh:
                        data = json.load(fh)
                    exchanges.append(parse_exchange(data, source=str(path), scenario=scenario,
                                                    name=name))
                except RecordingError as exc:
                    errors.append(exc)
                except (OSError, UnicodeDecodeError) as exc:
                    errors.append(RecordingError(str(path), f"cannot read: {exc}"))
                except json.JSONDecodeError as exc:
                    errors.append(RecordingError(
                        str(path), f"not valid JSON: {exc.msg} at line {exc.lineno} "
                                   f"column {exc.colno}"))
        self._index(exchanges)
        self.errors = errors

    def _index(self, exchanges: list[Exchange]) -> None:
        by_digest: dict[tuple[str, str], list[Exchange]] = {}
        by_scenario: dict[str, list[Exchange]] = {}
        for exchange in exchanges:
            by_digest.setdefault((exchange.provider, exchange.digest), []).append(exchange)
            by_scenario.setdefault(exchange.scenario, []).append(exchange)
        self.exchanges = exchanges
        self.by_digest = by_digest
        self.by_scenario = by_scenario

    def add(self, exchange: Exchange) -> None:
        self._index([*self.exchanges, exchange])

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
            {"name": e.name, "scenario": e.scenario, "provider": e.provider, "digest": e.digest,
             "model": e.request.body.get("model"), "stream": e.response.stream,
             "status": e.response.status, "source": e.source,
             "description": e.meta.get("description")}
            for e in self.exchanges
        ]


def _json_files(root: Path) -> list[Path]:
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found.extend(Path(dirpath) / f for f in sorted(filenames)
                     if f.endswith(".json") and not f.startswith("."))
    return found
