"""Response heads as h11 writes them, and how the body after each is framed.

`build_head` is h11's `_clean_up_response_headers_for_sending` and choice of body writer,
byte for byte (header order, ``Date``, ``Transfer-Encoding: chunked`` for HTTP/1.1 and a
close-delimited body for HTTP/1.0, ``Connection: close``), for headers as an ASGI app or
a plan gives them. The ``Date`` value is left out of the bytes and filled in when the
head is written (`Head.render`), so that a head is built once and written many times.
Pure: nothing here does I/O.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, Final

__all__ = ["CHUNKED", "HTTP10", "LENGTH", "PHRASES", "Head", "build_head", "http_date", "tokens"]

PHRASES: Final = {status.value: status.phrase.encode("ascii") for status in HTTPStatus}

# Body framings of a response (h11's writers): Content-Length, chunked, close-delimited.
LENGTH: Final = 0
CHUNKED: Final = 1
HTTP10: Final = 2

_FIELD_NAME: Final = re.compile(rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")
_FIELD_VALUE: Final = re.compile(rb"(?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*)?")


_date_cache: list[Any] = [0, b""]


def http_date() -> bytes:
    """The current ``Date`` header value (formatted once a second)."""
    now = int(time.time())
    if now != _date_cache[0]:
        _date_cache[0] = now
        _date_cache[1] = formatdate(now, usegmt=True).encode("ascii")
    value: bytes = _date_cache[1]
    return value


class Head:
    """A response head as h11 would write it, and how the body that follows is framed."""

    __slots__ = ("after_date", "before_date", "keep_alive", "length", "mode")

    def __init__(
        self, before_date: bytes, after_date: bytes | None, mode: int, length: int, keep: bool
    ) -> None:
        self.before_date = before_date
        """The head up to the Date value (the whole head when `after_date` is None)."""
        self.after_date = after_date
        """None: the headers had their own Date."""
        self.mode = mode
        """`LENGTH`, `CHUNKED` or `HTTP10`."""
        self.length = length
        """With `LENGTH`: the declared length."""
        self.keep_alive = keep
        """Whether the connection can serve another request after a complete body."""

    def render(self) -> bytes:
        if self.after_date is None:
            return self.before_date
        return self.before_date + http_date() + self.after_date


def tokens(value: bytes) -> list[bytes]:
    """The comma-separated tokens of a header value, in lower case."""
    return [token.strip(b" \t") for token in value.lower().split(b",")]


def _comma_tokens(items: Sequence[tuple[bytes, bytes, bytes]], name: bytes) -> list[bytes]:
    found: list[bytes] = []
    for _, key, value in items:
        if key == name:
            for token in value.split(b","):
                token = token.strip(b" \t").lower()
                if token:
                    found.append(token)
    return found


def build_head(
    status: int,
    headers: Sequence[tuple[bytes, bytes]],
    *,
    is_head: bool,
    http10: bool,
    keep_alive: bool,
    close: bool,
) -> Head:
    """h11's `_clean_up_response_headers_for_sending` and body framing, for `headers` as
    the app (or plan) gives them; `close` adds ``connection: close`` (the server's own
    wish), `keep_alive` is the client's. RuntimeError for what h11 refuses to send."""
    if not 200 <= status < 1000:
        raise RuntimeError(f"response status {status} is not in the range [200, 1000)")
    items: list[tuple[bytes, bytes, bytes]] = []
    has_date = False
    for raw, value in headers:
        if _FIELD_NAME.fullmatch(raw) is None:
            raise RuntimeError(f"illegal response header name {raw!r}")
        if _FIELD_VALUE.fullmatch(value) is None:
            raise RuntimeError(f"illegal response header value {value!r}")
        name = raw.lower()
        if name == b"date":
            has_date = True
        elif name == b"content-length":
            if not value.isdigit():
                raise RuntimeError(f"bad Content-Length {value!r}")
        elif name == b"transfer-encoding" and value.lower() != b"chunked":
            raise RuntimeError("only Transfer-Encoding: chunked is supported")
        items.append((raw, name, value))
    if not has_date:
        items.append((b"date", b"date", b""))  # its value is filled in when rendered
    if close:
        items.append((b"connection", b"connection", b"close"))
    # Framing as for a GET (a HEAD's headers are a GET's): T-E beats C-L.
    has_te = any(key == b"transfer-encoding" for _, key, _ in items)
    lengths = [value for _, key, value in items if key == b"content-length"]
    need_close = False
    if status not in (204, 304) and (has_te or not lengths):
        items = [i for i in items if i[1] != b"content-length" and i[1] != b"transfer-encoding"]
        if http10:
            need_close = not is_head
        else:
            items.append((b"Transfer-Encoding", b"transfer-encoding", b"chunked"))
    if not keep_alive or need_close:
        connection = set(_comma_tokens(items, b"connection"))
        connection.discard(b"keep-alive")
        connection.add(b"close")
        items = [i for i in items if i[1] != b"connection"]
        items += [(b"Connection", b"connection", token) for token in sorted(connection)]
    keep = keep_alive and not need_close and b"close" not in _comma_tokens(items, b"connection")
    # The writer, for the real method.
    if is_head or status in (204, 304):
        mode, length = LENGTH, 0
    elif any(key == b"transfer-encoding" for _, key, _ in items):
        mode, length = CHUNKED, 0
    else:
        lengths = [value for _, key, value in items if key == b"content-length"]
        if lengths:
            if len(set(lengths)) != 1:
                raise RuntimeError("conflicting Content-Length headers")
            mode, length = LENGTH, int(lengths[0])
        else:
            mode, length = HTTP10, 0
            keep = False
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, PHRASES.get(status, b""))]
    ordered = [i for i in items if i[1] == b"host"] + [i for i in items if i[1] != b"host"]
    before: bytes | None = None
    for raw, name, value in ordered:
        if name == b"date" and not has_date and before is None:
            lines.append(b"%s: " % raw)
            before = b"".join(lines)
            lines = [b"\r\n"]
        else:
            lines.append(b"%s: %s\r\n" % (raw, value))
    lines.append(b"\r\n")
    if before is None:
        return Head(b"".join(lines), None, mode, length, keep)
    return Head(before, b"".join(lines), mode, length, keep)
