"""`boto3`'s ``bedrock-runtime`` client against a real chaosllm server: every shipped
Bedrock recording comes back as what it encodes (``converse`` and ``converse_stream``; boto3
has no async client), the recorded event-stream frames byte for byte, AWS's errors, and
per fault what the SDK does (observed behaviour, stated as assertions; the README's table).

botocore retries on its own (legacy mode: 5 attempts; standard: 3), so every client here
says how many attempts it makes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import boto3
import httpx
import pytest
import urllib3.exceptions
from botocore.config import Config
from botocore.eventstream import ChecksumMismatch, EventStreamBuffer
from botocore.exceptions import ClientError, ConnectionClosedError, EventStreamError
from botocore.exceptions import ReadTimeoutError as BotoReadTimeout

from chaosllm import ChaosServer
from chaosllm.providers import PROVIDERS
from tests.helpers import all_recordings, recording
from tests.helpers import sdk_arguments as request

NAMES = all_recordings("bedrock.converse")
STREAMED = [n for n in NAMES if recording(n)["response"].get("chunks")]
BEDROCK = PROVIDERS["bedrock.converse"]
TEXT = "bedrock-text/0001"
STREAM = "bedrock-stream/0001"
TOOLS = "bedrock-tools/0001"


def client(server: ChaosServer, *, attempts: int = 1, read_timeout: float = 10) -> Any:
    config = Config(
        retries={"total_max_attempts": attempts, "mode": "standard"},
        read_timeout=read_timeout,
        connect_timeout=5,
    )
    return boto3.client(
        "bedrock-runtime",
        endpoint_url=server.url,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="y",
        config=config,
    )


@pytest.fixture
def bedrock(server: ChaosServer) -> Iterator[Any]:
    sdk = client(server)
    yield sdk
    sdk.close()


def expected(name: str) -> dict[str, Any]:
    answer: dict[str, Any] = recording(name)["response"]["body"]
    return answer


def answer_of(response: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in response.items() if k != "ResponseMetadata"}


def events(sdk: Any, name: str, got: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The events of a ``converse_stream`` call (appended to `got` as they come, so that a
    test sees those before a failure); the stream is closed however it ends."""
    got = [] if got is None else got
    stream = sdk.converse_stream(**request(name))["stream"]
    try:
        got.extend(stream)
    finally:
        stream.close()
    return got


def assembled(stream: list[dict[str, Any]]) -> dict[str, Any]:
    """What a caller builds from ``converse_stream`` events: the ``converse`` answer."""
    blocks: dict[int, dict[str, Any]] = {}
    inputs: dict[int, str] = {}
    answer: dict[str, Any] = {}
    role = None
    for event in stream:
        ((kind, data),) = event.items()
        if kind == "messageStart":
            role = data["role"]
        elif kind == "contentBlockStart":
            use = data["start"]["toolUse"]
            blocks[data["contentBlockIndex"]] = {"toolUse": dict(use)}
            inputs[data["contentBlockIndex"]] = ""
        elif kind == "contentBlockDelta":
            i, delta = data["contentBlockIndex"], data["delta"]
            if "text" in delta:
                block = blocks.setdefault(i, {"text": ""})
                block["text"] += delta["text"]
            else:
                inputs[i] += delta["toolUse"]["input"]
        elif kind == "contentBlockStop" and data["contentBlockIndex"] in inputs:
            i = data["contentBlockIndex"]
            blocks[i]["toolUse"]["input"] = json.loads(inputs.pop(i))
        elif kind == "messageStop":
            answer["stopReason"] = data["stopReason"]
        elif kind == "metadata":
            answer.update(data)
    content = [blocks[i] for i in sorted(blocks)]
    return {"output": {"message": {"role": role, "content": content}}, **answer}


# -- every shipped recording ----------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_converse_returns_the_recorded_answer(bedrock: Any, name: str) -> None:
    assert answer_of(bedrock.converse(**request(name))) == expected(name)


@pytest.mark.parametrize("name", NAMES)
def test_converse_stream_events_add_up_to_the_recorded_answer(bedrock: Any, name: str) -> None:
    stream = events(bedrock, name)
    assert list(stream[0]) == ["messageStart"]
    assert [next(iter(e)) for e in stream[-2:]] == ["messageStop", "metadata"]
    assert assembled(stream) == expected(name)


@pytest.mark.parametrize("name", STREAMED)
def test_recorded_frames_replay_byte_for_byte(server: ChaosServer, name: str) -> None:
    data = recording(name)
    chunks = data["response"]["chunks"]
    wire = httpx.post(
        server.url + data["request"]["path"].replace(":", "%3A"),
        json={k: v for k, v in data["request"]["body"].items() if k not in ("modelId", "stream")},
        timeout=10,
    )
    assert wire.status_code == 200
    assert wire.headers["content-type"] == "application/vnd.amazon.eventstream"
    assert wire.content == b"".join(BEDROCK.codec.encode_frame(c["data"]) for c in chunks)
    buffer = EventStreamBuffer()
    buffer.add_data(wire.content)
    payloads = [json.loads(m.payload) for m in buffer]
    assert payloads == [json.loads(c["data"].split("\n\n", 1)[1]) for c in chunks]
    assert all("p" in p for p in payloads[:-1])  # Bedrock's padding, kept as recorded


def test_the_sdk_sees_the_recorded_stream_events(bedrock: Any) -> None:
    stream = events(bedrock, STREAM)
    recorded = [c["data"] for c in recording(STREAM)["response"]["chunks"]]
    assert [next(iter(e)) for e in stream] == [t.split("\n", 1)[0].split(": ")[1] for t in recorded]
    text = "".join(e["contentBlockDelta"]["delta"]["text"] for e in stream[1:-3])
    assert text == expected(STREAM)["output"]["message"]["content"][0]["text"]


def test_a_tool_call_streams_its_input_as_json_string_fragments(bedrock: Any) -> None:
    stream = events(bedrock, TOOLS)
    starts = [e["contentBlockStart"] for e in stream if "contentBlockStart" in e]
    assert starts == [
        {
            "start": {
                "toolUse": {"toolUseId": "tooluse_kZJMlvQmRJ6eAyJE5GIl7Q", "name": "get_weather"}
            },
            "contentBlockIndex": 1,
        }
    ]
    fragments = [
        e["contentBlockDelta"]["delta"]["toolUse"]["input"]
        for e in stream
        if "toolUse" in e.get("contentBlockDelta", {}).get("delta", {})
    ]
    assert len(fragments) > 1 and all(isinstance(f, str) for f in fragments)
    assert json.loads("".join(fragments)) == {"city": "Paris", "unit": "celsius"}


def test_the_tool_result_turn_gets_its_answer(bedrock: Any) -> None:
    got = bedrock.converse(**request("bedrock-tools/0002"))
    assert got["output"]["message"]["content"] == [
        {"text": "It's 18°C and partly cloudy in Paris."}
    ]
    assert got["usage"] == {"inputTokens": 482, "outputTokens": 16, "totalTokens": 498}


# -- AWS's errors ---------------------------------------------------------------------


def test_an_unknown_model_is_resource_not_found_naming_digest_and_nearest(bedrock: Any) -> None:
    arn = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-x:0"
    with pytest.raises(ClientError) as caught:
        bedrock.converse(**{**request(TEXT), "modelId": arn})
    error = caught.value.response["Error"]
    assert error["Code"] == "ResourceNotFoundException"
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    assert "No recording matches this request (digest " in error["Message"]
    assert f"model {arn!r}" in error["Message"]  # the ARN's slashes reached the binding
    assert "bedrock-text/0001" in error["Message"]


def test_a_bad_request_is_a_validation_exception(server: ChaosServer) -> None:
    sdk = boto3.client(
        "bedrock-runtime",
        endpoint_url=server.url,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="y",
        config=Config(parameter_validation=False, retries={"total_max_attempts": 1}),
    )
    bad = [{"role": "system", "content": [{"text": "hi"}]}]
    with closing(sdk), pytest.raises(ClientError) as caught:
        sdk.converse(modelId="m", messages=bad)
    assert caught.value.response["Error"]["Code"] == "ValidationException"
    assert "[user, assistant]" in caught.value.response["Error"]["Message"]
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400


# -- every fault ----------------------------------------------------------------------


def journal(server: ChaosServer) -> list[dict[str, Any]]:
    return server.requests()


@pytest.mark.parametrize("stream", [False, True])
def test_empty_response(server: ChaosServer, bedrock: Any, stream: bool) -> None:
    server.arm("empty_response")
    if stream:
        assert [next(iter(e)) for e in events(bedrock, TEXT)] == [
            "messageStart",
            "messageStop",
            "metadata",
        ]
    else:
        got = bedrock.converse(**request(TEXT))
        assert got["output"]["message"]["content"] == [] and got["stopReason"] == "end_turn"


def test_truncated_stream_ends_the_iteration_cleanly_without_message_stop(
    server: ChaosServer, bedrock: Any
) -> None:
    server.arm("truncated_stream", after_chunks=3)
    assert [next(iter(e)) for e in events(bedrock, STREAM)] == ["messageStart"] + [
        "contentBlockDelta"
    ] * 2


def test_truncated_json_is_an_answer_without_output(server: ChaosServer, bedrock: Any) -> None:
    server.arm("truncated_stream")
    assert "output" not in bedrock.converse(**request(TEXT))  # botocore drops the bad JSON


def test_dropped_connection_mid_stream_raises_urllib3s_protocol_error(
    server: ChaosServer, bedrock: Any
) -> None:
    server.arm("dropped_connection", after_chunks=2)
    got: list[dict[str, Any]] = []
    with pytest.raises(urllib3.exceptions.ProtocolError):
        events(bedrock, STREAM, got)
    assert len(got) == 2


def test_dropped_connection_inside_a_frame(server: ChaosServer, bedrock: Any) -> None:
    server.arm("dropped_connection", after_chunks=2, after_bytes=20)
    got: list[dict[str, Any]] = []
    with pytest.raises(urllib3.exceptions.ProtocolError):
        events(bedrock, STREAM, got)
    assert len(got) == 2  # the third frame's first 20 bytes are no event
    chunks = recording(STREAM)["response"]["chunks"]
    whole = sum(len(BEDROCK.codec.encode_frame(c["data"])) for c in chunks[:2])
    (entry,) = journal(server)
    assert entry["frames_sent"] == 2 and entry["bytes_sent"] == whole + 20


def test_dropped_json_is_an_answer_without_output(server: ChaosServer, bedrock: Any) -> None:
    server.arm("dropped_connection")
    assert "output" not in bedrock.converse(**request(TEXT))


def test_error_in_200_mid_stream_is_a_model_stream_error_exception(
    server: ChaosServer, bedrock: Any
) -> None:
    server.arm("error_in_200", after_chunks=2)
    got: list[dict[str, Any]] = []
    with pytest.raises(EventStreamError) as caught:
        events(bedrock, STREAM, got)
    assert len(got) == 2
    assert caught.value.response["Error"]["Code"] == "modelStreamErrorException"


def test_error_in_200_json_is_an_answer_without_output(server: ChaosServer, bedrock: Any) -> None:
    server.arm("error_in_200", message="boom")
    got = bedrock.converse(**request(TEXT))
    assert "output" not in got and got["ResponseMetadata"]["HTTPStatusCode"] == 200


@pytest.mark.parametrize(
    ("fault", "params", "code", "status"),
    [
        ("http_503", {}, "ServiceUnavailableException", 503),
        ("http_429", {}, "ThrottlingException", 429),
        ("http_error", {"status": 400}, "ValidationException", 400),
        ("http_error", {"status": 403}, "AccessDeniedException", 403),
        ("http_error", {"status": 404}, "ResourceNotFoundException", 404),
        ("http_error", {"status": 408}, "ModelTimeoutException", 408),
        ("http_error", {"status": 424}, "ModelErrorException", 424),
        ("http_error", {"status": 500}, "InternalServerException", 500),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_error_statuses_are_the_modelled_exceptions(
    server: ChaosServer,
    bedrock: Any,
    fault: str,
    params: dict[str, Any],
    code: str,
    status: int,
    stream: bool,
) -> None:
    server.arm(fault, **params)
    with pytest.raises(ClientError) as caught:
        if stream:
            events(bedrock, STREAM)
        else:
            bedrock.converse(**request(TEXT))
    assert type(caught.value).__name__ == code  # the modelled exception class
    assert caught.value.response["Error"]["Code"] == code
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == status


@pytest.mark.parametrize("fault", ["http_503", "http_429"])
def test_botocore_retries_503_and_throttling_at_once(server: ChaosServer, fault: str) -> None:
    with closing(client(server, attempts=2)) as sdk:
        server.arm(fault, retry_after=30)
        got = sdk.converse(**request(TEXT))
    assert got["output"] == expected(TEXT)["output"]
    assert got["ResponseMetadata"]["RetryAttempts"] == 1
    first, second = journal(server)
    assert first["status"] in (503, 429) and second["status"] == 200
    # botocore ignores Retry-After (30 s here): its own backoff is well under a second.
    assert second["monotonic"] - first["monotonic"] < 5


def test_malformed_tool_args_json_is_an_empty_input_cut_by_max_tokens(
    server: ChaosServer, bedrock: Any
) -> None:
    server.arm("malformed_tool_args")
    got = bedrock.converse(**request(TOOLS))
    (use,) = [b["toolUse"] for b in got["output"]["message"]["content"] if "toolUse" in b]
    assert use["input"] == {} and got["stopReason"] == "max_tokens"


def test_malformed_tool_args_stream_is_input_fragments_that_are_not_json(
    server: ChaosServer, bedrock: Any
) -> None:
    server.arm("malformed_tool_args")
    stream = events(bedrock, TOOLS)
    text = "".join(
        e["contentBlockDelta"]["delta"]["toolUse"]["input"]
        for e in stream
        if "toolUse" in e.get("contentBlockDelta", {}).get("delta", {})
    )
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    assert stream[-2] == {"messageStop": {"stopReason": "max_tokens"}}


@pytest.mark.parametrize("stream", [False, True])
def test_connection_reset(server: ChaosServer, bedrock: Any, stream: bool) -> None:
    if stream:
        server.arm("connection_reset", after_chunks=2)
        got: list[dict[str, Any]] = []
        with pytest.raises(urllib3.exceptions.ProtocolError, match="reset"):
            events(bedrock, STREAM, got)
        assert len(got) == 2
    else:
        server.arm("connection_reset")
        with pytest.raises(ConnectionClosedError):
            bedrock.converse(**request(TEXT))


@pytest.mark.parametrize("stream", [False, True])
def test_empty_reply_is_connection_closed(server: ChaosServer, bedrock: Any, stream: bool) -> None:
    server.arm("empty_reply")
    with pytest.raises(ConnectionClosedError):
        if stream:
            events(bedrock, STREAM)
        else:
            bedrock.converse(**request(TEXT))


@pytest.mark.parametrize("stream", [False, True])
def test_latency_past_the_read_timeout(server: ChaosServer, stream: bool) -> None:
    server.arm("latency", delay_ms=1500)
    with closing(client(server, read_timeout=0.3)) as sdk, pytest.raises(BotoReadTimeout):
        if stream:
            events(sdk, STREAM)
        else:
            sdk.converse(**request(TEXT))


def test_slow_stream_arrives_whole(server: ChaosServer, bedrock: Any) -> None:
    server.arm("slow_stream", delay_ms=5)
    assert assembled(events(bedrock, STREAM)) == expected(STREAM)


@pytest.mark.parametrize("stream", [False, True])
def test_stall_is_a_read_timeout(server: ChaosServer, stream: bool) -> None:
    server.arm("stall", after_chunks=2, max_ms=5000)
    with closing(client(server, read_timeout=0.3)) as sdk:
        if stream:
            got: list[dict[str, Any]] = []
            with pytest.raises(urllib3.exceptions.ReadTimeoutError):
                events(sdk, STREAM, got)
            assert len(got) == 2
        else:
            with pytest.raises(BotoReadTimeout):
                sdk.converse(**request(TEXT))


def test_garbage_mid_stream_is_a_frame_with_a_bad_crc(server: ChaosServer, bedrock: Any) -> None:
    server.arm("garbage", after_chunks=2)
    got: list[dict[str, Any]] = []
    with pytest.raises(ChecksumMismatch):
        events(bedrock, STREAM, got)
    assert len(got) == 2


def test_garbage_data_mid_stream_is_sent_as_given(server: ChaosServer, bedrock: Any) -> None:
    server.arm("garbage", after_chunks=1, data="not an event stream at all")
    with pytest.raises(ChecksumMismatch):  # its first 12 bytes fail as a prelude
        events(bedrock, STREAM)


def test_garbage_before_the_head_is_connection_closed(server: ChaosServer, bedrock: Any) -> None:
    server.arm("garbage")
    with pytest.raises(ConnectionClosedError):
        bedrock.converse(**request(TEXT))


def test_the_fixture_gives_a_bedrock_client_and_env(chaosllm: Any) -> None:
    with closing(chaosllm.bedrock(config=Config(retries={"total_max_attempts": 1}))) as sdk:
        assert answer_of(sdk.converse(**request(TEXT))) == expected(TEXT)
    env = chaosllm.env
    assert env["AWS_ENDPOINT_URL_BEDROCK_RUNTIME"] == chaosllm.url
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"} <= set(env)
    assert [r["path"] for r in chaosllm.requests()] == [
        f"/model/{request(TEXT)['modelId']}/converse"
    ]


def test_boto3_finds_the_server_from_the_env(
    server: ChaosServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {
        "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": server.url,
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "y",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    session = boto3.session.Session()  # reads the environment now
    sdk = session.client("bedrock-runtime", config=Config(retries={"total_max_attempts": 1}))
    with closing(sdk):
        assert answer_of(sdk.converse(**request(TEXT))) == expected(TEXT)
