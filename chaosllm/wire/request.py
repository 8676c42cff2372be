"""What the builtin server's parser produces: a request, or a refusal of one.

Both queue on the connection in arrival order (`chaosllm.wire.protocol.Connection`), so
that a refusal is answered after the requests before it, and both count toward the
bytes buffered behind a response in flight (`size`).
"""

from __future__ import annotations

from typing import Final

from chaosllm.wire.common import path_of

__all__ = ["CONTINUE", "Refusal", "Request"]

CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"
"""The interim answer to ``Expect: 100-continue``."""


class Request:
    """A complete request (or one whose body is still arriving)."""

    __slots__ = (
        "body",
        "derived",
        "headers",
        "http_version",
        "is_head",
        "keep_alive",
        "method",
        "path",
        "query",
        "raw_path",
        "size",
        "upgrade",
        "want_continue",
    )

    def __init__(
        self,
        method: bytes,
        target: bytes,
        http_version: str,
        headers: list[tuple[bytes, bytes]],
        keep_alive: bool,
    ) -> None:
        self.method = method
        self.raw_path, self.query, self.path = path_of(target)
        self.http_version = http_version
        self.headers = headers
        self.keep_alive = keep_alive
        self.is_head = method == b"HEAD"
        self.body = b""
        self.size = 0
        self.want_continue = False
        self.derived: object = None
        """What the fast path made of this request (`chaosllm.wire.common.Direct`), kept
        with it: a request read again from the memo is this object, worked out once."""
        self.upgrade: bytes | None = None
        """A WebSocket upgrade: the bytes that came after its head (None: not one)."""


class Refusal:
    """An answer the server gives on its own, in the request order, then closes."""

    __slots__ = ("code", "linger", "message", "path", "size", "status", "type_")

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        *,
        type_: str = "invalid_request_error",
        path: str | None = None,
        linger: bool = False,
    ) -> None:
        self.status = status
        self.message = message
        self.code = code
        self.type_ = type_
        self.path = path
        self.linger = linger
        self.size = 0
