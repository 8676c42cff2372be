"""The mcp 1.x Python client (``ClientSession`` with ``streamablehttp_client`` and
``sse_client``) against chaosllm's MCP endpoint: a session recorded through chaosllm
from the loopback server, replayed with that server stopped over streamable HTTP and
over the older HTTP+SSE transport, and a fault as it sees it.

mcp 1.x and 2.x are one package name and cannot share a virtual environment: the 1.x
client runs in its own (``.venv-mcp1``, made by ``.ci/run``; or the interpreter
``CHAOSLLM_MCP1_PYTHON`` names) as a subprocess, and these tests are skipped, saying so,
where it is not there."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from chaosllm.server import ChaosServer
from tests.helpers import ROOT
from tests.mcp_server import serving_mcp

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

PYTHON = Path(os.environ.get("CHAOSLLM_MCP1_PYTHON") or ROOT / ".venv-mcp1" / "bin" / "python")

CLIENT = """
import asyncio, json, sys
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamablehttp_client


async def main(url, transport):
    seen = []

    async def on_progress(progress, total, message):
        seen.append(progress)

    headers = {"x-chaosllm-session": "v1", "authorization": "Bearer sk-v1-secret-0123456789"}
    connect = sse_client if transport == "sse" else streamablehttp_client
    async with connect(url, headers=headers) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            init = await session.initialize()
            tools = await session.list_tools()
            arguments = {"q": "chaos"}
            result = await session.call_tool("search", arguments, progress_callback=on_progress)
            readme = await session.read_resource("doc://readme")
            prompt = await session.get_prompt("ask", {"topic": "faults"})
    print(json.dumps({
        "version": init.protocolVersion,
        "tools": [t.name for t in tools.tools],
        "result": result.structuredContent,
        "is_error": result.isError,
        "text": result.content[0].text,
        "progress": seen,
        "readme": readme.contents[0].text,
        "prompt": prompt.messages[0].content.text,
    }))


asyncio.run(asyncio.wait_for(main(sys.argv[1], sys.argv[2]), 60))
"""


def _version() -> str | None:
    if not PYTHON.exists():
        return None
    found = subprocess.run(
        [str(PYTHON), "-c", "import importlib.metadata as m; print(m.version('mcp'))"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return found.stdout.strip() if found.returncode == 0 else None


VERSION = _version()

needs_mcp1 = pytest.mark.skipif(
    VERSION is None or not VERSION.startswith("1."),
    reason=f"no mcp 1.x client at {PYTHON}: python3 -m venv .venv-mcp1 && "
    ".venv-mcp1/bin/pip install 'mcp>=1.20,<2' (.ci/run does), or set CHAOSLLM_MCP1_PYTHON",
)


def client(script: Path, url: str, transport: str = "http") -> dict[str, Any]:
    done = subprocess.run(
        [str(PYTHON), str(script), url, transport],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=script.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


@needs_mcp1
def test_the_mcp1_client_records_replays_and_meets_a_fault(tmp_path: Path) -> None:
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    record_dir = tmp_path / "rec"
    with (
        serving_mcp() as (upstream, server),
        ChaosServer(
            tmp_path / "none",
            mode="record",
            mcp_upstreams={"search": upstream},
            record_dir=record_dir,
        ) as chaos,
    ):
        recorded = client(script, f"{chaos.url}/mcp/search")
    assert server.calls == ["chaos"]
    assert recorded["version"] == "2025-11-25" and recorded["progress"] == [0.5]
    assert recorded["result"] == {"hits": 5, "query": "chaos"}
    text = "".join(f.read_text() for f in record_dir.rglob("*.json"))
    assert "sk-v1-secret" not in text

    with ChaosServer(record_dir) as chaos:  # the upstream is stopped
        assert client(script, f"{chaos.url}/mcp/search") == recorded
        assert client(script, f"{chaos.url}/mcp/search/sse", "sse") == recorded
        chaos.arm({"type": "tool_error", "message": "index offline", "match": {"tool": "search"}})
        broken = client(script, f"{chaos.url}/mcp/search")
        journal = chaos.requests("v1")
    assert broken["is_error"] is True and broken["text"] == "index offline"
    calls = [e for e in journal if e["method"] == "tools/call"]
    assert [e["match"] for e in calls] == ["exact"] * 3
    assert calls[-1]["fault"]["type"] == "tool_error"
