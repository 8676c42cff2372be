"""chaosllm's own recording format: one exchange per JSON file.

A recording is ``{"chaosllm": 1, "provider", "request", "response", "digest", ...}``
(see README, "Recording format"). `parse_exchange` reads one, `exchange_to_json` writes
one; the digest is always computed from the request by its provider (the one written in
the file is only kept for `doctor`), except for an exchange keyed by a fixture's own hash
(``"keyed_by": "hash-keyed"``), which keeps it.
"""

from __future__ import annotations

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
from chaosllm.providers import PROVIDERS
from chaosllm.store.formats.base import YAML_SUFFIXES, FixtureFormat, Location

__all__ = ["FORMAT", "FORMAT_VERSION", "detect", "exchange_to_json", "parse", "parse_exchange"]

FORMAT_VERSION = 1

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
    if not (isinstance(version, int) and 1 <= version <= FORMAT_VERSION):
        raise RecordingError(
            source,
            f"unsupported format version {version!r}: this chaosllm reads version {FORMAT_VERSION}",
        )
    provider_name = data.get("provider", "openai.chat")
    if provider_name not in PROVIDERS:
        raise RecordingError(
            source, f"unknown provider {provider_name!r}; known: {', '.join(sorted(PROVIDERS))}"
        )
    provider = PROVIDERS[provider_name]

    keyed_by = data.get("keyed_by", Keying.REQUEST)
    if keyed_by not in Keying.ALL:
        raise RecordingError(
            source, f'"keyed_by" must be one of {", ".join(Keying.ALL)}, got {keyed_by!r}'
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
    if not (isinstance(status, int) and not isinstance(status, bool) and 100 <= status <= 599):
        raise RecordingError(
            source, f'"response.status" must be an HTTP status code, got {status!r}'
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
        if not (isinstance(item, dict) and isinstance(item.get("data"), str)):
            raise RecordingError(
                source, f'"response.chunks[{i}]" must be an object with a string "data"'
            )
        delay = item.get("delay_ms", 0.0)
        if not (isinstance(delay, (int, float)) and not isinstance(delay, bool) and delay >= 0):
            raise RecordingError(source, f'"response.chunks[{i}].delay_ms" must be a number >= 0')
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


def detect(path: Path, data: JSON) -> bool:
    """A native recording: an object with ``"chaosllm"`` or ``"request"``; and any JSON
    that is not an object, so that its error says what a recording must be."""
    if isinstance(data, dict):
        return "chaosllm" in data or "request" in data
    return path.suffix.lower() not in YAML_SUFFIXES


def parse(data: JSON, at: Location) -> list[Exchange]:
    """The one exchange of a recording file, named ``<dir scenario>/<file stem>``."""
    return [
        parse_exchange(
            data, source=at.source, scenario=at.scenario, name=f"{at.scenario}/{at.stem}"
        )
    ]


FORMAT = FixtureFormat(
    name="chaosllm",
    shape='a chaosllm recording (a JSON object with "chaosllm": 1)',
    detect=detect,
    parse=parse,
    importable=False,
)
