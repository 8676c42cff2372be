"""A WebSocket upgrade request, read off its headers (no WebSocket library needed: the
HTTP reader asks this of every upgrade request, and only a session loads wsproto,
`chaosllm.wire.websocket`), and the ASGI names of chaosllm's own WebSocket messages."""

from __future__ import annotations

import base64
from typing import Final

from chaosllm.wire.head import tokens

__all__ = ["DROP", "STALL", "WS_EXTENSION", "check_upgrade", "is_upgrade", "subprotocols"]

WS_EXTENSION: Final = "chaosllm.websocket"
"""The scope extension of chaosllm's servers: the app may send `DROP` and `STALL`."""
DROP: Final = "chaosllm.websocket.drop"
"""ASGI message type: end the TCP connection now, without a close frame."""
STALL: Final = "chaosllm.websocket.stall"
"""ASGI message type: stop answering pings (the app sends nothing more either)."""


def is_upgrade(method: bytes | str, headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a request asks for a WebSocket (``Upgrade: websocket``)."""
    if method not in (b"GET", "GET"):
        return False
    return any(name == b"upgrade" and b"websocket" in tokens(value) for name, value in headers)


def check_upgrade(headers: list[tuple[bytes, bytes]]) -> tuple[int, str] | None:
    """What is wrong with a WebSocket upgrade request (status, message), or None."""
    found = {name: value for name, value in headers}
    if b"upgrade" not in tokens(found.get(b"connection", b"")):
        return 400, "A WebSocket upgrade needs 'Connection: Upgrade'"
    version = found.get(b"sec-websocket-version", b"").strip()
    if version != b"13":
        return 426, f"Unsupported Sec-WebSocket-Version {version.decode('latin-1')!r}: use 13"
    key = found.get(b"sec-websocket-key", b"").strip()
    try:
        ok = len(base64.b64decode(key, validate=True)) == 16
    except ValueError:
        ok = False
    if not ok:
        return 400, "A WebSocket upgrade needs a Sec-WebSocket-Key of 16 bytes in base64"
    return None


def subprotocols(headers: list[tuple[bytes, bytes]]) -> list[str]:
    """The subprotocols the client offers, in its order (the ASGI scope's)."""
    return [
        token.decode("latin-1")
        for name, value in headers
        if name == b"sec-websocket-protocol"
        for token in tokens(value)
    ]
