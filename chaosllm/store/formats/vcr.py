"""VCR.py cassettes holding OpenAI chat calls (YAML, or vcrpy's JSON serializer).

A cassette is ``{"interactions": [{"request": ..., "response": ...}, ...],
"version": 1}``. vcrpy writes a request as ``{"body", "headers", "method",
"uri"}`` and a response as ``{"body": {"string": ...}, "headers": {name:
[values]}, "status": {"code", "message"}}``; the body is the raw bytes from
the transport, so a gzip-encoded answer is a YAML ``!!binary`` string with
``Content-Encoding: gzip`` (unless the cassette was recorded with
``decode_compressed_response=True``). Cassettes from older vcrpy versions'
httpx support (``content``, ``status_code``) are read too, and so are those of
pydantic-ai's serializer, which keeps a JSON body parsed as ``parsed_body``
instead of ``body``. A body that is really missing is an error that says so.

Every ``POST .../chat/completions`` interaction becomes one exchange keyed by
its request like a native recording (other interactions are skipped); a
``text/event-stream`` answer keeps its frames as recorded chunks, so a
streamed call replays frame for frame and as JSON. Key-shaped secrets in the
request are redacted before keying, as chaosllm redacts incoming requests.
The file is one scenario, its exchanges in cassette order.
"""

from __future__ import annotations

import gzip
import json
import zlib
from typing import Any
from urllib.parse import urlsplit

from chaosllm.errors import RecordingError
from chaosllm.model import JSON, Exchange, RecordedChunk, RecordedRequest, RecordedResponse
from chaosllm.providers import PROVIDERS, Provider, provider_for_path
from chaosllm.store.formats.base import YAML_SUFFIXES, FixtureFormat, by_content, run_parser

__all__ = ["FORMAT", "looks_like", "parse"]


def looks_like(data: JSON) -> bool:
    return isinstance(data, dict) and isinstance(data.get("interactions"), list)


def _require(cond: bool, source: str, problem: str) -> None:
    if not cond:
        raise RecordingError(source, problem)


def _provider(path: str) -> Provider | None:
    found = provider_for_path(path)
    if found is None and path.rstrip("/").endswith("/chat/completions"):
        found = PROVIDERS["openai.chat"]  # e.g. a gateway's /openai/v1/chat/completions
    return found


def _headers(raw: Any) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    if isinstance(raw, dict):
        for name, values in raw.items():
            for value in values if isinstance(values, list) else [values]:
                pairs.append((str(name).lower(), str(value)))
    return pairs


def _text(raw: Any, encoding: str, source: str, where: str) -> str:
    """The body as text: raw transport bytes decompressed and decoded."""
    if raw is None:
        return ""
    if isinstance(raw, str):
        return raw
    _require(isinstance(raw, (bytes, bytearray)), source, f"{where} must be a string")
    data = bytes(raw)
    for coding in reversed([c.strip().lower() for c in encoding.split(",") if c.strip()]):
        try:
            if coding in ("gzip", "x-gzip"):
                data = gzip.decompress(data)
            elif coding == "deflate":
                try:
                    data = zlib.decompress(data)
                except zlib.error:
                    data = zlib.decompress(data, -zlib.MAX_WBITS)
            elif coding != "identity":
                raise RecordingError(
                    source,
                    f"{where} is {coding}-encoded, which chaosllm cannot decode: "
                    f"record the cassette with decode_compressed_response=True",
                )
        except (OSError, EOFError, zlib.error) as exc:
            raise RecordingError(source, f"{where}: cannot decode {coding}: {exc}") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordingError(source, f"{where} is not UTF-8 text: {exc}") from exc


def _missing(where: str) -> str:
    return (
        f"{where} is missing (neither body nor parsed_body was recorded): re-record the "
        f"cassette, or check the serializer keeps bodies"
    )


def _request_body(request: dict[str, Any], source: str, where: str) -> dict[str, Any]:
    parsed = request.get("parsed_body")
    if isinstance(parsed, dict) and request.get("body") is None:  # pydantic-ai's serializer
        return parsed
    raw = request.get("body")
    if isinstance(raw, dict) and "string" in raw:  # some serializers nest it too
        raw = raw["string"]
    _require(raw is not None and raw != "", source, _missing(where))
    text = _text(raw, "", source, where)
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordingError(source, f"{where} is not JSON: {exc.msg}") from exc
    _require(isinstance(body, dict), source, f"{where} must be a JSON object")
    found: dict[str, Any] = body
    return found


def _status(response: dict[str, Any], source: str, where: str) -> int:
    status = response.get("status", response.get("status_code"))
    if isinstance(status, dict):
        status = status.get("code")
    _require(
        isinstance(status, int) and not isinstance(status, bool) and 100 <= status <= 599,
        source,
        f"{where}.status must hold an HTTP status code",
    )
    assert isinstance(status, int)
    return status


def _frames(text: str) -> list[str]:
    events = text.replace("\r\n", "\n").split("\n\n")
    return [event + "\n\n" for event in events if event.strip()]


def parse(data: JSON, *, source: str, scenario: str) -> list[Exchange]:
    """The chat-completion exchanges of one cassette, in order."""
    # The recorder's redaction rules; imported here so that reading the fixture formats
    # (which the matcher does) does not load the recording proxy.
    from chaosllm.store.redact import Redactor, kept_response_headers

    _require(looks_like(data), source, 'a VCR cassette is an object with "interactions"')
    redactor = Redactor()
    interactions = data["interactions"]
    exchanges: list[Exchange] = []
    for i, interaction in enumerate(interactions):
        where = f"interactions[{i}]"
        _require(
            isinstance(interaction, dict)
            and isinstance(interaction.get("request"), dict)
            and isinstance(interaction.get("response"), dict),
            source,
            f'{where} must be an object with "request" and "response" objects',
        )
        request, response = interaction["request"], interaction["response"]
        method = str(request.get("method", "")).upper()
        uri = request.get("uri")
        _require(isinstance(uri, str), source, f"{where}.request.uri must be a string")
        path = urlsplit(uri).path
        provider = _provider(path)
        if method != "POST" or provider is None:
            continue  # not a chat completion: nothing chaosllm serves
        body = redactor.body(_request_body(request, source, f"{where}.request.body"))
        status = _status(response, source, f"{where}.response")
        headers = _headers(response.get("headers"))
        header = {name: value for name, value in headers}
        raw = response.get("body")
        raw = raw.get("string") if isinstance(raw, dict) else raw
        if raw is None and "content" in response:  # older vcrpy httpx cassettes
            raw = response["content"]
        parsed = response.get("parsed_body")
        if raw is None and parsed is not None:  # pydantic-ai's serializer: JSON kept parsed
            raw = parsed if isinstance(parsed, str) else json.dumps(parsed)
        _require(raw is not None, source, _missing(f"{where}.response.body"))
        text = _text(raw, header.get("content-encoding", ""), source, f"{where}.response.body")
        streamed = "text/event-stream" in header.get("content-type", "") or (
            body.get("stream") is True and text.lstrip().startswith(("data:", "event:"))
        )
        chunks: tuple[RecordedChunk, ...] | None = None
        if streamed:
            frames = _frames(text)
            try:
                answer = provider.assemble(frames)
            except (ValueError, TypeError, AttributeError) as exc:
                raise RecordingError(
                    source, f"{where}: the streamed answer cannot be assembled: {exc}"
                ) from exc
            chunks = tuple(RecordedChunk(f) for f in frames)
        else:
            try:
                answer = json.loads(text)
            except json.JSONDecodeError as exc:
                raise RecordingError(
                    source, f"{where}.response.body is not JSON: {exc.msg}"
                ) from exc
        number = len(exchanges) + 1
        exchanges.append(
            Exchange(
                provider=provider.name,
                request=RecordedRequest(
                    method="POST",
                    path=path if path in getattr(provider, "paths", ()) else "/v1/chat/completions",
                    body=body,
                ),
                response=RecordedResponse(
                    status=status,
                    body=answer,
                    stream=streamed,
                    chunks=chunks,
                    headers=kept_response_headers(headers),
                ),
                digest=provider.digest(body),
                name=f"{scenario}/{number:04d}",
                scenario=scenario,
                meta={
                    "format": "vcr",
                    "description": f"VCR cassette: {method} {uri}",
                    "vcr": {"uri": uri, "interaction": i},
                },
                source=source,
            )
        )
    _require(
        bool(exchanges),
        source,
        f"no OpenAI chat completion call (POST .../chat/completions) among its "
        f"{len(interactions)} interactions",
    )
    return exchanges


FORMAT = FixtureFormat(
    name="vcr",
    shape='a VCR cassette ("interactions")',
    detect=by_content(looks_like),
    parse=run_parser(parse),
    holds_run=True,
    suffixes=(".json", *YAML_SUFFIXES),
)
