"""The fault board is bounded (issue #23): past ``--max-faults`` arming is refused whole,
a 429 ``too_many_faults`` on the control plane (every way of arming) and `TooManyFaults`
in the Python API; disarming makes room again."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from chaosllm import ChaosServer
from chaosllm.config import ServerConfig
from chaosllm.errors import TooManyFaults
from chaosllm.faults import parse_fault_specs
from chaosllm.faults.board import FaultBoard
from chaosllm.http.app import create_app

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(ServerConfig(max_faults=3))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, client=("127.0.0.1", 5000)),
        base_url="http://127.0.0.1",
    ) as c:
        yield c


async def test_arming_past_the_bound_is_a_429_and_arms_nothing(client: httpx.AsyncClient) -> None:
    armed = await client.post("/__fault", json=[{"type": "http_503"}] * 2)
    assert armed.status_code == 201
    refused = await client.post("/__fault", json=[{"type": "http_503"}] * 2)
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["code"] == "too_many_faults"
    assert "--max-faults" in error["message"] and "none armed" in error["message"]
    assert len((await client.get("/__fault")).json()["armed"]) == 2
    assert (await client.post("/__fault/http_429")).status_code == 201
    assert (await client.post("/__fault/http_429")).status_code == 429
    assert (await client.post("/__profile", json={"profile": "flaky-provider"})).status_code == 429
    assert (await client.delete("/__fault")).status_code == 200
    assert (await client.post("/__fault/http_429")).status_code == 201


def test_the_board_and_the_python_api_raise_too_many_faults() -> None:
    board = FaultBoard(max_faults=2)
    board.arm(parse_fault_specs({"type": "http_503"}))
    with pytest.raises(TooManyFaults):
        board.arm(parse_fault_specs([{"type": "http_503"}] * 2))
    assert len(board) == 1
    with ChaosServer(max_faults=1) as server:
        server.arm("http_503")
        with pytest.raises(TooManyFaults, match="max-faults"):
            server.arm("http_429")


def test_the_default_bound_is_ten_thousand() -> None:
    assert FaultBoard().max_faults == 10_000
    assert ServerConfig().max_faults == 10_000
