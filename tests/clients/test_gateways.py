"""Each gateway failure (`--gateway`, `chaosllm.providers.gateways`) through the official
`openai` SDK on a real socket, and what it raised (the rows of docs/gateways.md); an
answer through a profile carries the gateway's extra members."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from chaosllm import ChaosServer
from tests.clients.test_frameworks import litellm, litellm_warnings  # noqa: F401 (a fixture)
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


VLLM_ERROR = {
    "message": "Provider disconnected unexpectedly",
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}


def test_vllm_stream_error_is_swallowed_by_the_sdk_a_silent_truncation() -> None:
    with ChaosServer(gateway="vllm") as server:
        server.arm({"type": "vllm_stream_error", "after_chunks": 2})
        chunks = ask(server, stream=True)
        server.arm({"type": "vllm_stream_error"})
        with pytest.raises(openai.BadRequestError) as info:
            ask(server)  # a JSON request: the stream's error object, as the 400 it says
    assert text(chunks) == "The"  # no exception: the error object parsed as a chunk
    assert chunks[-1].model_extra == VLLM_ERROR
    assert info.value.status_code == 400
    assert info.value.body == {"object": "error", **VLLM_ERROR}


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
    named: list[Any] = [{**MESSAGES[1], "name": "ann"}]  # no recording has it: canned
    with ChaosServer(on_miss="fallback") as server:
        server.arm({"type": "unsupported_param"})
        with openai_client(server) as client, pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="gpt-4o-mini", messages=named)
    assert info.value.body == {
        "message": "'messages.0' : for 'role:user' the following must be satisfied"
        "[('messages.0' : property 'name' is unsupported)]",
        "type": "invalid_request_error",
    }


def test_recording_through_a_gateway_keeps_its_extra_members(tmp_path: Path) -> None:
    with (
        ChaosServer(gateway="openrouter") as upstream,  # a loopback OpenRouter
        ChaosServer(mode="record", upstream=upstream.url, record_dir=tmp_path) as proxy,
    ):
        recorded, recorded_chunks = ask(proxy), ask(proxy, stream=True)
    with ChaosServer(recordings=[tmp_path]) as replay:  # no profile: the recordings' own
        answer, chunks = ask(replay), ask(replay, stream=True)
    assert answer.model_extra == recorded.model_extra == {"provider": "OpenAI"}
    assert answer.usage is not None and recorded.usage is not None
    assert answer.usage.model_extra == recorded.usage.model_extra
    assert answer.usage.model_extra["cost"] > 0
    assert [c.model_extra for c in chunks] == [c.model_extra for c in recorded_chunks]
    assert all(c.model_extra == {"provider": "OpenAI"} for c in chunks)


# -- litellm, routed by its provider prefixes (skipped without the litellm extra) -----------


@pytest.fixture
def llm(litellm: Any) -> Iterator[Any]:  # noqa: F811 (test_frameworks' fixture: offline)
    yield litellm
    # litellm leaves the responses of streams it broke off (or did not close) open: they
    # are collected here, inside the test, their sockets' ResourceWarning expected.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def litellm_ask(llm: Any, server: ChaosServer, prefix: str, **extra: Any) -> Any:
    options = {
        "model": f"{prefix}/gpt-4o-mini",
        "messages": MESSAGES,
        "api_base": server.base_url,
        "api_key": "sk-test",
        "num_retries": 0,
        **extra,
    }
    if not extra.pop("stream", False):
        return llm.completion(**options)
    return list(llm.completion(**options))


@litellm_warnings
def test_litellm_openrouter_prefix_keeps_the_members_and_raises_on_402(llm: Any) -> None:
    with ChaosServer(gateway="openrouter") as server:
        answer = litellm_ask(llm, server, "openrouter")
        assert answer.choices[0].message.content == ANSWER
        assert answer.provider == "OpenAI" and answer.usage.cost > 0
        server.arm({"type": "openrouter_credits"})
        with pytest.raises(llm.APIError) as info:
            litellm_ask(llm, server, "openrouter")
    assert info.value.status_code == 402 and "more credits" in str(info.value)


@litellm_warnings
def test_litellm_openrouter_prefix_breaks_on_the_midstream_errors_string_code(
    llm: Any,
) -> None:
    with ChaosServer(gateway="openrouter") as server:
        server.arm({"type": "openrouter_midstream_error"})
        with pytest.raises(ValueError, match="invalid literal for int"):
            litellm_ask(llm, server, "openrouter", stream=True)


@litellm_warnings
def test_litellm_hosted_vllm_prefix_swallows_the_stream_error(llm: Any) -> None:
    with ChaosServer(gateway="vllm") as server:
        server.arm({"type": "vllm_stream_error", "after_chunks": 2})
        chunks = litellm_ask(llm, server, "hosted_vllm", stream=True)
    assert text(chunks) == "The"


@litellm_warnings
def test_litellm_deepseek_prefix_reads_reasoning_content(llm: Any) -> None:
    with ChaosServer(gateway="deepseek") as server:
        server.arm({"type": "reasoning_preamble", "remaining": 2})
        chunks = litellm_ask(llm, server, "deepseek", stream=True)
        answer = litellm_ask(llm, server, "deepseek")
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    assert reasoning == "Let me think about this first." and text(chunks) == ANSWER
    assert answer.choices[0].message.reasoning_content == "Let me think about this first."


@litellm_warnings
def test_litellm_groq_prefix_raises_bad_request_naming_the_parameter(llm: Any) -> None:
    refused = pytest.raises(llm.BadRequestError, match="property 'logprobs' is unsupported")
    with ChaosServer(gateway="groq") as server, refused:
        litellm_ask(llm, server, "groq", logprobs=True)


def test_groq_refuses_a_parameter_even_when_no_recording_answers() -> None:
    """Groq refuses what it does not support before anything else: a request no recording
    answers gets its 400, not chaosllm's miss."""
    with ChaosServer(gateway="groq") as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-test", max_retries=0)
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(
                model="llama-3.3-70b-versatile",
                messages=[{"role": "user", "content": "a question nobody recorded"}],
                logprobs=True,
            )
        record = server.requests()[-1]
    assert info.value.body == {
        "message": "property 'logprobs' is unsupported",
        "type": "invalid_request_error",
    }
    assert record["status"] == 400 and not record.get("miss")
