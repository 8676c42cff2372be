"""Bedrock Converse in memory (the provider and `EnginePair`): the path binds the model id
and the stream flag, the digest leaves the transport out, validation and misses in AWS's
shapes, stream frames and their assembly, and each fault as the event stream breaks."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chaosllm.errors import EventStreamError
from chaosllm.faults.transform import DEFAULT_GARBAGE
from chaosllm.providers import PROVIDERS, eventstream, provider_for_path
from chaosllm.providers.bedrock import ERROR_TYPE_SUFFIX
from tests.helpers import all_recordings, recording
from tests.memory import Answer, EnginePair

BEDROCK = PROVIDERS["bedrock.converse"]
NAMES = all_recordings("bedrock.converse")
STREAM = "bedrock-stream/0001"
TOOLS = "bedrock-tools/0001"


def path_of(name: str) -> str:
    path: str = recording(name)["request"]["path"]
    return path


def wire_body(name: str) -> dict[str, Any]:
    """What botocore sends: the body without what the path says."""
    body = dict(recording(name)["request"]["body"])
    del body["modelId"], body["stream"]
    return body


def stream_path(name: str) -> str:
    return path_of(name).removesuffix("-stream").removesuffix("/converse") + "/converse-stream"


def events(answer: Answer) -> list[eventstream.Message]:
    return eventstream.decode_all(answer.body)


def test_the_paths_bind_the_model_id_and_the_stream_flag() -> None:
    arn = "arn:aws:bedrock:us-east-1:1:inference-profile/us.anthropic.claude:0"
    assert provider_for_path(f"/model/{arn}/converse-stream") is BEDROCK
    assert BEDROCK.path_params(f"/model/{arn}/converse-stream") == {
        "modelId": arn,
        "stream": "true",
    }
    assert BEDROCK.path_params("/model/m:0/converse") == {"modelId": "m:0", "stream": "false"}
    assert BEDROCK.path_params("/model/m/invoke") is None
    bound = BEDROCK.bind({"messages": []}, {"modelId": "m", "stream": "true"}, "")
    assert bound == {"messages": [], "modelId": "m", "stream": True}
    assert BEDROCK.upstream_path(f"/model/{arn}/converse") == (
        "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A1%3Ainference-profile%2Fus.anthropic.claude%3A0"
        "/converse"
    )


def test_a_stream_and_a_json_request_share_a_digest() -> None:
    body = recording(STREAM)["request"]["body"]
    assert BEDROCK.digest({**body, "stream": False}) == BEDROCK.digest(body)
    assert BEDROCK.digest({**body, "modelId": "other"}) != BEDROCK.digest(body)
    assert BEDROCK.digest({**body, "inferenceConfig": {"maxTokens": 9}}) == BEDROCK.digest(body)


@pytest.mark.parametrize("name", NAMES)
def test_every_recording_replays_as_json_and_as_a_stream(pair: EnginePair, name: str) -> None:
    answer = pair.send(wire_body(name), path=path_of(name).removesuffix("-stream"))
    assert answer.status == 200 and answer.json() == recording(name)["response"]["body"]
    streamed = pair.send(wire_body(name), path=stream_path(name))
    assert streamed.headers["content-type"] == "application/vnd.amazon.eventstream"
    texts = [eventstream.message_text(m) for m in events(streamed)]
    assert BEDROCK.assemble(texts) == recording(name)["response"]["body"]
    assert BEDROCK.codec.stream_complete(texts)
    assert streamed.record["model"] == recording(name)["request"]["body"]["modelId"]


@pytest.mark.parametrize("name", NAMES)
def test_rendered_frames_assemble_back_to_the_answer(name: str) -> None:
    answer = recording(name)["response"]["body"]
    frames = BEDROCK.codec.stream_frames(answer)
    assert BEDROCK.assemble(frames) == answer
    for text in frames:
        assert BEDROCK.codec.frame_text(BEDROCK.codec.encode_frame(text)) == text


def test_a_bad_request_is_a_validation_exception(pair: EnginePair) -> None:
    answer = pair.send({"messages": [{"role": "user", "content": "hi"}]}, path="/model/m/converse")
    assert answer.status == 400
    assert answer.headers["x-amzn-errortype"] == "ValidationException" + ERROR_TYPE_SUFFIX
    assert answer.json()["message"].startswith("1 validation error detected: ")
    assert "content" in answer.json()["message"]


def test_a_miss_is_resource_not_found_naming_digest_and_nearest(pair: EnginePair) -> None:
    body = {"messages": [{"role": "user", "content": [{"text": "Write a haiku about seas."}]}]}
    answer = pair.send(
        body, path=f"/model/{recording(STREAM)['request']['body']['modelId']}/converse"
    )
    assert answer.status == 404
    assert answer.headers["x-amzn-errortype"].startswith("ResourceNotFoundException:")
    assert set(answer.json()) == {"message"}
    assert answer.headers["x-chaosllm-digest"] in answer.json()["message"]
    assert "bedrock-stream/0001" in answer.json()["message"]


def test_an_orphan_tool_result_is_found() -> None:
    body = {
        "modelId": "m",
        "messages": [
            {"role": "user", "content": [{"text": "hi"}]},
            {"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "content": []}}]},
        ],
    }
    assert [f.check for f in BEDROCK.conversation_findings(body)] == ["orphan_tool_result"]
    full = recording("bedrock-tools/0002")["request"]["body"]
    assert BEDROCK.conversation_findings(full) == []
    assert BEDROCK.has_system_prompt(recording("bedrock-text/0001")["request"]["body"])


# -- faults, as the event stream breaks --------------------------------------------------


def faulted(pair: EnginePair, spec: dict[str, Any], name: str = STREAM) -> Answer:
    pair.arm(spec)
    return pair.send(wire_body(name), path=stream_path(name))


def kinds(answer: Answer) -> list[str | None]:
    return [m.kind for m in events(answer)]


def test_truncation_is_clamped_before_message_stop(pair: EnginePair) -> None:
    answer = faulted(pair, {"type": "truncated_stream", "after_chunks": 99})
    got = kinds(answer)
    assert got[-1] == "contentBlockStop" and "messageStop" not in got
    assert not BEDROCK.codec.stream_complete([eventstream.message_text(m) for m in events(answer)])


def test_error_in_200_is_an_exception_message(pair: EnginePair) -> None:
    answer = faulted(pair, {"type": "error_in_200", "after_chunks": 2, "message": "boom"})
    *_, last = events(answer)
    assert last.message_type == "exception" and last.kind == "modelStreamErrorException"
    assert json.loads(last.payload)["message"] == "boom"
    assert BEDROCK.faults.stream_error_frame("slow", status=429)[-200:].count(
        b"throttlingException"
    )


def test_garbage_is_the_next_frame_with_a_bad_crc(pair: EnginePair) -> None:
    clean = pair.send(wire_body(STREAM), path=stream_path(STREAM)).reply.plan.pieces
    answer = faulted(pair, {"type": "garbage", "after_chunks": 2})
    pieces = answer.reply.plan.pieces
    assert [p.data for p in pieces[:2]] == [p.data for p in clean[:2]]
    assert pieces[2].data == eventstream.corrupt(clean[2].data)
    assert pieces[2].data != DEFAULT_GARBAGE
    with pytest.raises(EventStreamError, match="message checksum"):
        eventstream.decode_message(pieces[2].data)


@pytest.mark.parametrize("fault", ["dropped_connection", "connection_reset"])
def test_after_bytes_cuts_inside_the_next_frame(pair: EnginePair, fault: str) -> None:
    clean = pair.send(wire_body(STREAM), path=stream_path(STREAM)).reply.plan.pieces
    answer = faulted(pair, {"type": fault, "after_chunks": 1, "after_bytes": 9})
    pieces = answer.reply.plan.pieces
    assert [p.data for p in pieces] == [clean[0].data, clean[1].data[:9]]
    assert [p.frame for p in pieces] == [True, False]


def test_malformed_tool_args_are_cut_input_fragments(pair: EnginePair) -> None:
    answer = faulted(pair, {"type": "malformed_tool_args"}, TOOLS)
    texts = [eventstream.message_text(m) for m in events(answer)]
    with pytest.raises(json.JSONDecodeError):
        BEDROCK.assemble(texts)
    pair.arm({"type": "malformed_tool_args"})
    body = pair.send(wire_body(TOOLS), path=path_of(TOOLS)).json()
    assert body["stopReason"] == "max_tokens"
    assert [b["toolUse"]["input"] for b in body["output"]["message"]["content"][1:]] == [{}]


def test_empty_response_keeps_only_start_stop_and_metadata(pair: EnginePair) -> None:
    answer = faulted(pair, {"type": "empty_response"})
    assert kinds(answer) == ["messageStart", "messageStop", "metadata"]


def test_http_errors_carry_the_error_type_header(pair: EnginePair) -> None:
    for status, name in ((429, "ThrottlingException"), (408, "ModelTimeoutException")):
        pair.arm({"type": "http_error", "status": status})
        answer = pair.send(wire_body(STREAM), path=path_of(STREAM))
        assert answer.status == status
        assert answer.headers["x-amzn-errortype"] == name + ERROR_TYPE_SUFFIX
        assert set(answer.json()) == {"message"}
