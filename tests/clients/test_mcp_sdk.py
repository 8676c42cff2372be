"""The official mcp SDK client against chaosllm's MCP endpoint: a session recorded through
chaosllm from a loopback server written with the SDK's own server side, replayed with
that server stopped, and the MCP faults as the SDK sees them."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError

from chaosllm.server import ChaosServer
from tests.mcp_server import serving_mcp

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
        with ChaosServer(  # --mcp-upstream alone: no --upstream
            tmp_path / "none",
            mode="record",
            mcp_upstreams={"search": upstream},
            record_dir=record_dir,
        ) as chaos:

            async def record() -> dict[str, Any]:
                async with connect(f"{chaos.url}/mcp/search") as client:
                    return await agent_session(client)

            recorded = run(record)
            # a model request (no upstream for it) gets a 502 saying so
            model = httpx2.post(f"{chaos.url}/v1/chat/completions", json={"model": "m"})
            assert model.status_code == 502 and "--mcp-upstream" in model.text
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


# -- each MCP fault as the SDK's client sees it -----------------------------------------------


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An agent session recorded through chaosllm from the loopback server."""
    root = tmp_path_factory.mktemp("mcp")
    with (
        serving_mcp() as (upstream, _),
        ChaosServer(
            root / "none",
            mode="record",
            upstream="http://127.0.0.1:9",
            mcp_upstreams={"search": upstream},
            record_dir=root / "rec",
        ) as chaos,
    ):

        async def record() -> None:
            async with connect(f"{chaos.url}/mcp/search") as client:
                await agent_session(client)

        run(record)
    return root / "rec"


def faulted(recorded: Path, spec: dict[str, Any], exercise: Any, **options: Any) -> Any:
    """`exercise(client)` against a replay of `recorded` with `spec` armed."""
    with ChaosServer(recorded) as chaos:
        chaos.arm(spec)

        async def go() -> Any:
            async with connect(f"{chaos.url}/mcp/search", **options) as client:
                return await exercise(client)

        return run(go), chaos.requests()


async def call(client: Client) -> Any:
    await client.list_tools()
    return await client.call_tool("search", {"q": "chaos"})


def test_tool_error_is_a_result_with_is_error(recorded: Path) -> None:
    spec = {"type": "tool_error", "message": "index offline", "match": {"tool": "search"}}
    result, journal = faulted(recorded, spec, call)
    assert result.is_error is True and result.content[0].text == "index offline"
    (entry,) = [e for e in journal if e["fault"]]
    assert entry["method"] == "tools/call" and entry["tool"] == "search"


def test_mcp_error_raises_the_code(recorded: Path) -> None:
    spec = {"type": "mcp_error", "code": -32002, "message": "no such resource"}

    async def failing(client: Client) -> Any:
        with pytest.raises(MCPError) as raised:
            await client.call_tool("search", {"q": "chaos"})
        return raised.value

    error, _ = faulted(recorded, {**spec, "match": {"server": "search", "tool": "search"}}, failing)
    assert error.code == -32002 and error.message == "no such resource"


def test_mcp_session_lost_then_a_new_session_works(recorded: Path) -> None:
    async def lost(client: Client) -> Any:
        with pytest.raises(MCPError) as raised:
            await client.call_tool("search", {"q": "chaos"})
        with pytest.raises(MCPError):
            await client.list_tools()  # the session is gone for good
        return raised.value

    with ChaosServer(recorded) as chaos:
        chaos.arm({"type": "mcp_session_lost", "match": {"tool": "search"}})

        async def go() -> tuple[Any, Any]:
            async with connect(f"{chaos.url}/mcp/search") as client:
                error = await lost(client)
            async with connect(f"{chaos.url}/mcp/search") as client:  # initialize again
                return error, await client.call_tool("search", {"q": "chaos"})

        error, result = run(go)
    assert "Session terminated" in error.message
    assert result.structured_content == {"hits": 5, "query": "chaos"}


DROP = {"type": "mcp_stream_drop", "after_events": 1}


def test_mcp_stream_drop_sends_progress_and_never_the_result(recorded: Path) -> None:
    seen: list[float] = []

    async def dropped(client: Client) -> Any:
        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append(progress)

        with pytest.raises(MCPError) as raised:
            await client.call_tool("search", {"q": "chaos"}, progress_callback=on_progress)
        return raised.value

    error, _ = faulted(recorded, {**DROP, "match": {"tool": "search"}}, dropped)
    assert seen == [0.5] and "without a response" in error.message


def test_a_resumable_stream_drop_is_resumed_by_the_sdk(recorded: Path) -> None:
    """With ``retry_ms`` the dropped stream's events carry ids: the SDK reconnects with a
    GET and ``Last-Event-ID`` and gets the rest, the result too."""
    seen: list[float] = []

    async def resumed(client: Client) -> Any:
        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append(progress)

        return await client.call_tool("search", {"q": "chaos"}, progress_callback=on_progress)

    spec = {**DROP, "retry_ms": 10, "match": {"tool": "search"}}
    result, journal = faulted(recorded, spec, resumed)
    assert result.structured_content == {"hits": 5, "query": "chaos"} and seen == [0.5]
    (call,) = [e for e in journal if e["method"] == "tools/call"]
    assert call["fault"]["type"] == "mcp_stream_drop"  # called once: resumed, not retried


def test_mcp_timeout_leaves_the_client_to_its_read_timeout(recorded: Path) -> None:
    async def timed_out(client: Client) -> Any:
        with pytest.raises(MCPError) as raised:
            await client.call_tool("search", {"q": "chaos"}, read_timeout_seconds=0.5)
        return raised.value

    spec = {"type": "mcp_timeout", "max_ms": 30_000, "match": {"tool": "search"}}
    error, journal = faulted(recorded, spec, timed_out)
    assert "Timed out" in error.message or "timed out" in error.message.lower()
    # the SDK cancels the call it gave up on; chaosllm stops the silent answer there
    call = next(e for e in journal if e["method"] == "tools/call")
    cancel = next(e for e in journal if e["method"] == "notifications/cancelled")
    assert cancel["cancels"] == call["seq"] and call["outcome"] == "cancelled"


def test_tools_changed_notifies_and_lists_other_tools(recorded: Path) -> None:
    notes: list[str] = []

    async def handler(message: Any) -> None:
        notes.append(type(message).__name__)

    async def changed(client: Client) -> Any:
        await client.call_tool("search", {"q": "chaos"})
        return [t.name for t in (await client.list_tools()).tools]

    spec = {"type": "tools_changed", "match": {"tool": "search"}}
    tools, _ = faulted(recorded, spec, changed, message_handler=handler)
    assert tools == ["chaosllm_added_tool"]
    assert any("ToolListChanged" in note for note in notes), notes


def test_bad_tool_output_fails_the_sdk_schema_check(recorded: Path) -> None:
    async def checked(client: Client) -> Any:
        with pytest.raises(RuntimeError) as raised:
            await call(client)
        return raised.value

    error, _ = faulted(recorded, {"type": "bad_tool_output"}, checked)
    assert "Invalid structured content" in str(error)


# -- record-missing: chaosllm's session, the upstream's own behind it --------------------------


@pytest.mark.parametrize("stateless", [False, True], ids=["sessions", "stateless-upstream"])
def test_record_missing_keeps_its_session_and_opens_the_upstreams(
    tmp_path: Path, stateless: bool
) -> None:
    """The SDK client's session is chaosllm's throughout: what is recorded is replayed,
    what is not goes to the upstream within an upstream session of its own (opened by a
    proxied initialize, or with the client's initialize when the first miss needs it)."""
    record_dir = tmp_path / "rec"
    record_dir.mkdir()

    async def calls(url: str, *queries: str) -> list[Any]:
        async with connect(url) as client:
            await client.list_tools()
            return [
                (await client.call_tool("search", {"q": q})).structured_content for q in queries
            ]

    with serving_mcp(stateless=stateless) as (upstream, server):
        options: dict[str, Any] = {"mode": "record-missing", "mcp_upstreams": {"search": upstream}}
        with ChaosServer(record_dir, **options) as chaos:  # nothing recorded: all proxied
            first = run(lambda: calls(f"{chaos.url}/mcp/search", "chaos"))
            minted = [e for e in chaos.requests() if e["method"] == "initialize"]
        with ChaosServer(record_dir, **options) as chaos:  # initialize replayed, one new call
            second = run(lambda: calls(f"{chaos.url}/mcp/search", "chaos", "tools"))
            journal = chaos.requests()
        assert server.calls == ["chaos", "tools"]  # the recorded call was not asked again
    assert first == [{"hits": 5, "query": "chaos"}] and minted[0]["match"] == "upstream"
    assert second == [{"hits": 5, "query": "chaos"}, {"hits": 5, "query": "tools"}]
    matches = {e["method"] + ":" + str(e.get("tool")): e["match"] for e in journal}
    assert matches["initialize:None"] == "exact" and matches["tools/list:None"] == "exact"
    assert [e["match"] for e in journal if e.get("tool") == "search"] == ["exact", "upstream"]
    with ChaosServer(record_dir) as chaos:  # the upstream is stopped: both calls replay
        assert run(lambda: calls(f"{chaos.url}/mcp/search", "chaos", "tools")) == second


# -- the older HTTP+SSE transport (2024-11-05), for old clients ---------------------------------


def test_the_http_sse_transport_replays_and_breaks_for_old_clients(recorded: Path) -> None:
    """The SDK's ``sse_client`` (GET ``/mcp/search/sse``, POSTs to the endpoint it names)
    replays what was recorded over streamable HTTP, meets the faults, and its messages
    are journalled as the streamable endpoint's."""

    async def old_client(url: str) -> dict[str, Any]:
        async with Client(
            sse_client(url, headers={"x-chaosllm-session": "old"}), mode="legacy"
        ) as c:
            return await agent_session(c)

    with ChaosServer(recorded) as chaos:
        replayed = run(lambda: old_client(f"{chaos.url}/mcp/search/sse"))
        chaos.arm({"type": "tool_error", "message": "offline", "match": {"tool": "search"}})

        async def broken() -> Any:
            async with Client(sse_client(f"{chaos.url}/mcp/search/sse"), mode="legacy") as c:
                return await c.call_tool("search", {"q": "chaos"})

        result = run(broken)
        journal = chaos.requests("old")
    assert replayed["result"] == {"hits": 5, "query": "chaos"} and replayed["progress"] == [0.5]
    assert replayed["readme"] == "chaosllm breaks tool servers on purpose."
    assert result.is_error is True and result.content[0].text == "offline"
    methods = [e["method"] for e in journal]
    assert methods[:3] == ["initialize", "notifications/initialized", "tools/list"]
    assert all(e["path"] == "/mcp/search" for e in journal)


def test_a_cancelled_call_over_http_sse_is_journalled_so(recorded: Path) -> None:
    """``mcp_timeout`` on the older transport: the SDK gives up and cancels; the silent
    call's entry says ``cancelled`` and the cancellation names it."""
    with ChaosServer(recorded) as chaos:
        chaos.arm({"type": "mcp_timeout", "max_ms": 30_000, "match": {"tool": "search"}})

        async def timed_out() -> Any:
            async with Client(sse_client(f"{chaos.url}/mcp/search/sse"), mode="legacy") as c:
                with pytest.raises(MCPError) as raised:
                    await c.call_tool("search", {"q": "chaos"}, read_timeout_seconds=0.5)
                await c.list_tools()  # then a request the stream answers: it got the cancel
                return raised.value

        error = run(timed_out)
        journal = chaos.requests()
    assert "timed out" in error.message.lower()
    call = next(e for e in journal if e["method"] == "tools/call")
    cancel = next(e for e in journal if e["method"] == "notifications/cancelled")
    assert cancel["cancels"] == call["seq"] and call["outcome"] == "cancelled"
    assert all(e["outcome"] != "pending" for e in journal)


def test_an_old_client_is_recorded_over_http_sse_and_replays_on_either_transport(
    tmp_path: Path,
) -> None:
    """In record mode the older transport's messages go through the streamable endpoint
    to the upstream: the ``sse_client``'s session is recorded (without its API key) and
    replays, with the upstream stopped, to it and to a streamable HTTP client."""

    async def old_client(url: str) -> dict[str, Any]:
        headers = {"authorization": TOKEN, "x-chaosllm-session": "old"}
        async with Client(sse_client(url, headers=headers), mode="legacy") as c:
            return await agent_session(c)

    with (
        serving_mcp() as (upstream, server),
        ChaosServer(
            tmp_path / "none",
            mode="record",
            mcp_upstreams={"search": upstream},
            record_dir=tmp_path / "rec",
        ) as chaos,
    ):
        recorded = run(lambda: old_client(f"{chaos.url}/mcp/search/sse"))
        journal = chaos.requests("old")
    assert server.calls == ["chaos"]  # the tool ran upstream, once
    assert recorded["result"] == {"hits": 5, "query": "chaos"} and recorded["progress"] == [0.5]
    assert recorded["readme"] == "chaosllm breaks tool servers on purpose."
    assert [e["method"] for e in journal][:2] == ["initialize", "notifications/initialized"]
    assert all(e["path"] == "/mcp/search" and e["status"] in (200, 202) for e in journal)
    written = list((tmp_path / "rec").rglob("*.json"))
    assert written and not any("sk-mcp-secret" in f.read_text("utf-8") for f in written)

    async def new_client(url: str) -> dict[str, Any]:
        async with connect(url) as c:
            return await agent_session(c)

    with ChaosServer(tmp_path / "rec") as replay:
        again = run(lambda: old_client(f"{replay.url}/mcp/search/sse"))
        fresh = run(lambda: new_client(f"{replay.url}/mcp/search"))
        misses = [e for e in replay.requests() if e["miss"]]
    assert again == recorded
    assert fresh["result"] == recorded["result"] and fresh["tools"] == recorded["tools"]
    assert misses == []


def test_record_missing_tells_the_upstream_of_a_cancelled_call(tmp_path: Path) -> None:
    """A call no recording answers runs upstream; when the SDK gives up on it and sends
    ``notifications/cancelled``, the upstream is sent it too, in the upstream's session
    (the spec says a dropped connection is no cancellation: an upstream other than the
    SDK's, which also stops on the disconnect, would run on), and it is not recorded."""
    ran: list[str] = []
    upstream_server = MCPServer("slow")

    @upstream_server.tool()
    async def wait(seconds: float) -> str:
        """Wait that long."""
        ran.append("started")
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            ran.append("cancelled")
            raise
        return "waited"

    async def give_up(url: str) -> None:
        async with connect(url) as client:
            with pytest.raises(MCPError):
                await client.call_tool("wait", {"seconds": 30}, read_timeout_seconds=0.5)
            await client.list_tools()  # the session goes on

    record_dir = tmp_path / "rec"
    record_dir.mkdir()
    with (
        serving_mcp(upstream_server) as (upstream, _),
        ChaosServer(record_dir, mode="record-missing", mcp_upstreams={"slow": upstream}) as chaos,
    ):
        run(lambda: give_up(f"{chaos.url}/mcp/slow"))
        deadline = time.monotonic() + 10
        while "cancelled" not in ran and time.monotonic() < deadline:
            time.sleep(0.02)
        journal = chaos.requests("agent")
    assert ran == ["started", "cancelled"]
    told = [e for e in journal if e["method"] == "notifications/cancelled"]
    assert len(told) == 1 and told[0]["match"] == "upstream" and told[0]["status"] == 202
    recorded = " ".join(f.read_text("utf-8") for f in record_dir.rglob("*.json"))
    assert "notifications/cancelled" not in recorded and '"wait"' in recorded
