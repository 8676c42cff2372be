"""An agent loop (openai-agents, its MCP server over streamable HTTP) with chaosllm as
both its model and its tool server, under a seeded joint fault schedule: hypothesis
finds a planted bug (the tool executed twice after a retried model call) and shrinks it
to the smallest schedule that shows it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

agents = pytest.importorskip("agents")

from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled  # noqa: E402
from agents.mcp import MCPServerStreamableHttp  # noqa: E402
from hypothesis import find, settings  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402

from chaosllm.server import ChaosServer  # noqa: E402
from chaosllm.strategies import joint_fault_schedules  # noqa: E402
from tests.mcp_server import recording_turn  # noqa: E402

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.slow,
    # openai-agents' MCP client (on mcp 2.x) leaves its httpx2 clients' aclose() to tasks
    # that run after the turn's event loop is gone: the framework's leak, not chaosllm's
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

SESSION = "agent-loop"
QUESTION = "How many documents are there about chaos?"
HEADERS = {"x-chaosllm-session": SESSION}


async def run_agent(url: str, *, restart_on_error: bool) -> str | None:
    """The agent's turn. The planted bug: on a model error it runs the whole turn again,
    tool call and all, instead of retrying the model call alone."""
    set_tracing_disabled(True)
    client = AsyncOpenAI(
        base_url=f"{url}/v1", api_key="test", max_retries=0, timeout=2.0, default_headers=HEADERS
    )
    params: Any = {"url": f"{url}/mcp/search", "headers": HEADERS, "timeout": 2.0}
    async with (
        client,
        MCPServerStreamableHttp(  # the model's client closed too
            params=params, cache_tools_list=True, client_session_timeout_seconds=2.0
        ) as server,
    ):
        agent = Agent(
            name="researcher",
            instructions="Use the search tool.",
            mcp_servers=[server],
            model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client),
        )
        for _ in range(3 if restart_on_error else 1):
            try:
                result = await Runner.run(agent, QUESTION)
                return str(result.final_output)
            except Exception:
                if not restart_on_error:
                    raise
    return None


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agent's turn recorded through chaosllm: model and tool server together."""
    root = tmp_path_factory.mktemp("agent")
    with recording_turn(root) as (chaos, ran):
        answer = anyio.run(lambda: run_agent(chaos.url, restart_on_error=False))
    assert answer == "There are 5 documents about chaos."
    assert ran == ["chaos"]  # the tool ran once, upstream
    return root / "rec"


@pytest.fixture(scope="module")
def chaos(recorded: Path) -> Iterator[ChaosServer]:
    with ChaosServer(recorded, seed=7) as server:
        yield server


def test_the_recorded_turn_replays_with_no_finding(chaos: ChaosServer) -> None:
    chaos.reset()
    answer = anyio.run(lambda: run_agent(chaos.url, restart_on_error=False))
    assert answer == "There are 5 documents about chaos."
    journal = chaos.requests(SESSION)
    assert [e["path"] for e in journal if e["path"].startswith("/v1/")] == [
        "/v1/chat/completions",
        "/v1/chat/completions",
    ]
    assert [e.get("tool") for e in journal if e["method"] == "tools/call"] == ["search"]
    assert chaos.verdict(SESSION) == []


def test_a_joint_schedule_finds_the_tool_run_twice_and_shrinks_it(chaos: ChaosServer) -> None:
    # one event loop for every example: the framework closes its HTTP clients in tasks
    # that outlive a turn
    with anyio.from_thread.start_blocking_portal() as portal:

        def runs_the_tool_twice(schedule: list[dict[str, Any]]) -> bool:
            chaos.reset()
            if schedule:
                chaos.arm(schedule)
            portal.call(lambda: run_agent(chaos.url, restart_on_error=True))
            found = chaos.verdict(SESSION)
            return any(f.name == "tool_executed_twice_after_retry" for f in found)

        shrunk = _shrunk(runs_the_tool_twice)
        assert runs_the_tool_twice(shrunk)  # the shrunk schedule shows the bug again
        journal = chaos.requests(SESSION)
    # the smallest schedule breaks the model request after the tool ran, and nothing of
    # the tool server: the agent restarted the turn and ran the tool again
    assert 1 <= len(shrunk) <= 2 and all("server" not in f["match"] for f in shrunk), shrunk
    faulted = [e["seq"] for e in journal if e["fault"] and e["path"] == "/v1/chat/completions"]
    calls = [e["seq"] for e in journal if e["method"] == "tools/call"]
    assert len(calls) == 2 and calls[0] < faulted[-1] < calls[1], journal


def _shrunk(condition: Any) -> list[dict[str, Any]]:
    strategy = joint_fault_schedules(
        servers=["search"],
        tools=["search"],
        max_faults=3,
        max_after_requests=1,
        stall_ms=200.0,
        session=SESSION,
    )
    found: list[dict[str, Any]] = find(
        strategy,
        condition,
        settings=settings(max_examples=40, database=None, deadline=None, derandomize=True),
    )
    return found


FRAMEWORK_TABLE = {
    # fault: (the turn still answers, the tool error's text reached the model)
    "mcp_error": (False, None),
    "tool_error": (False, True),
    "mcp_timeout": (False, None),
    "mcp_stream_drop": (False, None),
    "mcp_session_lost": (False, None),
    "tools_changed": (True, None),
    "bad_tool_output": (False, None),
}
"""What openai-agents does with each MCP fault on its tool call (docs/mcp.md's table): a
turn that does not answer asked the model with a tool output nobody recorded (its
error text, not the tool's answer); after a tool error the model gets its text (a
result in the recorded result's envelope: before chaosllm kept its ``resultType``, the
client refused it and the model got a generic error, which looked like the agent
hiding the tool's error)."""


@pytest.mark.parametrize("kind", list(FRAMEWORK_TABLE))
def test_what_openai_agents_does_with_each_mcp_fault(chaos: ChaosServer, kind: str) -> None:
    chaos.reset()
    spec: dict[str, Any] = {"type": kind, "match": {"tool": "search"}}
    if kind == "mcp_timeout":
        spec["max_ms"] = 4000  # beyond the client's 2 s
    chaos.arm(spec)
    try:
        answered = anyio.run(lambda: run_agent(chaos.url, restart_on_error=False)) is not None
    except Exception:
        answered = False
    journal = chaos.requests(SESSION)
    names = [f.name for f in chaos.verdict(SESSION)]
    expected_answer, error_seen = FRAMEWORK_TABLE[kind]
    assert answered is expected_answer
    assert [e["method"] for e in journal if e["path"] == "/mcp/search"][-1] == "tools/call"
    if error_seen is False:
        assert "tool_error_hidden_from_model" in names
    if error_seen is True:
        assert "tool_error_hidden_from_model" not in names
    assert any(e["miss"] for e in journal) is not expected_answer
