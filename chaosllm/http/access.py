"""The access log: a line per provider request, and one more when a fault fires.

``POST /v1/chat/completions exact knowledge/0004 200 fault=- 0.4ms`` (the decision's
time; a stream's frames follow it). By default the lines go to the ``chaosllm.access``
logger at INFO, so a library user sees them only when they turn INFO on for
``chaosllm``. ``chaosllm serve`` writes them to standard error through a `LineBuffer`
instead: a logging record costs a replayed request more than the rest of its answer
(tens of microseconds: the record, its formatting, a write and a flush per line), a
buffered line about one; the buffer is written out within `FLUSH_S`, when it holds
`FLUSH_BYTES`, and before any other log line, so the order of lines is kept.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any, Final, TextIO

__all__ = ["FLUSH_BYTES", "FLUSH_S", "AccessLog", "LineBuffer", "access_lines"]

access_log = logging.getLogger("chaosllm.access")

FLUSH_S: Final = 0.05
"""The longest a buffered line waits to be written."""
FLUSH_BYTES: Final = 32 * 1024
"""What the buffer holds at most before it is written out at once."""


def access_lines(record: Any, ms: float) -> str:
    """The access line of a journal record (and the fault line after it, when a fault
    fired), newline-terminated, without a prefix."""
    fault = record.fault
    if record.miss:
        matched = "miss"
    elif record.rate_limited:
        matched = "rate-limited"
    else:
        matched = record.match or ("proxy" if record.recording is None else "-")
    status = "-" if record.status is None else record.status
    fired = f"{fault['type']}#{fault.get('id', '?')}" if fault else "-"
    session = f" session={record.session}" if record.session else ""
    line = (
        f"{record.method} {record.path} {matched} {record.recording or '-'} {status} "
        f"fault={fired} {ms:.1f}ms{session}\n"
    )
    if fault:
        line += f"fault {fired} fired on request #{record.seq} ({record.method} {record.path})\n"
    return line


class LineBuffer:
    """Lines for a stream, written out in batches (see the module docstring).

    Thread-safe. A line is buffered without a lock (a deque's append is atomic): a
    replayed request pays for its line about a microsecond. A daemon thread writes out
    what waits longer than `FLUSH_S`; a writer that fills the buffer to `FLUSH_BYTES`
    writes it out itself, so the buffer holds no more than that and one line."""

    def __init__(self, stream: TextIO, prefix: str = "") -> None:
        self.stream = stream
        self.prefix = prefix
        self._lines: deque[str] = deque()
        self._size = 0
        """About what `_lines` holds, in characters: counted by the writers, reset by a
        flush (a line counted while a flush runs may be counted after it was written)."""
        self._armed = False
        """Whether the flusher was told of the lines waiting (cleared before it writes
        them out: a line that comes after is told of again)."""
        self._write_lock = threading.Lock()
        """Held while lines are taken and written: one flush at a time, lines in order."""
        self._start_lock = threading.Lock()
        self._pending = threading.Event()
        self._stopped = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def write(self, text: str) -> None:
        """Buffer `text` (lines, each newline-terminated); each line is prefixed when the
        batch is written out (one ``replace`` a batch instead of one a line)."""
        self._lines.append(text)
        self._size += len(text)
        if self._size >= FLUSH_BYTES:
            self.flush()
        elif not self._armed:
            self._armed = True
            if self._thread is None:
                self._start()
            self._pending.set()

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._flusher, name="chaosllm-access-log", daemon=True
                )
                self._thread.start()

    def flush(self) -> None:
        """Write out what is buffered."""
        lines = self._lines
        with self._write_lock:
            self._size = 0
            taken: list[str] = []
            while lines:
                taken.append(lines.popleft())
            if not taken:
                return
            text = "".join(taken)
            prefix = self.prefix
            if prefix:
                text = prefix + text[:-1].replace("\n", "\n" + prefix) + "\n"
            try:
                self.stream.write(text)
                self.stream.flush()
            except (OSError, ValueError):  # the stream is gone: the lines with it
                pass

    def close(self) -> None:
        """Write out what is buffered and stop the thread."""
        with self._start_lock:
            self._closed = True
            thread = self._thread
        self._stopped.set()
        self._pending.set()
        if thread is not None:
            thread.join(timeout=1.0)
        self.flush()

    def _flusher(self) -> None:
        while not self._stopped.is_set():
            self._pending.wait()
            # Lines that come meanwhile join the batch: one write per FLUSH_S at most.
            self._stopped.wait(FLUSH_S)
            self._pending.clear()
            self._armed = False  # before the lines are taken: a later one arms again
            self.flush()


class AccessLog:
    """Where the access lines go: the ``chaosllm.access`` logger (`buffer` None), or a
    `LineBuffer`."""

    __slots__ = ("buffer",)

    def __init__(self, buffer: LineBuffer | None = None) -> None:
        self.buffer = buffer

    @property
    def enabled(self) -> bool:
        return self.buffer is not None or access_log.isEnabledFor(logging.INFO)

    def write(self, record: Any, ms: float) -> None:
        text = access_lines(record, ms)
        buffer = self.buffer
        if buffer is not None:
            buffer.write(text)
            return
        for line in text.splitlines():
            access_log.info("%s", line)
