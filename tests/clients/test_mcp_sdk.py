"""The official mcp SDK client against chaosllm's MCP endpoint: a session recorded through
chaosllm from a loopback server written with the SDK's own server side, replayed with
that server stopped, and the MCP faults as the SDK sees them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

mcp = pytest.importorskip("mcp")

import anyio  # noqa: E402
import httpx2  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from chaosllm.server import ChaosServer  # noqa: E402
from tests.mcp_server import serving_mcp  # noqa: E402

pytestmark = [pytest.mark.timeout(60), pytest.mark.slow]

TOKEN = "Bearer sk-mcp-secret-0123456789"


@asynccontextmanager
async def connect(url: str, *, session: str = "agent", **options: Any) -> AsyncIterator[Client]:
    """The SDK's client over streamable HTTP (the 2025-11-25 revision: sessions), sending
    an API key chaosllm must never write down."""
    headers = {"authorization": TOKEN, "x-chaosllm-session": session}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(10.0)) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode="legacy", **options) as client:
            yield client


async def agent_session(client: Client) -> dict[str, Any]:
    """What an agent does with a server: list, call (with progress), read, prompt."""
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    tools = await client.list_tools()
    result = await client.call_tool("search", {"q": "chaos"}, progress_callback=on_progress)
    resources = await client.list_resources()
    readme = await client.read_resource("doc://readme")
    prompt = await client.get_prompt("ask", {"topic": "faults"})
    return {
        "tools": [t.name for t in tools.tools],
        "result": result.structured_content,
        "is_error": result.is_error,
        "progress": seen,
        "resources": [str(r.uri) for r in resources.resources],
        "readme": readme.contents[0].text,  # type: ignore[union-attr]
        "prompt": prompt.messages[0].content.text,  # type: ignore[union-attr]
    }


def run(exercise: Callable[[], Awaitable[Any]]) -> Any:
    async def bounded() -> Any:
        with anyio.fail_after(30):
            return await exercise()

    return anyio.run(bounded)


def test_a_session_recorded_through_chaosllm_replays_with_the_server_stopped(
    tmp_path: Path,
) -> None:
    record_dir = tmp_path / "rec"
    with serving_mcp() as (upstream, server):
        with ChaosServer(
            tmp_path / "none",
            mode="record",
            upstream="http://127.0.0.1:9",
            mcp_upstreams={"search": upstream},
            record_dir=record_dir,
        ) as chaos:

            async def record() -> dict[str, Any]:
                async with connect(f"{chaos.url}/mcp/search") as client:
                    return await agent_session(client)

            recorded = run(record)
        assert server.calls == ["chaos"]
    files = sorted(record_dir.rglob("*.json"))
    assert len(files) >= 6  # initialize, tools/list, tools/call, resources, read, prompt
    text = "".join(f.read_text() for f in files)
    assert "sk-mcp-secret" not in text and "authorization" not in text.lower()
    assert {json.loads(f.read_text())["provider"] for f in files} == {"mcp"}

    with ChaosServer(record_dir) as chaos:  # the upstream is stopped

        async def replay() -> dict[str, Any]:
            async with connect(f"{chaos.url}/mcp/search") as client:
                return await agent_session(client)

        replayed = run(replay)
        journal = chaos.requests()
    assert replayed == recorded
    assert replayed["result"] == {"hits": 5, "query": "chaos"} and replayed["progress"] == [0.5]
    methods = [e["method"] for e in journal]
    assert methods[:3] == ["initialize", "notifications/initialized", "tools/list"]
    call = next(e for e in journal if e["method"] == "tools/call")
    assert call["tool"] == "search" and call["path"] == "/mcp/search"
    assert call["session"] == "agent" and call["match"] == "exact"
