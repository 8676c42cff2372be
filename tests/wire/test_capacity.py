"""No client locks others out of the builtin server, on real sockets and at scale: 1,200
idle keep-alive connections and 1,000 stalled clients leave health, control and a replay
answering within a second; at a lower ``max_connections`` the oldest idle connections
make room and the control plane still answers. ``--host ::`` is dual-stack."""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import time
from collections.abc import Iterator

import pytest

from chaosllm import ChaosServer
from chaosllm.server import ServerKind
from tests.helpers import read_head, read_response, request_body

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

NAME = "knowledge/0004"
SOCKET_TIMEOUT = 10.0
IDLE = 1200
STALLED = 1000
ANSWER_WITHIN = 5.0
"""An answer, not a wait behind the stalls (60 s each): generous for a loaded 2-core CI
machine (alone, a control-plane answer here takes about 15 ms)."""


@pytest.fixture
def many_files() -> Iterator[None]:
    """Room for the sockets of both ends in this one process (the server raises its own
    limit; the test's client sockets count too)."""
    if sys.platform == "win32":  # pragma: no cover
        pytest.skip("no RLIMIT_NOFILE")
    import resource

    needed = 2 * (IDLE + STALLED) + 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"the open-file hard limit ({hard}) is below {needed}")
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    try:
        yield
    finally:
        _, now_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1024), now_hard))


def connect(server: ChaosServer) -> socket.socket:
    assert server.port is not None
    return socket.create_connection(("127.0.0.1", server.port), timeout=SOCKET_TIMEOUT)


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


def post(session: str | None = None) -> bytes:
    body = json.dumps(request_body(NAME, stream=False)).encode()
    extra = f"X-Chaosllm-Session: {session}\r\n" if session else ""
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


def timed(server: ChaosServer, request: bytes) -> tuple[float, int, bytes, bytes]:
    """A request on a fresh connection: seconds until its whole answer, status, head, body."""
    started = time.monotonic()
    with connect(server) as sock:
        sock.sendall(request)
        status, head, body = read_response(sock)
    return time.monotonic() - started, status, head, body


def closed(sock: socket.socket) -> bool:
    """The server closed `sock` (without waiting)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    finally:
        sock.setblocking(True)
        sock.settimeout(SOCKET_TIMEOUT)


@contextlib.contextmanager
def sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    try:
        yield opened
    finally:
        for sock in opened:
            sock.close()


def open_idle(server: ChaosServer, opened: list[socket.socket], count: int) -> list[socket.socket]:
    """`count` keep-alive connections that made one request each and went idle, in order
    (a connection that has not sent anything yet counts as idle too)."""
    idle: list[socket.socket] = []
    for _ in range(count):
        sock = connect(server)
        opened.append(sock)
        idle.append(sock)
        sock.sendall(get("/health"))
        assert read_response(sock)[0] == 200
    return idle


def open_stalled(
    server: ChaosServer, opened: list[socket.socket], count: int
) -> list[socket.socket]:
    """`count` clients whose replay stalls after its head."""
    server.arm(
        {"type": "stall", "max_ms": 60_000, "remaining": count, "match": {"session": "stalled"}}
    )
    stalled = [connect(server) for _ in range(count)]
    opened += stalled
    for sock in stalled:
        sock.sendall(post("stalled"))
    for sock in stalled:
        assert read_head(sock)[0] == 200
    return stalled


def assert_answering(server: ChaosServer, *, replay_status: int = 200) -> None:
    for path in ("/health", "/__fault"):
        elapsed, status, _, _ = timed(server, get(path))
        assert status == 200, path
        assert elapsed < ANSWER_WITHIN, (path, elapsed)
    elapsed, status, head, _ = timed(server, post())
    assert status == replay_status
    assert elapsed < ANSWER_WITHIN, ("replay", elapsed)
    if replay_status == 200:
        assert b"x-chaosllm-match: exact" in head.lower()


@pytest.mark.parametrize("kind", [ServerKind.BUILTIN, ServerKind.H11])
def test_1200_idle_and_1000_stalled_clients_leave_the_server_answering(
    many_files: None, kind: ServerKind
) -> None:
    with ChaosServer(server=kind) as server, sockets() as opened:
        idle = open_idle(server, opened, IDLE)
        open_stalled(server, opened, STALLED)
        assert_answering(server)
        # The idle connections are still good.
        for sock in (idle[0], idle[-1]):
            sock.sendall(get("/health"))
            assert read_response(sock)[0] == 200


def test_when_full_the_oldest_idle_connections_make_room(many_files: None) -> None:
    with ChaosServer(max_connections=1000) as server, sockets() as opened:
        idle = open_idle(server, opened, IDLE)
        time.sleep(0.3)
        gone = [closed(sock) for sock in idle]
        assert sum(gone) == IDLE - 1000
        assert not any(gone[-800:])  # the newest are kept
        assert_answering(server)


def test_a_server_full_of_stalled_clients_answers_its_control_plane(many_files: None) -> None:
    with ChaosServer(max_connections=STALLED) as server, sockets() as opened:
        open_stalled(server, opened, STALLED)
        # Nothing idle to close: health and control answer anyway (then close), and a
        # provider request is turned away at once instead of waiting for a stall to end.
        assert_answering(server, replay_status=503)
        elapsed, status, head, body = timed(server, post())
        assert json.loads(body)["error"]["code"] == "server_busy"
        assert b"connection: close" in head.lower()
        elapsed, status, _, body = timed(server, get("/__fault"))
        assert status == 200 and elapsed < ANSWER_WITHIN


def _has_ipv6() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _has_ipv6(), reason="no IPv6 loopback")
@pytest.mark.parametrize("kind", [ServerKind.BUILTIN, ServerKind.H11])
def test_host_wildcard_v6_is_dual_stack(kind: ServerKind) -> None:
    with ChaosServer(host="::", server=kind) as server:
        assert server.port is not None
        for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.settimeout(SOCKET_TIMEOUT)
                sock.connect((address, server.port))
                host = f"[{address}]" if ":" in address else address
                # The control plane sees 127.0.0.1 as the loopback client it is.
                sock.sendall(
                    f"GET /__fault HTTP/1.1\r\nHost: {host}:{server.port}\r\n\r\n".encode()
                )
                status, _, body = read_response(sock)
                assert status == 200, body
                assert json.loads(body)["armed"] == []
