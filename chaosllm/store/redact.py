"""Redaction: what never reaches a recording file. Pure.

Secrets are removed before a request is keyed and before anything is written:

- request headers are never stored at all (the format has no place for them),
  and of the response headers only an allow-list of informative ones is kept
  (request ids, processing time, rate limits, Retry-After): `kept_response_headers`;
- in bodies and SSE frames, every configured secret value and every string
  shaped like a well-known API key (``sk-...``, ``sk-ant-...``, ``sk-proj-...``,
  Google ``AIza...``) becomes ``[REDACTED]``: `Redactor`, `redact_body`;
- and so does every credential the request itself carries, whatever its shape
  (`credential_values`: the Bearer token or other ``Authorization`` value, ``api-key``,
  ``x-api-key``, ``x-goog-api-key``, ``x-amz-security-token``, the AWS access key id of
  a SigV4 signature, ``?key=``): `Redactor.carrying` adds them for that request, to its
  keying, its recording (request and upstream answer) and its journal record.

Digests are computed over the redacted request, by the recorder and by the
replayer alike, so a request that carries a key matches its recording.

Redaction works on the decoded strings (`Redactor.body`), never on the raw bytes: a
client may write any character of a key as a JSON escape (``"\\u0073k-..."`` is
``"sk-..."``). `Redactor.request_body` skips the walk over the parsed body only when the
raw bytes prove that no decoded string can hold a secret: no key marker (``sk-``,
``AIza``) and no escape of one of its characters, and no configured value and no escape
at all when values are configured (`Redactor.may_contain_secret`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from urllib.parse import parse_qsl

from chaosllm.model import JSON

__all__ = [
    "CREDENTIAL_HEADERS",
    "KEPT_RESPONSE_HEADERS",
    "KEY_PATTERNS",
    "MIN_CREDENTIAL",
    "REDACTED",
    "SECRET_HEADERS",
    "Redactor",
    "credential_values",
    "is_secret_header",
    "kept_response_headers",
    "redact_body",
    "redact_text",
]

REDACTED = "[REDACTED]"

SECRET_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "api-key",
        "x-api-key",
        "x-goog-api-key",
        "openai-organization",
        "openai-project",
        "anthropic-organization-id",
        "cookie",
        "set-cookie",
        "x-chaosllm-token",
    }
)
"""Headers that carry credentials or account identity: never stored."""

CREDENTIAL_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "api-key",
        "x-api-key",
        "x-goog-api-key",
        "x-amz-security-token",
    }
)
"""The request headers whose values are credentials, redacted wherever they appear."""
_CREDENTIAL_PARAMS = frozenset(
    {"key", "api-key", "api_key", "x-amz-security-token", "x-amz-credential"}
)
_CREDENTIAL_LENGTHS = frozenset(len(h) for h in CREDENTIAL_HEADERS)
MIN_CREDENTIAL = 12
"""Shorter values are not taken for credentials (``sk-test``, ``dummy``: a word that
could be in any prompt)."""

_SECRET_HEADER_WORDS = ("api-key", "apikey", "token", "secret", "password", "auth", "cookie")

KEPT_RESPONSE_HEADERS = frozenset(
    {
        "x-request-id",
        "request-id",
        "openai-processing-ms",
        "openai-version",
        "retry-after",
        "retry-after-ms",
    }
)
_KEPT_RESPONSE_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-")

KEY_PATTERNS: Sequence[str] = (
    # OpenAI (sk-..., sk-proj-..., sk-svcacct-...) and Anthropic (sk-ant-api03-...) keys.
    r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_\-]{20,}",
    # Google API keys.
    r"(?<![A-Za-z0-9])AIza[0-9A-Za-z_\-]{35}",
)
"""Well-known API key shapes, redacted wherever they appear."""

_BACKSLASH = ord("\\")
_ESCAPE = b"\\u00"
_ESCAPED_MARKER_CHAR = re.compile(rb"\\u00(?:7[3aA]|6[1bB]|2[dD]|4[19])")
"""A JSON escape of a character of a key marker (s, k, -, A, I, z, a): the decoded
string may hold a marker that the raw bytes do not show."""


def is_secret_header(name: str) -> bool:
    lowered = name.lower()
    return lowered in SECRET_HEADERS or any(word in lowered for word in _SECRET_HEADER_WORDS)


def kept_response_headers(headers: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The response headers worth recording and replaying (lower-cased names, sorted)."""
    kept: dict[str, str] = {}
    for name, value in headers:
        lowered = name.lower()
        if lowered in SECRET_HEADERS:
            continue
        if lowered in KEPT_RESPONSE_HEADERS or lowered.startswith(_KEPT_RESPONSE_PREFIXES):
            kept[lowered] = value
    return tuple(sorted(kept.items()))


def _credential_parts(name: str, value: str) -> Iterable[str]:
    value = value.strip()
    if name in ("authorization", "proxy-authorization"):
        _, _, rest = value.partition(" ")
        rest = rest.strip()
        if "Credential=" in rest:  # AWS SigV4: Credential=AKID/date/region/service/...
            yield rest.split("Credential=", 1)[1].split("/", 1)[0]
            return
        yield rest or value
        return
    if name == "x-amz-credential":
        yield value.split("/", 1)[0]
    yield value


def credential_values(
    headers: Iterable[tuple[bytes | str, bytes | str]], query: bytes = b""
) -> tuple[str, ...]:
    """The credentials a request carries (the values of `CREDENTIAL_HEADERS` and of the
    credential query parameters; of an ``Authorization`` its token, or the access key id
    of an AWS signature), at least `MIN_CREDENTIAL` characters."""
    found: list[str] = []
    for name, value in headers:
        if len(name) not in _CREDENTIAL_LENGTHS:
            continue
        lowered = (name.decode("latin-1") if isinstance(name, bytes) else name).lower()
        if lowered in CREDENTIAL_HEADERS:
            text = value.decode("latin-1") if isinstance(value, bytes) else value
            found.extend(_credential_parts(lowered, text))
    if query and b"=" in query:
        for name, value in parse_qsl(query.decode("latin-1")):
            if name.lower() in _CREDENTIAL_PARAMS:
                found.extend(_credential_parts(name.lower(), value))
    return tuple(sorted({v for v in found if len(v) >= MIN_CREDENTIAL}))


class Redactor:
    """Replaces configured secret values and well-known key shapes by ``[REDACTED]``."""

    __slots__ = ("_bytes", "_pattern", "secrets")

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Longest first, so that a secret containing another is replaced whole.
        values = sorted({s for s in (v.strip() for v in secrets) if s}, key=lambda s: -len(s))
        self.secrets: tuple[str, ...] = tuple(values)
        self._bytes = tuple(s.encode("utf-8") for s in values)
        self._pattern = re.compile("|".join([re.escape(s) for s in values] + list(KEY_PATTERNS)))

    def carrying(self, credentials: Sequence[str]) -> Redactor:
        """This redactor with a request's `credentials` (`credential_values`) added."""
        if not credentials:
            return self
        return _redactor((*self.secrets, *credentials))

    def text(self, text: str) -> str:
        return self._pattern.sub(REDACTED, text)

    def body(self, value: JSON) -> JSON:
        """`value` with every string (values and keys) redacted; a new structure."""
        if isinstance(value, str):
            return self._pattern.sub(REDACTED, value)
        if isinstance(value, dict):
            return {
                self.text(k) if isinstance(k, str) else k: self.body(v) for k, v in value.items()
            }
        if isinstance(value, list):
            return [self.body(v) for v in value]
        return value

    def may_contain_secret(self, raw: bytes) -> bool:
        """A fast, conservative check of a raw JSON body: False only when parsing it cannot
        yield a string with a secret (no key marker, no configured value, no escapes that
        could hide one)."""
        # A marker in a decoded string is in the raw bytes, or one of its characters is
        # written as an escape (``\u0073k-``). Escapes need a backslash, and looking for
        # one byte is a memchr: a body without any pays next to nothing for the escape
        # check. (`find`, not `in`: ``bytes in bytes`` first tries the needle as an int
        # and pays for the TypeError, which costs more than the search.)
        if raw.find(b"sk-") >= 0 or raw.find(b"AIza") >= 0:
            return True
        if _BACKSLASH in raw:
            return bool(self._bytes) or (
                raw.find(_ESCAPE) >= 0 and _ESCAPED_MARKER_CHAR.search(raw) is not None
            )
        if not self._bytes:
            return False
        return any(raw.find(secret) >= 0 for secret in self._bytes)

    def request_body(self, body: JSON, raw: bytes | None = None) -> JSON:
        """The request as it is keyed and stored: `body` itself when `raw` (its bytes)
        cannot contain a secret, else a redacted copy."""
        if raw is not None and not self.may_contain_secret(raw):
            return body
        return self.body(body)


@functools.lru_cache(maxsize=32)
def _redactor(secrets: tuple[str, ...]) -> Redactor:
    return Redactor(secrets)


def redact_text(text: str, secrets: Sequence[str] = ()) -> str:
    return _redactor(tuple(secrets)).text(text)


def redact_body(body: JSON, secrets: Sequence[str] = ()) -> JSON:
    """`body` with configured `secrets` and well-known key shapes replaced by
    ``[REDACTED]`` in every string, recursively."""
    return _redactor(tuple(secrets)).body(body)
