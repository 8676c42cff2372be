"""Routes with parameters (`Provider.path_templates`) and binding (`Provider.bind`): the
path and query of a request folded into what the engine keys, matches and records."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import pytest

from chaosllm.config import ServerConfig
from chaosllm.core.engine import Engine, ProviderCall, Reply
from chaosllm.errors import InvalidRequest
from chaosllm.model import JSON
from chaosllm.providers.openai_chat import OpenAIChat
from chaosllm.store.recordings import RecordingStore


class _Templated(OpenAIChat):
    """OpenAI chat on a path naming the model, as Azure's deployments do."""

    name = "test.templated"
    paths = ()
    path_templates: ClassVar[tuple[str, ...]] = (
        "/deployments/{model}:chat",
        "/arn/{model:path}/chat",
    )

    def bind(self, body: JSON, params: Mapping[str, str], query: str) -> JSON:
        if not isinstance(body, dict):
            raise InvalidRequest("the body is not an object")
        if "bad" in query:
            raise InvalidRequest("a bad query")
        return {**body, "model": params["model"]}


def test_a_template_names_one_segment_or_with_path_any_run() -> None:
    provider = _Templated()
    assert provider.path_params("/deployments/gpt-4o:chat") == {"model": "gpt-4o"}
    assert provider.path_params("/deployments/a:b:chat") == {"model": "a:b"}
    assert provider.path_params("/deployments/a/b:chat") is None
    assert provider.path_params("/arn/x/y/z/chat") == {"model": "x/y/z"}
    assert provider.path_params("/deployments/gpt-4o:chatX") is None
    assert provider.path_params("/other") is None
    assert OpenAIChat().path_params("/v1/chat/completions") is None


def _call(path: str, model_in_body: str | None = None, query: bytes = b"") -> ProviderCall:
    body = b'{"messages": [{"role": "user", "content": "hi"}]}'
    if model_in_body is not None:
        body = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}]}' % (
            model_in_body.encode()
        )
    return ProviderCall(provider=_Templated(), path=path, body=body, query=query)


def test_the_engine_keys_a_request_by_what_its_path_says() -> None:
    engine = Engine(ServerConfig(recordings=[]), RecordingStore([]))
    first = engine.handle(_call("/deployments/one:chat"))
    second = engine.handle(_call("/deployments/two:chat"))
    again = engine.handle(_call("/deployments/one:chat", model_in_body="ignored"))
    assert isinstance(first, Reply) and isinstance(second, Reply) and isinstance(again, Reply)
    records = [r.record for r in engine.journal.entries()]
    assert [r.model for r in records] == ["one", "two", "one"]
    assert records[0].digest != records[1].digest
    assert records[0].digest == records[2].digest  # the path's model wins over the body's


def test_a_query_the_binding_refuses_gets_the_protocols_400() -> None:
    engine = Engine(ServerConfig(recordings=[]), RecordingStore([]))
    reply = engine.handle(_call("/deployments/one:chat", query=b"x=bad"))
    assert isinstance(reply, Reply)
    assert reply.plan.status == 400
    assert b"a bad query" in reply.plan.body()
    # The cache of prepared bodies keys by path and query too: the same body on a good
    # query is not refused.
    assert isinstance(ok := engine.handle(_call("/deployments/one:chat")), Reply)
    assert ok.plan.status == 404


@pytest.mark.parametrize("path", ["/deployments/a/b:chat"])
def test_a_path_no_template_matches_is_refused(path: str) -> None:
    engine = Engine(ServerConfig(recordings=[]), RecordingStore([]))
    reply = engine.handle(_call(path))
    assert isinstance(reply, Reply) and reply.plan.status == 400
