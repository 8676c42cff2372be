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

import contextlib
import json
from collections.abc import Iterable, Iterator
from typing import Any, Final

from chaosllm.model import JSON
from chaosllm.providers.sse import FrameSplitter

__all__ = ["NDJSON_HEADERS", "NDJSON_TYPE", "LineSplitter", "iter_objects", "line"]

NDJSON_TYPE: Final = "application/x-ndjson"
NDJSON_HEADERS: Final = (("content-type", NDJSON_TYPE),)
"""The headers a rendered NDJSON stream is served with (before the recorded ones)."""
_NEWLINE: Final = (b"\n",)


def line(payload: JSON) -> str:
    """One frame: the compact JSON of `payload` and a newline."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False) + "\n"


def iter_objects(frames: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The JSON object of each line in `frames` (anything else is passed over)."""
    for frame in frames:
        for text in frame.split("\n"):
            value = _object(text) if text.strip() else None
            if value is not None:
                yield value


def _object(text: str) -> dict[str, Any] | None:
    """The JSON object a line holds, None for any other line."""
    with contextlib.suppress(json.JSONDecodeError):
        value = json.loads(text)
        if isinstance(value, dict):
            return value
    return None


class LineSplitter(FrameSplitter):
    """Cuts NDJSON bytes into frames (one line each, its newline kept) as they arrive,
    timing each by the arrival of the bytes that completed it; what `FrameSplitter` does
    for SSE (its `finish`: bytes after the last newline join the last frame)."""

    __slots__ = ()

    def _marks(self, buffer: bytearray) -> tuple[bytes, ...]:
        return _NEWLINE
