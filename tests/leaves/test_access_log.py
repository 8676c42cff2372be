"""The access log's lines and its buffer: every line prefixed, in order, written out
within its bound, at once when the buffer is full, and all of it on close."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from chaosllm.http.access import FLUSH_BYTES, AccessLog, LineBuffer, access_lines


class _Stream:
    """A text stream that says when it was written to."""

    def __init__(self) -> None:
        self.text = ""
        self.writes = 0
        self.written = threading.Event()

    def write(self, text: str) -> int:
        self.text += text
        self.writes += 1
        self.written.set()
        return len(text)

    def flush(self) -> None:
        pass


def _record(**fields: Any) -> Any:
    base = {
        "fault": None,
        "miss": False,
        "rate_limited": False,
        "match": "exact",
        "recording": "simple-chat/0001",
        "status": 200,
        "method": "POST",
        "path": "/v1/chat/completions",
        "session": None,
        "seq": 3,
    }
    return SimpleNamespace(**{**base, **fields})


def test_the_lines_say_what_was_answered_and_which_fault_fired() -> None:
    assert access_lines(_record(), 0.44) == (
        "POST /v1/chat/completions exact simple-chat/0001 200 fault=- 0.4ms\n"
    )
    fired = _record(fault={"type": "http_503", "id": "flt_1"}, session="s1", status=503)
    assert access_lines(fired, 1.0).splitlines() == [
        "POST /v1/chat/completions exact simple-chat/0001 503 fault=http_503#flt_1 1.0ms "
        "session=s1",
        "fault http_503#flt_1 fired on request #3 (POST /v1/chat/completions)",
    ]
    assert " miss - " in access_lines(_record(miss=True, recording=None, match=None), 0)


def test_buffered_lines_are_prefixed_in_order_and_written_out_within_the_bound() -> None:
    stream = _Stream()
    lines = LineBuffer(stream, prefix="chaosllm: ")  # type: ignore[arg-type]
    try:
        lines.write("one\n")
        lines.write("two\nthree\n")
        assert stream.written.wait(5.0)  # the flusher's bound is 50 ms: 5 s is generous
        assert stream.text == "chaosllm: one\nchaosllm: two\nchaosllm: three\n"
    finally:
        lines.close()


def test_a_full_buffer_is_written_at_once_and_close_writes_the_rest() -> None:
    stream = _Stream()
    lines = LineBuffer(stream)  # type: ignore[arg-type]
    line = "x" * 99 + "\n"
    for _ in range(FLUSH_BYTES // len(line) + 1):
        lines.write(line)
    assert stream.writes >= 1 and len(stream.text) >= FLUSH_BYTES  # no wait: written there
    lines.write("last\n")
    lines.close()
    assert stream.text.endswith(line + "last\n")
    assert stream.text.count("\n") == FLUSH_BYTES // len(line) + 2


def test_without_a_buffer_the_lines_go_to_the_access_logger(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = AccessLog()
    with caplog.at_level(logging.INFO, logger="chaosllm.access"):
        assert log.enabled
        log.write(_record(fault={"type": "http_429", "id": "flt_2"}), 2.0)
    assert [r.getMessage() for r in caplog.records] == [
        "POST /v1/chat/completions exact simple-chat/0001 200 fault=http_429#flt_2 2.0ms",
        "fault http_429#flt_2 fired on request #3 (POST /v1/chat/completions)",
    ]


@pytest.mark.timeout(60)
def test_lines_written_from_threads_while_flushing_are_each_written_once_in_order() -> None:
    """Writers take no lock: lines that come while the flusher, or a writer whose line
    filled the buffer, writes out the others are neither lost nor written twice, and each
    writer's lines keep their order."""
    stream = _Stream()
    lines = LineBuffer(stream, prefix="p ")  # type: ignore[arg-type]
    per_thread = 3000
    start = threading.Barrier(4)

    def writer(name: str) -> None:
        start.wait()
        for i in range(per_thread):
            lines.write(f"{name} {i:05d} {'x' * 40}\n")
            if i % 500 == 0:
                lines.flush()  # as a log line from another logger does

    threads = [threading.Thread(target=writer, args=(f"w{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30.0)
    lines.close()
    written = stream.text.splitlines()
    assert len(written) == 4 * per_thread
    for n in range(4):
        mine = [line.split()[2] for line in written if line.startswith(f"p w{n} ")]
        assert mine == [f"{i:05d}" for i in range(per_thread)]
    assert stream.writes > 1  # written out in several batches, some while others wrote


def test_a_line_after_a_flush_is_written_out_within_the_bound() -> None:
    """The flusher is told again of a line that comes after it took the others."""
    stream = _Stream()
    lines = LineBuffer(stream)  # type: ignore[arg-type]
    try:
        lines.write("one\n")
        assert stream.written.wait(5.0)
        stream.written.clear()
        lines.write("two\n")
        assert stream.written.wait(5.0)
        assert stream.text == "one\ntwo\n"
    finally:
        lines.close()
