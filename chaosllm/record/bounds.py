"""What the proxy holds of an upstream answer, bounded: a body read whole, and a
content-encoded body decoded (streamed through ``zlib.decompressobj`` with
``max_length``, in a worker thread: a compression bomb costs at most `MAX_DECODED` bytes
and never stalls the event loop). Past a bound the answer is `UpstreamTooLarge`."""

from __future__ import annotations

import zlib
from typing import Final

from chaosllm.errors import NotRecordable, UpstreamTooLarge

__all__ = ["MAX_BODY", "MAX_DECODED", "MAX_RATIO", "decode"]

MAX_BODY: Final = 64 << 20
"""The most bytes of an upstream answer the proxy keeps (read whole, or recorded)."""
MAX_DECODED: Final = 64 << 20
"""The most bytes a content-encoded answer may decode to."""
MAX_RATIO: Final = 100
"""The most bytes one encoded byte may decode to (past the first `_RATIO_FLOOR` bytes)."""
_RATIO_FLOOR: Final = 1 << 20
_STEP: Final = 1 << 20


def decode(data: bytes, encoding: str, *, limit: int = MAX_DECODED) -> bytes:
    """`data` without its content coding (gzip, deflate; identity as it is).

    Raises `UpstreamTooLarge` for a body that decodes to more than `limit` bytes or to
    more than `MAX_RATIO` times its size, `NotRecordable` for a coding the recorder
    cannot decode, `zlib.error` for bytes that are not what they claim."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return data
    if encoding in ("gzip", "x-gzip"):
        return _inflate(data, 16 + zlib.MAX_WBITS, limit, encoding)
    if encoding == "deflate":
        try:
            return _inflate(data, zlib.MAX_WBITS, limit, encoding)
        except zlib.error:
            return _inflate(data, -zlib.MAX_WBITS, limit, encoding)
    raise NotRecordable(
        f"the upstream answered with Content-Encoding {encoding!r}, "
        f"which the recorder cannot decode"
    )


def _inflate(data: bytes, wbits: int, limit: int, encoding: str) -> bytes:
    cap = min(limit, max(_RATIO_FLOOR, MAX_RATIO * len(data)))
    inflater = zlib.decompressobj(wbits)
    out = bytearray()
    pending = data
    while True:
        piece = inflater.decompress(pending, _STEP)
        out += piece
        if len(out) > cap:
            raise UpstreamTooLarge(
                f"its {len(data)} bytes of Content-Encoding {encoding!r} decode to more "
                f"than {cap} bytes (the bound: {limit} bytes, {MAX_RATIO}x its size): "
                f"a compression bomb is not read"
            )
        pending = inflater.unconsumed_tail
        if not pending and len(piece) < _STEP:
            break
    if not inflater.eof:
        raise zlib.error("the compressed body is cut short")
    return bytes(out)
