"""Each gateway failure (`--gateway`, `chaosllm.providers.gateways`) through the official
`openai` SDK on a real socket, and what it raised (the rows of docs/gateways.md); an
answer through a profile carries the gateway's extra members."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from chaosllm import ChaosServer
from tests.helpers import openai_client

pytestmark = pytest.mark.timeout(60)

MESSAGES: list[Any] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
ANSWER = "The capital of France is Paris."


@pytest.fixture(scope="module", params=["openrouter", "vllm", "deepseek", "groq"])
def gateway(request: pytest.FixtureRequest) -> Iterator[tuple[str, ChaosServer]]:
    with ChaosServer(gateway=request.param) as server:
        yield request.param, server


def ask(server: ChaosServer, *, stream: bool = False, **extra: Any) -> Any:
    with openai_client(server) as client:
        if not stream:
            return client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, **extra)
        return list(
            client.chat.completions.create(
                model="gpt-4o-mini", messages=MESSAGES, stream=True, **extra
            )
        )


def text(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_each_profile_answers_as_its_gateway(gateway: tuple[str, ChaosServer]) -> None:
    name, server = gateway
    server.reset()
    answer, chunks = ask(server), ask(server, stream=True)
    assert answer.choices[0].message.content == ANSWER and text(chunks) == ANSWER
    if name == "openrouter":
        assert answer.model_extra == {"provider": "OpenAI"}
        assert answer.usage is not None and answer.usage.model_extra["cost"] > 0
        assert all(c.model_extra == {"provider": "OpenAI"} for c in chunks)
    else:
        assert answer.model_extra == {}


def test_openrouter_credits_is_a_402_the_sdk_raises_as_a_bare_status_error() -> None:
    with ChaosServer(gateway="openrouter") as server:
        server.arm({"type": "openrouter_credits"})
        with pytest.raises(openai.APIStatusError) as info:
            ask(server, max_tokens=64)
    assert type(info.value) is openai.APIStatusError and info.value.status_code == 402
    assert info.value.body == {
        "code": 402,
        "message": "This request requires more credits, or fewer max_tokens. You requested "
        "up to 64 tokens, but can only afford 0. To increase, visit "
        "https://openrouter.ai/settings/credits and add more credits",
        "metadata": {},
    }


def test_openrouter_midstream_error_raises_api_error_while_iterating() -> None:
    with ChaosServer(gateway="openrouter") as server:
        server.arm({"type": "openrouter_midstream_error", "after_chunks": 2})
        got: list[Any] = []
        with (
            pytest.raises(openai.APIError, match="Provider disconnected unexpectedly"),
            openai_client(server) as client,
        ):
            for chunk in client.chat.completions.create(
                model="gpt-4o-mini", messages=MESSAGES, stream=True
            ):
                got.append(chunk)
        assert len(got) == 2
        server.arm({"type": "openrouter_midstream_error"})
        broken = ask(server)  # a 200 whose body is the error: no choices at all
    assert broken.choices is None and broken.model_extra["error"]["code"] == 502


def test_vllm_stream_error_is_swallowed_by_the_sdk_a_silent_truncation() -> None:
    with ChaosServer(gateway="vllm") as server:
        server.arm({"type": "vllm_stream_error", "after_chunks": 2})
        chunks = ask(server, stream=True)
    assert text(chunks) == "The"  # no exception: the error object parsed as a chunk
    assert chunks[-1].model_extra == {
        "message": "Provider disconnected unexpectedly",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }


def test_reasoning_preamble_leads_with_reasoning_content_deltas() -> None:
    with ChaosServer(gateway="deepseek") as server:
        server.arm({"type": "reasoning_preamble", "remaining": 2})
        chunks = ask(server, stream=True)
        answer = ask(server)
    reasoning = [(c.choices[0].delta.model_extra or {}).get("reasoning_content") for c in chunks]
    assert "".join(r for r in reasoning if r) == "Let me think about this first."
    first = next(i for i, c in enumerate(chunks) if c.choices[0].delta.content)
    assert all(r is None for r in reasoning[first:])  # the reasoning came first
    assert text(chunks) == ANSWER
    message = answer.choices[0].message
    assert message.model_extra == {"reasoning_content": "Let me think about this first."}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"logprobs": True}, "property 'logprobs' is unsupported"),
        ({"logit_bias": {"1": 2}}, "property 'logit_bias' is unsupported"),
        ({"n": 2}, "'n' : number must be at most 1"),
    ],
)
def test_groq_refuses_the_parameter_the_request_carries(
    extra: dict[str, Any], message: str
) -> None:
    with ChaosServer(gateway="groq") as server:
        with pytest.raises(openai.BadRequestError) as info:
            ask(server, **extra)
        server.arm({"type": "unsupported_param"})
        assert ask(server).choices[0].message.content == ANSWER  # carries none: no 400
    assert info.value.body == {"message": message, "type": "invalid_request_error"}


def test_unsupported_param_names_a_message_name_without_the_profile() -> None:
    named = [{**MESSAGES[1], "name": "ann"}]  # no recording has it: the canned answer's
    with ChaosServer(on_miss="fallback") as server:
        server.arm({"type": "unsupported_param"})
        with openai_client(server) as client, pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="gpt-4o-mini", messages=named)
    assert info.value.body == {
        "message": "'messages.0' : for 'role:user' the following must be satisfied"
        "[('messages.0' : property 'name' is unsupported)]",
        "type": "invalid_request_error",
    }
