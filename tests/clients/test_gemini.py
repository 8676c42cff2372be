"""The official `google-genai` SDK against a real chaosllm server: every shipped Gemini
recording comes back as the SDK objects it encodes (sync, async, JSON, stream, Gemini API
and Vertex AI paths), function calling (automatic and by hand), the other model methods,
record -> replay through the proxy, and per fault what the SDK does (observed behaviour,
stated as assertions: the README's table)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from google import genai
from google.genai import errors, types
from google.oauth2.credentials import Credentials

from chaosllm import ChaosServer
from chaosllm.providers.sse import iter_data
from chaosllm.testing.pytest_plugin import ChaosHandle
from tests.helpers import (
    CLIENT_RECORDINGS,
    RECORDINGS,
    all_recordings,
    any_recording,
    chunk_data,
    loopback_upstream,
    recording_proxy,
    write_chunk,
    written_chunk_data,
)

NAMES = all_recordings("gemini.generate_content")
TEXT = "gemini-text/0001"
STREAM = "gemini-stream/0001"
TOOLS = "gemini-tools/0001"
AFTER = "gemini-tools/0002"
AFC = "gemini-afc/0001"
"""google-genai's automatic function calling from a Python function (its schema as
``parameters_json_schema`` with the default, its result as ``{result}``): a request only
this SDK sends, so a recording the client tests serve (`CLIENT_RECORDINGS`), not shipped."""
AFC_AFTER = "gemini-afc/0002"
KEY = "AIzaSyChaosllmTestKey0000000000000000000"
"""A key shaped like Google's (what redaction must catch)."""


def get_weather(city: str, unit: str = "celsius") -> dict[str, Any]:
    """Get the current weather in a city.

    Args:
        city: The city, e.g. Paris.
        unit: celsius or fahrenheit.
    """
    return {"temperature": 18, "unit": unit, "conditions": "partly cloudy"}


GET_WEATHER = types.FunctionDeclaration(
    name="get_weather",
    description="Get the current weather in a city.",
    parameters=types.Schema(
        type=types.Type.OBJECT,
        properties={
            "city": types.Schema(type=types.Type.STRING, description="The city, e.g. Paris."),
            "unit": types.Schema(type=types.Type.STRING, description="celsius or fahrenheit."),
        },
        required=["city"],
    ),
)
"""The shipped gemini-tools' function, declared as the Vercel AI SDK declares it too."""


def call(name: str, *, afc: bool = True) -> dict[str, Any]:
    """The google-genai call that sends a recording's request."""
    if name == TEXT:
        return {
            "model": "gemini-2.5-flash",
            "contents": "What is the capital of France? Answer in one sentence.",
        }
    if name == STREAM:
        config = types.GenerateContentConfig(
            system_instruction="You are a poet. Answer with the poem only.", temperature=0.7
        )
        return {
            "model": "gemini-2.0-flash",
            "contents": "Write a four-line poem about the sea.",
            "config": config,
        }
    if name == TOOLS:
        tools = types.GenerateContentConfig(tools=[types.Tool(function_declarations=[GET_WEATHER])])
    else:
        assert name == AFC
        tools = types.GenerateContentConfig(
            tools=[get_weather],
            automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=not afc),
        )
    return {
        "model": "gemini-2.5-flash",
        "contents": "What's the weather like in Paris?",
        "config": tools,
    }


REPLAYED = [TEXT, STREAM, TOOLS]
"""The recordings a single call asks for (AFTER is the function-response turn)."""


def expected(name: str) -> types.GenerateContentResponse:
    return types.GenerateContentResponse.model_validate(any_recording(name)["response"]["body"])


def recorded_chunks(name: str) -> list[types.GenerateContentResponse]:
    chunks = any_recording(name)["response"]["chunks"]
    return [
        types.GenerateContentResponse.model_validate(json.loads(data))
        for data in iter_data([c["data"] for c in chunks])
    ]


def dump(response: types.GenerateContentResponse) -> dict[str, Any]:
    """What a response says (not how it arrived: headers, the AFC history)."""
    return response.model_dump(
        exclude={"sdk_http_response", "automatic_function_calling_history"}, exclude_none=True
    )


def client(server: ChaosServer, **options: Any) -> genai.Client:
    http = types.HttpOptions(base_url=server.url, **{"timeout": 10_000, **options})
    return genai.Client(api_key=KEY, http_options=http)


def retrying(server: ChaosServer, attempts: int = 3, **options: Any) -> genai.Client:
    """A client with the SDK's retries on (off by default): fast, no jitter."""
    retry = types.HttpRetryOptions(attempts=attempts, initial_delay=0.01, max_delay=0.05, jitter=0)
    return client(server, retry_options=retry, **options)


@pytest.fixture
def sdk(server: ChaosServer) -> Iterator[genai.Client]:
    with client(server) as c:
        yield c


@pytest.fixture(scope="module")
def afc_shared() -> Iterator[ChaosServer]:
    with ChaosServer(recordings=[RECORDINGS, CLIENT_RECORDINGS]) as server:
        yield server


@pytest.fixture
def afc_server(afc_shared: ChaosServer) -> ChaosServer:
    """A server of the shipped recordings and the client tests' own (`AFC`)."""
    afc_shared.reset()
    return afc_shared


@pytest.fixture
def afc_sdk(afc_server: ChaosServer) -> Iterator[genai.Client]:
    with client(afc_server) as c:
        yield c


def streamed(c: genai.Client, name: str) -> list[types.GenerateContentResponse]:
    return list(c.models.generate_content_stream(**call(name)))


def statuses(server: ChaosServer) -> list[int | None]:
    return [r["status"] for r in server.requests()]


# -- replay ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", REPLAYED)
def test_sync_generate_content(sdk: genai.Client, name: str) -> None:
    assert dump(sdk.models.generate_content(**call(name, afc=False))) == dump(expected(name))


@pytest.mark.parametrize("name", REPLAYED)
def test_sync_stream(sdk: genai.Client, name: str) -> None:
    chunks = list(sdk.models.generate_content_stream(**call(name, afc=False)))
    final = chunks[-1]
    assert final.candidates and final.candidates[0].finish_reason == types.FinishReason.STOP
    assert dump(final)["usage_metadata"] == dump(expected(name))["usage_metadata"]
    text = "".join(c.text or "" for c in chunks)
    assert text == (expected(name).text or "")
    if any_recording(name)["response"].get("chunks"):  # recorded frames come back as recorded
        assert [dump(c) for c in chunks] == [dump(c) for c in recorded_chunks(name)]


# google-genai's async transport is aiohttp when it is installed, and it subclasses
# aiohttp's ClientSession, which aiohttp warns about.
AIOHTTP_SUBCLASS = "ignore:Inheritance class AiohttpClientSession:DeprecationWarning"


@pytest.mark.filterwarnings(AIOHTTP_SUBCLASS)
def test_the_async_client(afc_server: ChaosServer) -> None:
    async def main() -> None:
        with anyio.fail_after(20):
            c = client(afc_server).aio  # closed below (and by the client on exit)
            for name in REPLAYED:
                got = await c.models.generate_content(**call(name, afc=False))
                assert dump(got) == dump(expected(name))
                stream = await c.models.generate_content_stream(**call(name, afc=False))
                chunks = [ch async for ch in stream]
                assert "".join(ch.text or "" for ch in chunks) == (expected(name).text or "")
            answer = await c.models.generate_content(**call(AFC))  # automatic function calling
            assert answer.text == expected(AFC_AFTER).text
            await c.aclose()

    anyio.run(main)


def test_automatic_function_calling_runs_the_tool_and_sends_its_result(
    afc_sdk: genai.Client, afc_server: ChaosServer
) -> None:
    answer = afc_sdk.models.generate_content(**call(AFC))
    assert dump(answer) == dump(expected(AFC_AFTER))
    history = answer.automatic_function_calling_history or []
    assert [c.role for c in history] == ["user", "model", "user"]
    assert [r["match"] for r in afc_server.requests()] == ["exact", "exact"]
    assert [r["recording"] for r in afc_server.requests()] == [AFC, AFC_AFTER]


def test_function_calling_by_hand(sdk: genai.Client) -> None:
    first = sdk.models.generate_content(**call(TOOLS))
    [function_call] = first.function_calls or []
    assert function_call.name == "get_weather" and function_call.id == "fc-3b1e9d0a"
    assert function_call.args == {"city": "Paris", "unit": "celsius"}
    assert first.candidates and first.candidates[0].content
    result = types.Part(  # answered by the call's id, as the Vercel AI SDK answers it
        function_response=types.FunctionResponse(
            id=function_call.id,
            name="get_weather",
            response={"name": "get_weather", "content": get_weather(**function_call.args)},
        )
    )
    follow_up = sdk.models.generate_content(
        **{
            **call(TOOLS),
            "contents": [
                "What's the weather like in Paris?",
                first.candidates[0].content,
                types.Content(role="user", parts=[result]),
            ],
        }
    )
    assert dump(follow_up) == dump(expected(AFTER))


@pytest.mark.parametrize("version", ["v1beta", "v1"])
def test_both_api_versions(server: ChaosServer, version: str) -> None:
    with client(server, api_version=version) as c:
        assert dump(c.models.generate_content(**call(TEXT))) == dump(expected(TEXT))
        assert [m.name for m in c.models.list()].count("models/gemini-2.5-flash") == 1
    assert server.requests()[0]["path"] == f"/{version}/models/gemini-2.5-flash:generateContent"


def test_vertex_ai_express_and_project_paths(server: ChaosServer) -> None:
    http = types.HttpOptions(base_url=server.url, timeout=10_000)
    express = genai.Client(vertexai=True, api_key=KEY, http_options=http)
    project = genai.Client(
        vertexai=True,
        project="my-project",
        location="us-central1",
        credentials=Credentials(token="ya29.chaosllm-test"),  # type: ignore[no-untyped-call]
        http_options=http,
    )
    for c in (express, project):
        with c:
            assert dump(c.models.generate_content(**call(TEXT))) == dump(expected(TEXT))
            chunks = list(c.models.generate_content_stream(**call(STREAM)))
            assert [dump(ch) for ch in chunks] == [dump(ch) for ch in recorded_chunks(STREAM)]
    assert [r["path"] for r in server.requests()] == [
        "/v1beta1/publishers/google/models/gemini-2.5-flash:generateContent",
        "/v1beta1/publishers/google/models/gemini-2.0-flash:streamGenerateContent",
        "/v1beta1/projects/my-project/locations/us-central1/publishers/google/models/"
        "gemini-2.5-flash:generateContent",
        "/v1beta1/projects/my-project/locations/us-central1/publishers/google/models/"
        "gemini-2.0-flash:streamGenerateContent",
    ]


def test_count_tokens_embeddings_and_the_model_list(sdk: genai.Client) -> None:
    counted = sdk.models.count_tokens(model="gemini-2.5-flash", contents="x" * 10)
    assert counted.total_tokens == 3
    embedded = sdk.models.embed_content(
        model="gemini-embedding-001",
        contents=["hello", "world"],
        config=types.EmbedContentConfig(output_dimensionality=16),
    )
    vectors = [e.values or [] for e in embedded.embeddings or []]
    assert [len(v) for v in vectors] == [16, 16] and vectors[0] != vectors[1]
    again = sdk.models.embed_content(model="gemini-embedding-001", contents="hello")
    assert (again.embeddings or [])[0].values != vectors[0]  # 768 by default
    names = [m.name for m in sdk.models.list()]
    assert "models/gemini-2.0-flash" in names and "models/gemini-2.5-flash" in names


def test_vertex_embeddings_and_count_tokens(server: ChaosServer) -> None:
    http = types.HttpOptions(base_url=server.url, timeout=10_000)
    with genai.Client(vertexai=True, api_key=KEY, http_options=http) as vertex:
        embedded = vertex.models.embed_content(model="text-embedding-005", contents=["hello"])
        assert len((embedded.embeddings or [])[0].values or []) == 768
        counted = vertex.models.count_tokens(model="gemini-2.5-flash", contents="x" * 10)
    assert counted.total_tokens == 3


def test_bad_request_is_googles_400(sdk: genai.Client) -> None:
    with pytest.raises(errors.ClientError) as info:
        sdk.models.generate_content(
            model="gemini-2.5-flash",
            contents=[types.Content(role="system", parts=[types.Part(text="hi")])],
        )
    assert info.value.code == 400 and info.value.status == "INVALID_ARGUMENT"
    assert "valid role" in (info.value.message or "")


def test_unknown_model_is_googles_404_naming_the_digest(
    sdk: genai.Client, server: ChaosServer
) -> None:
    with pytest.raises(errors.ClientError) as info:
        sdk.models.generate_content(**{**call(TEXT), "model": "gemini-9-ultra"})
    assert info.value.code == 404 and info.value.status == "NOT_FOUND"
    [entry] = server.requests()
    assert entry["digest"] in (info.value.message or "")
    assert TEXT in (info.value.message or "")


def test_the_fixture_client(chaosllm: ChaosHandle) -> None:
    with chaosllm.gemini() as c:
        assert dump(c.models.generate_content(**call(TEXT))) == dump(expected(TEXT))
        assert chaosllm.env["GOOGLE_GEMINI_BASE_URL"] == chaosllm.url
        chaosllm.arm("http_503")
        with pytest.raises(errors.ServerError):
            c.models.generate_content(**call(TEXT))
    assert [r["status"] for r in chaosllm.requests()] == [200, 503]


def test_the_sdk_reads_the_fixtures_env(
    chaosllm: ChaosHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    for name, value in chaosllm.env.items():
        monkeypatch.setenv(name, value)
    with genai.Client() as c:
        assert dump(c.models.generate_content(**call(TEXT))) == dump(expected(TEXT))


# -- faults: what google-genai does (the README's table) --------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_http_503_is_a_server_error_not_retried_by_default(
    sdk: genai.Client, server: ChaosServer, stream: bool
) -> None:
    server.arm("http_503")
    with pytest.raises(errors.ServerError) as info:
        streamed(sdk, STREAM) if stream else sdk.models.generate_content(**call(TEXT))
    assert info.value.code == 503 and info.value.status == "UNAVAILABLE"
    assert statuses(server) == [503]


def test_http_503_with_retry_options_is_retried_and_recovers(server: ChaosServer) -> None:
    server.arm("http_503", remaining=2)
    with retrying(server) as c:
        assert dump(c.models.generate_content(**call(TEXT))) == dump(expected(TEXT))
    assert statuses(server) == [503, 503, 200]


def test_http_429_is_resource_exhausted_and_retry_after_is_ignored(server: ChaosServer) -> None:
    server.arm("http_429", retry_after=5)
    with client(server) as c, pytest.raises(errors.ClientError) as info:
        c.models.generate_content(**call(TEXT))
    assert info.value.code == 429 and info.value.status == "RESOURCE_EXHAUSTED"
    server.arm("http_429", retry_after=5)
    with client(server) as c, pytest.raises(errors.ClientError) as info:
        streamed(c, STREAM)
    assert info.value.code == 429
    server.reset()
    server.arm("http_429", retry_after=5)
    started = time.monotonic()
    with retrying(server) as c:
        assert c.models.generate_content(**call(TEXT)).text == expected(TEXT).text
    # Observed: its own exponential backoff, not the 5 s Retry-After.
    assert time.monotonic() - started < 4
    assert statuses(server) == [429, 200]


@pytest.mark.parametrize(
    ("status", "rpc", "kind", "retried"),
    [
        (400, "INVALID_ARGUMENT", errors.ClientError, False),
        (403, "PERMISSION_DENIED", errors.ClientError, False),
        (404, "NOT_FOUND", errors.ClientError, False),
        (500, "INTERNAL", errors.ServerError, True),
        (504, "DEADLINE_EXCEEDED", errors.ServerError, True),
    ],
)
def test_http_error_statuses(
    server: ChaosServer, status: int, rpc: str, kind: type[errors.APIError], retried: bool
) -> None:
    server.arm("http_error", status=status)
    with retrying(server, attempts=2) as c:
        if retried:
            assert c.models.generate_content(**call(TEXT)).text == expected(TEXT).text
        else:
            with pytest.raises(kind) as info:
                c.models.generate_content(**call(TEXT))
            assert info.value.code == status and info.value.status == rpc
    assert statuses(server) == ([status, 200] if retried else [status])


def test_error_event_mid_stream_raises_a_server_error_after_the_chunks_before_it(
    sdk: genai.Client, server: ChaosServer
) -> None:
    server.arm("error_in_200", after_chunks=2)
    got: list[str] = []
    with pytest.raises(errors.ServerError) as info:
        for chunk in sdk.models.generate_content_stream(**call(STREAM)):
            got.append(chunk.text or "")
    assert got == [c.text for c in recorded_chunks(STREAM)[:2]]
    assert info.value.code == 500 and info.value.status == "INTERNAL"


def test_error_envelope_in_a_200_json_is_an_empty_response(
    sdk: genai.Client, server: ChaosServer
) -> None:
    server.arm("error_in_200")
    # Observed: no exception; the SDK's converter drops the unknown "error" key.
    answer = sdk.models.generate_content(**call(TEXT))
    assert answer.candidates is None and answer.text is None


def test_truncated_stream_ends_without_a_finish_reason_silently(
    sdk: genai.Client, server: ChaosServer
) -> None:
    server.arm("truncated_stream", after_chunks=10)
    chunks = streamed(sdk, STREAM)
    assert len(chunks) == 3  # clamped before the finishing response
    assert all(c.candidates and c.candidates[0].finish_reason is None for c in chunks)
    full = expected(STREAM).text or ""
    text = "".join(c.text or "" for c in chunks)
    assert full.startswith(text) and text != full


def test_truncated_json_body_raises_a_json_error(sdk: genai.Client, server: ChaosServer) -> None:
    server.arm("truncated_stream")
    # Observed: the SDK's json.loads of the cut body, unwrapped.
    with pytest.raises(json.JSONDecodeError):
        sdk.models.generate_content(**call(TEXT))


@pytest.mark.parametrize("stream", [False, True])
def test_malformed_tool_args_is_malformed_function_call(
    afc_sdk: genai.Client, afc_server: ChaosServer, stream: bool
) -> None:
    afc_server.arm("malformed_tool_args")
    if stream:
        [answer] = list(afc_sdk.models.generate_content_stream(**call(AFC)))
    else:
        answer = afc_sdk.models.generate_content(**call(AFC))
    # Observed: no function call, no exception; automatic function calling stops there
    # (one request); the Gemini API converter drops finishMessage.
    assert answer.candidates and answer.function_calls is None
    assert answer.candidates[0].finish_reason == types.FinishReason.MALFORMED_FUNCTION_CALL
    assert answer.text is None and answer.candidates[0].finish_message is None
    assert statuses(afc_server) == [200]


def test_malformed_function_call_message_reaches_a_vertex_client(server: ChaosServer) -> None:
    server.arm("malformed_tool_args")
    http = types.HttpOptions(base_url=server.url, timeout=10_000)
    with genai.Client(vertexai=True, api_key=KEY, http_options=http) as vertex:
        answer = vertex.models.generate_content(**call(TOOLS))
    assert answer.candidates
    message = answer.candidates[0].finish_message or ""
    assert message.startswith("Malformed function call: get_weather{")


@pytest.mark.parametrize("stream", [False, True])
def test_empty_response_has_no_text_and_stops(
    sdk: genai.Client, server: ChaosServer, stream: bool
) -> None:
    server.arm("empty_response")
    answer = streamed(sdk, TEXT)[-1] if stream else sdk.models.generate_content(**call(TEXT))
    assert answer.candidates and answer.candidates[0].finish_reason == types.FinishReason.STOP
    assert answer.text is None and answer.function_calls is None


@pytest.mark.parametrize("stream", [False, True])
def test_dropped_connection_is_the_http_librarys_error_never_retried(
    server: ChaosServer, stream: bool
) -> None:
    server.arm("dropped_connection", after_chunks=2)
    with retrying(server) as c, pytest.raises(Exception) as info:
        streamed(c, STREAM) if stream else c.models.generate_content(**call(TEXT))
    assert not isinstance(info.value, errors.APIError)
    assert type(info.value).__name__ == "RemoteProtocolError"
    assert len(server.requests()) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_connection_reset_is_a_read_error_never_retried(server: ChaosServer, stream: bool) -> None:
    server.arm("connection_reset", after_chunks=2)
    with retrying(server) as c, pytest.raises(Exception) as info:
        streamed(c, STREAM) if stream else c.models.generate_content(**call(TEXT))
    assert type(info.value).__name__ == "ReadError"
    assert len(server.requests()) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_empty_reply_is_a_remote_protocol_error_never_retried(
    server: ChaosServer, stream: bool
) -> None:
    server.arm("empty_reply")
    with retrying(server) as c, pytest.raises(Exception) as info:
        streamed(c, STREAM) if stream else c.models.generate_content(**call(TEXT))
    assert type(info.value).__name__ == "RemoteProtocolError"
    assert len(server.requests()) == 1


def test_stall_times_out_and_retry_options_retry_a_timeout(server: ChaosServer) -> None:
    server.arm("stall", max_ms=5000)
    with client(server, timeout=500) as c, pytest.raises(Exception) as info:
        c.models.generate_content(**call(TEXT))
    assert type(info.value).__name__ == "ReadTimeout"
    server.arm("stall", after_chunks=1, max_ms=5000)
    with client(server, timeout=500) as c, pytest.raises(Exception) as info:
        streamed(c, STREAM)
    assert type(info.value).__name__ == "ReadTimeout"
    server.reset()
    server.arm("stall", max_ms=5000)
    with retrying(server, timeout=500) as c:
        assert c.models.generate_content(**call(TEXT)).text == expected(TEXT).text
    assert len(server.requests()) == 2


def test_garbage(sdk: genai.Client, server: ChaosServer) -> None:
    server.arm("garbage")
    with pytest.raises(Exception) as info:
        sdk.models.generate_content(**call(TEXT))
    assert type(info.value).__name__ == "RemoteProtocolError"
    server.arm("garbage", after_chunks=1)
    got: list[str] = []
    with pytest.raises(errors.UnknownApiResponseError):
        for chunk in sdk.models.generate_content_stream(**call(STREAM)):
            got.append(chunk.text or "")
    assert got == [recorded_chunks(STREAM)[0].text]


@pytest.mark.parametrize("kind", ["latency", "slow_stream"])
def test_slowness_delivers_the_whole_answer(server: ChaosServer, kind: str) -> None:
    server.arm(kind, delay_ms=100, remaining=2)
    started = time.monotonic()
    with client(server) as c:
        chunks = streamed(c, STREAM)
        assert time.monotonic() - started >= 0.1
        started = time.monotonic()
        assert dump(c.models.generate_content(**call(TEXT))) == dump(expected(TEXT))
    assert time.monotonic() - started >= 0.1
    assert [dump(ch) for ch in chunks] == [dump(ch) for ch in recorded_chunks(STREAM)]


# -- record -> replay through the proxy --------------------------------------------------------


class _Upstream(BaseHTTPRequestHandler):
    """A small Gemini upstream: the shipped recordings' answers, by method; it keeps the
    API key each request brought (header or ``key=`` query)."""

    protocol_version = "HTTP/1.1"
    keys: list[str] = []

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        path, _, query = self.path.partition("?")
        key = self.headers.get("x-goog-api-key") or dict(
            p.split("=", 1) for p in query.split("&") if "=" in p
        ).get("key", "")
        type(self).keys.append(key)
        if path.endswith(":streamGenerateContent"):
            data = "".join(c["data"] for c in any_recording(STREAM)["response"]["chunks"]).encode()
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for piece in (data[:100], data[100:]):
                write_chunk(self, piece)
            self.wfile.write(b"0\r\n\r\n")
            return
        body = json.dumps(any_recording(TEXT)["response"]["body"]).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json; charset=UTF-8")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def upstream() -> Iterator[str]:
    _Upstream.keys = []
    with loopback_upstream(_Upstream) as url:
        yield url


def test_record_then_replay_and_no_key_is_stored(
    tmp_path: Path, upstream: str, caplog: pytest.LogCaptureFixture
) -> None:
    with ChaosServer(mode="record", upstream=upstream, record_dir=tmp_path) as proxy:
        with client(proxy) as c:
            assert dump(c.models.generate_content(**call(TEXT))) == dump(expected(TEXT))
            chunks = streamed(c, STREAM)
            assert [dump(ch) for ch in chunks] == [dump(ch) for ch in recorded_chunks(STREAM)]
        # A client that puts the key in the query, as Google's REST examples do.
        raw = httpx.post(
            f"{proxy.url}/v1beta/models/gemini-2.5-flash:generateContent?key={KEY}",
            json={"contents": [{"role": "user", "parts": [{"text": "Hi"}]}]},
            timeout=10,
        )
        assert raw.status_code == 200
        journal = json.dumps(proxy.requests())
    assert _Upstream.keys == [KEY, KEY, KEY]  # the upstream got the key each time
    written = sorted(tmp_path.rglob("*.json"))
    assert len(written) == 3
    texts = [p.read_text("utf-8") for p in written]
    assert all(KEY not in t and "key=" not in t for t in texts)
    assert KEY not in journal and KEY not in caplog.text
    stored = [json.loads(t) for t in texts]
    assert {s["provider"] for s in stored} == {"gemini.generate_content"}
    [stream] = [s for s in stored if s["response"]["stream"]]
    assert [c["data"] for c in stream["response"]["chunks"]] == chunk_data(STREAM)
    assert stream["request"]["body"]["alt"] == "sse"
    with ChaosServer(tmp_path) as replay, client(replay) as c:
        assert dump(c.models.generate_content(**call(TEXT))) == dump(expected(TEXT))
        chunks = streamed(c, STREAM)
        assert [dump(ch) for ch in chunks] == [dump(ch) for ch in recorded_chunks(STREAM)]
        assert [r["match"] for r in replay.requests()] == ["exact", "exact"]


def test_the_recorder_never_stores_a_cut_stream(tmp_path: Path) -> None:
    with recording_proxy(record_dir=tmp_path) as (upstream, proxy), client(proxy) as c:
        upstream.arm("truncated_stream", after_chunks=2)
        assert len(streamed(c, STREAM)) == 2
        assert list(tmp_path.rglob("*.json")) == []
        streamed(c, STREAM)
        assert written_chunk_data(tmp_path) == chunk_data(STREAM)


@pytest.mark.parametrize("kind", ["uvicorn", "h11"])
def test_the_other_servers_serve_gemini(kind: str) -> None:
    with ChaosServer(server=kind) as other, client(other) as c:
        assert dump(c.models.generate_content(**call(TEXT))) == dump(expected(TEXT))
        chunks = streamed(c, STREAM)
        assert [dump(ch) for ch in chunks] == [dump(ch) for ch in recorded_chunks(STREAM)]
        assert c.models.count_tokens(model="gemini-2.5-flash", contents="x" * 8).total_tokens == 2


def test_a_raw_client_gets_a_streamed_json_array_without_alt_sse(server: ChaosServer) -> None:
    body: dict[str, Any] = {
        "contents": [
            {"parts": [{"text": "Write a four-line poem about the sea."}], "role": "user"}
        ],
        "systemInstruction": {
            "parts": [{"text": "You are a poet. Answer with the poem only."}],
            "role": "user",
        },
    }
    url = f"{server.url}/v1beta/models/gemini-2.0-flash:streamGenerateContent?key={KEY}"
    with httpx.stream("POST", url, json=body, timeout=10) as response:
        assert response.headers["content-type"].startswith("application/json")
        raw = response.read()
    recorded = [c["data"] for c in any_recording(STREAM)["response"]["chunks"]]
    assert json.loads(raw) == [json.loads(d) for d in iter_data(recorded)]
    [entry] = server.requests()
    assert entry["match"] == "exact" and KEY not in json.dumps(entry)
