"""The sans-IO WebSocket core (`chaosllm.wire.websocket`) in memory, against wsproto's
client side: the handshake answer, ping/pong, fragments, the 1009 bound, protocol
errors, the close handshake, permessage-deflate."""

from __future__ import annotations

import base64
import hashlib

import pytest
from wsproto.connection import Connection, ConnectionType
from wsproto.events import CloseConnection, Message, Ping, Pong, TextMessage
from wsproto.extensions import PerMessageDeflate

from chaosllm.wire.upgrade import check_upgrade, is_upgrade
from chaosllm.wire.websocket import WebSocketCore

pytestmark = pytest.mark.timeout(30)

KEY = base64.b64encode(b"0123456789abcdef")


def upgrade_headers(**extra: bytes) -> list[tuple[bytes, bytes]]:
    headers = [
        (b"host", b"127.0.0.1"),
        (b"upgrade", b"websocket"),
        (b"connection", b"Upgrade"),
        (b"sec-websocket-key", KEY),
        (b"sec-websocket-version", b"13"),
    ]
    return headers + [(k.replace("_", "-").encode(), v) for k, v in extra.items()]


def opened(**extra: bytes) -> tuple[WebSocketCore, Connection, bytes]:
    core = WebSocketCore(upgrade_headers(**extra), max_message_bytes=1000)
    head = core.accept({"type": "websocket.accept"})
    extensions = []
    for line in head.split(b"\r\n"):
        if line.startswith(b"Sec-WebSocket-Extensions: "):
            pmd = PerMessageDeflate()
            pmd.finalize(line.split(b": ", 1)[1].decode())  # as the client's handshake does
            extensions.append(pmd)
    client = Connection(ConnectionType.CLIENT, extensions=list(extensions))
    return core, client, head


def events_of(client: Connection, data: bytes) -> list[object]:
    client.receive_data(data)
    return list(client.events())


def test_an_upgrade_request_is_recognised_and_checked() -> None:
    headers = upgrade_headers()
    assert is_upgrade(b"GET", headers)
    assert not is_upgrade(b"POST", headers)
    assert check_upgrade(headers) is None
    bad_version = [(k, b"8" if k == b"sec-websocket-version" else v) for k, v in headers]
    assert check_upgrade(bad_version) == (426, "Unsupported Sec-WebSocket-Version '8': use 13")
    no_key = [(k, v) for k, v in headers if k != b"sec-websocket-key"]
    assert check_upgrade(no_key) is not None and check_upgrade(no_key)[0] == 400  # type: ignore[index]


def test_accept_answers_with_the_rfc_token() -> None:
    _, _, head = opened()
    token = base64.b64encode(hashlib.sha1(KEY + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    assert head.startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
    assert b"Sec-WebSocket-Accept: " + token + b"\r\n" in head
    assert b"permessage-deflate" not in head


def test_a_ping_is_answered_unless_the_session_stalls() -> None:
    core, client, _ = opened()
    reply = core.feed(client.send(Ping(b"hi")))
    assert [type(e) for e in events_of(client, reply)] == [Pong]
    core.stalled = True
    assert core.feed(client.send(Ping(b"again"))) == b""


def test_fragments_make_one_message() -> None:
    core, client, _ = opened()
    data = client.send(Message(data="hel", message_finished=False))
    data += client.send(Message(data="lo", message_finished=True))
    assert core.feed(data) == b""
    assert list(core.inbox) == [{"type": "websocket.receive", "text": "hello"}]


def test_a_message_over_the_limit_closes_with_1009() -> None:
    core, client, _ = opened()
    reply = b"".join(
        core.feed(client.send(Message(data="x" * 400, message_finished=False))) for _ in range(3)
    )
    [close] = events_of(client, reply)
    assert isinstance(close, CloseConnection) and close.code == 1009
    assert core.inbox[-1] == {"type": "websocket.disconnect", "code": 1009}


def test_invalid_utf8_closes_with_1007() -> None:
    core, client, _ = opened()
    frame = bytes([0x81, 0x82, 0, 0, 0, 0, 0xC3, 0x28])  # masked text frame, bad UTF-8
    [close] = events_of(client, core.feed(frame))
    assert isinstance(close, CloseConnection) and close.code == 1007


def test_the_clients_close_is_echoed_and_reported() -> None:
    core, client, _ = opened()
    reply = core.feed(client.send(CloseConnection(code=1000, reason="bye")))
    [close] = events_of(client, reply)
    assert isinstance(close, CloseConnection) and close.code == 1000
    assert core.inbox[-1] == {"type": "websocket.disconnect", "code": 1000}


def test_a_server_close_carries_code_and_a_bounded_reason() -> None:
    core, client, _ = opened()
    [close] = events_of(client, core.close(4000, "r" * 200))
    assert isinstance(close, CloseConnection)
    assert close.code == 4000 and close.reason == "r" * 123
    assert core.close(1000) == b""  # once


def test_permessage_deflate_is_negotiated_and_inflated() -> None:
    core, client, head = opened(
        sec_websocket_extensions=b"permessage-deflate; client_max_window_bits"
    )
    assert b"Sec-WebSocket-Extensions: permessage-deflate" in head
    data = client.send(Message(data="a" * 900))
    assert len(data) < 100  # compressed on the wire
    core.feed(data)
    assert core.inbox[-1] == {"type": "websocket.receive", "text": "a" * 900}
    [echo] = events_of(client, core.send({"type": "websocket.send", "text": "b" * 500}))
    assert isinstance(echo, TextMessage) and echo.data == "b" * 500


def test_a_deflated_message_is_bounded_as_it_inflates() -> None:
    core, client, _ = opened(sec_websocket_extensions=b"permessage-deflate")
    [close] = events_of(client, core.feed(client.send(Message(data="z" * 50_000))))
    assert isinstance(close, CloseConnection) and close.code == 1009
