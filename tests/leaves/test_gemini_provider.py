"""The Gemini provider in memory: binding of the model paths, validation and misses in
Google's envelope, both stream framings, assembly, every fault as Gemini breaks, the
conversation checks and the computed model methods (no sockets)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
import pytest

from chaosllm.config import OnMiss, ServerConfig
from chaosllm.core.clock import ManualClock
from chaosllm.core.engine import Engine, ProviderCall, Reply
from chaosllm.faults import FAULT_TYPES, parse_fault_spec, parse_fault_specs
from chaosllm.faults.transform import fault_applies
from chaosllm.http.app import create_app
from chaosllm.http.direct import DirectHandler
from chaosllm.http.state import ChaosState
from chaosllm.model import Ending
from chaosllm.paths import shipped_dir
from chaosllm.providers import PROVIDERS, provider_for_path
from chaosllm.providers.gemini import (
    Gemini,
    GeminiCodec,
    batch_embed_answer,
    count_tokens_answer,
    embed_answer,
    predict_answer,
    rpc_status,
    validate_gemini_conversation,
)
from chaosllm.providers.sse import iter_data
from chaosllm.store.recordings import RecordingStore
from tests.helpers import all_recordings, recording

_PROVIDER = PROVIDERS["gemini.generate_content"]
assert isinstance(_PROVIDER, Gemini)
GEMINI: Gemini = _PROVIDER
NAMES = all_recordings("gemini.generate_content")
TEXT = "gemini-text/0001"
STREAM = "gemini-stream/0001"
TOOLS = "gemini-tools/0001"


def path_of(model: str, method: str = "generateContent", prefix: str = "/v1/models") -> str:
    return f"{prefix}/{model}:{method}"


def client_body(name: str) -> dict[str, Any]:
    """The body the client sent for a recording (what the path and query carried removed)."""
    body = dict(recording(name)["request"]["body"])
    for key in ("model", "stream", "alt"):
        body.pop(key, None)
    return body


def model_of(name: str) -> str:
    model: str = recording(name)["request"]["body"]["model"]
    return model


class Client:
    """An engine over the shipped recordings, called the way google-genai calls it."""

    def __init__(self, **config: Any) -> None:
        dirs = [shipped_dir("recordings")]
        self.engine = Engine(
            ServerConfig(recordings=dirs, **config),
            RecordingStore.load(dirs),
            clock=ManualClock(),
        )

    def send(
        self,
        name: str | None = None,
        *,
        body: Any = None,
        model: str | None = None,
        stream: bool = False,
        sse: bool = True,
        prefix: str = "/v1/models",
        query: str | None = None,
    ) -> Reply:
        if name is not None:
            body = client_body(name) if body is None else body
            model = model or model_of(name)
        assert model is not None
        method = "streamGenerateContent" if stream else "generateContent"
        path = path_of(model, method, prefix)
        if query is None:
            query = "alt=sse" if stream and sse else ""
        provider = provider_for_path(path)
        assert provider is GEMINI
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        reply = self.engine.handle(
            ProviderCall(provider=provider, path=path, body=raw, query=query.encode())
        )
        assert isinstance(reply, Reply)
        return reply

    def arm(self, spec: dict[str, Any]) -> None:
        self.engine.board.arm(parse_fault_specs(spec))


def frames(reply: Reply) -> list[str]:
    return [p.data.decode("utf-8", "replace") for p in reply.plan.pieces]


def payloads(reply: Reply) -> list[Any]:
    return [json.loads(data) for data in iter_data(frames(reply))]


def body_json(reply: Reply) -> Any:
    return json.loads(reply.plan.body())


# -- paths and binding -------------------------------------------------------------------


@pytest.mark.parametrize(
    "prefix",
    [
        "/v1beta/models",
        "/v1/models",
        "/v1beta1/projects/my-project/locations/us-central1/publishers/google/models",
        "/v1/projects/my-project/locations/europe-west4/publishers/google/models",
        "/v1beta1/publishers/google/models",
        "/v1/publishers/google/models",
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_every_model_path_replays_the_recording(prefix: str, stream: bool) -> None:
    reply = Client().send(TEXT, prefix=prefix, stream=stream)
    assert reply.plan.status == 200
    if stream:
        assert GEMINI.assemble(frames(reply)) == recording(TEXT)["response"]["body"]
    else:
        assert body_json(reply) == recording(TEXT)["response"]["body"]
    record = reply.entry.record
    assert record.model == "gemini-2.5-flash" and record.stream is stream


def test_the_other_methods_and_paths_are_not_the_providers() -> None:
    for path in (
        "/v1/models/gemini-2.5-flash:countTokens",
        "/v1/models/gemini-2.5-flash:embedContent",
        "/v1/models/gemini-2.5-flash",
        "/v1/models/a/b:generateContent",
        "/v2/models/gemini-2.5-flash:generateContent",
    ):
        assert provider_for_path(path) is None, path


def test_binding_folds_the_path_and_query_in_and_never_the_key() -> None:
    params = GEMINI.path_params(path_of("gemini-2.5-flash", "streamGenerateContent"))
    assert params == {"model": "gemini-2.5-flash", "method": "streamGenerateContent"}
    body = {"contents": [{"parts": [{"text": "hi"}]}], "model": "other", "stream": False}
    assert GEMINI.bind(body, params, "alt=sse&key=AIzaSECRET") == {
        "contents": [{"parts": [{"text": "hi"}]}],
        "model": "gemini-2.5-flash",
        "stream": True,
        "alt": "sse",
    }
    generate = GEMINI.path_params(path_of("gemini-2.5-flash"))
    assert generate is not None
    assert GEMINI.bind(body, generate, "key=AIzaSECRET") == {
        "contents": [{"parts": [{"text": "hi"}]}],
        "model": "gemini-2.5-flash",
    }


def test_the_framing_is_not_part_of_the_digest() -> None:
    client = Client()
    digests = {
        client.send(TEXT).entry.record.digest,
        client.send(TEXT, stream=True).entry.record.digest,
        client.send(TEXT, stream=True, sse=False).entry.record.digest,
        client.send(TEXT, query="key=AIzaSyA-not-a-real-key-000000000000000").entry.record.digest,
    }
    assert digests == {recording(TEXT)["digest"]}


def test_a_key_in_the_query_never_reaches_the_journal() -> None:
    client = Client()
    client.send(TEXT, query="key=AIzaSyA-not-a-real-key-000000000000000")
    [entry] = client.engine.journal.entries()
    assert "AIza" not in json.dumps(entry.record.to_json())


# -- bad input and misses ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({}, "contents", "contents is not specified"),
        ({"contents": []}, "contents", "contents is not specified"),
        ({"contents": "hi"}, "contents", "expected a list of Content"),
        ({"contents": [{"role": "system", "parts": [{"text": "x"}]}]}, "contents[0].role", "role"),
        ({"contents": [{"role": "user", "parts": []}]}, "contents[0].parts", "must not be empty"),
        ({"contents": [{"parts": [{"nope": 1}]}]}, "contents[0].parts[0]", "oneof field 'data'"),
        (
            {"contents": [{"parts": [{"text": "x"}]}], "tools": {}},
            "tools",
            "a list of Tool",
        ),
    ],
)
def test_a_bad_request_is_googles_400(body: Any, field: str, words: str) -> None:
    reply = Client().send(body=body, model="gemini-2.5-flash")
    assert reply.plan.status == 400
    error = body_json(reply)["error"]
    assert error["code"] == 400 and error["status"] == "INVALID_ARGUMENT"
    assert words in error["message"]
    violations = [d for d in error["details"] if d["@type"].endswith("google.rpc.BadRequest")]
    assert violations[0]["fieldViolations"][0]["field"] == field


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"text"', b"{not json"])
def test_a_body_that_is_not_an_object_is_a_400(raw: bytes) -> None:
    reply = Client().send(body=raw, model="gemini-2.5-flash")
    assert reply.plan.status == 400
    assert body_json(reply)["error"]["status"] == "INVALID_ARGUMENT"


def test_an_unknown_alt_is_a_400() -> None:
    reply = Client().send(TEXT, stream=True, query="alt=proto")
    assert reply.plan.status == 400
    assert "alt" in body_json(reply)["error"]["message"]


def test_an_unknown_model_is_googles_404_naming_digest_and_nearest() -> None:
    reply = Client().send(TEXT, model="gemini-9-ultra")
    assert reply.plan.status == 404
    error = body_json(reply)["error"]
    assert error["code"] == 404 and error["status"] == "NOT_FOUND"
    assert reply.entry.record.digest in error["message"]
    assert TEXT in error["message"]
    [info] = [d for d in error["details"] if d["@type"].endswith("google.rpc.ErrorInfo")]
    assert info["domain"] == "chaosllm" and info["metadata"]["code"] == "no_recording"


def test_the_fallback_is_a_gemini_answer() -> None:
    reply = Client(on_miss=OnMiss.FALLBACK).send(body=client_body(TEXT), model="gemini-9")
    answer = body_json(reply)
    assert reply.plan.status == 200 and GEMINI.codec.is_answer(answer)
    assert "[chaosllm fallback]" in answer["candidates"][0]["content"]["parts"][0]["text"]


@pytest.mark.parametrize(
    ("status", "name"),
    [
        (400, "INVALID_ARGUMENT"),
        (401, "UNAUTHENTICATED"),
        (403, "PERMISSION_DENIED"),
        (404, "NOT_FOUND"),
        (429, "RESOURCE_EXHAUSTED"),
        (500, "INTERNAL"),
        (503, "UNAVAILABLE"),
        (504, "DEADLINE_EXCEEDED"),
        (502, "INTERNAL"),
        (418, "FAILED_PRECONDITION"),
    ],
)
def test_error_statuses_are_rpc_codes(status: int, name: str) -> None:
    assert rpc_status(status) == name
    assert GEMINI.errors.error_answer("m", status=status) == {
        "error": {"code": status, "message": "m", "status": name}
    }


# -- answers and streams -----------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_each_recording_is_a_consistent_answer(name: str) -> None:
    data = recording(name)
    body = data["response"]["body"]
    assert GEMINI.codec.is_answer(body)
    assert GEMINI.assemble(GEMINI.codec.stream_frames(body)) == body
    assert GEMINI.assemble(GeminiCodec().stream_frames(body, sse=False)) == body
    chunks = data["response"].get("chunks")
    if chunks:
        texts = [c["data"] for c in chunks]
        assert GEMINI.assemble(texts) == body
        assert GEMINI.codec.stream_complete(texts) and not GEMINI.codec.stream_complete(texts[:-1])


def test_recorded_frames_replay_byte_for_byte() -> None:
    reply = Client().send(STREAM, stream=True)
    assert frames(reply) == [c["data"] for c in recording(STREAM)["response"]["chunks"]]
    assert dict(reply.plan.headers)["content-type"].startswith("text/event-stream")
    assert all(f.endswith("\r\n\r\n") for f in frames(reply))


def test_without_alt_sse_the_stream_is_one_json_array() -> None:
    reply = Client().send(STREAM, stream=True, sse=False)
    assert dict(reply.plan.headers)["content-type"].startswith("application/json")
    array = json.loads(reply.plan.body())
    recorded = [c["data"] for c in recording(STREAM)["response"]["chunks"]]
    assert array == [json.loads(d) for d in iter_data(recorded)]
    rendered = Client().send(TEXT, stream=True, sse=False)
    assert GEMINI.assemble(frames(rendered)) == recording(TEXT)["response"]["body"]
    assert json.loads(rendered.plan.body())[-1]["candidates"][0]["finishReason"] == "STOP"


def test_a_rendered_stream_streams_a_few_words_a_response_and_finishes_last() -> None:
    reply = Client().send(TEXT, stream=True)
    got = payloads(reply)
    assert len(got) == 2
    assert [c["candidates"][0].get("finishReason") for c in got] == [None, "STOP"]
    assert got[0]["usageMetadata"] == {"promptTokenCount": 9, "totalTokenCount": 9}
    assert got[-1]["usageMetadata"] == recording(TEXT)["response"]["body"]["usageMetadata"]
    assert all(c["modelVersion"] == "gemini-2.5-flash" for c in got)


def test_a_function_call_streams_whole_with_its_args_object() -> None:
    [chunk] = payloads(Client().send(TOOLS, stream=True))
    part = chunk["candidates"][0]["content"]["parts"][0]
    assert part == {
        "functionCall": {
            "id": "fc-3b1e9d0a",
            "name": "get_weather",
            "args": {"city": "Paris", "unit": "celsius"},
        }
    }


def test_a_blocked_prompt_is_an_answer_that_finishes() -> None:
    blocked = {"promptFeedback": {"blockReason": "SAFETY"}, "modelVersion": "gemini-2.5-flash"}
    assert GEMINI.codec.is_answer(blocked)
    [frame] = GEMINI.codec.stream_frames(blocked)
    assert GEMINI.faults.frame_finishes(frame) and GEMINI.codec.stream_complete([frame])
    assert GEMINI.assemble([frame]) == blocked


def test_an_error_event_assembles_to_the_error() -> None:
    frame = GEMINI.faults.stream_error_frame("boom", status=500).decode()
    assert frame.startswith('data: {"error":')
    assert GEMINI.assemble(
        [GEMINI.codec.stream_frames(recording(TEXT)["response"]["body"])[0], frame]
    ) == {"error": {"code": 500, "message": "boom", "status": "INTERNAL"}}
    assert GEMINI.codec.stream_complete([frame])


def test_the_model_list_is_geminis_shape() -> None:
    listed = GEMINI.codec.models_body(["gemini-2.5-flash"])
    assert isinstance(listed, dict)
    assert listed["models"][0]["name"] == "models/gemini-2.5-flash"


# -- faults, as Gemini breaks ------------------------------------------------------------


def test_every_fault_of_the_catalogue_fires_on_gemini() -> None:
    """Each type that applies to a Gemini answer fires on one: JSON or stream (some are
    stream-only), text, non-ASCII text or a function call (some need one). A type made for
    another protocol's framing (its provider hook) applies to none and is passed over."""
    names = (STREAM, TOOLS, "gemini-tools/0002")

    def fires(kind: str, name: str, stream: bool) -> bool:
        client = Client()
        client.arm({"type": kind})
        record = client.send(name, stream=stream).entry.record.to_json()
        return bool(record.get("fault") or record.get("faults"))

    def applies(kind: str) -> bool:
        spec = parse_fault_spec({"type": kind})
        answers = [recording(name)["response"]["body"] for name in names]
        return any(fault_applies(spec, GEMINI, answer) for answer in answers)

    silent = [
        kind
        for kind in FAULT_TYPES
        if applies(kind)
        and not FAULT_TYPES[kind].mcp  # an MCP server's faults fire on MCP requests only
        and FAULT_TYPES[kind].session is None  # a session's fire on WebSocket sessions only
        and not any(fires(kind, name, stream) for name in names for stream in (False, True))
    ]
    assert silent == []
    assert applies("malformed_tool_args") and applies("empty_response")


def test_truncated_stream_ends_cleanly_before_the_finishing_response() -> None:
    client = Client()
    client.arm({"type": "truncated_stream", "after_chunks": 10})
    reply = client.send(STREAM, stream=True)
    recorded = [c["data"] for c in recording(STREAM)["response"]["chunks"]]
    assert frames(reply) == recorded[:-1]  # clamped: no finishReason, nothing broken
    assert reply.plan.ending is Ending.COMPLETE
    assert not GEMINI.codec.stream_complete(frames(reply))


def test_truncated_array_stream_has_no_closing_bracket() -> None:
    client = Client()
    client.arm({"type": "truncated_stream", "after_chunks": 2})
    reply = client.send(STREAM, stream=True, sse=False)
    body = reply.plan.body().decode()
    assert body.startswith("[{") and not body.rstrip().endswith("]")


def test_error_in_200_mid_stream_is_googles_envelope_as_an_event() -> None:
    client = Client()
    client.arm({"type": "error_in_200", "after_chunks": 2})
    reply = client.send(STREAM, stream=True)
    assert reply.plan.status == 200
    got = payloads(reply)
    assert len(got) == 3 and "candidates" in got[1]
    assert got[2] == {
        "error": {
            "code": 500,
            "message": "The server had an error while processing your request. Sorry about that!",
            "status": "INTERNAL",
        }
    }


@pytest.mark.parametrize("after_chunks", [0, 2])
@pytest.mark.parametrize("type_", ["error_in_200", "overloaded"])
def test_an_error_mid_array_is_the_arrays_last_element(type_: str, after_chunks: int) -> None:
    """Without alt=sse the error is written as the JSON array's next element (no SSE
    ``data:`` frame), and the array closes: the body is one JSON array."""
    client = Client()
    client.arm({"type": type_, "after_chunks": after_chunks})
    reply = client.send(STREAM, stream=True, sse=False)
    assert reply.plan.status == 200
    raw = reply.plan.body()
    assert b"data:" not in raw
    elements = json.loads(raw)
    assert isinstance(elements, list) and len(elements) == after_chunks + 1
    assert all("candidates" in element for element in elements[:-1])
    error = elements[-1]["error"]
    assert (error["code"], error["status"]) == (
        (500, "INTERNAL") if type_ == "error_in_200" else (503, "UNAVAILABLE")
    )
    assert GEMINI.assemble(frames(reply)) == elements[-1]
    # With alt=sse the same fault is still an SSE event.
    sse_client = Client()
    sse_client.arm({"type": type_, "after_chunks": after_chunks})
    assert "error" in payloads(sse_client.send(STREAM, stream=True))[-1]


def faulted_answer(type_: str, name: str, stream: bool) -> dict[str, Any]:
    """The answer to recording `name` with the fault `type_` armed (JSON, or assembled)."""
    client = Client()
    client.arm({"type": type_})
    reply = client.send(name, stream=stream)
    answer: dict[str, Any] = GEMINI.assemble(frames(reply)) if stream else body_json(reply)
    return answer


@pytest.mark.parametrize("stream", [False, True])
def test_malformed_tool_args_is_malformed_function_call(stream: bool) -> None:
    [candidate] = faulted_answer("malformed_tool_args", TOOLS, stream)["candidates"]
    assert candidate["finishReason"] == "MALFORMED_FUNCTION_CALL"
    assert "functionCall" not in json.dumps(candidate.get("content"))
    message = candidate["finishMessage"]
    assert message.startswith("Malformed function call: get_weather{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(message.removeprefix("Malformed function call: get_weather"))


def test_malformed_tool_args_does_not_fire_without_a_function_call() -> None:
    client = Client()
    client.arm({"type": "malformed_tool_args"})
    reply = client.send(TEXT)
    assert body_json(reply) == recording(TEXT)["response"]["body"]
    assert len(client.engine.board.armed()) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_empty_response_is_a_content_with_no_parts(stream: bool) -> None:
    answer = faulted_answer("empty_response", TEXT, stream)
    [candidate] = answer["candidates"]
    assert candidate["content"] == {"role": "model"} and candidate["finishReason"] == "STOP"
    usage = answer["usageMetadata"]
    assert "candidatesTokenCount" not in usage and usage["totalTokenCount"] == 9


@pytest.mark.parametrize(("kind", "status"), [("http_429", 429), ("http_503", 503)])
def test_http_faults_are_googles_envelope(kind: str, status: int) -> None:
    client = Client()
    client.arm({"type": kind, "retry_after": 2})
    reply = client.send(TEXT, stream=True)
    assert reply.plan.status == status
    error = body_json(reply)["error"]
    assert error["code"] == status and error["status"] == rpc_status(status)
    assert dict(reply.plan.headers)["retry-after"] == "2"


@pytest.mark.parametrize("kind", ["dropped_connection", "connection_reset", "stall", "garbage"])
def test_socket_faults_cut_after_whole_events(kind: str) -> None:
    client = Client()
    client.arm({"type": kind, "after_chunks": 2, **({"max_ms": 10} if kind == "stall" else {})})
    reply = client.send(STREAM, stream=True)
    recorded = [c["data"] for c in recording(STREAM)["response"]["chunks"]]
    assert frames(reply)[:2] == recorded[:2]
    assert reply.plan.ending is not Ending.COMPLETE


# -- the conversation ----------------------------------------------------------------------


def test_the_recorded_function_turn_has_no_findings() -> None:
    body = recording("gemini-tools/0002")["request"]["body"]
    assert GEMINI.conversation_findings(body, expects_system=False) == []


def test_conversation_defects_are_found() -> None:
    call = {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}}]}
    answer = {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {}}}]}
    user = {"role": "user", "parts": [{"text": "hi"}]}
    checks = [f.check for f in validate_gemini_conversation({"contents": [user, call, user]})]
    assert checks == ["orphan_tool_call"]
    checks = [f.check for f in validate_gemini_conversation({"contents": [user, answer]})]
    assert checks == ["orphan_tool_result"]
    checks = [f.check for f in validate_gemini_conversation({"contents": [call, answer]})]
    assert checks == ["role_order"]
    checks = [f.check for f in validate_gemini_conversation({"contents": [user, user]})]
    assert checks == ["doubled_user_message"]
    found = validate_gemini_conversation({"contents": [user]}, expects_system=True)
    assert [f.check for f in found] == ["missing_system_prompt"]
    assert GEMINI.has_system_prompt(recording(STREAM)["request"]["body"])


# -- the computed methods ------------------------------------------------------------------


def test_count_tokens_is_about_four_characters_a_token() -> None:
    body = {"contents": [{"parts": [{"text": "x" * 10}], "role": "user"}]}
    assert count_tokens_answer(body) == {
        "totalTokens": 3,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 3}],
    }
    assert count_tokens_answer(body, vertex=True)["totalBillableCharacters"] == 10


def test_embeddings_are_deterministic_unit_vectors() -> None:
    one = embed_answer({"content": {"parts": [{"text": "hi"}]}}, "gemini-embedding-001")
    values = one["embedding"]["values"]
    assert len(values) == 768 and abs(sum(v * v for v in values) - 1) < 1e-9
    batch = batch_embed_answer(
        {"requests": [{"content": {"parts": [{"text": "hi"}]}, "outputDimensionality": 768}]},
        "gemini-embedding-001",
    )
    assert batch["embeddings"][0]["values"] == values
    predicted = predict_answer({"instances": [{"content": "hi"}]}, "gemini-embedding-001")
    assert predicted["predictions"][0]["embeddings"]["values"] == values
    with pytest.raises(ValueError, match="requests is not specified"):
        batch_embed_answer({"requests": []}, "m")


# -- the builtin server's hot path and the ASGI app agree ------------------------------------


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("query", ["", "alt=sse"])
def test_the_direct_path_answers_as_the_app(name: str, query: str) -> None:
    def state() -> ChaosState:
        return ChaosState.from_config(ServerConfig(recordings=[shipped_dir("recordings")]))

    method = "streamGenerateContent" if query else "generateContent"
    path = path_of(model_of(name), method)
    raw = json.dumps(client_body(name)).encode()
    answer = DirectHandler(state())("POST", path, query.encode(), [], raw)
    assert answer is not None and answer[0].status == 200

    async def asgi() -> bytes:
        transport = httpx.ASGITransport(app=create_app(state=state()))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            response = await c.post(f"{path}?{query}" if query else path, content=raw)
            return response.content

    assert answer[0].body() == anyio.run(asgi)
