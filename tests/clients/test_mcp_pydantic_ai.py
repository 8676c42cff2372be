"""A second framework's MCP integration: pydantic-ai's ``MCPToolset`` (on the fastmcp
client, over streamable HTTP) with chaosllm as both its model and its tool server. The
agent's turn is recorded through chaosllm from a loopback model and the loopback MCP
server, replayed with both stopped, and the MCP faults met as pydantic-ai meets them."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("pydantic_ai.mcp")

from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from chaosllm.server import ChaosServer
from tests.helpers import chat_completion, loopback_upstream
from tests.mcp_server import serving_mcp

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

SESSION = "pydantic-ai"
QUESTION = "How many documents are there about chaos?"
HEADERS = {"x-chaosllm-session": SESSION}


class ScriptedModel(BaseHTTPRequestHandler):
    """A loopback Chat Completions upstream: it asks for the search tool, then answers
    with the tool's result (or its error) in its words."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        tool = [m for m in body["messages"] if m.get("role") == "tool"]
        if tool:
            answer = chat_completion(f"The search said: {tool[-1]['content']}", model=body["model"])
        else:
            call = {"name": "search", "arguments": json.dumps({"q": "chaos"})}
            message = {"tool_calls": [{"id": "call_1", "type": "function", "function": call}]}
            answer = chat_completion(None, model=body["model"], message=message)
            answer["choices"][0]["finish_reason"] = "tool_calls"
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


async def turn(url: str, **toolset: Any) -> str:
    """One agent turn: pydantic-ai's Agent, chaosllm's model, chaosllm's tool server."""
    client = AsyncOpenAI(
        base_url=f"{url}/v1", api_key="test", max_retries=0, default_headers=HEADERS
    )
    model = OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(openai_client=client))
    toolset.setdefault("read_timeout", 5.0)
    tools = MCPToolset(f"{url}/mcp/search", headers=HEADERS, **toolset)
    agent = Agent(model, toolsets=[tools], instructions="Use the search tool.")
    with anyio.fail_after(60):
        async with client, agent:
            result = await agent.run(QUESTION)
    return str(result.output)


def run(url: str, **toolset: Any) -> str:
    return anyio.run(lambda: turn(url, **toolset))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """The agent's turn recorded through chaosllm (model and tool server) and its answer."""
    root = tmp_path_factory.mktemp("pydantic-ai")
    with (
        loopback_upstream(ScriptedModel) as model,
        serving_mcp() as (tools, server),
        ChaosServer(
            root / "none",
            mode="record",
            upstream=model,
            mcp_upstreams={"search": tools},
            record_dir=root / "rec",
        ) as chaos,
    ):
        answer = run(chaos.url)
        assert server.calls == ["chaos"]
    yield root / "rec", answer


def test_the_turn_replays_with_model_and_tools_stopped(recorded: tuple[Path, str]) -> None:
    record_dir, answer = recorded
    assert "hits" in answer and "5" in answer  # the model read the tool's result
    providers = {json.loads(f.read_text())["provider"] for f in record_dir.rglob("*.json")}
    assert providers == {"mcp", "openai.chat"}
    with ChaosServer(record_dir) as chaos:
        assert run(chaos.url) == answer
        journal = chaos.requests(SESSION)
        verdict = chaos.verdict(SESSION)
    kinds = [e.get("tool") or ("model" if e["path"] == "/v1/chat/completions" else None)
             for e in journal]  # fmt: skip
    assert kinds.index("search") > kinds.index("model")  # the model asked, then the tool ran
    assert kinds[-1] == "model" and all(e["match"] != "miss" for e in journal)
    assert journal[0]["method"] == "server/discover"  # fastmcp speaks the 2026-07-28 revision
    assert [f.name for f in verdict] == []  # a clean replay: nothing found


@pytest.mark.parametrize("behavior", ["retry", "failed"])
def test_a_tool_error_reaches_the_model(
    recorded: tuple[Path, str], tmp_path: Path, behavior: str
) -> None:
    """``tool_error`` (an ``isError`` result, in the recorded result's envelope: the
    2026-07-28 revision fastmcp negotiates requires its ``resultType``), in record-missing
    mode with the loopback model answering what was not recorded: pydantic-ai hands the
    tool's text to the model (``retry``: as a retry prompt; ``failed``: as the failed
    call's result), so no ``tool_error_hidden_from_model``."""
    record_dir = tmp_path / "rec"
    shutil.copytree(recorded[0], record_dir)
    with (
        loopback_upstream(ScriptedModel) as model,
        ChaosServer(record_dir, mode="record-missing", upstream=model) as chaos,
    ):
        chaos.arm({"type": "tool_error", "message": "index offline", "match": {"tool": "search"}})
        answer = run(chaos.url, tool_error_behavior=behavior)
        journal = chaos.requests(SESSION)
        verdict = chaos.verdict(SESSION)
    assert "index offline" in answer  # the model read the tool's error
    calls = [e for e in journal if e.get("tool") == "search"]
    assert calls[0]["fault"]["type"] == "tool_error"
    assert journal[-1]["path"] == "/v1/chat/completions" and journal[-1]["match"] == "upstream"
    assert "tool_error_hidden_from_model" not in [f.name for f in verdict]


FRAMEWORK_TABLE: dict[str, str | None] = {
    # fault: what the model's next request says of the tool (None: the turn raises)
    "mcp_error": "chaosllm injected a JSON-RPC error.",
    "tool_error": "chaosllm: the tool 'search' failed.",
    "mcp_timeout": "timed out",
    "mcp_stream_drop": "SSE stream ended without a response",
    "mcp_session_lost": "Not Found",
    "tools_changed": '"hits":5',
    "bad_tool_output": None,
}
"""What pydantic-ai does with each MCP fault on its tool call (docs/mcp.md's table), the
loopback model answering the requests nobody recorded (record-missing): every failure
but a result its schema refuses reaches the model as the tool's error text; that one
raises out of the run."""


@pytest.mark.parametrize("kind", list(FRAMEWORK_TABLE))
def test_what_pydantic_ai_does_with_each_mcp_fault(
    recorded: tuple[Path, str], tmp_path: Path, kind: str
) -> None:
    record_dir = tmp_path / "rec"
    shutil.copytree(recorded[0], record_dir)
    spec: dict[str, Any] = {"type": kind, "match": {"tool": "search"}}
    if kind == "mcp_timeout":
        spec["max_ms"] = 20_000  # beyond the client's read timeout
    if kind == "mcp_stream_drop":
        spec["after_events"] = 1
    with (
        loopback_upstream(ScriptedModel) as model,
        ChaosServer(record_dir, mode="record-missing", upstream=model) as chaos,
    ):
        chaos.arm(spec)
        said = FRAMEWORK_TABLE[kind]
        if said is None:
            with pytest.raises(RuntimeError, match="Invalid structured content"):
                run(chaos.url)
            return
        answer = run(chaos.url, read_timeout=1.0)
        journal = chaos.requests(SESSION)
    assert said in answer
    call = next(e for e in journal if e.get("tool") == "search")
    assert call["fault"]["type"] == kind
    if kind == "mcp_timeout":  # the 2026-07-28 client leaves the call: no cancellation
        assert call["outcome"] == "client_gone"
        assert "notifications/cancelled" not in [e["method"] for e in journal]
