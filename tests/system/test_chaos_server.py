"""`ChaosServer`: the Python API the pytest plugin and users build on."""

from __future__ import annotations

import logging

import httpx
import openai
import pytest

from chaosllm import ChaosServer, InvalidFaultSpec, ServerError
from chaosllm.http.direct import DirectFront
from tests.helpers import recording, request_body


def test_urls_and_lifecycle() -> None:
    server = ChaosServer()
    with pytest.raises(ServerError, match="not started"):
        _ = server.url
    with server:
        assert server.url.startswith("http://127.0.0.1:")
        assert server.base_url == server.url + "/v1"
        with pytest.raises(ServerError, match="already started"):
            server.start()
        assert httpx.get(server.url + "/health", timeout=5).status_code == 200
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/health", timeout=5)


def test_arm_forms_and_validation() -> None:
    with ChaosServer() as server:
        assert server.arm("http_503", remaining=2) == ["flt_1"]
        assert server.arm({"type": "latency", "delay_ms": 1}) == ["flt_2"]
        assert server.arm([{"type": "stall"}, {"type": "garbage"}]) == ["flt_3", "flt_4"]
        with pytest.raises(InvalidFaultSpec, match="unknown fault type"):
            server.arm([{"type": "http_503"}, {"type": "bogus"}])
        assert len(server.faults()["armed"]) == 4  # nothing half-armed
        assert server.disarm("flt_1") == 1
        assert server.disarm() == 3
        assert server.arm_profile("rate-limit-burst") == ["flt_5"]
        server.reset()
        assert server.faults() == {"armed": [], "fired": []}


def test_requests_journal_and_reset() -> None:
    with ChaosServer() as server:
        with openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0) as client:
            client.chat.completions.create(**request_body("simple-chat/0001", stream=False))
        [entry] = server.requests()
        assert entry["recording"] == "simple-chat/0001" and entry["match"] == "exact"
        assert entry["status"] == 200 and entry["outcome"] == "complete"
        server.reset()
        assert server.requests() == []


def test_profile_argument_and_invalid_mode() -> None:
    with ChaosServer(profile="outage-recovers") as server:
        assert [f["type"] for f in server.faults()["armed"]] == [
            "http_503",
            "http_error",
            "empty_reply",
        ]
    with pytest.raises(ServerError, match="needs --upstream URL"):
        ChaosServer(mode="record")


def test_uvicorn_server_replays_and_degrades_socket_faults(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with (
        ChaosServer(server="uvicorn") as server,
        openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0, timeout=5) as client,
    ):
        # Provider requests take the builtin server's hot path in front of the app.
        assert isinstance(server._uvicorn.config.app, DirectFront)
        completion = client.chat.completions.create(
            **request_body("simple-chat/0001", stream=False)
        )
        assert (
            completion.model_dump(exclude_unset=True)["id"]
            == recording("simple-chat/0001")["response"]["body"]["id"]
        )
        server.arm("connection_reset", after_chunks=2)
        with (
            caplog.at_level(logging.WARNING, logger="chaosllm.wire"),
            pytest.raises(openai.APIConnectionError),
            client.chat.completions.create(
                **request_body("long-answer/0001", stream=True)
            ) as stream,
        ):
            list(stream)
        entry = server.requests()[-1]
        assert entry["fault"]["type"] == "connection_reset"
        assert entry["degraded"]
        assert any("degraded" in r.getMessage() for r in caplog.records)


def test_prebound_sockets_say_tcp_so_asyncio_sets_nodelay() -> None:
    """asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP; without it,
    uvicorn on the asyncio loop answered every request ~40 ms late (delayed ACK)."""
    import socket

    from chaosllm.server import _bind

    sock = _bind("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()
