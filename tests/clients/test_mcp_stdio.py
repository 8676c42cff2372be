"""``chaosllm mcp-stdio`` with the official mcp client's stdio transport: a server run as
a command (the SDK's own MCPServer over stdio) recorded through the bridge, replayed
with no command, and broken by the faults of ``--faults``."""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from tests.helpers import CLI, ROOT

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]

SERVER = [sys.executable, "-c", "from tests.mcp_server import search_server; search_server().run()"]


def bridge(*args: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=CLI[0], args=[*CLI[1:], "mcp-stdio", "--name", "search", *args], cwd=str(ROOT)
    )


def run(exercise: Callable[[], Awaitable[Any]]) -> Any:
    async def bounded() -> Any:
        with anyio.fail_after(60):
            return await exercise()

    return anyio.run(bounded)


async def session(params: StdioServerParameters) -> dict[str, Any]:
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    async with Client(params, mode="legacy") as client:
        tools = await client.list_tools()
        result = await client.call_tool("search", {"q": "stdio"}, progress_callback=on_progress)
        return {
            "tools": [t.name for t in tools.tools],
            "result": result.structured_content,
            "is_error": result.is_error,
            "text": result.content[0].text,  # type: ignore[union-attr]
            "progress": seen,
        }


def test_record_then_replay_then_break_over_stdio(tmp_path: Path) -> None:
    record_dir = tmp_path / "rec"
    recorded = run(lambda: session(bridge("--record-dir", str(record_dir), "--", *SERVER)))
    assert recorded["result"] == {"hits": 5, "query": "stdio"} and recorded["progress"] == [0.5]
    files = sorted(record_dir.rglob("*.json"))
    assert len(files) == 3  # initialize, tools/list, tools/call (with its progress)
    call = json.loads(files[-1].read_text())
    assert call["request"]["body"]["method"] == "tools/call" and call["response"]["chunks"]

    journal = tmp_path / "journal.jsonl"
    replay = bridge("--replay", "--recordings", str(record_dir), "--journal", str(journal))
    assert run(lambda: session(replay)) == recorded  # no server command at all
    methods = [json.loads(line)["method"] for line in journal.read_text().splitlines()]
    assert methods[:3] == ["initialize", "notifications/initialized", "tools/list"]

    faults = tmp_path / "faults.json"
    faults.write_text(
        json.dumps({"type": "tool_error", "message": "down", "match": {"tool": "search"}})
    )
    broken = bridge("--replay", "--recordings", str(record_dir), "--faults", str(faults))
    got = run(lambda: session(broken))
    assert got["is_error"] is True and got["text"] == "down"
