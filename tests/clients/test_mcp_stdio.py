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


def messages(error: BaseException) -> str:
    """An error's text and those of the errors it groups."""
    grouped: tuple[BaseException, ...] = getattr(error, "exceptions", ())
    return " | ".join([str(error), *(messages(e) for e in grouped)])


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


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"type": "tool_error", "message": "down"}, {"is_error": True, "text": "down"}),
        ({"type": "bad_tool_output"}, "Invalid structured content"),
    ],
    ids=["answers-alone", "breaks-the-answer"],
)
def test_faults_apply_while_recording_over_stdio(
    tmp_path: Path, spec: dict[str, Any], expected: Any
) -> None:
    """Recording with ``--faults``: the agent gets the broken answer, the recording keeps
    the server's, and ``--journal`` says which fault fired."""
    record_dir, faults, journal = tmp_path / "rec", tmp_path / "faults.json", tmp_path / "j.jsonl"
    faults.write_text(json.dumps({**spec, "match": {"server": "search", "tool": "search"}}))
    params = bridge(
        "--record-dir", str(record_dir), "--faults", str(faults), "--journal", str(journal),
        "--", *SERVER,
    )  # fmt: skip
    if isinstance(expected, str):

        async def broken() -> Any:
            with pytest.raises(Exception) as raised:  # over stdio: in an exception group
                await session(params)
            return messages(raised.value)

        assert expected in run(broken)
    else:
        got = run(lambda: session(params))
        assert {k: got[k] for k in expected} == expected
    entries = [json.loads(line) for line in journal.read_text().splitlines()]
    assert all(e["outcome"] == "complete" for e in entries)
    call = next(e for e in entries if e["method"] == "tools/call")
    assert call["fault"]["type"] == spec["type"] and call["tool"] == "search"
    bodies = [json.loads(f.read_text())["response"]["body"] for f in record_dir.rglob("*.json")]
    (answer,) = [b for b in bodies if "structuredContent" in json.dumps(b)]
    assert answer["result"]["structuredContent"] == {"hits": 5, "query": "stdio"}
    assert answer["result"]["isError"] is False
