"""Workspace templating and id remapping: recordings made in one workspace, with ids minted
in one run, replay in another (seeds/completion-test-api.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from chaosllm import ChaosServer
from chaosllm.model import Exchange, RecordedChunk, RecordedRequest, RecordedResponse
from chaosllm.providers import OpenAIChat
from chaosllm.providers.openai_chat import OpenAIChatCodec, sse_frame
from chaosllm.store.templating import (
    WORKSPACE_TOKEN,
    adapt,
    learn_id_map,
    remap_ids,
    substitute_workspace,
    tokenize_workspace,
)
from tests.helpers import chat_messages, openai_client

P = OpenAIChat()
CODEC = OpenAIChatCodec()  # typed: its stream_frames takes include_usage
LIVE = "/tmp/chaos-run-42/workspace"
SYSTEM = {"role": "system", "content": "You are a coding agent. Work in the workspace."}


def completion(message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-rec",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, **message},
                "logprobs": None,
                "finish_reason": finish,
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def write_recording(
    root: Path, name: str, request: dict[str, Any], answer: dict[str, Any], *, stream: bool = False
) -> None:
    response: dict[str, Any] = {"status": 200, "body": answer}
    if stream:
        response["chunks"] = [
            {"data": f, "delay_ms": 0} for f in CODEC.stream_frames(answer, include_usage=False)
        ]
    path = root / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"chaosllm": 1, "request": {"body": request}, "response": response}), "utf-8"
    )


# -- pure ------------------------------------------------------------------------------


def test_tokenize_and_substitute_round_trip() -> None:
    body = {
        "messages": [
            {"role": "user", "content": f"Edit {LIVE}/src/app.py please"},
            {
                "role": "assistant",
                "tool_calls": [tool_call("c1", "read_file", {"path": f"{LIVE}/src/app.py"})],
            },
            {"role": "user", "content": f"not {LIVE}2/x nor /var{LIVE}"},
        ]
    }
    keyed = tokenize_workspace(body, LIVE + "/")
    assert keyed["messages"][0]["content"] == f"Edit {WORKSPACE_TOKEN}/src/app.py please"
    assert json.loads(keyed["messages"][1]["tool_calls"][0]["function"]["arguments"]) == {
        "path": f"{WORKSPACE_TOKEN}/src/app.py"
    }
    assert keyed["messages"][2] is body["messages"][2]  # a longer path is another path
    assert substitute_workspace(keyed, LIVE) == body
    untouched = {"messages": [{"role": "user", "content": "nothing here"}]}
    assert tokenize_workspace(untouched, LIVE) is untouched
    assert substitute_workspace(untouched, LIVE) is untouched


def test_a_windows_workspace_stays_valid_json_in_arguments() -> None:
    live = "C:\\Users\\ci\\ws"
    answer = completion(
        {
            "tool_calls": [tool_call("c1", "write_file", {"path": f"{WORKSPACE_TOKEN}\\out.txt"})],
            "content": f"Writing to {WORKSPACE_TOKEN}",
        }
    )
    served = substitute_workspace(answer, live)
    message = served["choices"][0]["message"]
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {
        "path": "C:\\Users\\ci\\ws\\out.txt"
    }
    assert message["content"] == "Writing to C:\\Users\\ci\\ws"
    request = {
        "messages": [
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "c1", "function": {"arguments": json.dumps({"path": live + "\\a"})}}
                ],
            }
        ]
    }
    keyed = tokenize_workspace(request, live)
    assert json.loads(keyed["messages"][0]["tool_calls"][0]["function"]["arguments"]) == {
        "path": WORKSPACE_TOKEN + "\\a"
    }


def test_learn_and_remap_ids() -> None:
    recorded = {
        "messages": [
            SYSTEM,
            {"role": "user", "content": "spawn a reviewer"},
            {"role": "assistant", "tool_calls": [tool_call("call_rec_1", "agent_spawn", {})]},
            {
                "role": "tool",
                "tool_call_id": "call_rec_1",
                "content": '{"sessionId": "sess_7f3a91", "status": "started"}',
            },
        ]
    }
    live = json.loads(
        json.dumps(recorded)
        .replace("call_rec_1", "call_live_9")
        .replace("sess_7f3a91", "sess_c0ffee42")
    )
    live["messages"][1]["content"] = "spawn a reviewer"
    mapping = learn_id_map(recorded, live)
    assert mapping == {"call_rec_1": "call_live_9", "sess_7f3a91": "sess_c0ffee42"}
    answer = completion(
        {
            "tool_calls": [
                tool_call(
                    "call_rec_2",
                    "agent_message",
                    {"sessionId": "sess_7f3a91", "text": "sess_7f3a91x stays"},
                )
            ]
        }
    )
    remapped = remap_ids(answer, mapping)
    arguments = json.loads(
        remapped["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    )
    assert arguments == {"sessionId": "sess_c0ffee42", "text": "sess_7f3a91x stays"}
    assert remap_ids(answer, {}) is answer


def test_texts_that_differ_beyond_ids_teach_nothing() -> None:
    recorded = {"messages": [{"role": "user", "content": "open sess_1234 now"}]}
    live = {"messages": [{"role": "user", "content": "close sess_9999 later"}]}
    assert learn_id_map(recorded, live) == {}


def test_adapt_rewrites_stream_frames_or_falls_back_to_the_body() -> None:
    answer = completion(
        {
            "tool_calls": [
                tool_call(
                    "c1",
                    "write_file",
                    {"path": f"{WORKSPACE_TOKEN}/notes/todo.txt", "content": "hi"},
                )
            ]
        },
        "tool_calls",
    )
    arguments = answer["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    cut = arguments.index(WORKSPACE_TOKEN) + 5

    def frame(delta: dict[str, Any], finish: str | None = None) -> str:
        return sse_frame(
            {
                "id": "x",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "gpt-4o",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
        )

    def args(piece: str) -> dict[str, Any]:
        return {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}

    frames = [
        frame(
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "write_file", "arguments": ""},
                    }
                ],
            }
        ),
        frame(args(arguments[:cut])),
        frame(args(arguments[cut:])),
        frame({}, "tool_calls"),
        "data: [DONE]\n\n",
    ]
    assert not any(WORKSPACE_TOKEN in f for f in frames)  # split across argument deltas
    exchange = Exchange(
        provider="openai.chat",
        request=RecordedRequest("POST", "/v1/chat/completions", {"messages": []}),
        response=RecordedResponse(
            200, answer, stream=True, chunks=tuple(RecordedChunk(f) for f in frames)
        ),
        digest="d",
        name="s/0001",
        scenario="s",
    )
    served, _ = adapt(exchange, {}, workspace=LIVE, remap=False, assemble=P.assemble)
    assert served.response.chunks is None  # re-rendered from the rewritten body
    arguments = served.response.body["choices"][0]["message"]["tool_calls"][0]["function"][
        "arguments"
    ]
    assert json.loads(arguments)["path"] == f"{LIVE}/notes/todo.txt"
    # A token whole inside one frame is rewritten in place: the frames are kept.
    whole = CODEC.stream_frames(
        completion({"content": f"Saved to {WORKSPACE_TOKEN}."}), include_usage=False
    )
    whole = ["".join(whole[:-2]), *whole[-2:]]  # role and content deltas in one chunk
    kept = Exchange(
        provider="openai.chat",
        request=exchange.request,
        response=RecordedResponse(
            200, P.assemble(whole), stream=True, chunks=tuple(RecordedChunk(f) for f in whole)
        ),
        digest="d",
        name="s/0002",
        scenario="s",
    )
    served, _ = adapt(kept, {}, workspace=LIVE, remap=False, assemble=P.assemble)
    assert served.response.chunks is not None and LIVE in served.response.chunks[0].data


# -- in the server ----------------------------------------------------------------------

ASK_WRITE = {
    "model": "gpt-4o",
    "messages": [
        SYSTEM,
        {"role": "user", "content": f"Create {WORKSPACE_TOKEN}/notes/todo.txt with 'hi'."},
    ],
}
WRITE_ANSWER = completion(
    {
        "tool_calls": [
            tool_call(
                "call_w1",
                "write_file",
                {"path": f"{WORKSPACE_TOKEN}/notes/todo.txt", "content": "hi"},
            )
        ]
    },
    "tool_calls",
)


@pytest.fixture
def workspace_server(tmp_path: Path) -> Iterator[ChaosServer]:
    write_recording(tmp_path / "recs", "files/0001", ASK_WRITE, WRITE_ANSWER, stream=True)
    with ChaosServer(tmp_path / "recs") as server:
        yield server


def live_request() -> dict[str, Any]:
    request: dict[str, Any] = json.loads(json.dumps(ASK_WRITE).replace(WORKSPACE_TOKEN, LIVE))
    return request


def test_workspace_templating_through_the_sdk(workspace_server: ChaosServer) -> None:
    with httpx.Client(base_url=workspace_server.url, timeout=10) as control:
        assert control.post("/__fault", json={"type": "http_503"}).status_code == 201
        r = control.post("/__workspace", json={"path": LIVE})
        assert r.json() == {"workspace": LIVE, "disarmed": 1}  # faults disarmed
    with openai_client(workspace_server) as sdk:
        completion_ = sdk.chat.completions.create(**live_request())
        with sdk.chat.completions.create(**live_request(), stream=True) as stream:
            pieces = [
                c.function.arguments or ""
                for chunk in stream
                for choice in chunk.choices
                for c in choice.delta.tool_calls or []
                if c.function
            ]
    [call] = completion_.choices[0].message.tool_calls or []
    assert json.loads(call.function.arguments)["path"] == f"{LIVE}/notes/todo.txt"
    assert json.loads("".join(pieces))["path"] == f"{LIVE}/notes/todo.txt"
    assert [e["match"] for e in workspace_server.requests()] == ["exact", "exact"]


def test_bad_workspace_requests(workspace_server: ChaosServer) -> None:
    with httpx.Client(base_url=workspace_server.url, timeout=10) as control:
        assert control.post("/__workspace", json={"dir": LIVE}).status_code == 400
        assert control.post("/__workspace", json={"path": ""}).status_code == 400
        assert control.post("/__workspace", json={"path": None}).json()["workspace"] is None
    workspace_server.set_workspace(LIVE)
    assert workspace_server.state.matcher.workspace == LIVE


SPAWNED = "4b1d0c3e-8f2a-4e6b-9c7d-1a2b3c4d5e6f"


def spawn_flow(session_id: str) -> list[dict[str, Any]]:
    return [
        SYSTEM,
        {"role": "user", "content": "Spawn a reviewer agent for the README."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [tool_call("call_spawn_1", "agent_spawn", {"task": "review"})],
        },
        {
            "role": "tool",
            "tool_call_id": "call_spawn_1",
            "content": json.dumps({"sessionId": session_id, "status": "started"}),
        },
    ]


def test_ids_minted_in_an_earlier_step_are_remapped(tmp_path: Path) -> None:
    first = {"model": "gpt-4o", "messages": spawn_flow("")[:2]}
    write_recording(
        tmp_path,
        "agents/0001",
        first,
        completion(
            {"tool_calls": [tool_call("call_spawn_1", "agent_spawn", {"task": "review"})]},
            "tool_calls",
        ),
    )
    write_recording(
        tmp_path,
        "agents/0002",
        {"model": "gpt-4o", "messages": spawn_flow(SPAWNED)},
        completion(
            {
                "tool_calls": [
                    tool_call(
                        "call_msg_1",
                        "agent_message",
                        {"sessionId": SPAWNED, "text": "Start with the intro."},
                    )
                ]
            },
            "tool_calls",
        ),
    )
    live_id = "9e8d7c6b-5a49-4838-a726-150f0e0d0c0b"
    with (
        ChaosServer(tmp_path) as server,
        openai_client(server) as sdk,
    ):
        step1 = sdk.chat.completions.create(
            model="gpt-4o", messages=chat_messages(spawn_flow("")[:2])
        )
        spawn = (step1.choices[0].message.tool_calls or [])[0]
        assert spawn.type == "function" and spawn.function.name == "agent_spawn"
        step2 = sdk.chat.completions.create(
            model="gpt-4o", messages=chat_messages(spawn_flow(live_id))
        )
        [call] = step2.choices[0].message.tool_calls or []
        assert call.type == "function"
        assert json.loads(call.function.arguments) == {
            "sessionId": live_id,
            "text": "Start with the intro.",
        }
        assert [e["match"] for e in server.requests()] == ["exact", "nearest"]
