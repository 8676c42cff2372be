"""Accepting the builtin server's connections: every connection waiting, in one turn of
the event loop.

uvloop's own server (`loop.create_server`) accepts one connection each time the loop
reports the listening socket readable (libuv, since 1.45, does not accept in a loop),
and a loop busy with 2,000 keep-alive connections reports it about once a turn: under
such a flood the listen queue drained at 8 to 16 connections a second, and a fresh
client waited there behind the rest of a connect storm for 4-8 s before its request was
even read. An `Acceptor` watches the listening socket itself (``add_reader``) and accepts
until none is waiting (at most `ACCEPT_BATCH` a turn), each connection then made by the
loop (``connect_accepted_socket``: TLS included) with the server's protocol, as
``create_server`` would. Out of file descriptors, it stops accepting for
`RETRY_DELAY_S` (as asyncio's own server does), logging once per
`LOG_INTERVAL_S`; the connections wait in the listen queue meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import time
from collections.abc import Callable
from typing import Any, Final

__all__ = ["ACCEPT_BATCH", "Acceptor"]

logger = logging.getLogger("chaosllm.wire")

ACCEPT_BATCH: Final = 256
"""The most connections accepted in one turn of the event loop."""
RETRY_DELAY_S: Final = 0.1
"""How long accepting pauses when the process is out of file descriptors."""
LOG_INTERVAL_S: Final = 10.0
"""At most one log line per this many seconds about failing accepts."""
_RESOURCES: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class Acceptor:
    """Accepts on one listening socket and makes each connection with `factory`."""

    __slots__ = ("factory", "failed", "loop", "opening", "reported", "retry", "sock", "ssl")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        factory: Callable[[], asyncio.Protocol],
        ssl: Any = None,
    ) -> None:
        self.loop = loop
        self.sock = sock
        self.factory = factory
        self.ssl = ssl
        self.opening: set[asyncio.Task[None]] = set()
        """Connections accepted whose transport is being made (a TLS handshake, say)."""
        self.retry: asyncio.TimerHandle | None = None
        self.failed = 0
        self.reported = float("-inf")

    def start(self) -> None:
        self.retry = None
        self.loop.add_reader(self.sock.fileno(), self._accept)

    def close(self) -> None:
        """Stop accepting; connections still being made are abandoned (closed)."""
        if self.retry is not None:
            self.retry.cancel()
            self.retry = None
        with contextlib.suppress(ValueError, OSError):
            self.loop.remove_reader(self.sock.fileno())
        for task in self.opening:
            task.cancel()

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                if exc.errno not in _RESOURCES:
                    raise
                self._out_of_files(exc)
                return
            conn.setblocking(False)
            task = self.loop.create_task(self._open(conn))
            self.opening.add(task)
            task.add_done_callback(self.opening.discard)

    async def _open(self, conn: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(self.factory, conn, ssl=self.ssl)
        except (OSError, asyncio.CancelledError) as exc:  # the client left; a shutdown
            conn.close()
            if isinstance(exc, asyncio.CancelledError):
                raise
            logger.debug("setting up an accepted connection failed: %s", exc)
        except Exception as exc:  # a failed TLS handshake ends this connection only
            conn.close()
            logger.debug("setting up an accepted connection failed: %s", exc)

    def _out_of_files(self, exc: OSError) -> None:
        self.failed += 1
        now = time.monotonic()
        if now - self.reported >= LOG_INTERVAL_S:
            self.reported = now
            logger.error(
                "cannot accept connections: %s (%d failed accepts since the last report; "
                "they wait in the listen queue). Raise the open-file limit (ulimit -n).",
                exc,
                self.failed,
            )
            self.failed = 0
        with contextlib.suppress(ValueError, OSError):
            self.loop.remove_reader(self.sock.fileno())
        self.retry = self.loop.call_later(RETRY_DELAY_S, self.start)
