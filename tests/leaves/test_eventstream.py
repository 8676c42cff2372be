"""The AWS event-stream codec, pure: round trips on bytes and on the recording's text form,
CRC errors detected, and botocore's own decoder (`botocore.eventstream.EventStreamBuffer`)
reading what the encoder writes byte for byte."""

from __future__ import annotations

import struct
import uuid
import zlib

import pytest
from botocore.eventstream import ChecksumMismatch, EventStreamBuffer

from chaosllm.errors import EventStreamError
from chaosllm.providers import eventstream as es

ALL_TYPES = (
    es.Header(":event-type", "contentBlockDelta"),
    es.Header("yes", True, 0),
    es.Header("no", False, 1),
    es.Header("byte", -7, 2),
    es.Header("short", 31000, 3),
    es.Header("int", -2_000_000_000, 4),
    es.Header("long", 2**40 + 3, 5),
    es.Header("bytes", b"\x00\xffraw", 6),
    es.Header("when", 1_700_000_000_123, 8),
    es.Header("id", uuid.UUID("0123456789abcdef0123456789abcdef"), 9),
)


def botocore_messages(data: bytes) -> list[tuple[dict[str, object], bytes]]:
    buffer = EventStreamBuffer()
    buffer.add_data(data)
    return [(m.headers, m.payload) for m in buffer]


def test_the_empty_message_is_the_published_test_vector() -> None:
    # aws-c-event-stream's "empty message" vector: 16 bytes, both CRCs.
    assert es.encode_message((), b"").hex() == "000000100000000005c248eb7d98c8ff"


def test_a_message_round_trips_through_bytes_with_every_header_type() -> None:
    data = es.encode_message(ALL_TYPES, b'{"delta":{"text":"Hi"}}')
    message, size = es.decode_message(data)
    assert size == len(data)
    assert message.headers == ALL_TYPES
    assert message.payload == b'{"delta":{"text":"Hi"}}'


def test_botocore_decodes_what_the_encoder_writes() -> None:
    payload = b'{"contentBlockIndex":0,"delta":{"text":"Hello"}}'
    data = es.encode_message(ALL_TYPES, payload) + es.event_message("metadata", b"{}")
    (headers, got), (last, empty) = botocore_messages(data)
    assert got == payload and empty == b"{}"
    assert headers == {
        ":event-type": "contentBlockDelta",
        "yes": True,
        "no": False,
        "byte": -7,
        "short": 31000,
        "int": -2_000_000_000,
        "long": 2**40 + 3,
        "bytes": b"\x00\xffraw",
        "when": 1_700_000_000_123,
        "id": uuid.UUID("0123456789abcdef0123456789abcdef").bytes,
    }
    assert last == {
        ":event-type": "metadata",
        ":content-type": "application/json",
        ":message-type": "event",
    }


def test_the_layout_is_prelude_headers_payload_crc() -> None:
    data = es.event_message("messageStart", b'{"role":"assistant"}')
    total, head, prelude_crc = struct.unpack_from(">III", data)
    assert total == len(data)
    assert prelude_crc == zlib.crc32(data[:8])
    assert data[12 : 12 + head].startswith(b"\x0b:event-type\x07\x00\x0cmessageStart")
    assert data[12 + head : -4] == b'{"role":"assistant"}'
    assert struct.unpack(">I", data[-4:])[0] == zlib.crc32(data[:-4])


def test_an_exception_message_names_its_exception_type() -> None:
    data = es.event_message("throttlingException", b'{"message":"slow"}', message_type="exception")
    ((headers, _),) = botocore_messages(data)
    assert headers[":exception-type"] == "throttlingException"
    assert headers[":message-type"] == "exception"
    assert ":event-type" not in headers


def test_a_corrupted_frame_fails_the_message_checksum_in_both_decoders() -> None:
    frame = es.event_message("contentBlockDelta", b'{"delta":{"text":"x"}}')
    bad = es.corrupt(frame)
    assert len(bad) == len(frame) and bad[:-4] == frame[:-4]
    with pytest.raises(EventStreamError, match="message checksum mismatch"):
        es.decode_message(bad)
    with pytest.raises(ChecksumMismatch):
        botocore_messages(bad)


@pytest.mark.parametrize("at", [0, 5, 9, 13, 30])
def test_a_flipped_bit_anywhere_is_detected(at: int) -> None:
    frame = bytearray(es.event_message("messageStop", b'{"stopReason":"end_turn"}'))
    frame[at] ^= 0x10
    with pytest.raises(EventStreamError, match=r"checksum|length"):
        es.decode_message(bytes(frame))


def test_short_and_oversized_messages_are_refused() -> None:
    frame = es.event_message("messageStop", b"{}")
    with pytest.raises(EventStreamError, match="cut off"):
        es.decode_message(frame[:-1])
    with pytest.raises(EventStreamError, match="prelude"):
        es.decode_message(frame[:8])
    lengths = struct.pack(">II", 16, es.MAX_HEADERS_LENGTH + 1)
    bad = lengths + struct.pack(">I", zlib.crc32(lengths)) + b"\x00" * 4
    with pytest.raises(EventStreamError, match="headers length"):
        es.decode_message(bad)
    with pytest.raises(EventStreamError, match=r"a byte is left|prelude"):
        es.decode_all(frame + b"\x00")


def test_the_text_form_round_trips_every_header_type() -> None:
    message = es.Message(ALL_TYPES, '{"text":"é\\n\\nstill the payload"}'.encode())
    text = es.message_text(message)
    assert text.startswith(":event-type: contentBlockDelta\nyes;bool: true\nno;bool: false\n")
    assert "bytes;bytes: AP9yYXc=\n" in text
    assert es.text_message(text) == message
    empty = es.Message((), b"\n\nno headers")
    assert es.text_message(es.message_text(empty)) == empty


def test_text_that_is_not_a_frame_is_refused() -> None:
    for text in ("no blank line", "bad line\n\n{}", "x;int: many\n\n{}", "x;nope: 1\n\n{}"):
        with pytest.raises(EventStreamError):
            es.text_message(text)
    with pytest.raises(EventStreamError, match="UTF-8"):
        es.message_text(es.Message((), b"\xff"))


def test_the_splitter_cuts_messages_as_bytes_arrive() -> None:
    frames = [es.event_message(f"e{i}", b'{"i":%d}' % i) for i in range(3)]
    data = b"".join(frames)
    splitter = es.MessageSplitter(0.0)
    completed = [splitter.feed(data[i : i + 7], float(i)) for i in range(0, len(data), 7)]
    splitter.finish()
    assert sum(completed) == 3
    assert [f for f, _ in splitter.frames] == frames


def test_bytes_after_the_last_message_join_it_and_garbage_stops_the_split() -> None:
    frame = es.event_message("messageStop", b"{}")
    splitter = es.MessageSplitter(0.0)
    assert splitter.feed(frame + b"\x00\x00\x00\x01" + b"x" * 20, 1.0) == 1
    splitter.finish()
    assert b"".join(f for f, _ in splitter.frames) == frame + b"\x00\x00\x00\x01" + b"x" * 20
    counting = es.MessageSplitter(0.0, keep=False)
    assert counting.feed(frame * 2, 1.0) == 2 and counting.frames == []
