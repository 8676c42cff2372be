"""MCP recordings and requests for the tests: a server ``search`` with one tool."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.memory import Answer, EnginePair

QUERY = "chaos engineering for agents and the tool servers they call"
SERVER = "search"
PATH = f"/mcp/{SERVER}"
ACCEPT = (("accept", "application/json, text/event-stream"),)
INIT_PARAMS = {
    "protocolVersion": "2025-11-25",
    "capabilities": {},
    "clientInfo": {"name": "tests", "version": "1"},
}
TOOLS = [
    {
        "name": "search",
        "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}},
        "outputSchema": {
            "type": "object",
            "properties": {"hits": {"type": "integer"}},
            "required": ["hits"],
        },
    },
    {"name": "fetch", "inputSchema": {"type": "object"}},
]


def _frame(message: Any) -> dict[str, Any]:
    return {"data": f"event: message\ndata: {json.dumps(message)}\n\n", "delay_ms": 0}


def write_recordings(root: Path) -> Path:
    """initialize, tools/list and two tools/call (one streamed with progress)."""
    scenario = root / "mcp-search"
    scenario.mkdir(parents=True)
    exchanges: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        (
            "initialize",
            INIT_PARAMS,
            {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {"listChanged": True}},
                "serverInfo": {"name": SERVER, "version": "1"},
            },
        ),
        ("tools/list", {}, {"tools": TOOLS}),
        (
            "tools/call",
            {"name": "search", "arguments": {"q": QUERY}},
            {
                "content": [{"type": "text", "text": '{"hits": 3}'}],
                "structuredContent": {"hits": 3},
                "isError": False,
            },
        ),
    ]
    for number, (method, params, result) in enumerate(exchanges, 1):
        response: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "result": result}
        recorded: dict[str, Any] = {"status": 200, "body": response}
        if method == "tools/call":
            progress = {
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {"progressToken": 1, "progress": 0.5},
            }
            recorded.update(stream=True, chunks=[_frame(progress), _frame(response)])
        request = {"server": SERVER, "stream": True, "jsonrpc": "2.0", "id": 1, "method": method}
        request["params"] = params
        data = {
            "chaosllm": 1,
            "provider": "mcp",
            "request": {"method": "POST", "path": PATH, "body": request},
            "response": recorded,
        }
        (scenario / f"{number:04d}.json").write_text(json.dumps(data, indent=2))
    return root


class McpClient:
    """A client of the engine's MCP endpoint: JSON-RPC ids counted, the session kept."""

    def __init__(self, pair: EnginePair, *, session: str | None = None) -> None:
        self.pair = pair
        self.session = session
        self.mcp_session: str | None = None
        self.next_id = 0

    def headers(self) -> tuple[tuple[str, str], ...]:
        if self.mcp_session is None:
            return ACCEPT
        return (*ACCEPT, ("mcp-session-id", self.mcp_session))

    def post(self, message: Any) -> Answer:
        return self.pair.send(message, path=PATH, headers=self.headers(), session=self.session)

    def request(self, method: str, params: Any = None) -> Answer:
        self.next_id += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
        if params is not None:
            message["params"] = params
        return self.post(message)

    def initialize(self) -> Answer:
        answer = self.request("initialize", INIT_PARAMS)
        self.mcp_session = answer.headers.get("mcp-session-id")
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return answer

    def call(self, arguments: Any = None, name: str = "search", token: Any = None) -> Answer:
        params: dict[str, Any] = {"name": name, "arguments": arguments or {"q": QUERY}}
        if token is not None:
            params["_meta"] = {"progressToken": token}
        return self.request("tools/call", params)


def messages(answer: Answer) -> list[Any]:
    """The JSON-RPC messages of an answer (its SSE events, or its JSON body)."""
    if answer.headers.get("content-type", "").startswith("text/event-stream"):
        return [
            json.loads(line[5:])
            for frame in answer.frames()
            for line in frame.splitlines()
            if line.startswith("data:")
        ]
    return [answer.json()] if answer.body else []
