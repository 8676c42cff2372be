"""The builtin server's request reader: httptools' (llhttp's) callbacks, building the
requests of one connection and queueing them, with the refusals, in arrival order.

A request's head is at most `MAX_HEAD` bytes (431); an HTTP version other than 1.0 and
1.1 gets 505; Content-Length together with Transfer-Encoding (RFC 9112 section 6.1) 400
and the connection closed; any other malformed HTTP 400; a body over `max_body_bytes`,
declared or counted as it arrives, 413 and a lingering close. A refusal is queued after
the requests before it, and nothing more is read (`Connection.discarding`).

What a read parses to is kept in the server's memo (`chaosllm.core.memo`, a pure entry)
when it was exactly one whole, plain keep-alive request read from the parser's start:
the same bytes read there again are that request again, queued without parsing (llhttp
is back in its start state after every complete message; the request is shared, and
nothing changes a queued request but ``want_continue``, which a plain one never has).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

import httptools

from chaosllm.wire.common import BOTH_FRAMINGS, MAX_HEAD, path_of, version_refusal
from chaosllm.wire.flow import held, stash_full
from chaosllm.wire.head import tokens
from chaosllm.wire.request import CONTINUE, Refusal, Request
from chaosllm.wire.upgrade import is_upgrade

if TYPE_CHECKING:
    from chaosllm.wire.protocol import Connection

__all__ = ["BODY", "HEAD", "IDLE", "SLICE", "RequestReader"]

logger = logging.getLogger("chaosllm.wire")

_STOP: Final = "chaosllm refused the request"
SLICE: Final = 4096
"""The most bytes parsed between two looks at the queue (`_feed_bounded`): what one slice
of small pipelined requests can add beyond the bound."""
REQUEST_COST: Final = 1024
"""What a memoised request holds besides its bytes (the object, its header tuples)."""

# Reader states: waiting for a message (nothing of it received), in its head, in its body.
IDLE: Final = 0
HEAD: Final = 1
BODY: Final = 2


class RequestReader:
    """One connection's parser and the request it is reading."""

    __slots__ = (
        "body_since",
        "body_size",
        "completed",
        "conn",
        "head_bytes",
        "head_since",
        "head_size",
        "headers",
        "last_data",
        "parser",
        "parts",
        "plain",
        "pstate",
        "req",
        "rest",
        "url",
    )

    def __init__(self, conn: Connection, now: float) -> None:
        self.conn = conn
        self.parser = httptools.HttpRequestParser(self)
        self.pstate = IDLE
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_size = 0
        self.head_bytes = 0
        """Bytes received of the head in progress (the 431 limit over several reads)."""
        self.req: Request | None = None
        """The request whose body is arriving."""
        self.parts: list[bytes] = []
        self.body_size = 0
        self.head_since = now
        self.body_since = now
        self.last_data = now
        self.completed = 0
        """Requests read whole so far."""
        self.rest = b""
        """Bytes read but not parsed: the queue was full (`_feed_bounded`)."""
        self.plain: Request | None = None
        """The request last read whole, when it is plain (keep-alive, no Expect, no
        upgrade), else None: what the memo may keep."""

    def feed(self, data: bytes) -> None:
        """Parse `data` (after what was held back): complete requests and refusals go to
        the connection's queue; a read larger than `SLICE` is parsed in slices while the
        queue has room (`_feed_bounded`)."""
        rest = self.rest
        if rest:
            self.rest = b""
            data = rest + data
        if len(data) > SLICE:
            self._feed_bounded(data)
            return
        conn = self.conn
        memo = conn.server.memo
        if memo is None or self.pstate != IDLE:
            self._parse(data)
            return
        key = ("request", conn.server.max_body_bytes, data)
        req: Request | None = memo.get(key)
        if req is not None:  # these bytes from the start state: this request again
            self.head_since = self.body_since = self.last_data = conn.loop.time()
            self._complete(req)
            return
        completed = self.completed
        self._parse(data)
        req = self.plain
        if (
            req is not None
            and self.completed == completed + 1
            and self.pstate == IDLE
            and not conn.discarding
        ):
            memo.put(key, req, len(data) + REQUEST_COST)

    def _feed_bounded(self, data: bytes) -> None:
        """Parse `data` in slices until the queue is full (`stash_full`): the rest is held
        back unparsed, reading paused, until the connection has answered what is queued
        (`Connection._pump` feeds it then). A read holds up to 256 KiB: parsed whole, a
        pipelining client's read became some 400 requests at once, beyond the bound."""
        conn = self.conn
        start = 0
        end = len(data)
        while start < end:
            if conn.discarding or conn.closed:
                return
            # (the request next in turn is read whole: its body is the body limit's)
            queue = conn.queue
            if (queue or conn.busy) and stash_full(len(queue), conn.queued + self.body_size):
                self.rest = data[start:]
                conn.flow.pause_reading()
                return
            stop = start + SLICE
            self._parse(data[start:stop])
            start = stop
            if conn.discarding and start < end:  # an upgrade's: the bytes after its head
                last = conn.queue[-1] if conn.queue else None
                if type(last) is Request and last.upgrade is not None:
                    last.upgrade += data[start:]
                return

    def _parse(self, data: bytes) -> None:
        conn = self.conn
        if self.pstate == BODY:
            self.last_data = conn.loop.time()
        else:
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            # The request asked to switch protocols: a WebSocket takes the bytes after its
            # head (`chaosllm.wire.ws_protocol`); another is answered as a plain request
            # and the connection closed after it (on_headers_complete saw to both).
            conn.discarding = True
            last = conn.queue[-1] if conn.queue else None
            if type(last) is Request and last.upgrade is not None:
                last.upgrade = data[exc.args[0] :]
        except httptools.HttpParserError as exc:
            self.parse_error(exc)
        if not conn.discarding and self.pstate != BODY and self.head_bytes > MAX_HEAD:
            self.refuse(
                431, f"Request head too large: the limit is {MAX_HEAD} bytes", "bad_request"
            )

    def release(self) -> None:
        """The connection is lost: drop the parser (which holds this reader's callbacks)
        and the connection, so that both are freed by reference counting."""
        del self.parser
        del self.conn
        self.rest = b""

    # -- httptools callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.pstate = HEAD
        self.url = b""
        self.headers = []
        self.head_size = 0
        self.head_since = self.conn.loop.time()

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.head_size += len(url)
        if self.head_size > MAX_HEAD:
            self._stop_parsing(
                431, f"Request head too large: the limit is {MAX_HEAD} bytes", "bad_request"
            )

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.pstate == BODY:  # a chunked body's trailer field: never a header
            self.body_size += len(name) + len(value)
            return
        if value[-1:] in (b" ", b"\t"):
            value = value.rstrip(b" \t")
        self.headers.append((name.lower(), value))
        self.head_size += len(name) + len(value) + 4
        if self.head_size > MAX_HEAD:
            self._stop_parsing(
                431, f"Request head too large: the limit is {MAX_HEAD} bytes", "bad_request"
            )

    def on_headers_complete(self) -> None:
        parser = self.parser
        server = self.conn.server
        self.pstate = BODY
        self.head_bytes = 0
        version = parser.get_http_version()
        path = path_of(self.url)[2]
        refusal = version_refusal(version)
        if refusal is not None:
            self._stop_parsing(505, refusal, "http_version_not_supported", path=path)
        length: bytes | None = None
        chunked = False
        hosts = 0
        close = False
        expect = False
        for name, value in self.headers:
            if name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                if chunked or value.lower() != b"chunked":
                    self._stop_parsing(
                        501,
                        "Only Transfer-Encoding: chunked is supported",
                        "bad_request",
                        path=path,
                    )
                chunked = True
            elif name == b"host":
                hosts += 1
            elif name == b"connection":
                close = close or b"close" in tokens(value)
            elif name == b"expect":
                expect = expect or b"100-continue" in tokens(value)
        if chunked and length is not None:
            self._stop_parsing(400, BOTH_FRAMINGS, "bad_request", path=path)
        if version == "1.1" and hosts != 1:
            problem = "Missing mandatory Host: header" if not hosts else "Found multiple Host:"
            self._stop_parsing(400, f"Malformed HTTP request: {problem}", "bad_request")
        limit = server.max_body_bytes
        declared = int(length) if length is not None else 0
        if declared > limit:
            self._stop_parsing(
                413,
                f"Request body too large: the limit is {limit} bytes",
                "request_too_large",
                path=path,
                linger=True,
            )
        method = parser.get_method()
        req = Request(method, self.url, version, self.headers, version == "1.1" and not close)
        if parser.should_upgrade():
            if declared or chunked:
                self._stop_parsing(
                    400, "Upgrade requests with a body are not supported", "bad_request", path=path
                )
            req.keep_alive = False  # served as a plain request; the connection then closes
            if is_upgrade(method, self.headers):
                req.upgrade = b""
        self.req = req
        self.plain = req if req.keep_alive and not expect else None
        self.parts = []
        self.body_size = 0
        self.body_since = self.last_data = self.conn.loop.time()
        if expect and version == "1.1":
            if self.conn.busy or self.conn.queue:
                req.want_continue = True
            else:
                self.conn.write_quietly(CONTINUE)

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)
        self.body_size += len(body)
        if self.body_size > self.conn.server.max_body_bytes:
            req = self.req
            self._stop_parsing(
                413,
                f"Request body too large: the limit is {self.conn.server.max_body_bytes} bytes",
                "request_too_large",
                path=req.path if req is not None else None,
                linger=True,
            )

    def on_message_complete(self) -> None:
        req = self.req
        if req is None:  # pragma: no cover - llhttp completes only headed messages
            return
        self.req = None
        parts = self.parts
        req.body = parts[0] if len(parts) == 1 else b"".join(parts)
        self.parts = []
        req.size = held(self.body_size, self.head_size, len(req.headers))
        self.body_size = 0
        self.url = b""
        self.pstate = IDLE
        self._complete(req)

    def _complete(self, req: Request) -> None:
        """`req` read whole: queued (and counted) on the connection."""
        self.completed += 1
        self.head_bytes = 0
        conn = self.conn
        conn.queue.append(req)
        conn.queued += req.size

    # -- refusals -----------------------------------------------------------------------

    def refuse(
        self,
        status: int,
        message: str,
        code: str,
        *,
        type_: str = "invalid_request_error",
        path: str | None = None,
        linger: bool = False,
    ) -> None:
        """Answer `status` in turn (after the requests before it), then close; nothing
        more is read meanwhile."""
        self.conn.discarding = True
        self.conn.queue.append(
            Refusal(status, message, code, type_=type_, path=path, linger=linger)
        )

    def _stop_parsing(
        self,
        status: int,
        message: str,
        code: str,
        *,
        path: str | None = None,
        linger: bool = False,
    ) -> None:
        self.refuse(status, message, code, path=path, linger=linger)
        raise httptools.HttpParserError(_STOP)

    def parse_error(self, exc: httptools.HttpParserError) -> None:
        if self.conn.discarding:
            return  # a refusal of ours is already queued
        cause = exc.__context__
        if isinstance(exc, httptools.HttpParserCallbackError) and cause is not None:
            logger.error("request parsing failed", exc_info=cause)
            self.refuse(500, "Internal server error", "internal_error", type_="server_error")
            return
        reason = str(exc)
        path = path_of(self.url)[2] if self.url else None
        if "HTTP version" in reason:
            message = "Unsupported HTTP version: chaosllm speaks HTTP/1.1 and HTTP/1.0"
            self.refuse(505, message, "http_version_not_supported", path=path)
        elif "can't be present with" in reason:  # Content-Length with Transfer-Encoding
            self.refuse(400, BOTH_FRAMINGS, "bad_request", path=path)
        else:
            self.refuse(400, f"Malformed HTTP request: {reason}", "bad_request")
