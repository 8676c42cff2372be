"""The stack's ceiling: uvloop + httptools answering with chaosllm's own bytes, nothing else.

chaosllm's default server is an `asyncio.Protocol` on uvloop that parses with httptools.
This module is that stack with everything of chaosllm taken out: a protocol that feeds
what it reads to an `httptools.HttpRequestParser` and, when a request is complete,
writes one fixed response -- the exact bytes (status line, headers, body) a running
chaosllm answered the same request with, captured first (`capture`). No routing, no
JSON, no journal, no ASGI; keep-alive as the request asks (HTTP/1.1 unless
``Connection: close``; HTTP/1.0 closes). Whatever chaosllm does per request, it cannot
be faster than this on the same loop and parser: chaosllm / ceiling is the share of the
stack's capacity that chaosllm leaves to its clients.

Run as a server (the benchmark does this in a subprocess)::

    python benchmarks/ceiling.py --response FILE

FILE holds the raw HTTP response. It prints ``ceiling listening on
http://127.0.0.1:PORT`` once bound (port 0: one the system picks) and serves until
SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import cast
from urllib.parse import urlsplit

import httptools

__all__ = ["capture", "main"]


class _Replay(asyncio.Protocol):
    """One connection: parse requests, answer each with `response`."""

    __slots__ = ("keep", "parser", "response", "transport")

    def __init__(self, response: bytes) -> None:
        self.response = response
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.keep = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        del self.parser  # the parser holds our callbacks: break the cycle

    # httptools callbacks (only those defined are called)

    def on_headers_complete(self) -> None:
        self.keep = self.parser.should_keep_alive()

    def on_message_complete(self) -> None:
        transport = self.transport
        if transport is None:
            return
        transport.write(self.response)
        if not self.keep:
            transport.close()


async def _serve(response: bytes) -> None:
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    server = await loop.create_server(lambda: _Replay(response), sock=sock)
    print(f"ceiling listening on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


class _Capture:
    """httptools callbacks that note where one response ends, and whether it keeps the
    connection open (asked while the parser is at the head: after it, it says no)."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.done = False
        self.keep = False

    def on_headers_complete(self) -> None:
        self.keep = self.parser.should_keep_alive()

    def on_message_complete(self) -> None:
        self.done = True


def capture(url: str, request_file: Path, timeout: float = 10.0) -> bytes:
    """The raw response (head and body, exactly as written) that the server at `url`
    answers to the request `wrk` sends with ``post.lua`` and `request_file`, on a
    keep-alive connection. Raises RuntimeError when it is not a keep-alive 200."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    import workloads  # the driver's: the server itself needs none of it

    request = workloads.raw_request(host, port, parts.path or "/", request_file.read_bytes())
    seen = _Capture()
    received = bytearray()
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(request)
        while not seen.done:
            chunk = sock.recv(65536)
            if not chunk:
                raise RuntimeError(f"{url}: the connection closed before the response ended")
            received += chunk
            seen.parser.feed_data(chunk)
    status = seen.parser.get_status_code()
    if status != 200 or not seen.keep:
        raise RuntimeError(
            f"{url}: answered {status}, keep-alive {seen.keep}: {bytes(received[:300])!r}"
        )
    return bytes(received)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the stack's ceiling: a fixed-bytes server")
    parser.add_argument("--response", type=Path, required=True, help="the raw HTTP response")
    args = parser.parse_args(argv)
    response = args.response.read_bytes()
    import uvloop

    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(_serve(response))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
