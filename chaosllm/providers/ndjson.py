"""Newline-delimited JSON (NDJSON), Ollama's stream framing. Pure.

Theory of operation
-------------------
A stream is a sequence of lines, each one JSON object and ``\\n``
(``application/x-ndjson``). A *frame* is one line with its newline: what a
`RecordedChunk` holds and what one `Piece` of a stream plan carries.

- encoding: `line` (compact JSON, non-ASCII kept as it is, one ``\\n``);
- decoding: `iter_objects` yields the JSON object of each line of some frames
  (blank lines and lines that are not a JSON object are passed over);
- `LineSplitter` cuts a raw byte stream, as it arrives, into frames after each
  ``\\n``, keeping every byte and the gap before each frame (the recording
  proxy's `FrameSplitting`); bytes after the last newline join the last frame
  when the stream ends (or are a frame of their own when there is none).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any, Final

from chaosllm.model import JSON

__all__ = ["NDJSON_HEADERS", "NDJSON_TYPE", "LineSplitter", "iter_objects", "line"]

NDJSON_TYPE: Final = "application/x-ndjson"
NDJSON_HEADERS: Final = (("content-type", NDJSON_TYPE),)
"""The headers a rendered NDJSON stream is served with (before the recorded ones)."""


def line(payload: JSON) -> str:
    """One frame: the compact JSON of `payload` and a newline."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False) + "\n"


def iter_objects(frames: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The JSON object of each line in `frames` (anything else is passed over)."""
    for frame in frames:
        for text in frame.split("\n"):
            if not text.strip():
                continue
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                yield value


class LineSplitter:
    """Cuts NDJSON bytes into frames (one line each, its newline kept) as they arrive,
    timing each by the arrival of the bytes that completed it."""

    __slots__ = ("_buffer", "_last", "frames", "keep")

    def __init__(self, start: float, *, keep: bool = True) -> None:
        self._buffer = bytearray()
        self._last = start
        self.keep = keep
        """Whether frames are kept (False: only counted)."""
        self.frames: list[tuple[bytes, float]] = []
        """(exact bytes, milliseconds since the previous frame or the head)."""

    def feed(self, data: bytes, now: float) -> int:
        """Take the next bytes; how many frames they completed."""
        buffer = self._buffer
        search = len(buffer)
        buffer += data
        cut = count = 0
        while (at := buffer.find(b"\n", search)) != -1:
            end = at + 1
            if self.keep:
                self.frames.append((bytes(buffer[cut:end]), (now - self._last) * 1000.0))
            self._last = now
            count += 1
            cut = search = end
        if cut:
            del buffer[:cut]
        return count

    def finish(self) -> None:
        """End of stream: bytes after the last newline join the last frame, so that the
        frames always add up to the body."""
        if self._buffer and self.keep:
            if self.frames:
                data, delay = self.frames[-1]
                self.frames[-1] = (data + bytes(self._buffer), delay)
            else:
                self.frames.append((bytes(self._buffer), 0.0))
        self._buffer.clear()
