"""A loopback MCP server written with the mcp SDK's own server side (MCPServer over
streamable HTTP, served by uvicorn in a thread): the upstream chaosllm records."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel

from chaosllm.server import ChaosServer
from tests.helpers import chat_completion, free_port, loopback_upstream, write_json


class Hits(BaseModel):
    hits: int
    query: str


def search_server() -> MCPServer:
    server = MCPServer("search")
    calls: list[str] = []

    @server.tool()
    async def search(q: str, ctx: Context) -> Hits:
        """Count the documents about q."""
        calls.append(q)
        await ctx.report_progress(0.5, 1.0, "searching")
        return Hits(hits=len(q), query=q)

    @server.resource("doc://readme")
    def readme() -> str:
        return "chaosllm breaks tool servers on purpose."

    @server.prompt()
    def ask(topic: str) -> str:
        return f"Tell me about {topic}."

    server.calls = calls  # type: ignore[attr-defined]
    return server


@contextmanager
def serving_mcp(
    server: MCPServer | None = None, *, stateless: bool = False
) -> Iterator[tuple[str, Any]]:
    """The server on a loopback port (`stateless`: keeping no sessions, no
    ``Mcp-Session-Id``): its endpoint URL and the server; stopped on exit."""
    server = server or search_server()
    app = server.streamable_http_app(stateless_http=stateless)
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    runner = uvicorn.Server(config)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not runner.started:
        assert time.monotonic() < deadline, "the MCP server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/mcp", server
    finally:
        runner.should_exit = True
        thread.join(10)


class ScriptedModel(BaseHTTPRequestHandler):
    """A loopback Chat Completions upstream for an agent with `search_server`'s tool: it
    asks for the search tool, then answers from the tool's result."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if any(m.get("role") == "tool" for m in body["messages"]):
            answer = chat_completion("There are 5 documents about chaos.", model=body["model"])
        else:
            call = {"name": "search", "arguments": json.dumps({"q": "chaos"})}
            message = {"tool_calls": [{"id": "call_1", "type": "function", "function": call}]}
            answer = chat_completion(None, model=body["model"], message=message)
            answer["choices"][0]["finish_reason"] = "tool_calls"
        write_json(self, answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def recording_turn(root: Path) -> Iterator[tuple[ChaosServer, list[str]]]:
    """chaosllm recording an agent's turn into ``root / "rec"``: `ScriptedModel` on
    loopback as its model's upstream and `search_server` as its tool server ``search``;
    the proxy and the queries the tool ran with upstream."""
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
        yield chaos, server.calls
