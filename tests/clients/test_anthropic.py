"""The official `anthropic` SDK against a real chaosllm server: every shipped Anthropic
recording comes back as the SDK object it encodes (sync, async, JSON, stream), and per
fault, what the SDK does (observed behaviour, stated as assertions)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import anyio
import httpx
import pytest
from anthropic.types import Message

from chaosllm import ChaosServer
from chaosllm.providers.anthropic_messages import iter_events
from tests.helpers import all_recordings, recording, recording_proxy
from tests.helpers import sdk_arguments as request

NAMES = all_recordings("anthropic.messages")


def client(server: ChaosServer, **options: Any) -> anthropic.Anthropic:
    options = {"api_key": "sk-ant-test", "max_retries": 0, "timeout": 10, **options}
    return anthropic.Anthropic(base_url=server.url, **options)


@pytest.fixture
def sdk(server: ChaosServer) -> Iterator[anthropic.Anthropic]:
    with client(server) as c:
        yield c


def expected(name: str) -> Message:
    return Message.model_validate(recording(name)["response"]["body"])


def same(got: Message, name: str) -> bool:
    """The SDK object equals the recorded message (a stream's final message is a
    ParsedMessage: compared by value)."""
    return got.model_dump() == expected(name).model_dump()


@pytest.mark.parametrize("name", NAMES)
def test_sync_create(sdk: anthropic.Anthropic, name: str) -> None:
    assert sdk.messages.create(**request(name)) == expected(name)


@pytest.mark.parametrize("name", NAMES)
def test_sync_stream(sdk: anthropic.Anthropic, name: str) -> None:
    with sdk.messages.stream(**request(name)) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert same(final, name)
    assert text == "".join(b.text for b in expected(name).content if b.type == "text")


def test_recorded_frames_replay_verbatim(sdk: anthropic.Anthropic) -> None:
    name = "anthropic-stream/0001"
    chunks = recording(name)["response"]["chunks"]
    events = sdk.messages.create(**request(name), stream=True)
    with events:
        got = [e.to_dict() for e in events]
    recorded = [
        json.loads(data)
        for kind, data in iter_events([c["data"] for c in chunks])
        if kind != "ping"
    ]  # the SDK skips pings
    assert got == recorded
    assert any(kind == "ping" for kind, _ in iter_events([c["data"] for c in chunks]))


def test_async_create_and_stream(shared_server: ChaosServer) -> None:
    async def main() -> None:
        with anyio.fail_after(20):
            async with anthropic.AsyncAnthropic(
                base_url=shared_server.url, api_key="x", max_retries=0, timeout=10
            ) as c:
                for name in NAMES:
                    assert await c.messages.create(**request(name)) == expected(name)
                    async with c.messages.stream(**request(name)) as stream:
                        assert same(await stream.get_final_message(), name)

    anyio.run(main)


def test_tool_use_loop(sdk: anthropic.Anthropic) -> None:
    first = sdk.messages.create(**request("anthropic-tools/0001"))
    assert first.stop_reason == "tool_use"
    call = next(b for b in first.content if b.type == "tool_use")
    assert call.name == "get_weather" and call.input == {
        "location": "San Francisco, CA",
        "unit": "celsius",
    }
    body = request("anthropic-tools/0001")
    follow_up = sdk.messages.create(
        **{
            **body,
            "messages": [
                *body["messages"],
                {
                    "role": "assistant",
                    "content": [b.model_dump(exclude_none=True) for b in first.content],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": call.id,
                            "content": "15 degrees celsius, partly cloudy",
                        }
                    ],
                },
            ],
        }
    )
    assert follow_up == expected("anthropic-tools/0002")


def test_models_list_in_anthropic_shape(sdk: anthropic.Anthropic) -> None:
    ids = [m.id for m in sdk.models.list()]
    assert "claude-sonnet-4-6" in ids
    raw = httpx.get(sdk.base_url.copy_with(path="/v1/models").__str__(), timeout=5)
    assert raw.json()["object"] == "list"  # without anthropic-version: the OpenAI shape


def test_bad_request_is_anthropic_error(sdk: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        sdk.messages.create(
            model="claude-sonnet-4-6", max_tokens=10, messages=[{"role": "system", "content": "x"}]
        )
    assert info.value.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "messages.0.role: Input should be 'user' or 'assistant'",
        },
        "request_id": info.value.request_id,  # the SDK's, from the request-id header
    }
    assert str(info.value.request_id).startswith("req_011C")


# -- faults ------------------------------------------------------------------------------


def test_529_is_retried_and_recovers(server: ChaosServer) -> None:
    server.arm("http_error", status=529, retry_after=0.05)
    with client(server, max_retries=2) as c:
        assert c.messages.create(**request("anthropic-text/0001")) == expected(
            "anthropic-text/0001"
        )
    assert [r["status"] for r in server.requests()] == [529, 200]


@pytest.mark.parametrize("stream", [False, True])
def test_529_without_retries_is_overloaded_error(
    sdk: anthropic.Anthropic, server: ChaosServer, stream: bool
) -> None:
    server.arm("http_error", status=529)
    with pytest.raises(anthropic.OverloadedError) as info:
        if stream:
            with sdk.messages.stream(**request("anthropic-stream/0001")) as s:
                s.get_final_message()
        else:
            sdk.messages.create(**request("anthropic-text/0001"))
    assert info.value.status_code == 529
    assert info.value.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "chaosllm injected an HTTP 529 error."},
        "request_id": info.value.request_id,
    }


def test_429_retry_after_is_honoured(server: ChaosServer) -> None:
    server.arm("http_429", retry_after=0.1)
    with client(server, max_retries=1) as c:
        assert c.messages.create(**request("anthropic-text/0001")).stop_reason == "end_turn"
    assert [r["status"] for r in server.requests()] == [429, 200]


def test_error_event_mid_stream_raises_api_status_error(
    sdk: anthropic.Anthropic, server: ChaosServer
) -> None:
    server.arm("error_in_200", after_chunks=4)
    with (
        pytest.raises(anthropic.APIStatusError) as info,
        sdk.messages.stream(**request("anthropic-stream/0001")) as stream,
    ):
        stream.get_final_message()
    assert info.value.body == {
        "type": "error",
        "error": {
            "type": "api_error",
            "message": "The server had an error while processing your request. Sorry about that!",
        },
    }


def test_error_envelope_in_200_json_is_returned_as_a_message(
    sdk: anthropic.Anthropic, server: ChaosServer
) -> None:
    server.arm("error_in_200")
    # Observed: the SDK builds a Message from the envelope without validating it: no
    # exception, type "error", content None (iterating it raises TypeError).
    message = sdk.messages.create(**request("anthropic-text/0001"))
    assert message.type == "error" and message.content is None
    assert (message.model_extra or {})["error"]["type"] == "api_error"


def test_truncated_stream_is_accepted_silently(
    sdk: anthropic.Anthropic, server: ChaosServer
) -> None:
    server.arm("truncated_stream", after_chunks=5)
    with sdk.messages.stream(**request("anthropic-stream/0001")) as stream:
        final = stream.get_final_message()
    # Observed: no message_stop, no error: a partial message with stop_reason None.
    assert final.stop_reason is None
    full = expected("anthropic-stream/0001").content[0]
    assert final.content[0].type == "text" and full.type == "text"
    assert full.text.startswith(final.content[0].text) and final.content[0].text != full.text


@pytest.mark.parametrize("stream", [False, True])
def test_malformed_tool_args(sdk: anthropic.Anthropic, server: ChaosServer, stream: bool) -> None:
    server.arm("malformed_tool_args")
    if stream:
        with sdk.messages.stream(**request("anthropic-tools/0001")) as s:
            final = s.get_final_message()
    else:
        final = sdk.messages.create(**request("anthropic-tools/0001"))
    # Observed: the SDK parses the cut partial_json in partial mode and drops the
    # unterminated string: an empty input, stop_reason max_tokens, no exception.
    call = next(b for b in final.content if b.type == "tool_use")
    assert call.input == {} and final.stop_reason == "max_tokens"


@pytest.mark.parametrize("kind", ["dropped_connection", "connection_reset"])
def test_socket_faults(sdk: anthropic.Anthropic, server: ChaosServer, kind: str) -> None:
    server.arm(kind, after_chunks=3)
    with pytest.raises(anthropic.APIConnectionError):
        sdk.messages.create(**request("anthropic-text/0001"))
    server.arm(kind, after_chunks=3)
    # Observed: mid-stream, the SDK lets its HTTP library's error through unwrapped.
    with (
        pytest.raises(Exception) as info,
        sdk.messages.stream(**request("anthropic-stream/0001")) as s,
    ):
        s.get_final_message()
    assert not isinstance(info.value, anthropic.AnthropicError)
    assert type(info.value).__name__ == (
        "RemoteProtocolError" if kind == "dropped_connection" else "ReadError"
    )
    assert sdk.messages.create(**request("anthropic-text/0001")).stop_reason == "end_turn"


def test_dropped_connection_json_is_retried(server: ChaosServer) -> None:
    server.arm("dropped_connection")
    with client(server, max_retries=1) as c:
        assert c.messages.create(**request("anthropic-text/0001")) == expected(
            "anthropic-text/0001"
        )
    assert len(server.requests()) == 2


def test_empty_response_is_an_empty_message(sdk: anthropic.Anthropic, server: ChaosServer) -> None:
    server.arm("empty_response", remaining=2)
    assert sdk.messages.create(**request("anthropic-text/0001")).content == []
    with sdk.messages.stream(**request("anthropic-stream/0001")) as s:
        assert s.get_final_message().content == []


# -- record -> replay ----------------------------------------------------------------------


def test_record_then_replay(tmp_path: Path) -> None:
    names = ["anthropic-text/0001", "anthropic-tools/0001", "anthropic-thinking/0001"]
    with (
        recording_proxy(record_dir=tmp_path) as (_, proxy),
        client(proxy) as c,
    ):
        for name in names:
            assert c.messages.create(**request(name)) == expected(name)
        with c.messages.stream(**request("anthropic-stream/0001")) as s:
            assert same(s.get_final_message(), "anthropic-stream/0001")
    written = sorted(tmp_path.rglob("*.json"))
    assert len(written) == 4
    assert {json.loads(p.read_text())["provider"] for p in written} == {"anthropic.messages"}
    with ChaosServer(tmp_path) as replay, client(replay) as c:
        for name in names:
            assert c.messages.create(**request(name)) == expected(name)
        with c.messages.stream(**request("anthropic-stream/0001")) as s:
            assert same(s.get_final_message(), "anthropic-stream/0001")


def test_truncated_json_body_raises_json_error(
    sdk: anthropic.Anthropic, server: ChaosServer
) -> None:
    server.arm("truncated_stream")
    # Observed: a 200 whose body is cut short reaches the SDK's JSON parser unwrapped.
    with pytest.raises(json.JSONDecodeError):
        sdk.messages.create(**request("anthropic-text/0001"))


def test_stall_times_out(server: ChaosServer) -> None:
    with client(server, timeout=0.5) as c:
        server.arm("stall", max_ms=3000)
        with pytest.raises(anthropic.APITimeoutError):
            c.messages.create(**request("anthropic-text/0001"))
        server.arm("stall", after_chunks=2, max_ms=3000)
        with (
            pytest.raises(Exception) as info,
            c.messages.stream(**request("anthropic-stream/0001")) as s,
        ):
            s.get_final_message()
        assert type(info.value).__name__ == "ReadTimeout"
        assert not isinstance(info.value, anthropic.AnthropicError)


def test_recorder_never_stores_a_cut_stream(tmp_path: Path) -> None:
    with (
        recording_proxy(record_dir=tmp_path) as (upstream, proxy),
        client(proxy) as c,
    ):
        upstream.arm("truncated_stream", after_chunks=4)
        with c.messages.stream(**request("anthropic-stream/0001")) as s:
            assert s.get_final_message().stop_reason is None
        assert list(tmp_path.rglob("*.json")) == []
        with c.messages.stream(**request("anthropic-stream/0001")) as s:
            assert same(s.get_final_message(), "anthropic-stream/0001")
        [written] = tmp_path.rglob("*.json")
        chunks = json.loads(written.read_text())["response"]["chunks"]
        assert [ch["data"] for ch in chunks] == [
            ch["data"] for ch in recording("anthropic-stream/0001")["response"]["chunks"]
        ]
