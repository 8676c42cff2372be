"""Trace fixtures (seeds/trace-fixtures.md): the document's own examples replay through
the official openai SDK, in order, per session; hints and expected tool results are
checked and journaled; recorded extras are kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import (
    ChatCompletionMessage,
    ChatCompletionMessageToolCallUnion,
    ChatCompletionToolParam,
)

from chaosllm import ChaosServer
from chaosllm.model import Keying
from chaosllm.store.recordings import RecordingStore
from tests.helpers import chat_messages, session_client
from tests.memory import EnginePair

STEERING = {
    "model_name": "advanced-steering",
    "turns": [
        {
            "user_input": "Write hello to /tmp/test.txt",
            "steps": [
                {
                    "response": {
                        "type": "tool_calls",
                        "tool_calls": [
                            {
                                "id": "c1",
                                "name": "write_file",
                                "arguments": {"path": "/tmp/test.txt", "content": "hello"},
                            }
                        ],
                        "input_tokens": 60,
                        "output_tokens": 20,
                    }
                },
                {
                    "response": {
                        "type": "text",
                        "content": "Done.",
                        "input_tokens": 80,
                        "output_tokens": 5,
                    }
                },
            ],
        },
        {
            "user_input": "Actually, change it to goodbye",
            "steps": [
                {
                    "response": {
                        "type": "tool_calls",
                        "tool_calls": [
                            {
                                "id": "c2",
                                "name": "write_file",
                                "arguments": {"path": "/tmp/test.txt", "content": "goodbye"},
                            }
                        ],
                        "input_tokens": 100,
                        "output_tokens": 20,
                    }
                },
                {
                    "response": {
                        "type": "text",
                        "content": "Updated.",
                        "input_tokens": 120,
                        "output_tokens": 5,
                    }
                },
            ],
        },
    ],
}

TOOL_ECHO = {
    "model_name": "spot-tool-echo",
    "turns": [
        {
            "user_input": "Please echo hello for me",
            "steps": [
                {
                    "request_hint": {"last_user_message_contains": "echo"},
                    "response": {
                        "type": "tool_calls",
                        "tool_calls": [
                            {"id": "call_echo_1", "name": "echo", "arguments": {"message": "hello"}}
                        ],
                        "input_tokens": 60,
                        "output_tokens": 20,
                    },
                },
                {
                    "response": {
                        "type": "text",
                        "content": "The echo tool returned: hello",
                        "input_tokens": 80,
                        "output_tokens": 15,
                    }
                },
            ],
        }
    ],
}

RECORDED = {
    "model_name": "recorded-claude-3-5-sonnet",
    "memory_snapshot": [
        {"path": "context/vision.md", "content": "# Vision\nBuild a secure AI assistant."}
    ],
    "http_exchanges": [
        {
            "request": {"method": "GET", "url": "https://api.example.com/time"},
            "response": {"status": 200, "body": '{"time": "14:30"}'},
        }
    ],
    "steps": [
        {"response": {"type": "user_input", "content": "What time is it?"}},
        {
            "request_hint": {
                "last_user_message_contains": "What time is it?",
                "min_message_count": 2,
            },
            "response": {
                "type": "tool_calls",
                "tool_calls": [
                    {
                        "id": "call_http_1",
                        "name": "http",
                        "arguments": {"url": "https://api.example.com/time"},
                    }
                ],
                "input_tokens": 60,
                "output_tokens": 20,
            },
        },
        {
            "request_hint": {"min_message_count": 4},
            "expected_tool_results": [
                {
                    "tool_call_id": "call_http_1",
                    "name": "http",
                    "content": '{"status":200,"body":{"time":"14:30"}}',
                }
            ],
            "response": {
                "type": "text",
                "content": "The current time is 2:30 PM.",
                "input_tokens": 80,
                "output_tokens": 15,
            },
        },
    ],
}

SYSTEM = {"role": "system", "content": "You are IronClaw."}

# The tools the agent offers: a request without tools gets the next text step, as
# TraceLlm's complete() does.
TOOLS: list[ChatCompletionToolParam] = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in ("write_file", "echo", "http")
]


def write(directory: Path, name: str, trace: dict[str, Any]) -> None:
    path = directory / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trace, indent=2), "utf-8")


@pytest.fixture
def fixtures(tmp_path: Path) -> Path:
    root = tmp_path / "llm_traces"
    write(root, "advanced/steering", STEERING)
    write(root, "spot/tool_echo", TOOL_ECHO)
    write(root, "recorded_time", RECORDED)
    return root


def tool_result(call: ChatCompletionMessageToolCallUnion, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call.id, "content": content}


def assistant(message: ChatCompletionMessage) -> dict[str, Any]:
    return message.model_dump(exclude_none=True, exclude={"refusal", "annotations", "audio"})


def test_traces_load_as_ordered_scenarios(fixtures: Path) -> None:
    store = RecordingStore.load([fixtures])
    assert store.errors == []
    assert store.sequence_scenarios == {
        "advanced/steering": "advanced-steering",
        "recorded_time": "recorded-claude-3-5-sonnet",
        "spot/tool_echo": "spot-tool-echo",
    }
    steering = store.by_scenario["advanced/steering"]
    assert [e.name for e in steering] == [f"advanced/steering/000{i}" for i in range(1, 5)]
    assert all(e.keyed_by == Keying.SEQUENCE for e in store.exchanges)
    # user_input steps are skipped: the recorded trace has two LLM calls
    assert len(store.by_scenario["recorded_time"]) == 2
    assert store.by_digest == {}


def run_steering(client: openai.OpenAI, model: str) -> list[Any]:
    """The agent loop of the steering example: two turns, a tool call and a text each."""
    messages: list[dict[str, Any]] = [SYSTEM]
    answers = []
    for user in ("Write hello to /tmp/test.txt", "Actually, change it to goodbye"):
        messages.append({"role": "user", "content": user})
        while True:
            completion = client.chat.completions.create(
                tools=TOOLS, model=model, messages=chat_messages(messages)
            )
            message = completion.choices[0].message
            answers.append(completion)
            messages.append(assistant(message))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                messages.append(tool_result(call, "ok"))
    return answers


def test_steering_replays_in_order_through_the_sdk(server: ChaosServer) -> None:
    with session_client(server, "steer") as client:
        answers = run_steering(client, "advanced-steering")
    assert [a.choices[0].finish_reason for a in answers] == [
        "tool_calls",
        "stop",
        "tool_calls",
        "stop",
    ]
    first_call = (answers[0].choices[0].message.tool_calls or [])[0]
    assert first_call.id == "c1" and first_call.function.name == "write_file"
    assert json.loads(first_call.function.arguments) == {
        "path": "/tmp/test.txt",
        "content": "hello",
    }
    assert answers[1].choices[0].message.content == "Done."
    assert (
        json.loads((answers[2].choices[0].message.tool_calls or [])[0].function.arguments)[
            "content"
        ]
        == "goodbye"
    )
    assert answers[3].choices[0].message.content == "Updated."
    assert answers[0].usage is not None and answers[0].usage.prompt_tokens == 60
    journal = server.requests("steer")
    assert [e["match"] for e in journal] == ["sequence"] * 4
    assert [e["findings"] for e in journal] == [[]] * 4


# -- in memory: the engine alone (tests/memory.py) ------------------------------------------


def user(text: str, model: str = "advanced-steering") -> dict[str, Any]:
    return {"model": model, "messages": [SYSTEM, {"role": "user", "content": text}], "tools": TOOLS}


def test_more_llm_calls_than_steps_is_a_clear_error(fixtures: Path) -> None:
    pair = EnginePair.of(fixtures)
    steps = [pair.send(user("Write hello to /tmp/test.txt"), session="x") for _ in range(4)]
    assert [s.status for s in steps] == [200] * 4
    assert [s.record["match"] for s in steps] == ["sequence"] * 4
    assert len({s.reply.recording for s in steps}) == 4  # each step once, in order
    extra = pair.send(user("and once more?"), session="x")
    assert extra.status == 404
    message = extra.error["message"]
    assert "More LLM calls than the trace 'advanced/steering' has steps" in message
    assert "this is call 5" in message


def test_sessions_follow_their_trace_independently(fixtures: Path) -> None:
    pair = EnginePair.of(fixtures)
    first_a = pair.send(user("Write hello to /tmp/test.txt"), session="a")
    first_b = pair.send(user("Write hello to /tmp/test.txt"), session="b")
    second_a = pair.send(user("Write hello to /tmp/test.txt"), session="a")
    call = first_a.json()["choices"][0]["message"]["tool_calls"][0]
    assert call["id"] == "c1" and first_b.body == first_a.body
    assert second_a.json()["choices"][0]["message"]["content"] == "Done."


def test_stream_replay_of_a_trace_step(server: ChaosServer) -> None:
    with (
        session_client(server, "stream") as client,
        client.chat.completions.create(
            tools=TOOLS,
            model="spot-tool-echo",
            stream=True,
            messages=[{"role": "user", "content": "Please echo hello for me"}],
        ) as stream,
    ):
        chunks = list(stream)
    calls = [
        c for chunk in chunks for choice in chunk.choices for c in choice.delta.tool_calls or []
    ]
    assert calls[0].id == "call_echo_1"
    assert json.loads("".join(c.function.arguments or "" for c in calls if c.function)) == {
        "message": "hello"
    }
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_echo_with_hint_satisfied_and_mismatched(fixtures: Path) -> None:
    pair = EnginePair.of(fixtures)
    first = pair.send(user("Please echo hello for me", "spot-tool-echo"), session="ok")
    assert first.record["findings"] == []
    mismatched = pair.send(user("Please say hello for me", "spot-tool-echo"), session="hint")
    # A hint is soft: the call is answered, and the mismatch is in the journal.
    assert mismatched.status == 200 and mismatched.body == first.body
    [finding] = mismatched.record["findings"]
    assert finding["oracle"] == "trace" and finding["check"] == "request_hint"
    assert finding["severity"] == "warning"
    assert "'echo' is not in the last user message" in finding["message"]


def test_findings_are_listed_over_http(server: ChaosServer) -> None:
    with session_client(server, "hint") as client:
        client.chat.completions.create(
            tools=TOOLS,
            model="spot-tool-echo",
            messages=[{"role": "user", "content": "Please say hello for me"}],
        )
    listed = httpx.get(server.url + "/__findings", params={"session": "hint"}).json()
    assert [f["check"] for f in listed["findings"]] == ["request_hint"]


def recorded_flow(client: openai.OpenAI, tool_output: str) -> Any:
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "What time is it?"}]
    first = client.chat.completions.create(
        tools=TOOLS, model="recorded-claude-3-5-sonnet", messages=chat_messages(messages)
    )
    message = first.choices[0].message
    messages.append(assistant(message))
    messages.append({**tool_result((message.tool_calls or [])[0], tool_output), "name": "http"})
    return client.chat.completions.create(
        tools=TOOLS, model="recorded-claude-3-5-sonnet", messages=chat_messages(messages)
    )


def test_recorded_legacy_trace_checks_expected_tool_results(server: ChaosServer) -> None:
    same = '{"status":200,"body":{"time":"14:30"}}'
    with session_client(server, "same") as client:
        answer = recorded_flow(client, same)
    assert answer.choices[0].message.content == "The current time is 2:30 PM."
    assert [e["findings"] for e in server.requests("same")] == [[], []]
    with session_client(server, "changed") as client:
        answer = recorded_flow(client, '{"status":200,"body":{"time":"09:15"}}')
    assert answer.choices[0].message.content == "The current time is 2:30 PM."
    [finding] = server.requests("changed")[1]["findings"]
    assert finding["check"] == "expected_tool_result" and finding["oracle"] == "trace"
    assert "call_http_1" in finding["message"] and "09:15" in finding["message"]


def test_memory_snapshot_and_http_exchanges_are_kept(server: ChaosServer) -> None:
    listing = httpx.get(server.url + "/__recordings").json()
    info = listing["scenarios"]["recorded_time"]
    assert info["memory_snapshot"] == RECORDED["memory_snapshot"]
    assert info["http_exchanges"] == RECORDED["http_exchanges"]
    assert info["model_name"] == "recorded-claude-3-5-sonnet" and info["layout"] == "steps"
    steering = listing["scenarios"]["advanced/steering"]
    assert [t["user_input"] for t in steering["turns"]] == [
        "Write hello to /tmp/test.txt",
        "Actually, change it to goodbye",
    ]


def first_call_id(client: openai.OpenAI, question: str) -> str:
    """The id of the first tool call answering `question` (asked with the TOOLS offered)."""
    answer = client.chat.completions.create(
        tools=TOOLS, model="gpt-4o-mini", messages=[{"role": "user", "content": question}]
    )
    return (answer.choices[0].message.tool_calls or [])[0].id


def test_a_single_trace_needs_no_model_name(tmp_path: Path) -> None:
    write(tmp_path, "echo", TOOL_ECHO)
    with ChaosServer(tmp_path) as server, session_client(server, "s") as client:
        assert first_call_id(client, "Please echo hello for me") == "call_echo_1"


def test_several_traces_and_an_unknown_model_say_how_to_choose(server: ChaosServer) -> None:
    with session_client(server, "which") as client, pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(
            tools=TOOLS, model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
        )
    message = str(caught.value)
    assert "POST /__scenario" in message and "advanced/steering" in message
    server.use_scenario("advanced/steering", "which")
    with session_client(server, "which") as client:
        assert first_call_id(client, "Write hello to /tmp/test.txt") == "c1"


def test_bad_traces_are_reported(tmp_path: Path) -> None:
    write(tmp_path, "no_model", {"turns": []})
    write(
        tmp_path,
        "bad_type",
        {"model_name": "m", "steps": [{"response": {"type": "image", "content": "x"}}]},
    )
    write(
        tmp_path,
        "only_markers",
        {"model_name": "m", "steps": [{"response": {"type": "user_input", "content": "x"}}]},
    )
    store = RecordingStore.load([tmp_path])
    problems = {Path(e.path).stem: e.problem for e in store.errors}
    assert '"model_name" is required' in problems["no_model"]
    assert 'must be "text", "tool_calls" or "user_input"' in problems["bad_type"]
    assert "nothing to replay" in problems["only_markers"]
