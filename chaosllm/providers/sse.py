"""The one Server-Sent Events codec: every provider and the recorder use it. Pure.

Theory of operation
-------------------
A stream is a sequence of *frames*: the exact text of one event, its field
lines and the blank line that ends it (what `RecordedChunk.data` holds, and
what one `Piece` of a stream plan carries). Two directions:

- encoding: `data_frame` (``data: <json>``, Chat Completions) and
  `event_frame` (``event: <type>`` + ``data: <json>``, Anthropic Messages and
  the Responses API), compact JSON with non-ASCII kept as it is;
- decoding: `iter_events` yields ``(event name, data)`` for each event in
  some frames (a frame may hold several events; multi-line data is joined
  with newlines; lines end with ``\\n`` or ``\\r\\n``; an event without data
  is no event). `iter_data` is the data alone, `event_types` what each event
  is (its payload's ``type``, else its ``event:`` name).

`FrameSplitter` cuts a raw byte stream, as it arrives, into frames at blank
lines (``\\n\\n``, ``\\r\\n\\r\\n``, ``\\r\\r``), keeping every byte and the gap
before each frame: the recording proxy stores what the upstream sent exactly.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

from chaosllm.model import JSON

__all__ = [
    "DONE",
    "DONE_FRAME",
    "MAX_FRAME",
    "SSE_HEADERS",
    "FrameSplitter",
    "data_frame",
    "event_frame",
    "event_types",
    "iter_data",
    "iter_events",
    "one_event",
    "split_frames",
]

DONE: Final = "[DONE]"
"""The data of the OpenAI Chat Completions terminator event."""
DONE_FRAME: Final = "data: [DONE]\n\n"
SSE_HEADERS: Final = (
    ("content-type", "text/event-stream; charset=utf-8"),
    ("cache-control", "no-cache"),
)
"""The headers a rendered stream is served with (before the recorded ones)."""


def _compact(payload: JSON) -> str:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def data_frame(payload: JSON) -> str:
    """One unnamed event: ``data: <json>`` and the blank line."""
    return "data: " + _compact(payload) + "\n\n"


def event_frame(payload: Mapping[str, Any]) -> str:
    """One event named by its payload's ``type``: ``event: <type>``, ``data: <json>``."""
    return f"event: {payload['type']}\ndata: {_compact(payload)}\n\n"


def iter_events(frames: Iterable[str]) -> Iterator[tuple[str | None, str]]:
    """``(event name, data)`` of each event in `frames` (multi-line data joined)."""
    for frame in frames:
        for event in frame.replace("\r\n", "\n").split("\n\n"):
            name = None
            data: list[str] = []
            for line in event.split("\n"):
                if line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
                elif line.startswith("event:"):
                    name = line[6:].strip()
            if data:
                yield name, "\n".join(data)


def one_event(frame: bytes) -> tuple[str | None, Any, dict[str, Any]] | None:
    """The ``event:`` name, the type (its JSON ``type``, else that name) and the JSON object
    of a frame holding one event; None for any other frame."""
    events = list(iter_events([frame.decode("utf-8", "replace")])) if frame else []
    if len(events) != 1:
        return None
    name, data = events[0]
    try:
        event = json.loads(data)
    except ValueError:
        return None
    return (name, event.get("type", name), event) if isinstance(event, dict) else None


def iter_data(frames: Iterable[str]) -> Iterator[str]:
    """The data of each event in `frames`."""
    for _, data in iter_events(frames):
        yield data


def event_types(frames: Iterable[str]) -> Iterator[str | None]:
    """What each event in `frames` is: its JSON payload's ``type`` (what clients parse), else
    its ``event:`` name, else None (``data: [DONE]``, say)."""
    for name, data in iter_events(frames):
        try:
            payload = json.loads(data)
        except json.JSONDecodeError:
            payload = None
        kind = payload.get("type") if isinstance(payload, dict) else None
        yield kind if isinstance(kind, str) else name or None


# -- bytes as they arrive -----------------------------------------------------------

_BOUNDARY_MARKS: Final = (b"\r\n\r\n", b"\n\n", b"\r\r")
_LF_MARK: Final = (b"\n\n",)


MAX_FRAME: Final = 8 << 20
"""The most bytes an unfinished frame holds: past it the bytes are cut off as a frame of
their own and the splitter notes `FrameSplitter.overflow` (a stream that never sends its
blank line, or event-stream bytes after a broken prelude, stays bounded)."""


class FrameSplitter:
    """Splits a raw SSE byte stream into frames (each with its terminating blank line),
    timing each by the arrival of the bytes that completed it. Each byte is scanned
    once, and an unfinished frame holds at most `max_frame` bytes."""

    __slots__ = ("_buffer", "_cr", "_last", "frames", "keep", "max_frame", "overflow")

    def __init__(self, start: float, *, keep: bool = True, max_frame: int = MAX_FRAME) -> None:
        self._buffer = bytearray()
        self._cr = False
        self._last = start
        self.keep = keep
        """Whether frames are kept (False: only counted)."""
        self.max_frame = max_frame
        self.overflow: str | None = None
        """Why the frames are not the stream's own (a frame cut at `max_frame`), if so."""
        self.frames: list[tuple[bytes, float]] = []
        """(exact bytes, milliseconds since the previous frame or the head)."""

    def feed(self, data: bytes, now: float) -> int:
        """Take the next bytes; how many frames they completed."""
        buffer = self._buffer
        search = max(0, len(buffer) - 3)
        buffer += data
        if not self._cr and b"\r" in data:
            self._cr = True
        marks = self._marks(buffer)
        cut = count = 0
        while True:
            end = -1
            for mark in marks:
                at = buffer.find(mark, search)
                if at != -1 and (end == -1 or at + len(mark) < end):
                    end = at + len(mark)
            if end == -1:
                break
            if self.keep:
                self.frames.append((bytes(buffer[cut:end]), (now - self._last) * 1000.0))
            self._last = now
            count += 1
            cut = search = end
        if cut:
            del buffer[:cut]
        return count + self._bound(now)

    def _bound(self, now: float) -> int:
        """Cut an unfinished frame over `max_frame` off as a frame (1), noting why."""
        buffer = self._buffer
        if len(buffer) <= self.max_frame:
            return 0
        self.overflow = f"a frame longer than {self.max_frame} bytes (it never ended)"
        if self.keep:
            self.frames.append((bytes(buffer), (now - self._last) * 1000.0))
        self._last = now
        buffer.clear()
        return 1

    def _marks(self, buffer: bytearray) -> tuple[bytes, ...]:
        """The byte sequences that end a frame (blank lines; `ndjson.LineSplitter`: a
        newline)."""
        return _BOUNDARY_MARKS if self._cr else _LF_MARK

    def finish(self) -> None:
        """End of stream: bytes after the last blank line join the last frame, so that
        the frames always add up to the body."""
        if self._buffer and self.keep:
            if self.frames:
                data, delay = self.frames[-1]
                self.frames[-1] = (data + bytes(self._buffer), delay)
            else:
                self.frames.append((bytes(self._buffer), 0.0))
        self._buffer.clear()


def split_frames(data: bytes) -> list[tuple[bytes, float]]:
    """A whole SSE body as frames (no gaps: all arrived at once)."""
    splitter = FrameSplitter(0.0)
    splitter.feed(data, 0.0)
    splitter.finish()
    return splitter.frames
