"""What the frameworks people use do with each fault (docs/providers/frameworks.md).

Each test points a framework at `chaosllm.ChaosServer` with a fault armed and asserts what
the framework does: retried, raised which exception, or silently accepted a partial
answer. A framework that is not installed is skipped (one extra each:
``pip install -e '.[langchain]'``); the default suite needs none. The answers come from
the shipped scenarios by sequence matching, whatever body the framework sends. Retries
are set small and Retry-After short, so the module stays fast."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from chaosllm import ChaosServer

pytestmark = pytest.mark.timeout(60)

QUESTION = "What's the weather like in Paris right now?"
FIRST_ANSWER = "The capital of France is Paris."
"""The first exchange of the shipped ``knowledge`` scenario."""


def statuses(server: ChaosServer) -> list[int | None]:
    return [e["status"] for e in server.requests(settle=1.0)]


# -- langchain-openai ---------------------------------------------------------------------------


def chat_openai(server: ChaosServer, *, retries: int = 0, tools: bool = False) -> Any:
    langchain_openai = pytest.importorskip("langchain_openai")
    from langchain_core.tools import tool

    @tool
    def get_weather(location: str) -> str:
        """Get the current weather for a location."""
        return "18 C"

    llm = langchain_openai.ChatOpenAI(
        model="gpt-4o-mini",
        base_url=server.base_url,
        api_key="sk-test",
        max_retries=retries,
        timeout=5,
    )
    server.use_scenario("tool-call" if tools else "knowledge")
    return llm.bind_tools([get_weather]) if tools else llm


SDK_ERRORS = pytest.mark.parametrize(
    ("spec", "error"),
    [
        ({"type": "http_503"}, openai.InternalServerError),
        ({"type": "http_429", "retry_after": 0.01}, openai.RateLimitError),
        ({"type": "dropped_connection"}, openai.APIConnectionError),
    ],
    ids=["http_503", "http_429", "dropped_connection"],
)
"""The faults a framework passes on as the SDK's exception, and which one."""


@SDK_ERRORS
def test_langchain_raises_the_sdk_error_without_retries_and_retries_it(
    server: ChaosServer, spec: dict[str, Any], error: type[Exception]
) -> None:
    llm = chat_openai(server)
    server.arm(spec)
    with pytest.raises(error):
        llm.invoke(QUESTION)
    server.reset()
    llm = chat_openai(server, retries=1)
    server.arm(spec)
    assert llm.invoke(QUESTION).content == FIRST_ANSWER
    assert len(statuses(server)) == 2  # the faulted attempt, then the retry


def test_langchain_raises_value_error_on_error_in_200_and_does_not_retry(
    server: ChaosServer,
) -> None:
    llm = chat_openai(server, retries=1)
    server.arm("error_in_200")
    with pytest.raises(ValueError, match="server_error"):
        llm.invoke(QUESTION)
    assert statuses(server) == [200]


def test_langchain_streams_an_error_in_200_frame_as_api_error(server: ChaosServer) -> None:
    llm = chat_openai(server)
    server.arm("error_in_200", after_chunks=2)
    with pytest.raises(openai.APIError):
        list(llm.stream(QUESTION))


def test_langchain_silently_accepts_a_truncated_stream(server: ChaosServer) -> None:
    llm = chat_openai(server)
    server.arm("truncated_stream")
    chunks = list(llm.stream(QUESTION))
    text = "".join(str(c.content) for c in chunks)
    assert text and text != FIRST_ANSWER and FIRST_ANSWER.startswith(text)


def test_langchain_raises_a_connection_error_on_a_dropped_stream(server: ChaosServer) -> None:
    llm = chat_openai(server)
    server.arm("dropped_connection")
    with pytest.raises(Exception) as info:
        list(llm.stream(QUESTION))
    # openai 3.57 wraps it; older SDKs (3.3, which instructor 1.17 pins) let the transport's through
    error = info.value
    assert isinstance(error, openai.APIConnectionError) or (
        type(error).__name__ == "RemoteProtocolError"
    ), repr(error)


def test_langchain_puts_malformed_tool_args_in_invalid_tool_calls(server: ChaosServer) -> None:
    llm = chat_openai(server, tools=True)
    server.arm("malformed_tool_args")
    message = llm.invoke(QUESTION)
    assert message.tool_calls == []
    (invalid,) = message.invalid_tool_calls
    assert invalid["name"] == "get_weather" and "not valid JSON" in invalid["error"]
    server.reset()
    llm = chat_openai(server, tools=True)
    (call,) = llm.invoke(QUESTION).tool_calls
    assert call["args"] == {"location": "Paris, France"}


# -- instructor ---------------------------------------------------------------------------------


def retry_exception() -> Any:
    """What instructor raises when it gives up (skips the test without instructor)."""
    return pytest.importorskip("instructor.core.exceptions").InstructorRetryException


def instructor_client(server: ChaosServer, *, sdk_retries: int = 0) -> Any:
    instructor = pytest.importorskip("instructor")
    server.use_scenario("tool-call")
    client = openai.OpenAI(
        base_url=server.base_url, api_key="sk-test", max_retries=sdk_retries, timeout=5
    )
    return instructor.from_openai(client)


def weather(client: Any, *, retries: int, partial: bool = False) -> Any:
    from pydantic import BaseModel

    class get_weather(BaseModel):  # the recorded tool's name
        location: str

    options: dict[str, Any] = {
        "model": "gpt-4o-mini",
        "response_model": get_weather,
        "max_retries": retries,
        "messages": [{"role": "user", "content": QUESTION}],
    }
    if partial:
        return list(client.chat.completions.create_partial(**options))[-1]
    return client.chat.completions.create(**options)


@pytest.mark.parametrize(
    "spec",
    [
        {"type": "http_503"},
        {"type": "http_429", "retry_after": 0.01},
        {"type": "dropped_connection"},
        {"type": "error_in_200"},
    ],
    ids=["http_503", "http_429", "dropped_connection", "error_in_200"],
)
def test_instructor_does_not_retry_a_failed_call_itself(
    server: ChaosServer, spec: dict[str, Any]
) -> None:
    InstructorRetryException = retry_exception()
    client = instructor_client(server)
    server.arm(spec)
    with pytest.raises(InstructorRetryException):
        weather(client, retries=1)
    assert len(statuses(server)) == 1  # its max_retries re-asks bad output, not failed calls


def test_instructor_leaves_http_retries_to_the_sdk(server: ChaosServer) -> None:
    client = instructor_client(server, sdk_retries=1)
    server.arm("http_503")
    assert weather(client, retries=0).location == "Paris, France"
    assert statuses(server) == [503, 200]


def test_instructor_reasks_malformed_tool_args(server: ChaosServer) -> None:
    InstructorRetryException = retry_exception()
    client = instructor_client(server)
    server.arm("malformed_tool_args")
    with pytest.raises(InstructorRetryException, match="validation error"):
        weather(client, retries=0)
    server.reset()
    client = instructor_client(server)
    server.arm("malformed_tool_args")
    assert weather(client, retries=1).location == "Paris, France"
    assert statuses(server) == [200, 200]  # the broken answer, then the re-ask


def test_instructor_refuses_a_truncated_stream_and_reasks_it(server: ChaosServer) -> None:
    InstructorRetryException = retry_exception()
    client = instructor_client(server)
    server.arm("truncated_stream")
    with pytest.raises(InstructorRetryException, match="Field required"):
        weather(client, retries=0, partial=True)
    server.reset()
    client = instructor_client(server)
    server.arm("truncated_stream")
    assert weather(client, retries=1, partial=True).location == "Paris, France"


# -- pydantic-ai --------------------------------------------------------------------------------


def pydantic_agent(server: ChaosServer, *, retries: int = 0, sdk_retries: int = 0) -> Any:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    client = openai.AsyncOpenAI(
        base_url=server.base_url, api_key="sk-test", max_retries=sdk_retries, timeout=5
    )
    model = OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(openai_client=client))
    agent = Agent(model, retries=retries)
    agent.chaos_client = client  # type: ignore[attr-defined]
    return agent


def run_agent(agent: Any) -> str:
    """The agent's output, run on a loop of its own that closes its client's sockets."""

    async def run() -> str:
        async with agent.chaos_client:
            result = await agent.run(QUESTION)
            output: str = result.output
            return output

    return asyncio.run(run())


def pydantic_error(name: str) -> Any:
    return getattr(pytest.importorskip("pydantic_ai.exceptions"), name)


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ({"type": "http_503"}, "ModelOverloadedError"),
        ({"type": "http_429", "retry_after": 0.01}, "ModelRateLimitError"),
        ({"type": "dropped_connection"}, "ModelConnectionError"),
        ({"type": "error_in_200"}, "UnexpectedModelBehavior"),
    ],
    ids=["http_503", "http_429", "dropped_connection", "error_in_200"],
)
def test_pydantic_ai_raises_its_own_error(
    server: ChaosServer, spec: dict[str, Any], error: str
) -> None:
    agent = pydantic_agent(server, retries=1)
    server.use_scenario("knowledge")
    server.arm(spec)
    with pytest.raises(pydantic_error(error)):
        run_agent(agent)
    assert len(statuses(server)) == 1  # its retries are for bad output, not failed calls


def test_pydantic_ai_leaves_http_retries_to_the_sdk(server: ChaosServer) -> None:
    agent = pydantic_agent(server, sdk_retries=1)
    server.use_scenario("knowledge")
    server.arm("http_503")
    assert run_agent(agent) == FIRST_ANSWER
    assert statuses(server) == [503, 200]


def test_pydantic_ai_reasks_malformed_tool_args(server: ChaosServer) -> None:
    for retries in (0, 1):
        server.reset()
        agent = pydantic_agent(server, retries=retries)

        @agent.tool_plain
        def get_weather(location: str) -> str:
            """Get the current weather for a location."""
            return "18 C"

        server.use_scenario("tool-call")
        server.arm("malformed_tool_args")
        if retries == 0:
            with pytest.raises(pydantic_error("UnexpectedModelBehavior"), match="max retries"):
                run_agent(agent)
        else:
            assert "18 °C" in run_agent(agent)
            # the broken answer, the retry prompt (a new request), then the tool result
            assert len(statuses(server)) == 3


def test_pydantic_ai_silently_accepts_a_truncated_stream(server: ChaosServer) -> None:
    agent = pydantic_agent(server)
    server.use_scenario("knowledge")
    server.arm("truncated_stream")

    async def streamed() -> Any:
        async with agent.chaos_client, agent.run_stream(QUESTION) as run:
            return await run.get_output()

    output = asyncio.run(streamed())
    assert output and output != FIRST_ANSWER and FIRST_ANSWER.startswith(output)


# -- openai-agents ------------------------------------------------------------------------------


def run_openai_agent(
    server: ChaosServer, *, sdk_retries: int = 0, stream: bool = False, tools: bool = False
) -> str:
    """The final output of an openai-agents run on the Chat Completions model."""
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)

    @agents.function_tool
    def get_weather(location: str) -> str:
        """Get the current weather for a location."""
        return "18 C"

    async def run() -> str:
        client = openai.AsyncOpenAI(
            base_url=server.base_url, api_key="sk-test", max_retries=sdk_retries, timeout=5
        )
        async with client:
            model = agents.OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client)
            agent = agents.Agent(name="a", model=model, tools=[get_weather] if tools else [])
            if stream:
                streamed = agents.Runner.run_streamed(agent, QUESTION)
                async for _ in streamed.stream_events():
                    pass
                return str(streamed.final_output)
            return str((await agents.Runner.run(agent, QUESTION)).final_output)

    return asyncio.run(run())


@SDK_ERRORS
def test_openai_agents_raises_the_sdk_error(
    server: ChaosServer, spec: dict[str, Any], error: type[Exception]
) -> None:
    pytest.importorskip("agents")
    server.use_scenario("knowledge")
    server.arm(spec)
    with pytest.raises(error):
        run_openai_agent(server)
    assert len(statuses(server)) == 1


def test_openai_agents_leaves_http_retries_to_the_sdk(server: ChaosServer) -> None:
    pytest.importorskip("agents")
    server.use_scenario("knowledge")
    server.arm("http_503")
    assert run_openai_agent(server, sdk_retries=1) == FIRST_ANSWER
    assert statuses(server) == [503, 200]


def test_openai_agents_raises_model_behavior_error_on_error_in_200(server: ChaosServer) -> None:
    agents = pytest.importorskip("agents")
    server.use_scenario("knowledge")
    server.arm("error_in_200")
    with pytest.raises(agents.ModelBehaviorError, match="no choices"):
        run_openai_agent(server)


def test_openai_agents_answers_malformed_tool_args_with_a_new_request(
    server: ChaosServer,
) -> None:
    agents = pytest.importorskip("agents")
    server.use_scenario("tool-call")
    server.arm("malformed_tool_args")
    # It sends the tool error back (a new request); anonymous requests get the recording
    # again with the same call id, which it refuses.
    with pytest.raises(agents.ModelBehaviorError, match="reused a completed tool call ID"):
        run_openai_agent(server, tools=True)
    assert len(statuses(server)) == 2


def test_openai_agents_silently_accepts_a_truncated_stream(server: ChaosServer) -> None:
    pytest.importorskip("agents")
    server.use_scenario("knowledge")
    server.arm("truncated_stream")
    output = run_openai_agent(server, stream=True)
    assert output and output != FIRST_ANSWER and FIRST_ANSWER.startswith(output)


# -- litellm ------------------------------------------------------------------------------------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a location.",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string"}},
            "required": ["location"],
        },
    },
}
APIS = ["completion", "acompletion"]
litellm_warnings = pytest.mark.filterwarnings(
    # litellm builds pydantic TypeAdapters over its TypedDicts with `ReadOnly` items as it
    # imports its modules lazily (the first call imports the GitHub Copilot authenticator's),
    # and pydantic warns on each; as an error it breaks that import half-way (then
    # AttributeError `__pydantic_core_schema__`). Only these tests ignore it.
    "ignore:Items? .* on TypedDict class .* using the `ReadOnly` qualifier:UserWarning"
)


@pytest.fixture
def litellm(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """litellm, imported offline (skips the test without it), leaving no loop or socket open.

    Without LITELLM_LOCAL_MODEL_COST_MAP its import fetches the model cost map from
    GitHub (read only at import). Its sync calls run their logging hooks on the thread's
    current event loop, asyncio creating one if there is none and leaving it unclosed:
    the test sets one and closes it. It caches the openai clients it makes, across
    tests: they are closed and dropped after each (the async ones on their own loop)."""
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    module = pytest.importorskip("litellm")
    module.suppress_debug_info = True  # else every failure prints a "Give Feedback" banner
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        yield module
    finally:
        cache = module.in_memory_llm_clients_cache
        for client in list(cache.cache_dict.values()):
            if isinstance(client, openai.OpenAI):
                client.close()
        cache.flush_cache()
        asyncio.set_event_loop(None)
        loop.close()


async def close_async_clients(litellm: Any) -> None:
    for client in list(litellm.in_memory_llm_clients_cache.cache_dict.values()):
        if isinstance(client, openai.AsyncOpenAI):
            await client.close()


def litellm_chunks(
    litellm: Any,
    server: ChaosServer,
    *,
    api: str = "completion",
    stream: bool = False,
    retries: int | None = None,
    tools: bool = False,
    received: list[Any] | None = None,
) -> Any:
    """The answer's message from `litellm.completion` or `acompletion` (openai provider,
    `api_base` at `server`); a stream's chunks are put in `received` as they arrive and
    assembled with `stream_chunk_builder`."""
    server.use_scenario("tool-call" if tools else "knowledge")
    options: dict[str, Any] = {
        "model": "openai/gpt-4o-mini",
        "api_base": server.base_url,
        "api_key": "sk-test",
        "messages": [{"role": "user", "content": QUESTION}],
        "timeout": 5,
    }
    if retries is not None:
        options["num_retries"] = retries
    if tools:
        options["tools"] = [WEATHER_TOOL]
    chunks = [] if received is None else received
    if api == "completion":
        if not stream:
            return litellm.completion(**options).choices[0].message
        chunks.extend(litellm.completion(stream=True, **options))
        return litellm.stream_chunk_builder(chunks).choices[0].message

    async def run() -> Any:
        try:
            if not stream:
                return (await litellm.acompletion(**options)).choices[0].message
            async for chunk in await litellm.acompletion(stream=True, **options):
                chunks.append(chunk)
            return litellm.stream_chunk_builder(chunks).choices[0].message
        finally:  # the clients it cached belong to this loop
            await close_async_clients(litellm)

    return asyncio.run(run())


def streamed_text(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


@litellm_warnings
@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(
    ("spec", "error", "status"),
    [
        ({"type": "http_503"}, "ServiceUnavailableError", 503),
        ({"type": "http_429", "retry_after": 0.01}, "RateLimitError", 429),
    ],
    ids=["http_503", "http_429"],
)
def test_litellm_raises_its_error_on_an_http_error_and_retries_it(
    litellm: Any,
    server: ChaosServer,
    spec: dict[str, Any],
    error: str,
    status: int,
    stream: bool,
    api: str,
) -> None:
    server.arm(spec)
    with pytest.raises(getattr(litellm, error)) as info:
        litellm_chunks(litellm, server, api=api, stream=stream, retries=0)
    assert isinstance(info.value, openai.APIStatusError)  # litellm's errors are the SDK's
    assert statuses(server) == [status]
    server.reset()
    server.arm(spec)
    message = litellm_chunks(litellm, server, api=api, stream=stream, retries=1)
    assert message.content == FIRST_ANSWER
    assert statuses(server) == [status, 200]


def litellm_error(name: str) -> Any:
    """An exception class of `litellm.exceptions` (not all are exported at the top)."""
    return getattr(pytest.importorskip("litellm.exceptions"), name)


@litellm_warnings
@pytest.mark.parametrize("api", APIS)
def test_litellm_raises_internal_server_error_on_a_dropped_json_answer_and_retries_it(
    litellm: Any, server: ChaosServer, api: str
) -> None:
    server.arm("dropped_connection")
    with pytest.raises(litellm.InternalServerError, match="Connection error"):
        litellm_chunks(litellm, server, api=api, retries=0)
    assert len(statuses(server)) == 1
    server.reset()
    server.arm("dropped_connection")
    # num_retries unset: the openai client's default retries
    assert litellm_chunks(litellm, server, api=api).content == FIRST_ANSWER
    assert len(statuses(server)) == 2


@litellm_warnings
@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize(
    ("spec", "error", "match"),
    [
        # the message is empty from `completion`, the envelope's from `acompletion`
        ({"type": "error_in_200"}, "APIError", None),
        ({"type": "truncated_stream"}, "InternalServerError", "Unterminated string"),
    ],
    ids=["error_in_200", "truncated_stream"],
)
def test_litellm_raises_on_a_broken_200_and_retries_it_only_with_num_retries(
    litellm: Any,
    server: ChaosServer,
    spec: dict[str, Any],
    error: str,
    match: str | None,
    api: str,
) -> None:
    server.arm(spec)
    with pytest.raises(litellm_error(error), match=match):
        litellm_chunks(litellm, server, api=api)  # num_retries unset
    assert statuses(server) == [200]  # a 200: the openai client does not retry it
    server.reset()
    server.arm(spec)
    assert litellm_chunks(litellm, server, api=api, retries=1).content == FIRST_ANSWER
    assert statuses(server) == [200, 200]  # litellm's own retry (num_retries)


@litellm_warnings
@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"type": "dropped_connection"}, "Connection error"),
        ({"type": "error_in_200", "after_chunks": 2}, "The server had an error"),
        ({"type": "truncated_stream"}, "Stream ended before a finish_reason was received"),
    ],
    ids=["dropped_connection", "error_in_200", "truncated_stream"],
)
def test_litellm_raises_mid_stream_fallback_error_on_a_broken_stream_and_does_not_retry(
    litellm: Any, server: ChaosServer, spec: dict[str, Any], match: str, api: str
) -> None:
    server.arm(spec)
    received: list[Any] = []
    with pytest.raises(litellm_error("MidStreamFallbackError"), match=match) as info:
        litellm_chunks(litellm, server, api=api, stream=True, retries=1, received=received)
    assert isinstance(info.value, litellm.ServiceUnavailableError)  # a 503 to `except`
    text = streamed_text(received)
    assert FIRST_ANSWER.startswith(text) and text != FIRST_ANSWER  # the chunks before it
    assert len(statuses(server)) == 1  # raised while iterating: num_retries does not apply


@litellm_warnings
@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_litellm_passes_malformed_tool_args_through_unparsed(
    litellm: Any, server: ChaosServer, stream: bool, api: str
) -> None:
    server.arm("malformed_tool_args")
    message = litellm_chunks(litellm, server, api=api, stream=stream, retries=1, tools=True)
    (call,) = message.tool_calls
    assert call.function.name == "get_weather"
    with pytest.raises(json.JSONDecodeError):
        json.loads(call.function.arguments)
    assert len(statuses(server)) == 1  # no error, so nothing retried
    server.reset()
    message = litellm_chunks(litellm, server, api=api, stream=stream, tools=True)
    (call,) = message.tool_calls
    assert json.loads(call.function.arguments) == {"location": "Paris, France"}
