"""The frame splitters stay bounded on streams that never end a frame (issue #23): each
byte is scanned once, an unfinished frame is cut at `max_frame` and the splitter says
so (`overflow`), so the recorder never records such a stream."""

from __future__ import annotations

import time

import pytest

from chaosllm.providers.eventstream import MessageSplitter, event_message
from chaosllm.providers.ndjson import LineSplitter
from chaosllm.providers.sse import FrameSplitter

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("splitter_type", [FrameSplitter, LineSplitter])
def test_a_frame_that_never_ends_is_scanned_once_and_held_bounded(
    splitter_type: type[FrameSplitter],
) -> None:
    splitter = splitter_type(0.0, keep=False, max_frame=1 << 20)
    piece = b"x" * 4096
    started = time.monotonic()
    splitter.feed(b"data: \r", 0.0)  # a CR early on: every mark is looked for
    for _ in range(16 * 1024):  # 64 MiB
        splitter.feed(piece, 0.0)
        assert len(splitter._buffer) <= (1 << 20) + 4096
    assert time.monotonic() - started < 5
    assert splitter.overflow is not None and "never ended" in splitter.overflow


def test_frames_within_the_bound_are_exact_and_no_overflow_is_noted() -> None:
    splitter = FrameSplitter(0.0, max_frame=64)
    assert splitter.feed(b"data: 1\n\ndata: 2\n\n", 0.0) == 2
    assert [f for f, _ in splitter.frames] == [b"data: 1\n\n", b"data: 2\n\n"]
    assert splitter.overflow is None


def test_event_stream_bytes_after_a_broken_prelude_are_bounded_and_noted() -> None:
    splitter = MessageSplitter(0.0, keep=True, max_frame=1 << 20)
    good = event_message("chunk", b'{"bytes": "e30="}')
    assert splitter.feed(good, 0.0) == 1
    assert splitter.overflow is None
    for _ in range(64):
        splitter.feed(b"\xff" * 65536, 0.0)
        assert len(splitter._buffer) <= 1 << 20
    assert splitter.overflow == "bytes after a broken message prelude"
