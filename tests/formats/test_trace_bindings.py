"""IronClaw's traces as its ``TraceLlm`` replays them (tests/support/trace_llm.rs): result
bindings and templates resolved from live tool results, steps chosen by hint for
interleaved threads, hints compared case-insensitively, a request without tools answered
by the next text step, a clear error when two traces share a model_name, and the trace's
own context kept. Fixtures are written here in the real shapes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionToolParam

from chaosllm import ChaosServer
from chaosllm.store.formats.importer import import_recordings
from chaosllm.store.recordings import RecordingStore
from chaosllm.store.templating import resolve_trace_arguments
from tests.helpers import chat_messages, session_client
from tests.memory import EnginePair

TOOLS: list[ChatCompletionToolParam] = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in ("create_file", "read_file", "search", "open_url", "memory_write")
]


def tool_step(call_id: str, name: str, arguments: Any, hint: str | None = None) -> dict[str, Any]:
    step: dict[str, Any] = {
        "response": {
            "type": "tool_calls",
            "tool_calls": [{"id": call_id, "name": name, "arguments": arguments}],
            "input_tokens": 50,
            "output_tokens": 10,
        }
    }
    if hint is not None:
        step["request_hint"] = {"last_user_message_contains": hint}
    return step


def text_step(content: str, hint: str | None = None) -> dict[str, Any]:
    step: dict[str, Any] = {
        "response": {"type": "text", "content": content, "input_tokens": 70, "output_tokens": 5}
    }
    if hint is not None:
        step["request_hint"] = {"last_user_message_contains": hint}
    return step


BOUND: dict[str, Any] = {
    "model_name": "bound-results",
    "turns": [
        {
            "user_input": "Create a file and read it back",
            "steps": [
                tool_step("call_create", "create_file", {"name": "notes.txt"}),
                tool_step(
                    "call_read",
                    "read_file",
                    {
                        "file_id": {
                            "$trace_result": {"tool_call_id": "call_create", "pointer": "/file/id"}
                        },
                        "sizes": [
                            {
                                "$trace_result": {
                                    "tool_call_id": "call_create",
                                    "pointer": "/file/sizes/1",
                                }
                            }
                        ],
                    },
                ),
                text_step("Read it."),
            ],
        }
    ],
}

TEMPLATED: dict[str, Any] = {
    "model_name": "templated-args",
    "turns": [
        {
            "user_input": "Search and open the first hit",
            "steps": [
                tool_step("call_search", "search", {"q": "chaos"}),
                tool_step(
                    "call_open",
                    "open_url",
                    {
                        "url": "{{call_search.url}}",
                        "note": "rank {{call_search.rank}} of {{tool:search.total}} hits",
                        "exact": "{{call_search.exact}}",
                        "unknown": "{{call_search.missing}} stays",
                    },
                ),
                text_step("Opened."),
            ],
        }
    ],
}

INTERLEAVED: dict[str, Any] = {
    "model_name": "mission-interleaved",
    "turns": [
        {
            "user_input": "What's the weather?",
            "steps": [
                tool_step("call_fg", "search", {"q": "weather"}, hint="weather"),
                tool_step("call_mission", "memory_write", {"k": "report"}, hint="MISSION REPORT"),
                text_step("It is sunny.", hint="weather"),
                text_step("Mission filed.", hint="mission report"),
            ],
        }
    ],
}

FORCE_TEXT: dict[str, Any] = {
    "model_name": "force-text",
    "turns": [
        {
            "user_input": "Summarise",
            "steps": [
                tool_step("call_skip", "search", {"q": "x"}),
                text_step("Summary without tools."),
                text_step("Second answer."),
            ],
        }
    ],
}

LEGACY: dict[str, Any] = {
    "model_name": "legacy-recorded",
    "usage": {"input_tokens": 230, "output_tokens": 40, "calls": 3},
    "steps": [
        {"response": {"type": "user_input", "content": "hello there"}},
        text_step("Hi!"),
        {"response": {"type": "user_input", "content": "search for cats"}},
        tool_step("call_cats", "search", {"q": "cats"}),
        text_step("Found cats."),
    ],
}


def write(directory: Path, name: str, trace: dict[str, Any]) -> Path:
    path = directory / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trace, indent=2), "utf-8")
    return path


@pytest.fixture
def fixtures(tmp_path: Path) -> Path:
    root = tmp_path / "llm_traces"
    write(root, "bound", BOUND)
    write(root, "templated", TEMPLATED)
    write(root, "interleaved", INTERLEAVED)
    write(root, "force_text", FORCE_TEXT)
    write(root, "legacy", LEGACY)
    return root


def arguments(completion: Any) -> Any:
    [call] = completion.choices[0].message.tool_calls
    return json.loads(call.function.arguments)


def assistant(completion: Any) -> dict[str, Any]:
    message: dict[str, Any] = completion.choices[0].message.model_dump(exclude_none=True)
    return message


# -- $trace_result bindings ---------------------------------------------------------------


def test_trace_result_bindings_resolve_from_the_live_tool_result(server: ChaosServer) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Create a file and read it"}]
    with session_client(server, "bind") as client:
        first = client.chat.completions.create(
            model="bound-results", messages=chat_messages(messages), tools=TOOLS
        )
        assert arguments(first) == {"name": "notes.txt"}
        messages.append(assistant(first))
        live = {"file": {"id": "file-live-4821", "sizes": [10, 20, 30]}}
        messages.append(
            {"role": "tool", "tool_call_id": "call_create", "content": json.dumps(live)}
        )
        second = client.chat.completions.create(
            model="bound-results", messages=chat_messages(messages), tools=TOOLS
        )
    # Not the marker verbatim: the values at the pointers, with their JSON types.
    assert arguments(second) == {"file_id": "file-live-4821", "sizes": [20]}
    assert [e["status"] for e in server.requests("bind")] == [200, 200]


def test_an_unresolvable_binding_is_refused_and_the_step_stays(fixtures: Path) -> None:
    pair = EnginePair.of(fixtures)
    ask = {"role": "user", "content": "Create a file"}
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_create",
                "type": "function",
                "function": {"name": "create_file", "arguments": "{}"},
            }
        ],
    }

    def body(result: str) -> dict[str, Any]:
        return {
            "model": "bound-results",
            "tools": TOOLS,
            "messages": [
                ask,
                call,
                {"role": "tool", "tool_call_id": "call_create", "content": result},
            ],
        }

    assert pair.send({**body("{}"), "messages": [ask]}, session="s").status == 200
    missing = pair.send(body('{"file": {}}'), session="s")
    assert missing.status == 400
    assert missing.error["code"] == "trace_binding"
    assert "'call_create' has no JSON Pointer '/file/id'" in missing.error["message"]
    # The step was not consumed: the corrected request gets it.
    fixed = pair.send(body('{"file": {"id": "f-9", "sizes": [1, 2]}}'), session="s")
    assert fixed.status == 200
    served = fixed.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(served) == {"file_id": "f-9", "sizes": [2]}


def test_binding_errors_name_what_is_wrong() -> None:
    marker = {"$trace_result": {"tool_call_id": "c1", "pointer": "/a"}}
    tool = [{"role": "tool", "tool_call_id": "c1", "content": '{"a": [1, {"b": 2}]}'}]
    assert resolve_trace_arguments({"x": marker}, tool) == {"x": [1, {"b": 2}]}
    with pytest.raises(ValueError, match="no tool message"):
        resolve_trace_arguments(marker, [])
    with pytest.raises(ValueError, match="only \\$trace_result"):
        resolve_trace_arguments({**marker, "extra": 1}, tool)
    with pytest.raises(ValueError, match="2 tool results"):
        resolve_trace_arguments(marker, tool * 2)
    # The safety layer's wrapper and a Python repr (str(dict)) are read too.
    wrapped = [
        {
            "role": "tool",
            "tool_call_id": "c1",
            "content": "<tool_output name=\"x\">\n{'a': True, 'n': None}\n</tool_output>",
        }
    ]
    assert resolve_trace_arguments(marker, wrapped) is True


# -- {{call_id.field}} and {{tool:NAME.field}} templates ----------------------------------


def test_templates_fill_from_tool_messages_and_user_rewrites(server: ChaosServer) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Search and open"}]
    with session_client(server, "tpl") as client:
        first = client.chat.completions.create(
            model="templated-args", messages=chat_messages(messages), tools=TOOLS
        )
        messages.append(assistant(first))
        live = {"url": "https://example.test/live/77", "rank": 1, "exact": False}
        messages.append(
            {"role": "tool", "tool_call_id": "call_search", "content": json.dumps(live)}
        )
        # An orphaned result rewritten as a user message (sanitize_tool_messages).
        messages.append(
            {"role": "user", "content": '[Tool `search` returned: {"total": 12, "q": "chaos"}]'}
        )
        second = client.chat.completions.create(
            model="templated-args", messages=chat_messages(messages), tools=TOOLS
        )
    assert arguments(second) == {
        "url": "https://example.test/live/77",
        "note": "rank 1 of 12 hits",
        "exact": "false",
        "unknown": "{{call_search.missing}} stays",
    }


# -- step selection by hint, case-insensitive, and a request without tools ---------------


def ask(text: str, *, model: str = "mission-interleaved", tools: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": text}]}
    if tools:
        body["tools"] = TOOLS
    return body


def test_interleaved_threads_each_get_their_own_steps(fixtures: Path) -> None:
    pair = EnginePair.of(fixtures)
    # The mission thread's call arrives first, though the foreground's step is recorded
    # first: the step whose hint fits is served.
    mission = pair.send(ask("Write the Mission Report now"), session="s")
    assert mission.json()["choices"][0]["message"]["tool_calls"][0]["id"] == "call_mission"
    assert mission.record["findings"] == []
    weather = pair.send(ask("what's the WEATHER like?"), session="s")
    assert weather.json()["choices"][0]["message"]["tool_calls"][0]["id"] == "call_fg"
    done = pair.send(ask("mission report: filed?"), session="s")
    assert done.json()["choices"][0]["message"]["content"] == "Mission filed."
    sunny = pair.send(ask("and the weather?"), session="s")
    assert sunny.json()["choices"][0]["message"]["content"] == "It is sunny."
    assert all(a.record["findings"] == [] for a in (weather, done, sunny))


def test_no_fitting_hint_serves_the_head_with_a_warning(fixtures: Path) -> None:
    pair = EnginePair.of(fixtures)
    head = pair.send(ask("something else entirely"), session="s")
    assert head.json()["choices"][0]["message"]["tool_calls"][0]["id"] == "call_fg"
    [finding] = head.record["findings"]
    assert finding["check"] == "request_hint" and finding["severity"] == "warning"


def test_a_request_without_tools_gets_the_next_text_step(server: ChaosServer) -> None:
    with session_client(server, "text") as client:
        first = client.chat.completions.create(
            model="force-text", messages=[{"role": "user", "content": "Summarise"}]
        )
        assert first.choices[0].finish_reason == "stop"
        assert first.choices[0].message.content == "Summary without tools."
        # The skipped tool step was consumed with it, as TraceLlm's complete() does.
        second = client.chat.completions.create(
            model="force-text", messages=[{"role": "user", "content": "Summarise"}], tools=TOOLS
        )
        assert second.choices[0].message.content == "Second answer."
    with session_client(server, "tools") as client:
        offered = client.chat.completions.create(
            model="force-text", messages=[{"role": "user", "content": "Summarise"}], tools=TOOLS
        )
    assert offered.choices[0].finish_reason == "tool_calls"


# -- model_name clashes and the past-the-end miss -----------------------------------------


def test_two_traces_sharing_a_model_name_say_so(tmp_path: Path) -> None:
    first = write(tmp_path, "a/one", FORCE_TEXT)
    second = write(tmp_path, "b/two", FORCE_TEXT)
    with (
        ChaosServer(tmp_path) as server,
        session_client(server, "clash") as client,
        pytest.raises(openai.NotFoundError) as caught,
    ):
        client.chat.completions.create(
            model="force-text", messages=[{"role": "user", "content": "Summarise"}]
        )
    message = str(caught.value)
    assert "2 traces share the model_name 'force-text'" in message
    # Named relative to the recordings directory (no absolute path of the machine).
    top = tmp_path.name
    assert f"{top}/a/one.json" in message and f"{top}/b/two.json" in message
    assert str(first) not in message and str(second) not in message
    assert "No recordings of this provider are loaded" not in message


def test_past_the_end_says_the_trace_ran_out(fixtures: Path) -> None:
    pair = EnginePair.of(fixtures)
    for _ in range(2):
        assert (
            pair.send(ask("Summarise", model="force-text", tools=False), session="s").status == 200
        )
    extra = pair.send(ask("Summarise", model="force-text", tools=False), session="s")
    assert extra.status == 404
    message = extra.error["message"]
    assert "More LLM calls than the trace 'force_text' has steps" in message
    assert "No recordings of this provider are loaded" not in message


# -- the trace's own context --------------------------------------------------------------


def test_legacy_user_input_markers_are_turns_and_usage_is_kept(server: ChaosServer) -> None:
    info = httpx.get(server.url + "/__recordings").json()["scenarios"]["legacy"]
    assert info["layout"] == "steps"
    assert [(t["user_input"], t["calls"]) for t in info["turns"]] == [
        ("hello there", 1),
        ("search for cats", 2),
    ]
    assert info["usage"] == LEGACY["usage"]


def test_a_flat_trace_without_markers_has_one_placeholder_turn(tmp_path: Path) -> None:
    write(tmp_path, "flat", {"model_name": "flat", "steps": [text_step("a"), text_step("b")]})
    info = RecordingStore.load([tmp_path]).scenario_info["flat"]
    assert info["turns"] == [{"user_input": "(test input)", "expects": None, "calls": 2}]


def test_import_keeps_markers_and_usage(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "imported"
    write(src, "legacy", LEGACY)
    result = import_recordings("trace", src, out)
    assert result.errors == [] and len(result.written) == 3
    info = RecordingStore.load([out]).scenario_info["legacy"]
    assert info["usage"] == LEGACY["usage"]
    assert [t["user_input"] for t in info["turns"]] == ["hello there", "search for cats"]


def test_only_tool_steps_left_for_a_request_without_tools_says_so(tmp_path: Path) -> None:
    steps: list[dict[str, Any]] = BOUND["turns"][0]["steps"]
    write(tmp_path, "tools_only", {"model_name": "tools-only", "turns": [BOUND["turns"][0]]})
    pair = EnginePair.of(tmp_path)
    assert pair.send(ask("go", model="tools-only"), session="s").status == 200
    body = ask("go", model="tools-only", tools=False)
    # Step 2 (tool_calls) is skipped to the text step 3, which is served.
    assert pair.send(body, session="s").json()["choices"][0]["message"]["content"] == "Read it."
    fresh = pair.send({**body, "messages": [{"role": "user", "content": "x"}]}, session="t")
    assert fresh.status == 200  # a new session: steps 1-2 skipped, step 3 served
    again = pair.send(body, session="t")
    assert again.status == 404
    assert "More LLM calls than the trace 'tools_only' has steps" in again.error["message"]
    write(
        tmp_path,
        "tools_only",
        {
            "model_name": "tools-only",
            "turns": [{"user_input": "go", "steps": steps[:2]}],
        },
    )
    only_tools = EnginePair.of(tmp_path).send(body, session="u")
    assert only_tools.status == 404
    message = only_tools.error["message"]
    assert "the 2 step(s) left of 'tools_only' are all tool_calls steps" in message


def test_a_bound_step_streams_with_the_resolved_arguments(server: ChaosServer) -> None:
    call: dict[str, Any] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_create",
                "type": "function",
                "function": {"name": "create_file", "arguments": "{}"},
            }
        ],
    }
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Create a file"},
        call,
        {
            "role": "tool",
            "tool_call_id": "call_create",
            "content": json.dumps({"file": {"id": "f-streamed", "sizes": [5, 6]}}),
        },
    ]
    with session_client(server, "stream") as client:
        client.chat.completions.create(
            model="bound-results", messages=chat_messages(messages[:1]), tools=TOOLS
        )
        stream = client.chat.completions.create(
            model="bound-results", messages=chat_messages(messages), tools=TOOLS, stream=True
        )
        pieces = [
            tc.function.arguments or ""
            for chunk in stream
            for choice in chunk.choices
            for tc in choice.delta.tool_calls or []
            if tc.function is not None
        ]
    assert json.loads("".join(pieces)) == {"file_id": "f-streamed", "sizes": [6]}
