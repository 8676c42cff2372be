"""The official `openai.AzureOpenAI` client against a real chaosllm server: every shipped
Azure recording comes back as the SDK object it encodes (deployment paths, ``azure_deployment=``,
the v1 paths, sync and async, JSON and stream, content filtering), Azure's error shapes,
record -> replay through the proxy, and per fault what the SDK does (the README's Azure
table)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion

from chaosllm import ChaosServer
from chaosllm.providers.sse import iter_data
from tests.helpers import all_recordings, chat_messages, recording, sdk_arguments

API_VERSION = "2024-10-21"
NAMES = all_recordings("azure.chat")


def azure(server: ChaosServer, **options: Any) -> openai.AzureOpenAI:
    options = {"api_key": "azure-key-0123456789", "max_retries": 0, "timeout": 10, **options}
    return openai.AzureOpenAI(azure_endpoint=server.url, api_version=API_VERSION, **options)


@pytest.fixture
def sdk(server: ChaosServer) -> Iterator[openai.AzureOpenAI]:
    with azure(server) as client:
        yield client


def request(name: str) -> dict[str, Any]:
    body = sdk_arguments(name)
    body["messages"] = chat_messages(body["messages"])
    return body


def expected(name: str) -> ChatCompletion:
    return ChatCompletion.model_validate(recording(name)["response"]["body"])


def test_the_shipped_azure_recordings_are_there() -> None:
    assert {"azure-chat/0001", "azure-stream/0001", "azure-content-filter/0001"} <= set(NAMES)
    for name in NAMES:
        assert recording(name)["request"]["path"].startswith("/openai/deployments/")


@pytest.mark.parametrize("name", NAMES)
def test_json_replay_on_the_deployment_path(sdk: openai.AzureOpenAI, name: str) -> None:
    got = sdk.chat.completions.create(**request(name))
    if "chunks" in recording(name)["response"]:
        # Recorded as a stream without usage: the JSON answer gets an estimated one.
        assert got.usage is not None and got.usage.completion_tokens > 0
        assert got.model_copy(update={"usage": None}) == expected(name)
    else:
        assert got == expected(name)
    choice = got.choices[0]
    assert choice.model_extra is not None and "content_filter_results" in choice.model_extra
    assert got.model_extra is not None and "prompt_filter_results" in got.model_extra


@pytest.mark.parametrize("name", NAMES)
def test_stream_replay_assembles_to_the_answer(sdk: openai.AzureOpenAI, name: str) -> None:
    chunks = list(sdk.chat.completions.create(**request(name), stream=True))
    assert chunks[0].choices == []  # the prompt's filter frame comes first, as Azure sends
    assert chunks[0].model_extra is not None
    assert (
        chunks[0].model_extra["prompt_filter_results"]
        == expected(name).model_extra[  # type: ignore[index]
            "prompt_filter_results"
        ]
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    answer = expected(name).choices[0]
    assert text == (answer.message.content or "")
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == [answer.finish_reason]


def test_recorded_frames_replay_verbatim(sdk: openai.AzureOpenAI) -> None:
    name = "azure-stream/0001"
    recorded = [
        json.loads(d)
        for d in iter_data([c["data"] for c in recording(name)["response"]["chunks"]])
        if d != "[DONE]"
    ]
    got = [c.to_dict() for c in sdk.chat.completions.create(**request(name), stream=True)]
    assert got == recorded


def test_azure_deployment_client_and_the_v1_paths(server: ChaosServer) -> None:
    with azure(server, azure_deployment="gpt-4o-mini") as client:
        # With azure_deployment the base URL names it; the body's model is not the key.
        body = request("azure-chat/0001")
        assert client.chat.completions.create(**{**body, "model": "anything"}) == expected(
            "azure-chat/0001"
        )
    with openai.OpenAI(
        base_url=server.url + "/openai/v1/", api_key="azure-key", max_retries=0
    ) as v1:
        # The v1 path names the model in the body, as OpenAI's does: the same recording.
        assert v1.chat.completions.create(**request("azure-chat/0001")) == expected(
            "azure-chat/0001"
        )


def test_content_filter_answer(sdk: openai.AzureOpenAI) -> None:
    got = sdk.chat.completions.create(**request("azure-content-filter/0001"))
    choice = got.choices[0]
    assert choice.finish_reason == "content_filter"
    assert choice.model_extra is not None
    assert choice.model_extra["content_filter_results"]["violence"]["filtered"] is True


def test_tool_call_then_result(sdk: openai.AzureOpenAI) -> None:
    first = sdk.chat.completions.create(**request("azure-tools/0001"))
    calls = first.choices[0].message.tool_calls
    assert calls is not None and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Oslo"}
    follow = sdk.chat.completions.create(**request("azure-tools/0002"))
    assert follow.choices[0].message.content == "It is 4 °C and overcast in Oslo."


def test_responses_on_azure(sdk: openai.AzureOpenAI) -> None:
    body = recording("azure-responses/0001")["request"]["body"]
    got = sdk.responses.create(**body)
    assert got.output_text == "Hello from Azure, friend!"


def test_embeddings_on_the_deployment_path(sdk: openai.AzureOpenAI) -> None:
    got = sdk.embeddings.create(model="text-embedding-3-small", input="hello")
    again = sdk.embeddings.create(model="text-embedding-3-small", input="hello")
    assert got.data[0].embedding == again.data[0].embedding
    assert any(x != 0 for x in got.data[0].embedding)


def test_async_json_and_stream(shared_server: ChaosServer) -> None:
    async def main() -> None:
        with anyio.fail_after(20):
            async with openai.AsyncAzureOpenAI(
                azure_endpoint=shared_server.url,
                api_version=API_VERSION,
                api_key="k",
                max_retries=0,
            ) as client:
                for name in NAMES:
                    got = await client.chat.completions.create(**request(name))
                    assert got.choices == expected(name).choices
                    stream = await client.chat.completions.create(**request(name), stream=True)
                    text = "".join(
                        [c.choices[0].delta.content or "" async for c in stream if c.choices]
                    )
                    assert text == (expected(name).choices[0].message.content or "")

    anyio.run(main)


# -- errors ---------------------------------------------------------------------------------


def test_a_miss_is_a_404_naming_the_digest(sdk: openai.AzureOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        sdk.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "never recorded"}]
        )
    assert "digest" in info.value.message
    assert info.value.code == "no_recording"


def test_a_bad_body_is_refused_in_the_openai_shape(sdk: openai.AzureOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model="gpt-4o-mini", messages=[])
    assert info.value.param == "messages"


def test_a_deployment_path_without_api_version_is_refused(server: ChaosServer) -> None:
    got = httpx.post(
        server.url + "/openai/deployments/gpt-4o-mini/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}]},
        timeout=5,
    )
    assert got.status_code == 400
    assert got.json()["error"]["param"] == "api-version"


@pytest.mark.parametrize(
    ("fault", "error", "code"),
    [
        ("http_429", openai.RateLimitError, "429"),
        ("http_503", openai.InternalServerError, "ServiceUnavailable"),
    ],
)
def test_injected_errors_carry_azures_codes(
    server: ChaosServer, fault: str, error: type[openai.APIStatusError], code: str
) -> None:
    server.arm(fault, remaining=1)
    with azure(server) as client, pytest.raises(error) as info:
        client.chat.completions.create(**request("azure-chat/0001"))
    assert info.value.code == code
    body = info.value.body
    assert isinstance(body, dict) and set(body) == {"code", "message"}  # Azure's envelope


# -- per fault: the same SDK, the same behaviour (the README's Azure table) -----------------


def _outcome(server: ChaosServer, fault: str, *, stream: bool) -> tuple[str, int]:
    """What the client got (an exception's class name, or "ok") and how many attempts the
    server saw, with the fault armed once and the SDK retrying twice."""
    server.reset()
    params: dict[str, Any] = {"remaining": 1}
    if fault in ("stall",):
        params["max_ms"] = 3000
    if fault in ("latency", "slow_stream"):
        params["delay_ms"] = 20
    server.arm(fault, **params)
    name = "azure-tools/0001" if fault == "malformed_tool_args" else "azure-chat/0001"
    result = "ok"
    with azure(server, max_retries=2, timeout=1.0) as client:
        try:
            if stream:
                for _ in client.chat.completions.create(**request(name), stream=True):
                    pass
            else:
                client.chat.completions.create(**request(name))
        except Exception as exc:
            result = type(exc).__name__
    return result, len(server.requests())


STREAMING = {
    "truncated_stream": ("ok", 1),
    "dropped_connection": ("APIConnectionError", 1),
    "error_in_200": ("APIError", 1),
    "connection_reset": ("APIConnectionError", 1),
    "stall": ("APITimeoutError", 1),
    "http_503": ("ok", 2),
    "http_429": ("ok", 2),
    "empty_reply": ("ok", 2),
    "malformed_tool_args": ("ok", 1),
    "empty_response": ("ok", 1),
    "slow_stream": ("ok", 1),
}
JSON_CALL = {
    "truncated_stream": ("JSONDecodeError", 1),
    "dropped_connection": ("ok", 2),
    "error_in_200": ("ok", 1),
    "connection_reset": ("ok", 2),
    "http_503": ("ok", 2),
    "http_429": ("ok", 2),
    "empty_reply": ("ok", 2),
    "garbage": ("ok", 2),
    "latency": ("ok", 1),
    "malformed_tool_args": ("ok", 1),
    "empty_response": ("ok", 1),
}


@pytest.mark.slow
@pytest.mark.parametrize("fault", sorted(JSON_CALL))
def test_fault_effect_json(server: ChaosServer, fault: str) -> None:
    assert _outcome(server, fault, stream=False) == JSON_CALL[fault]


@pytest.mark.slow
@pytest.mark.parametrize("fault", sorted(STREAMING))
def test_fault_effect_stream(server: ChaosServer, fault: str) -> None:
    assert _outcome(server, fault, stream=True) == STREAMING[fault]


def test_malformed_tool_args_breaks_the_arguments(server: ChaosServer) -> None:
    server.arm("malformed_tool_args", remaining=1)
    with azure(server) as client:
        got = client.chat.completions.create(**request("azure-tools/0001"))
    arguments = got.choices[0].message.tool_calls[0].function.arguments
    with pytest.raises(json.JSONDecodeError):
        json.loads(arguments)


def test_truncated_stream_keeps_the_prompt_filter_frame_and_cuts_the_answer(
    server: ChaosServer,
) -> None:
    server.arm("truncated_stream", remaining=1, after_chunks=3)
    with azure(server) as client:
        chunks = list(client.chat.completions.create(**request("azure-stream/0001"), stream=True))
    assert len(chunks) == 3 and chunks[0].choices == []
    assert not any(c.choices and c.choices[0].finish_reason for c in chunks)


# -- record -> replay -------------------------------------------------------------------------


def test_record_then_replay_through_the_proxy(tmp_path: Path) -> None:
    """A chaosllm replaying the shipped recordings is the Azure upstream; the proxy records
    what the SDK asked, never the api-key; a fresh server replays it equal."""
    record_dir = tmp_path / "recorded"
    with (
        ChaosServer() as upstream,
        ChaosServer(mode="record", upstream=upstream.url, record_dir=record_dir) as proxy,
        azure(proxy) as client,
    ):
        live = client.chat.completions.create(**request("azure-chat/0001"))
        streamed = list(client.chat.completions.create(**request("azure-stream/0001"), stream=True))
    files = sorted(record_dir.rglob("*.json"))
    assert len(files) == 2
    for file in files:
        text = file.read_text("utf-8")
        assert "azure-key-0123456789" not in text
        data = json.loads(text)
        assert data["provider"] == "azure.chat"
        assert data["request"]["body"]["model"] == "gpt-4o-mini"  # the deployment
        assert data["request"]["path"] == "/openai/deployments/gpt-4o-mini/chat/completions"
    with ChaosServer(recordings=[record_dir]) as replay, azure(replay) as client:
        assert client.chat.completions.create(**request("azure-chat/0001")) == live
        again = list(client.chat.completions.create(**request("azure-stream/0001"), stream=True))
    assert [c.to_dict() for c in again] == [c.to_dict() for c in streamed]


def test_the_fixture_gives_an_azure_client_and_env(chaosllm: Any) -> None:
    with chaosllm.azure_openai(max_retries=0) as client:
        assert client.chat.completions.create(**request("azure-chat/0001")) == expected(
            "azure-chat/0001"
        )
    env = chaosllm.env
    assert env["AZURE_OPENAI_ENDPOINT"] == chaosllm.url and env["OPENAI_API_VERSION"]
    assert [r["path"] for r in chaosllm.requests()] == [
        "/openai/deployments/gpt-4o-mini/chat/completions"
    ]
