"""Fields the providers' own descriptions require, in memory: a Responses stream's
``sequence_number`` that keeps increasing through an ``error`` event, the ``name`` of
``response.function_call_arguments.done``, the shipped ``azure-responses`` answer as a
full ``Response``, google.rpc code names against their HTTP mapping, the request id every
answer chaosllm makes itself carries (deterministic from the seed), and the 429 each
protocol sends: its own rate-limit headers only, its body agreeing with ``Retry-After``."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from chaosllm.config import ServerConfig, parse_rate_limit
from chaosllm.core.clock import ManualClock
from chaosllm.core.engine import Engine, ProviderCall, Reply
from chaosllm.faults import parse_fault_specs
from chaosllm.paths import shipped_dir
from chaosllm.providers import PROVIDERS
from chaosllm.providers.gemini import rpc_status
from chaosllm.providers.sse import iter_events
from chaosllm.store.recordings import RecordingStore
from tests.engine.test_failure_classes import CASES, STORE, Client, body_of
from tests.helpers import recording

pytestmark = pytest.mark.timeout(60)

RESPONSES = ("openai.responses", "azure.responses")


def events(reply: Any) -> list[dict[str, Any]]:
    text = "".join(p.data.decode() for p in reply.plan.pieces)
    return [json.loads(data) for _, data in iter_events([text])]


# -- 1. Responses: sequence_number keeps increasing through an error event -----------------


@pytest.mark.parametrize("name", RESPONSES)
@pytest.mark.parametrize(
    "fault",
    [
        {"type": "error_in_200", "after_chunks": 2},
        {"type": "error_in_200", "after_chunks": 5},
        {"type": "overloaded", "after_chunks": 3},
    ],
)
def test_a_mid_stream_error_event_continues_the_sequence_numbers(
    name: str, fault: dict[str, Any]
) -> None:
    client = Client.new()
    client.arm(fault)
    got = events(client.send(name, stream=True))
    assert got[-1]["type"] == "error" and len(got) > 2
    assert [e["sequence_number"] for e in got] == list(range(len(got)))


def test_the_error_event_after_recorded_frames_continues_their_numbers() -> None:
    """responses-streaming/0001 is served from its recorded frames."""
    engine = Engine(
        ServerConfig(recordings=[shipped_dir("recordings")]), STORE, clock=ManualClock()
    )
    engine.board.arm(parse_fault_specs({"type": "error_in_200", "after_chunks": 4}))
    body = recording("responses-streaming/0001")["request"]["body"]
    reply = engine.handle(
        ProviderCall(
            provider=PROVIDERS["openai.responses"],
            path="/v1/responses",
            body=json.dumps(body).encode(),
        )
    )
    assert isinstance(reply, Reply)
    got = events(reply)
    numbers = [e["sequence_number"] for e in got]
    assert got[-1]["type"] == "error" and numbers == list(range(numbers[0], numbers[0] + len(got)))


# -- 2. Responses: function_call_arguments.done names the function --------------------------


def test_function_call_arguments_done_carries_the_name() -> None:
    name = "responses-tools/0001"
    """OpenAI's ResponseFunctionCallArgumentsDoneEvent requires ``name``."""
    answer = recording(name)["response"]["body"]
    calls = {i["id"]: i["name"] for i in answer["output"] if i["type"] == "function_call"}
    codec = PROVIDERS["openai.responses"].codec
    done = [
        json.loads(data)
        for _, data in iter_events(codec.stream_frames(answer))
        if '"response.function_call_arguments.done"' in data
    ]
    assert calls and done and all(e["name"] == calls[e["item_id"]] for e in done)


# -- 3. the shipped azure-responses answer is a whole Response ------------------------------


def test_the_azure_responses_recording_has_every_member_a_response_requires() -> None:
    answer = recording("azure-responses/0001")["response"]["body"]
    for key in ("instructions", "metadata", "tool_choice", "temperature", "top_p"):
        assert key in answer
    assert set(answer["usage"]) >= {"input_tokens_details", "output_tokens_details"}
    assert answer["output"][0]["content"][0]["logprobs"] == []


def test_the_azure_responses_recording_keeps_its_digest() -> None:
    """Only its answer changed: the stored digest is the one its request computes."""
    data = recording("azure-responses/0001")
    provider = PROVIDERS["azure.responses"]
    assert data["digest"] == provider.digest(data["request"]["body"])


# -- 4. Gemini: google.rpc code names and their HTTP mapping -------------------------------

# google/rpc/code.proto (googleapis): each code and the HTTP status it maps to.
GOOGLE_RPC_HTTP = {
    "OK": 200,
    "CANCELLED": 499,
    "UNKNOWN": 500,
    "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "PERMISSION_DENIED": 403,
    "UNAUTHENTICATED": 401,
    "RESOURCE_EXHAUSTED": 429,
    "FAILED_PRECONDITION": 400,
    "ABORTED": 409,
    "OUT_OF_RANGE": 400,
    "UNIMPLEMENTED": 501,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "DATA_LOSS": 500,
}


@pytest.mark.parametrize("status", sorted(set(GOOGLE_RPC_HTTP.values()) - {200}))
def test_every_mapped_status_gets_a_google_rpc_code_that_maps_back(status: int) -> None:
    code = rpc_status(status)
    assert GOOGLE_RPC_HTTP[code] == status


def test_a_501_is_unimplemented() -> None:
    body = PROVIDERS["gemini.generate_content"].error_body(501, "no")
    assert body["error"]["status"] == "UNIMPLEMENTED"


def test_a_status_google_rpc_has_no_code_for_is_still_a_google_rpc_code() -> None:
    for status in (402, 405, 412, 413, 418, 502, 529):
        assert rpc_status(status) in GOOGLE_RPC_HTTP


# -- 5. request ids ------------------------------------------------------------------------

ID_HEADERS = {
    "openai.chat": ("x-request-id", r"req_[0-9a-f]{32}"),
    "openai.responses": ("x-request-id", r"req_[0-9a-f]{32}"),
    "azure.chat": ("apim-request-id", r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-"),
    "azure.responses": ("x-request-id", r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab]"),
    "anthropic.messages": ("request-id", r"req_011C[0-9A-Za-z]{20}"),
    "bedrock.converse": ("x-amzn-RequestId", r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab]"),
}
FAULTS = [
    {"type": "http_503"},
    {"type": "http_429", "retry_after": 2},
    {"type": "http_error", "status": 500},
    {"type": "invalid_api_key"},
    {"type": "model_not_found"},
    None,  # the recording itself
]


def _ids(seed: int, name: str, fault: dict[str, Any] | None) -> list[str]:
    config = ServerConfig(recordings=[shipped_dir("recordings")], seed=seed)
    client = Client(Engine(config, STORE, clock=ManualClock()))
    header = ID_HEADERS[name][0]
    got = []
    for _ in range(2):
        if fault is not None:
            client.arm(fault)
        headers = dict(client.send(name, stream=False).plan.headers)
        got.append(headers[header])
    return got


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f["type"] if f else "replay")
@pytest.mark.parametrize("name", sorted(ID_HEADERS))
def test_every_answer_carries_a_request_id_the_seed_decides(
    name: str, fault: dict[str, Any] | None
) -> None:
    header, shape = ID_HEADERS[name]
    first = _ids(7, name, fault)
    recorded = {k.lower() for k in recording(CASES[name].recording)["response"].get("headers", {})}
    if header.lower() in recorded and fault is None:
        return  # a recorded answer keeps the id it was recorded with
    assert all(re.match(shape, i) for i in first), first
    assert first[0] != first[1]  # no two answers share one
    assert _ids(7, name, fault) == first  # the same seed, the same ids
    assert _ids(8, name, fault)[0] != first[0]


@pytest.mark.parametrize("name", ["gemini.generate_content", "ollama.chat"])
def test_apis_that_send_no_request_id_get_none(name: str) -> None:
    client = Client.new()
    client.arm({"type": "http_503"})
    headers = {k.lower() for k, _ in client.send(name, stream=False).plan.headers}
    assert not headers & {"x-request-id", "request-id", "apim-request-id", "x-amzn-requestid"}


@pytest.mark.parametrize(
    "fault", [{"type": "http_503"}, {"type": "overloaded"}, {"type": "invalid_api_key"}]
)
def test_an_anthropic_error_body_says_its_request_id(fault: dict[str, Any]) -> None:
    client = Client.new()
    client.arm(fault)
    reply = client.send("anthropic.messages", stream=False)
    body = body_of(reply)
    assert body["type"] == "error"
    assert body["request_id"] == dict(reply.plan.headers)["request-id"]


def test_an_anthropic_miss_says_its_request_id() -> None:
    engine = Engine(
        ServerConfig(recordings=[shipped_dir("recordings")]), STORE, clock=ManualClock()
    )
    body = {"model": "claude-x", "max_tokens": 5, "messages": [{"role": "user", "content": "?"}]}
    reply = engine.handle(
        ProviderCall(
            provider=PROVIDERS["anthropic.messages"],
            path="/v1/messages",
            body=json.dumps(body).encode(),
        )
    )
    assert isinstance(reply, Reply) and reply.plan.status == 404
    assert body_of(reply)["request_id"] == dict(reply.plan.headers)["request-id"]


# -- 6. a 429 as each protocol sends it ---------------------------------------------------

RATE_HEADERS = {
    "openai.chat": {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "7s"},
    "openai.responses": {
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "7s",
    },
    "azure.chat": {"x-ratelimit-remaining-requests": "0"},
    "azure.responses": {"x-ratelimit-remaining-requests": "0"},
    "anthropic.messages": {
        "anthropic-ratelimit-requests-remaining": "0",
        # ManualClock's wall (1_700_000_000) + 7 s.
        "anthropic-ratelimit-requests-reset": "2023-11-14T22:13:27Z",
    },
    "gemini.generate_content": {},
    "bedrock.converse": {},
    "ollama.chat": {},
    "ollama.generate": {},
}


@pytest.mark.parametrize("name", sorted(RATE_HEADERS))
def test_a_429_carries_only_its_providers_rate_limit_headers(name: str) -> None:
    client = Client.new()
    client.arm({"type": "http_429", "retry_after": 7})
    reply = client.send(name, stream=False)
    assert reply.plan.status == 429
    headers = {k.lower(): v for k, v in reply.plan.headers}
    rate = {k: v for k, v in headers.items() if "ratelimit" in k}
    assert rate == RATE_HEADERS[name]
    assert headers["retry-after"] == "7" and headers["retry-after-ms"] == "7000"


@pytest.mark.parametrize("name", sorted(RATE_HEADERS))
def test_a_429_body_tells_the_wait_its_headers_tell(name: str) -> None:
    client = Client.new()
    client.arm({"type": "http_429", "retry_after": 7})
    text = json.dumps(body_of(client.send(name, stream=False)))
    assert "try again in 7s" in text and "in 1s" not in text


def test_a_gemini_429_says_the_wait_as_google_rpc_retry_info() -> None:
    client = Client.new()
    client.arm({"type": "http_429", "retry_after": 2.5})
    error = body_of(client.send("gemini.generate_content", stream=False))["error"]
    assert error["status"] == "RESOURCE_EXHAUSTED"
    [info] = [d for d in error["details"] if d["@type"].endswith("google.rpc.RetryInfo")]
    assert info == {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "3s"}


def test_a_429_without_a_wait_tells_one_second_everywhere() -> None:
    client = Client.new()
    client.arm({"type": "http_429"})
    reply = client.send("openai.chat", stream=False)
    assert "try again in 1s" in body_of(reply)["error"]["message"]
    assert dict(reply.plan.headers)["x-ratelimit-reset-requests"] == "1s"


def test_the_live_rate_limit_429_of_gemini_says_its_wait_too() -> None:
    config = ServerConfig(
        recordings=[shipped_dir("recordings")], rate_limit=parse_rate_limit("rpm=1")
    )
    client = Client(Engine(config, RecordingStore.load(config.recordings), clock=ManualClock()))
    client.send("gemini.generate_content", stream=False)
    error = body_of(client.send("gemini.generate_content", stream=False))["error"]
    assert any(d["@type"].endswith("RetryInfo") for d in error["details"])
