"""The AWS event-stream codec (``application/vnd.amazon.eventstream``). Pure.

Theory of operation
-------------------
Bedrock's ``converse-stream`` answers with a binary stream of *messages*. Each is::

    prelude:  total length (uint32) | headers length (uint32) | prelude CRC32 (uint32)
    headers:  per header: name length (uint8) | name | type (uint8) | value
    payload:  bytes (JSON for Bedrock)
    message CRC32 (uint32, over everything before it)

all big-endian, the CRCs zlib's CRC32 (the message CRC continues from the prelude's,
as botocore checks it). A header's value is typed: true/false (no value), byte, short,
int, long, bytes (uint16 length), string (uint16 length, UTF-8), timestamp (int64 ms)
or uuid (16 bytes). A message's ``:message-type`` header says what it is: ``event``
(``:event-type`` names it), ``exception`` (``:exception-type`` names a modelled error) or
``error`` (``:error-code``, ``:error-message``).

`encode_message` and `decode_message` are exact inverses on bytes. A recording stores
a frame as text, so `message_text` and `text_message` are a second pair of inverses:
one header a line (``name: value`` for a string, ``name;TYPE: value`` for any other
type, bytes in base64), a blank line, the payload as UTF-8. The CRCs are not stored:
encoding computes them, so a recorded frame replays byte for byte.

`MessageSplitter` cuts the bytes of a stream into messages as they arrive, by the
prelude's total length (the recorder's `FrameSplitting`); `corrupt` gives a message
with a wrong message CRC (what a checksum fault sends). Malformed bytes raise
`EventStreamError` (a `ValueError`).
"""

from __future__ import annotations

import base64
import struct
import uuid
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from chaosllm.errors import EventStreamError
from chaosllm.providers.sse import FrameSplitter

__all__ = [
    "CONTENT_TYPE",
    "MAX_HEADERS_LENGTH",
    "MAX_PAYLOAD_LENGTH",
    "Header",
    "Message",
    "MessageSplitter",
    "corrupt",
    "decode_all",
    "decode_message",
    "encode_message",
    "event_message",
    "iter_messages",
    "message_text",
    "text_message",
]

CONTENT_TYPE: Final = "application/vnd.amazon.eventstream"
PRELUDE_LENGTH: Final = 12
MAX_HEADERS_LENGTH: Final = 128 * 1024
MAX_PAYLOAD_LENGTH: Final = 24 * 1024 * 1024
"""botocore's limits (it refuses a message beyond them)."""
_MIN_LENGTH: Final = PRELUDE_LENGTH + 4
_MAX_MESSAGE: Final = _MIN_LENGTH + MAX_HEADERS_LENGTH + MAX_PAYLOAD_LENGTH

HeaderValue = bool | int | bytes | str | uuid.UUID

# type code -> the name a frame's text gives it (strings have none: ``name: value``)
_TYPE_NAMES: Final = {
    0: "bool",
    1: "bool",
    2: "byte",
    3: "short",
    4: "int",
    5: "long",
    6: "bytes",
    7: "string",
    8: "timestamp",
    9: "uuid",
}
_TYPE_CODES: Final = {"byte": 2, "short": 3, "int": 4, "long": 5, "bytes": 6, "timestamp": 8}
_INTS: Final = {2: ">b", 3: ">h", 4: ">i", 5: ">q", 8: ">q"}


@dataclass(frozen=True, slots=True)
class Header:
    """One typed header: `kind` is its type code (0-9; 0/1 the booleans)."""

    name: str
    value: HeaderValue
    kind: int = 7

    def encode(self) -> bytes:
        name = self.name.encode("utf-8")
        if not 0 < len(name) < 256:
            raise EventStreamError(f"header name {self.name!r} must be 1 to 255 bytes")
        head = bytes((len(name),)) + name
        kind, value = self.kind, self.value
        if kind in (0, 1):
            return head + bytes((0 if value else 1,))
        if kind in _INTS:
            if not isinstance(value, int):
                raise EventStreamError(f"header {self.name!r}: {value!r} is not an integer")
            try:
                return head + bytes((kind,)) + struct.pack(_INTS[kind], value)
            except struct.error as exc:
                raise EventStreamError(f"header {self.name!r}: {exc}") from None
        if kind == 9:
            if not isinstance(value, uuid.UUID):
                raise EventStreamError(f"header {self.name!r}: {value!r} is not a UUID")
            return head + b"\x09" + value.bytes
        if kind in (6, 7):
            data = value.encode("utf-8") if isinstance(value, str) else value
            if not isinstance(data, bytes) or len(data) > 0xFFFF:
                raise EventStreamError(f"header {self.name!r}: a value of at most 65535 bytes")
            return head + bytes((kind,)) + struct.pack(">H", len(data)) + data
        raise EventStreamError(f"header {self.name!r}: unknown header type {kind}")


@dataclass(frozen=True, slots=True)
class Message:
    """One event-stream message: its headers in order, and its payload."""

    headers: tuple[Header, ...]
    payload: bytes

    def header(self, name: str) -> HeaderValue | None:
        for header in self.headers:
            if header.name == name:
                return header.value
        return None

    @property
    def message_type(self) -> str | None:
        value = self.header(":message-type")
        return value if isinstance(value, str) else None

    @property
    def kind(self) -> str | None:
        """What the message is: its ``:event-type`` (an event), its ``:exception-type``
        (an exception) or its ``:error-code`` (an error)."""
        for name in (":event-type", ":exception-type", ":error-code"):
            value = self.header(name)
            if isinstance(value, str):
                return value
        return None


def encode_message(headers: Sequence[Header], payload: bytes) -> bytes:
    """A message's bytes on the wire, both CRCs computed."""
    head = b"".join(h.encode() for h in headers)
    if len(head) > MAX_HEADERS_LENGTH:
        raise EventStreamError(f"headers of {len(head)} bytes exceed {MAX_HEADERS_LENGTH}")
    if len(payload) > MAX_PAYLOAD_LENGTH:
        raise EventStreamError(f"a payload of {len(payload)} bytes exceeds {MAX_PAYLOAD_LENGTH}")
    total = _MIN_LENGTH + len(head) + len(payload)
    lengths = struct.pack(">II", total, len(head))
    prelude_crc = zlib.crc32(lengths)
    body = lengths + struct.pack(">I", prelude_crc) + head + payload
    return body + struct.pack(">I", zlib.crc32(body[8:], prelude_crc))


def event_message(event_type: str, payload: bytes, *, message_type: str = "event") -> bytes:
    """A message as Bedrock sends one: ``:event-type`` (or ``:exception-type``),
    ``:content-type: application/json``, ``:message-type``, then the payload."""
    name = ":exception-type" if message_type == "exception" else ":event-type"
    headers = (
        Header(name, event_type),
        Header(":content-type", "application/json"),
        Header(":message-type", message_type),
    )
    return encode_message(headers, payload)


def _prelude(data: bytes | bytearray, at: int = 0) -> tuple[int, int]:
    """(total length, headers length) of the message at `at`, its prelude checked."""
    total, head, crc = struct.unpack_from(">III", data, at)
    computed = zlib.crc32(bytes(data[at : at + 8]))
    if crc != computed:
        raise EventStreamError(
            f"prelude checksum mismatch: expected {crc:#010x}, computed {computed:#010x}"
        )
    if head > MAX_HEADERS_LENGTH:
        raise EventStreamError(f"a headers length of {head} exceeds {MAX_HEADERS_LENGTH}")
    if total < _MIN_LENGTH + head or total - head - _MIN_LENGTH > MAX_PAYLOAD_LENGTH:
        raise EventStreamError(f"a total length of {total} with {head} bytes of headers")
    return total, head


def _headers(data: bytes) -> tuple[Header, ...]:
    headers: list[Header] = []
    at, end = 0, len(data)
    try:
        while at < end:
            size = data[at]
            name = data[at + 1 : at + 1 + size].decode("utf-8")
            at += 1 + size
            kind = data[at]
            at += 1
            value: HeaderValue
            if kind in (0, 1):
                value = kind == 0
            elif kind in _INTS:
                fmt = _INTS[kind]
                (value,) = struct.unpack_from(fmt, data, at)
                at += struct.calcsize(fmt)
            elif kind in (6, 7):
                (length,) = struct.unpack_from(">H", data, at)
                raw = data[at + 2 : at + 2 + length]
                if len(raw) != length:
                    raise EventStreamError(f"header {name!r} runs past the headers")
                value = raw.decode("utf-8") if kind == 7 else raw
                at += 2 + length
            elif kind == 9:
                raw = data[at : at + 16]
                if len(raw) != 16:
                    raise EventStreamError(f"header {name!r} runs past the headers")
                value = uuid.UUID(bytes=raw)
                at += 16
            else:
                raise EventStreamError(f"header {name!r} has an unknown type {kind}")
            if any(h.name == name for h in headers):
                raise EventStreamError(f"header {name!r} appears twice")
            headers.append(Header(name, value, kind))
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise EventStreamError(f"headers that do not parse: {exc}") from None
    return tuple(headers)


def decode_message(data: bytes, at: int = 0) -> tuple[Message, int]:
    """The message starting at offset `at` of `data` and its length; `EventStreamError`
    for one that is cut short, out of range or fails a checksum."""
    if len(data) - at < PRELUDE_LENGTH:
        raise EventStreamError(f"{len(data) - at} bytes are not a message prelude")
    total, head = _prelude(data, at)
    if len(data) - at < total:
        raise EventStreamError(f"a message of {total} bytes cut off at {len(data) - at}")
    end = at + total
    (crc,) = struct.unpack_from(">I", data, end - 4)
    computed = zlib.crc32(data[at : end - 4])
    if crc != computed:
        raise EventStreamError(
            f"message checksum mismatch: expected {crc:#010x}, computed {computed:#010x}"
        )
    headers = _headers(data[at + PRELUDE_LENGTH : at + PRELUDE_LENGTH + head])
    return Message(headers, data[at + PRELUDE_LENGTH + head : end - 4]), total


def decode_all(data: bytes) -> list[Message]:
    """Every message of a whole stream (`EventStreamError` if a byte is left over)."""
    messages: list[Message] = []
    at = 0
    while at < len(data):
        message, size = decode_message(data, at)
        messages.append(message)
        at += size
    return messages


def corrupt(frame: bytes) -> bytes:
    """A message with its message CRC wrong (the prelude and all else intact): what a
    decoder must refuse with a checksum error."""
    if len(frame) < _MIN_LENGTH:
        raise EventStreamError(f"{len(frame)} bytes are not a message")
    (crc,) = struct.unpack_from(">I", frame, len(frame) - 4)
    return frame[:-4] + struct.pack(">I", crc ^ 0xFFFFFFFF)


# -- frame text (what a recording stores) -----------------------------------------------


def _value_text(header: Header) -> str:
    value = header.value
    if header.kind in (0, 1):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, uuid.UUID):
        return value.hex
    return str(value)


def message_text(message: Message) -> str:
    """A message as text: a header a line, a blank line, the payload (UTF-8)."""
    lines = []
    for header in message.headers:
        if "\n" in header.name or ": " in header.name or ";" in header.name:
            raise EventStreamError(f"header name {header.name!r} has no text form")
        text = _value_text(header)
        if "\n" in text:
            raise EventStreamError(f"header {header.name!r}: a value with a newline")
        suffix = "" if header.kind == 7 else ";" + _TYPE_NAMES[header.kind]
        lines.append(f"{header.name}{suffix}: {text}\n")
    try:
        payload = message.payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EventStreamError(f"a payload that is not UTF-8: {exc}") from None
    return "".join(lines) + "\n" + payload


def _header_of(line: str) -> Header:
    name, sep, text = line.partition(": ")
    if not sep:
        raise EventStreamError(f"header line {line!r} has no ': '")
    base, _, type_name = name.partition(";")
    if not type_name or type_name == "string":
        return Header(name if not type_name else base, text)
    try:
        if type_name == "bool":
            if text not in ("true", "false"):
                raise ValueError(text)
            return Header(base, text == "true", 0 if text == "true" else 1)
        if type_name == "uuid":
            return Header(base, uuid.UUID(hex=text), 9)
        kind = _TYPE_CODES[type_name]
        if kind == 6:
            return Header(base, base64.b64decode(text, validate=True), 6)
        return Header(base, int(text), kind)
    except (KeyError, ValueError) as exc:
        raise EventStreamError(f"header line {line!r}: {exc}") from None


def text_message(text: str) -> Message:
    """The inverse of `message_text`."""
    if text.startswith("\n"):
        head, payload = "", text[1:]
    else:
        head, sep, payload = text.partition("\n\n")
        if not sep:
            raise EventStreamError("a frame text needs a blank line after its headers")
    lines = head.split("\n") if head else []
    return Message(tuple(_header_of(line) for line in lines), payload.encode("utf-8"))


def iter_messages(texts: Sequence[str]) -> Iterator[Message]:
    """The messages of frame texts."""
    for text in texts:
        yield text_message(text)


# -- bytes as they arrive ---------------------------------------------------------------


class MessageSplitter(FrameSplitter):
    """Splits an event-stream body into messages as its bytes arrive (each timed by the
    arrival of the bytes that completed it): a `FrameSplitting`. Bytes that cannot start
    a message (a length out of range) stay unsplit and join the last frame at the end
    (`FrameSplitter.finish`, shared with SSE)."""

    __slots__ = ("_broken",)

    def __init__(self, start: float, *, keep: bool = True, max_frame: int = _MAX_MESSAGE) -> None:
        super().__init__(start, keep=keep, max_frame=max_frame)
        self._broken = False

    def feed(self, data: bytes, now: float) -> int:
        buffer = self._buffer
        buffer += data
        cut = count = 0
        while not self._broken and len(buffer) - cut >= PRELUDE_LENGTH:
            total, head = struct.unpack_from(">II", buffer, cut)
            payload = total - head - _MIN_LENGTH
            if payload < 0 or head > MAX_HEADERS_LENGTH or payload > MAX_PAYLOAD_LENGTH:
                self._broken = True
                break
            if len(buffer) - cut < total:
                break
            if self.keep:
                self.frames.append((bytes(buffer[cut : cut + total]), (now - self._last) * 1e3))
            self._last = now
            count += 1
            cut += total
        if cut:
            del buffer[:cut]
        if self._broken:
            self.overflow = "bytes after a broken message prelude"
        return count + self._bound(now)
