"""Ollama's native protocol in memory: NDJSON framing, streaming by default, the digest,
validation in Ollama's ``{"error": ...}`` envelope, replay, assembly, and every fault
expressed in NDJSON (the engine driven by `tests.memory.EnginePair`)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaosllm.errors import InvalidRequest
from chaosllm.model import Ending
from chaosllm.providers import PROVIDERS, provider_for_path
from chaosllm.providers.ndjson import LineSplitter, iter_objects, line
from chaosllm.providers.ollama import (
    OllamaChat,
    OllamaGenerate,
    embed_body,
    embeddings_body,
    model_name,
    show_body,
    tags_body,
)
from tests.helpers import all_recordings, recording, sdk_arguments, split_in_pieces
from tests.memory import Answer, EnginePair

CHAT_PATH = "/api/chat"
GENERATE_PATH = "/api/generate"
CHAT = PROVIDERS["ollama.chat"]
GENERATE = PROVIDERS["ollama.generate"]
NAMES = all_recordings("ollama.chat") + all_recordings("ollama.generate")


@pytest.fixture(scope="module")
def pair() -> EnginePair:
    return EnginePair.of()


@pytest.fixture
def fresh(pair: EnginePair) -> EnginePair:
    pair.engine.board.disarm()
    return pair


def path_of(name: str) -> str:
    path: str = recording(name)["request"]["path"]
    return path


def body_of(name: str, *, stream: bool | None) -> dict[str, Any]:
    """The recorded request as a client sends it: ``stream`` as given (None: absent)."""
    return sdk_arguments(name) if stream is None else sdk_arguments(name, stream=stream)


def lines(answer: Answer) -> list[dict[str, Any]]:
    return [json.loads(frame) for frame in answer.frames()]


# -- registry and framing -------------------------------------------------------------------


def test_the_two_paths_are_two_providers() -> None:
    assert isinstance(CHAT, OllamaChat) and provider_for_path(CHAT_PATH) is CHAT
    assert isinstance(GENERATE, OllamaGenerate) and provider_for_path(GENERATE_PATH) is GENERATE
    assert CHAT.codec.is_stream("application/x-ndjson") and not CHAT.codec.is_stream(
        "text/event-stream"
    )


def test_a_line_is_compact_json_and_a_newline() -> None:
    assert line({"a": "é", "b": [1, 2]}) == '{"a":"é","b":[1,2]}\n'
    assert list(iter_objects(['{"a":1}\n{"b":2}\n', "\n", "not json\n", "[1]\n"])) == [
        {"a": 1},
        {"b": 2},
    ]


BODY = b'{"a":1}\n{"b":"x\\ny"}\n\n{"done":true}\n'


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=len(BODY)), max_size=12))
def test_splitting_lines_does_not_depend_on_how_the_bytes_arrive(cuts: list[int]) -> None:
    assert split_in_pieces(LineSplitter(0.0), BODY, cuts) == [
        b'{"a":1}\n',
        b'{"b":"x\\ny"}\n',
        b"\n",
        b'{"done":true}\n',
    ]


def test_bytes_after_the_last_newline_join_the_last_line() -> None:
    splitter = LineSplitter(0.0)
    assert splitter.feed(b'{"a":1}\n{"b"', 0.001) == 1
    splitter.finish()
    assert splitter.frames == [(b'{"a":1}\n{"b"', 1.0)]
    counting = LineSplitter(0.0, keep=False)
    assert counting.feed(b"1\n2\n3", 0.0) == 2 and counting.frames == []


# -- requests -------------------------------------------------------------------------------


def test_ollama_streams_unless_told_not_to() -> None:
    assert CHAT.wants_stream({"model": "m"}) and CHAT.wants_stream({"stream": True})
    assert CHAT.wants_stream({"stream": None})
    assert not CHAT.wants_stream({"stream": False})


def test_the_digest_ignores_transport_sampling_and_the_latest_tag() -> None:
    body = body_of("ollama-chat/0001", stream=False)
    same = {**body, "model": "llama3.2:latest", "stream": True, "options": {"seed": 1}}
    assert (
        CHAT.digest(body)
        == CHAT.digest(same)
        == CHAT.digest(body_of("ollama-chat/0001", stream=None))
    )
    assert CHAT.digest(body) != CHAT.digest({**body, "model": "llama3.2:1b"})
    assert model_name("qwen3:latest") == "qwen3" and model_name("qwen3:8b") == "qwen3:8b"


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        (CHAT_PATH, [1], "json: cannot unmarshal array into Go value of type api.ChatRequest"),
        (CHAT_PATH, {"messages": []}, "model is required"),
        (CHAT_PATH, {"model": ""}, "model is required"),
        (
            CHAT_PATH,
            {"model": "m", "messages": "hi"},
            "json: cannot unmarshal string into Go struct field ChatRequest.messages of type "
            "[]api.Message",
        ),
        (
            CHAT_PATH,
            {"model": "m", "messages": [{"role": "user", "content": 1}]},
            "json: cannot unmarshal number into Go struct field Message.messages.0.content of "
            "type string",
        ),
        (
            CHAT_PATH,
            {"model": "m", "stream": "yes"},
            "json: cannot unmarshal string into Go struct field ChatRequest.stream of type bool",
        ),
        (
            GENERATE_PATH,
            {"model": "m", "prompt": ["x"]},
            "json: cannot unmarshal array into Go struct field GenerateRequest.prompt of type "
            "string",
        ),
    ],
)
def test_a_bad_request_is_ollamas_400(pair: EnginePair, path: str, body: Any, message: str) -> None:
    answer = pair.send(body, path=path)
    assert answer.status == 400
    assert answer.json() == {"error": message}


def test_bad_json_is_a_400_in_ollamas_envelope(pair: EnginePair) -> None:
    answer = pair.send(None, path=CHAT_PATH, raw=b"{not json")
    assert answer.status == 400 and set(answer.json()) == {"error"}


def test_a_miss_is_a_404_naming_the_digest_and_the_nearest(pair: EnginePair) -> None:
    body = {**body_of("ollama-chat/0001", stream=False), "model": "mistral"}
    answer = pair.send(body, path=CHAT_PATH)
    assert answer.status == 404
    [message] = answer.json().values()
    assert CHAT.digest(body) in message and "ollama-chat/0001" in message


# -- replay ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_each_recording_replays_as_json_and_as_ndjson(pair: EnginePair, name: str) -> None:
    recorded = recording(name)["response"]
    answer = pair.send(body_of(name, stream=False), path=path_of(name))
    assert answer.status == 200 and answer.json() == recorded["body"]
    assert answer.headers["content-type"] == "application/json"
    streamed = pair.send(body_of(name, stream=None), path=path_of(name))
    assert streamed.headers["content-type"] == "application/x-ndjson"
    frames = streamed.frames()
    assert all(f.endswith("\n") and f.count("\n") == 1 for f in frames)
    provider = provider_for_path(path_of(name))
    assert provider is not None
    assert provider.assemble(frames) == recorded["body"]
    assert provider.codec.stream_complete(frames) and not provider.codec.stream_complete(
        frames[:-1]
    )
    final = json.loads(frames[-1])
    assert final["done"] is True and final["done_reason"] == "stop"
    assert all(json.loads(f)["done"] is False for f in frames[:-1])
    if "chunks" in recorded:  # recorded frames replay verbatim
        assert frames == [c["data"] for c in recorded["chunks"]]


def test_a_stream_rendered_from_a_body_reads_back() -> None:
    body = recording("ollama-tools/0001")["response"]["body"]
    frames = CHAT.codec.stream_frames(body)
    parsed = [json.loads(f) for f in frames]
    assert parsed[0]["message"]["tool_calls"] == body["message"]["tool_calls"]
    assert parsed[-1]["done"] is True and parsed[-1]["message"] == {
        "role": "assistant",
        "content": "",
    }
    assert CHAT.assemble(frames) == body
    thinking = {**body, "message": {"role": "assistant", "content": "Hi.", "thinking": "Hm ok"}}
    assert [
        json.loads(f)["message"].get("thinking") for f in CHAT.codec.stream_frames(thinking)
    ] == [
        "Hm",
        " ok",
        None,
        None,
    ]
    assert CHAT.assemble(CHAT.codec.stream_frames(thinking)) == thinking


def test_an_error_line_assembles_to_the_error() -> None:
    frames = ['{"model":"m","message":{"role":"assistant","content":"a"},"done":false}\n']
    error = '{"error":"boom"}\n'
    assert CHAT.assemble([*frames, error]) == {"error": "boom"}
    assert CHAT.codec.stream_complete([*frames, error]) and not CHAT.codec.stream_complete(frames)


def test_the_fallback_is_an_answer(pair: EnginePair) -> None:
    for provider in (CHAT, GENERATE):
        answer = provider.fallback({"model": "m"}, "abc")
        assert provider.codec.is_answer(answer)
        assert provider.assemble(provider.codec.stream_frames(answer)) == answer


# -- faults, as NDJSON ----------------------------------------------------------------------

STREAM = "ollama-stream/0001"
TOOLS = "ollama-tools/0001"


def test_truncated_stream_keeps_only_unfinished_lines(fresh: EnginePair) -> None:
    fresh.arm({"type": "truncated_stream", "after_chunks": 99})
    answer = fresh.send(body_of(STREAM, stream=None), path=CHAT_PATH)
    got = lines(answer)
    assert got and all(g["done"] is False for g in got)
    assert len(got) == len(recording(STREAM)["response"]["chunks"]) - 1
    assert answer.reply.plan.ending is Ending.COMPLETE


def test_error_in_200_mid_stream_is_an_error_line(fresh: EnginePair) -> None:
    fresh.arm({"type": "error_in_200", "after_chunks": 2, "message": "boom"})
    got = lines(fresh.send(body_of(STREAM, stream=True), path=CHAT_PATH))
    assert [g.get("done") for g in got] == [False, False, None]
    assert got[-1] == {"error": "boom"}


def test_error_in_200_json_is_the_envelope_with_200(fresh: EnginePair) -> None:
    fresh.arm({"type": "error_in_200", "message": "boom"})
    answer = fresh.send(body_of("ollama-chat/0001", stream=False), path=CHAT_PATH)
    assert answer.status == 200 and answer.json() == {"error": "boom"}


@pytest.mark.parametrize(("status", "retry"), [(503, None), (429, "1")])
def test_http_errors_are_ollamas_envelope(
    fresh: EnginePair, status: int, retry: str | None
) -> None:
    fresh.arm({"type": f"http_{status}"})
    answer = fresh.send(body_of(STREAM, stream=None), path=CHAT_PATH)
    assert answer.status == status and list(answer.json()) == ["error"]
    assert answer.headers.get("retry-after") == retry


def test_malformed_tool_args_is_ollamas_tool_call_parse_error(fresh: EnginePair) -> None:
    fresh.arm({"type": "malformed_tool_args", "remaining": 2})
    answer = fresh.send(body_of(TOOLS, stream=False), path=CHAT_PATH)
    assert answer.status == 500
    message = answer.json()["error"]
    assert message.startswith('error parsing tool call: raw=\'{"city"')
    assert message.endswith("', err=unexpected end of JSON input")
    streamed = lines(fresh.send(body_of(TOOLS, stream=True), path=CHAT_PATH))
    assert streamed == [{"error": message}]  # no tool-call line, no done line


def test_malformed_tool_args_needs_a_tool_call(fresh: EnginePair) -> None:
    fresh.arm({"type": "malformed_tool_args"})
    assert fresh.send(body_of("ollama-chat/0001", stream=False), path=CHAT_PATH).status == 200
    assert len(fresh.engine.board) == 1  # not consumed


def test_empty_response_is_a_done_answer_without_content(fresh: EnginePair) -> None:
    fresh.arm({"type": "empty_response", "remaining": 2})
    answer = fresh.send(body_of(TOOLS, stream=False), path=CHAT_PATH).json()
    assert answer["message"] == {"role": "assistant", "content": ""}
    assert answer["done"] is True and answer["eval_count"] == 0
    got = lines(fresh.send(body_of("ollama-generate/0001", stream=True), path=GENERATE_PATH))
    assert len(got) == 1 and got[0]["done"] is True and got[0]["response"] == ""


@pytest.mark.parametrize("kind", ["dropped_connection", "connection_reset", "stall", "garbage"])
def test_socket_faults_cut_after_whole_lines(fresh: EnginePair, kind: str) -> None:
    fresh.arm({"type": kind, "after_chunks": 2})
    answer = fresh.send(body_of(STREAM, stream=None), path=CHAT_PATH)
    pieces = answer.reply.plan.pieces
    assert [json.loads(p.data)["done"] for p in pieces[:2]] == [False, False]
    assert answer.reply.plan.ending is not Ending.COMPLETE


# -- the conversation -----------------------------------------------------------------------


def checks(messages: list[dict[str, Any]]) -> list[str]:
    return [f.check for f in CHAT.conversation_findings({"model": "m", "messages": messages})]


CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"function": {"name": "f", "arguments": {}}}],
}


def test_conversation_checks_pair_tool_results_by_position_and_name() -> None:
    user = {"role": "user", "content": "q"}
    result = {"role": "tool", "content": "r", "tool_name": "f"}
    assert checks([user, CALL, result]) == []
    assert checks([user, CALL, {"role": "tool", "content": "r"}]) == []
    assert checks([user, CALL]) == ["orphan_tool_call"]
    assert checks([user, CALL, user]) == ["orphan_tool_call"]
    assert checks([user, result]) == ["orphan_tool_result"]
    assert checks([user, CALL, result, result]) == ["orphan_tool_result"]
    assert checks([user, user]) == ["doubled_user_message"]
    assert CHAT.has_system_prompt({"messages": [{"role": "system", "content": "s"}]})
    findings = CHAT.conversation_findings({"messages": [user]}, expects_system=True)
    assert [f.check for f in findings] == ["missing_system_prompt"]
    assert GENERATE.has_system_prompt({"system": "s"}) and not GENERATE.has_system_prompt({})
    [missing] = GENERATE.conversation_findings({"prompt": "p"}, expects_system=True)
    assert missing.check == "missing_system_prompt" and missing.param == "system"


# -- the auxiliary answers ------------------------------------------------------------------


def test_tags_list_each_model_once_with_its_tag() -> None:
    listed = tags_body(["llama3.2", "llama3.2:latest", "qwen3:8b"])["models"]
    assert [m["name"] for m in listed] == ["llama3.2:latest", "qwen3:8b"]
    assert all(m["model"] == m["name"] and len(m["digest"]) == 64 for m in listed)


def test_embeddings_are_deterministic_unit_vectors() -> None:
    first = embed_body({"model": "nomic-embed-text", "input": ["a", "b"]})
    assert first == embed_body({"model": "nomic-embed-text:latest", "input": ["a", "b"]}) | {
        "model": "nomic-embed-text"
    }
    a, b = first["embeddings"]
    assert a != b and abs(sum(x * x for x in a) - 1) < 1e-9 and len(a) == 768
    assert len(embed_body({"model": "e", "input": "a", "dimensions": 8})["embeddings"][0]) == 8
    assert (
        embeddings_body({"model": "e", "prompt": "a"})["embedding"]
        == embed_body({"model": "e", "input": "a"})["embeddings"][0]
    )
    with pytest.raises(InvalidRequest, match="model is required"):
        embed_body({"input": "a"})


def test_show_knows_the_recorded_models_only() -> None:
    assert show_body({"model": "llama3.2:latest"}, ["llama3.2"])["details"]["format"] == "gguf"
    with pytest.raises(InvalidRequest) as info:
        show_body({"model": "nope"}, ["llama3.2"])
    assert info.value.code == "not_found"
    assert info.value.message == 'model "nope" not found, try pulling it first'
