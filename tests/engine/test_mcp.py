"""MCP servers in memory: recordings keyed on the JSON-RPC method and params, the
streamable HTTP transport's sessions, bad input, misses, and each MCP fault."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chaosllm.core.verdict import findings
from chaosllm.model import Ending
from chaosllm.providers.mcp import (
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    NO_RECORDING_CODE,
    PARSE_ERROR,
)
from tests.mcp_helpers import ACCEPT, PATH, QUERY, McpClient, messages, write_recordings
from tests.memory import EnginePair


@pytest.fixture
def pair(tmp_path: Path) -> EnginePair:
    return EnginePair.of(write_recordings(tmp_path))


@pytest.fixture
def client(pair: EnginePair) -> McpClient:
    client = McpClient(pair, session="agent-1")
    client.initialize()
    return client


def test_initialize_mints_a_session_and_answers_with_the_request_id(pair: EnginePair) -> None:
    client = McpClient(pair)
    client.next_id = 41
    answer = client.initialize()
    assert answer.status == 200
    assert answer.headers["x-chaosllm-recording"] == "mcp-search/0001"
    (message,) = messages(answer)
    assert message["id"] == 42 and message["result"]["serverInfo"]["name"] == "search"
    assert client.mcp_session is not None and len(client.mcp_session) == 32
    other = McpClient(pair)
    other.initialize()
    assert other.mcp_session not in (None, client.mcp_session)


def test_session_ids_follow_the_seed(tmp_path: Path) -> None:
    root = write_recordings(tmp_path)

    def minted(seed: int) -> str | None:
        client = McpClient(EnginePair.of(root, seed=seed))
        client.initialize()
        return client.mcp_session

    assert minted(7) == minted(7) != minted(8)


def test_a_call_replays_its_progress_with_the_live_token_and_id(client: McpClient) -> None:
    answer = client.call(token="tok-9")
    progress, result = messages(answer)
    assert progress["method"] == "notifications/progress"
    assert progress["params"]["progressToken"] == "tok-9"
    assert result["id"] == client.next_id and result["result"]["structuredContent"] == {"hits": 3}
    record = answer.record
    assert record["method"] == "tools/call" and record["tool"] == "search"
    assert record["path"] == PATH and record["session"] == "agent-1"
    assert record["match"] == "exact"


def test_json_is_answered_when_the_client_accepts_no_sse(client: McpClient) -> None:
    message = {"jsonrpc": "2.0", "id": 5, "method": "tools/list"}
    headers = (("accept", "application/json"), ("mcp-session-id", client.mcp_session or ""))
    answer = client.pair.send(message, path=PATH, headers=headers)
    assert answer.headers["content-type"].startswith("application/json")
    assert answer.json()["id"] == 5 and len(answer.json()["result"]["tools"]) == 2


def test_nearest_matching_serves_a_close_call(tmp_path: Path) -> None:
    client = McpClient(EnginePair.of(write_recordings(tmp_path), nearest_threshold=0.75))
    client.initialize()
    answer = client.call({"q": QUERY.replace("call", "calls")})
    assert answer.record["match"] == "nearest"


def test_a_miss_is_a_json_rpc_error_naming_the_nearest(client: McpClient) -> None:
    answer = client.call({"q": "something else entirely, far from the recording"}, name="fetch")
    assert answer.status == 200  # never a 404: clients read that as a lost session
    (message,) = messages(answer)
    assert message["id"] == client.next_id
    assert message["error"]["code"] == NO_RECORDING_CODE
    assert "mcp-search/0003" in message["error"]["message"]
    assert answer.record["miss"] is True


def test_notifications_and_client_responses_are_accepted(client: McpClient) -> None:
    for message in (
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3}},
        {"jsonrpc": "2.0", "id": "srv-1", "result": {}},
    ):
        answer = client.post(message)
        assert answer.status == 202 and answer.body == b""


def test_ping_needs_no_recording(client: McpClient) -> None:
    (message,) = messages(client.request("ping"))
    assert message == {"jsonrpc": "2.0", "id": client.next_id, "result": {}}


def test_sessions_are_required_after_initialize(pair: EnginePair, client: McpClient) -> None:
    missing = pair.send(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, path=PATH, headers=ACCEPT
    )
    assert missing.status == 400 and missing.json()["error"]["code"] == INVALID_REQUEST
    unknown = pair.send(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        path=PATH,
        headers=(*ACCEPT, ("mcp-session-id", "not-minted")),
    )
    assert unknown.status == 404
    other_server = pair.send(
        {"jsonrpc": "2.0", "id": 1, "method": "ping"},
        path="/mcp/other",
        headers=client.headers(),
    )
    assert other_server.status == 404  # a session belongs to its server


def test_the_newest_revision_has_no_sessions(pair: EnginePair) -> None:
    headers = (*ACCEPT, ("mcp-protocol-version", "2026-07-28"))
    answer = pair.send({"jsonrpc": "2.0", "id": 1, "method": "ping"}, path=PATH, headers=headers)
    assert answer.status == 200


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"{not json", PARSE_ERROR),
        (b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', INVALID_REQUEST),
        (b'{"jsonrpc": "1.0", "id": 1, "method": "ping"}', INVALID_REQUEST),
        (b'{"jsonrpc": "2.0", "id": true, "method": "ping"}', INVALID_REQUEST),
        (b'{"jsonrpc": "2.0", "id": 1}', INVALID_REQUEST),
        (b'"ping"', INVALID_REQUEST),
    ],
)
def test_bad_input_gets_the_spec_errors(client: McpClient, raw: bytes, code: int) -> None:
    answer = client.pair.send(None, raw=raw, path=PATH, headers=client.headers())
    assert answer.status == 400
    assert answer.json()["error"]["code"] == code and answer.json()["id"] is None
    assert answer.record["status"] == 400 and answer.record["recording"] is None


def test_an_unknown_method_is_method_not_found(client: McpClient) -> None:
    (message,) = messages(client.request("tools/frobnicate"))
    assert message["error"]["code"] == METHOD_NOT_FOUND and message["id"] == client.next_id


# -- faults -------------------------------------------------------------------------------


def fault(client: McpClient, spec: dict[str, Any]) -> None:
    client.pair.arm(spec)


def test_mcp_error(client: McpClient) -> None:
    fault(
        client,
        {"type": "mcp_error", "code": -32002, "message": "gone", "match": {"server": "search"}},
    )
    (message,) = messages(client.request("tools/list"))
    assert message["error"] == {"code": -32002, "message": "gone"}
    assert message["id"] == client.next_id


def test_tool_error_fires_on_the_named_tool_only(client: McpClient) -> None:
    fault(client, {"type": "tool_error", "message": "quota", "match": {"tool": "search"}})
    assert "error" not in messages(client.request("tools/list"))[0]
    result = messages(client.call())[-1]["result"]
    assert result["isError"] is True and result["content"][0]["text"] == "quota"


def test_mcp_timeout_sends_the_head_then_nothing(client: McpClient) -> None:
    fault(client, {"type": "mcp_timeout", "max_ms": 500})
    plan = client.call().reply.plan
    assert plan.ending is Ending.STALL and plan.stall_ms == 500 and not plan.pieces


def test_mcp_stream_drop_keeps_progress_and_never_the_result(client: McpClient) -> None:
    fault(client, {"type": "mcp_stream_drop", "after_events": 1})
    answer = client.call(token=1)
    assert [m.get("method") for m in messages(answer)] == ["notifications/progress"]
    assert answer.reply.plan.ending is Ending.COMPLETE


def test_mcp_session_lost_ends_the_session(client: McpClient) -> None:
    fault(client, {"type": "mcp_session_lost", "match": {"server": "search"}})
    assert client.call().status == 404
    assert client.request("tools/list").status == 404  # lost for good
    client.initialize()
    assert client.request("tools/list").status == 200


def test_tools_changed_notifies_then_lists_other_tools(client: McpClient) -> None:
    fault(client, {"type": "tools_changed", "match": {"tool": "search"}})
    first = messages(client.call())
    assert first[0] == {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
    assert "result" in first[-1]
    tools = messages(client.request("tools/list"))[0]["result"]["tools"]
    assert [t["name"] for t in tools] == ["fetch", "chaosllm_added_tool"]


def test_bad_tool_output_breaks_the_structured_content(client: McpClient) -> None:
    fault(client, {"type": "bad_tool_output"})
    result = messages(client.call())[-1]["result"]
    assert result["structuredContent"] == {"hits": "0"}  # outputSchema says integer


def test_model_faults_spare_mcp_requests_unless_matched(client: McpClient) -> None:
    fault(client, {"type": "http_error", "status": 500})
    assert client.request("tools/list").status == 200
    fault(client, {"type": "latency", "delay_ms": 250, "match": {"server": "search"}})
    assert client.request("tools/list").reply.plan.head_delay_ms == 250
    fault(client, {"type": "garbage", "match": {"server": "search"}})
    assert client.call().reply.plan.ending is Ending.CLOSE


def test_mcp_faults_spare_model_requests(pair: EnginePair) -> None:
    fault(McpClient(pair), {"type": "mcp_error"})
    chat = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    assert pair.send(chat).record["fault"] is None
    assert len(pair.engine.board) == 1  # still armed, waiting for an MCP request


def test_one_journal_holds_model_and_mcp_requests(client: McpClient) -> None:
    client.call()
    journal = client.pair.journal("agent-1")
    assert [(e["method"], e.get("tool")) for e in journal] == [
        ("initialize", None),
        ("notifications/initialized", None),
        ("tools/call", "search"),
    ]


# -- verdicts -----------------------------------------------------------------------------


def verdicts(pair: EnginePair) -> list[str]:
    return [f.name for f in findings(pair.engine.journal.entries(), pair.engine.board.history())]


def test_tool_executed_twice_after_retry(client: McpClient) -> None:
    client.call()
    assert verdicts(client.pair) == []
    client.call()  # the same arguments again, after it had run
    assert verdicts(client.pair) == ["tool_executed_twice_after_retry"]


def test_a_call_retried_after_a_failure_is_no_double_execution(client: McpClient) -> None:
    fault(client, {"type": "mcp_stream_drop", "match": {"tool": "search"}})
    client.call()
    client.call()
    assert verdicts(client.pair) == []


def test_no_reinitialize_after_session_lost(client: McpClient) -> None:
    fault(client, {"type": "mcp_session_lost", "match": {"tool": "search"}})
    client.call()
    client.request("tools/list")  # with the lost session
    assert verdicts(client.pair) == ["no_reinitialize_after_session_lost"]


def test_reinitializing_after_a_lost_session_is_fine(client: McpClient) -> None:
    fault(client, {"type": "mcp_session_lost", "match": {"tool": "search"}})
    client.call()
    client.initialize()
    client.request("tools/list")
    assert verdicts(client.pair) == []


CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}


def test_tool_error_hidden_from_model(client: McpClient) -> None:
    fault(client, {"type": "tool_error", "message": "index offline", "match": {"tool": "search"}})
    client.call()
    client.pair.send(CHAT, session="agent-1")  # the error is not in it
    assert verdicts(client.pair) == ["tool_error_hidden_from_model"]


def test_a_tool_error_the_model_sees_is_no_finding(client: McpClient) -> None:
    fault(client, {"type": "tool_error", "message": "index offline", "match": {"tool": "search"}})
    client.call()
    told = {**CHAT, "messages": [*CHAT["messages"], {"role": "user", "content": "index offline"}]}
    client.pair.send(told, session="agent-1")
    assert verdicts(client.pair) == []
