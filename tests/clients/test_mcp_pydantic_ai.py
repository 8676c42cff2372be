"""A second framework's MCP client: pydantic-ai's `MCPToolset` (on FastMCP's client, which
negotiates the newest revision and opens with ``server/discover``) with chaosllm as both
its model and its tool server. Its turn is recorded through chaosllm from a loopback
model and a loopback MCP server, replays with both stopped, and meets each MCP fault as
docs/mcp.md's table says."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest

pytest.importorskip("pydantic_ai.mcp")

from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from chaosllm.server import ChaosServer
from tests.helpers import loopback_upstream
from tests.mcp_server import ScriptedModel, recording_turn

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

SESSION = "pydantic-ai-loop"
QUESTION = "How many documents are there about chaos?"
ANSWER = "There are 5 documents about chaos."
HEADERS = {"x-chaosllm-session": SESSION}


async def run_agent(url: str) -> str:
    """One turn: the model asks for the search tool, the toolset calls it, the model
    answers from its result. No retries of the model's calls: each shows in the journal."""
    client = AsyncOpenAI(
        base_url=f"{url}/v1", api_key="test", max_retries=0, timeout=2.0, default_headers=HEADERS
    )
    tools: MCPToolset[Any] = MCPToolset(
        f"{url}/mcp/search", headers=HEADERS, init_timeout=2.0, read_timeout=2.0
    )
    model = OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(openai_client=client))
    agent = Agent(model, toolsets=[tools], instructions="Use the search tool.")
    async with client:
        result = await agent.run(QUESTION)
    return str(result.output)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The turn recorded through chaosllm: model and tool server together."""
    root = tmp_path_factory.mktemp("pydantic-ai")
    with recording_turn(root) as (chaos, ran):
        assert anyio.run(run_agent, chaos.url) == ANSWER
        assert ran == ["chaos"]  # the tool ran once, upstream
    return root / "rec"


@pytest.fixture(scope="module")
def chaos(recorded: Path) -> Iterator[ChaosServer]:
    with ChaosServer(recorded, seed=7) as server:  # model and tool server both stopped
        yield server


def _methods(chaos: ChaosServer) -> list[str]:
    return [e["method"] for e in chaos.requests(SESSION) if e["path"] == "/mcp/search"]


def test_the_recorded_turn_replays_with_the_servers_stopped(chaos: ChaosServer) -> None:
    chaos.reset()
    assert anyio.run(run_agent, chaos.url) == ANSWER
    journal = chaos.requests(SESSION)
    assert [(e["method"], e.get("tool")) for e in journal] == [
        ("server/discover", None),
        ("tools/list", None),
        ("POST", None),
        ("tools/call", "search"),
        ("POST", None),
    ]
    assert all(e["match"] == "exact" and not e["miss"] for e in journal)
    assert chaos.verdict(SESSION) == []


FRAMEWORK_TABLE: dict[str, tuple[str | None, bool]] = {
    # fault: (what the turn raises, None: it answers; whether it listed the tools again)
    "mcp_error": ("ModelNotFoundError", False),
    "tool_error": ("ModelNotFoundError", False),
    "mcp_timeout": ("ModelNotFoundError", False),
    "mcp_stream_drop": ("ModelNotFoundError", False),
    "mcp_session_lost": ("ModelNotFoundError", False),
    "tools_changed": (None, True),
    "bad_tool_output": ("RuntimeError", False),
}
"""What pydantic-ai does with each MCP fault on its tool call (docs/mcp.md's table). By
default (``tool_error_behavior="retry"``) a failed call is handed to the model as a retry
prompt carrying the error's text: that model request was never recorded, so chaosllm's
miss (a 404, raised as ``ModelNotFoundError``) ends the turn, and its message names the
fault the previous request got. A result that breaks the tool's ``outputSchema`` is
refused by FastMCP's client (``RuntimeError``) before the model is asked; a
``list_changed`` notification empties its tool cache, so it lists the tools again."""


@pytest.mark.parametrize("kind", list(FRAMEWORK_TABLE))
def test_what_pydantic_ai_does_with_each_mcp_fault(chaos: ChaosServer, kind: str) -> None:
    chaos.reset()
    spec: dict[str, Any] = {"type": kind, "match": {"tool": "search"}}
    if kind == "mcp_timeout":
        spec["max_ms"] = 4000  # beyond the client's 2 s read timeout
    chaos.arm(spec)
    raised: str | None = None
    said = ""
    try:
        assert anyio.run(run_agent, chaos.url) == ANSWER
    except Exception as exc:
        raised = type(exc).__name__
        body = getattr(exc, "body", None)  # the model's error body, whole
        said = str(body.get("message", "")) if isinstance(body, dict) else str(exc)
    expected_raise, relisted = FRAMEWORK_TABLE[kind]
    assert raised == expected_raise
    journal = chaos.requests(SESSION)
    called = [e for e in journal if e["method"] == "tools/call"]
    assert len(called) == 1 and called[0]["fault"]["type"] == kind
    assert (_methods(chaos).count("tools/list") == 2) is relisted
    if expected_raise == "ModelNotFoundError":  # the model was asked with the error's text
        last = journal[-1]
        assert last["path"] == "/v1/chat/completions" and last["miss"]
        assert f"got the fault '{kind}'" in said  # chaosllm's miss says why
    # it hands a tool error's text to the model (openai-agents does not)
    names = [f.name for f in chaos.verdict(SESSION)]
    assert "tool_error_hidden_from_model" not in names
    assert "tool_executed_twice_after_retry" not in names


@pytest.mark.parametrize("behavior", ["retry", "failed"])
def test_a_tool_error_reaches_the_model_in_record_missing(
    recorded: Path, tmp_path: Path, behavior: Literal["retry", "failed"]
) -> None:
    """``tool_error`` with the flow not recorded: in record-missing mode the loopback
    model answers the request nobody recorded, and that request (recorded now) carries
    the tool's text, as a retry prompt (``"retry"``) or the failed call's result
    (``"failed"``). The result keeps the recorded envelope: FastMCP's client requires
    its ``resultType`` (without, it refused the result and the model got its validation
    error instead)."""
    record_dir = tmp_path / "rec"
    shutil.copytree(recorded, record_dir)
    before = set(record_dir.rglob("*.json"))
    with (
        loopback_upstream(ScriptedModel) as model,
        ChaosServer(record_dir, mode="record-missing", upstream=model) as chaos,
    ):
        chaos.arm({"type": "tool_error", "message": "index offline", "match": {"tool": "search"}})

        async def turn() -> str:
            client = AsyncOpenAI(
                base_url=f"{chaos.url}/v1", api_key="test", max_retries=0, default_headers=HEADERS
            )
            tools: MCPToolset[Any] = MCPToolset(
                f"{chaos.url}/mcp/search", headers=HEADERS, tool_error_behavior=behavior
            )
            model_ = OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(openai_client=client))
            agent = Agent(model_, toolsets=[tools], instructions="Use the search tool.")
            with anyio.fail_after(60):
                async with client:
                    return str((await agent.run(QUESTION)).output)

        assert anyio.run(turn) == ANSWER  # the loopback model answered from the error
        journal = chaos.requests(SESSION)
        names = [f.name for f in chaos.verdict(SESSION)]
    (call,) = [e for e in journal if e["method"] == "tools/call"]
    assert call["fault"]["type"] == "tool_error"
    assert journal[-1]["path"] == "/v1/chat/completions" and journal[-1]["match"] == "upstream"
    (new,) = set(record_dir.rglob("*.json")) - before  # the model request nobody recorded
    assert "index offline" in new.read_text()
    assert "tool_error_hidden_from_model" not in names
