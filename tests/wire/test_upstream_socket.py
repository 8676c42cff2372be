"""The record proxy's upstream WebSocket (`chaosllm.record.ws_client.UpstreamSocket`), its
protocol states driven in memory: a close is echoed only when the upstream began it. When
chaosllm began it (its client left) the upstream's close is the echo, and answering it
again raised wsproto's LocalProtocolError in the task relaying the upstream, so the
session's recording was never written."""

from __future__ import annotations

import anyio
import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import AcceptConnection, CloseConnection, Request, TextMessage

from chaosllm.record.ws_client import UpstreamSocket

pytestmark = pytest.mark.timeout(30)


class _Wire:
    """A byte stream whose reads are what the test queued, and whose writes it keeps."""

    def __init__(self) -> None:
        self.incoming: list[bytes] = []
        self.sent: list[bytes] = []

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self.incoming:
            raise anyio.EndOfStream
        return self.incoming.pop(0)

    async def send(self, item: bytes) -> None:
        self.sent.append(item)

    async def aclose(self) -> None:
        pass


def _connected() -> tuple[UpstreamSocket, WSConnection, _Wire]:
    client, server = WSConnection(ConnectionType.CLIENT), WSConnection(ConnectionType.SERVER)
    server.receive_data(client.send(Request(host="upstream", target="/v1/realtime")))
    [request] = list(server.events())
    assert isinstance(request, Request)
    client.receive_data(server.send(AcceptConnection()))
    assert [type(e) for e in client.events()] == [AcceptConnection]
    wire = _Wire()
    return UpstreamSocket(wire, client), server, wire  # type: ignore[arg-type]


def test_the_upstreams_echo_of_chaosllms_close_ends_the_relay_quietly() -> None:
    sock, server, wire = _connected()
    # chaosllm closes first (its client left) ...
    server.receive_data(sock.ws.send(CloseConnection(code=1000)))
    [close] = list(server.events())
    assert isinstance(close, CloseConnection)
    # ... and the relay then reads the upstream's echo
    wire.incoming.append(server.send(close.response()))
    assert anyio.run(sock.receive) is None
    assert sock.close_code == 1000
    assert sock.ws.state is ConnectionState.CLOSED
    assert wire.sent == []  # nothing answered to an echo


def test_a_close_the_upstream_begins_is_echoed() -> None:
    sock, server, wire = _connected()
    wire.incoming.append(server.send(TextMessage(data='{"type":"response.done"}')))
    wire.incoming.append(server.send(CloseConnection(code=1011, reason="bye")))
    assert anyio.run(sock.receive) == '{"type":"response.done"}'
    assert anyio.run(sock.receive) is None
    assert (sock.close_code, sock.close_reason) == (1011, "bye")
    server.receive_data(b"".join(wire.sent))
    [echo] = list(server.events())
    assert isinstance(echo, CloseConnection) and echo.code == 1011
