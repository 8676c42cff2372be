"""The shared provider base and the registry: routes by path, the protocol asking on a shared
endpoint, rendering (pure, equal for equal render keys), the error envelope everywhere
(plans, faults, the wire's own errors, the app's 404/405) and the model list."""

from __future__ import annotations

import json
import re
import socket
from dataclasses import replace
from typing import Any

import httpx
import pytest

from chaosllm.http.web import error_response
from chaosllm.model import (
    Exchange,
    RecordedChunk,
    RecordedRequest,
    RecordedResponse,
)
from chaosllm.providers import (
    DEFAULT_PROVIDER,
    PROVIDERS,
    Provider,
    embeddings,
    error_body_for_path,
    provider_for_client,
    provider_for_path,
)
from chaosllm.providers.base import ErrorKind
from chaosllm.wire.asgi import Receive, Scope, Send
from chaosllm.wire.server import WireServer
from tests.helpers import chat_completion

CHAT = PROVIDERS["openai.chat"]
ANTHROPIC = PROVIDERS["anthropic.messages"]
RESPONSES = PROVIDERS["openai.responses"]
SOCKET_TIMEOUT = 10.0


def test_registry_routes_every_path_to_its_provider() -> None:
    assert set(PROVIDERS) == {
        "openai.chat",
        "anthropic.messages",
        "openai.responses",
        "azure.chat",
        "azure.responses",
        "gemini.generate_content",
        "ollama.chat",
        "ollama.generate",
        "bedrock.converse",
        "mcp",
        "openai.responses.stored",
    }
    for name, provider in PROVIDERS.items():
        assert isinstance(provider, Provider) and provider.name == name
        assert provider.paths or provider.path_templates
        for path in provider.paths:
            assert provider_for_path(path) is provider
        for template in provider.path_templates:
            # Each template with its parameters filled in routes to its provider.
            path = re.sub(r"\{[^}]+\}", "p1", template)
            assert provider_for_path(path) is provider, template
    assert provider_for_path("/") is None
    for path in embeddings.PATHS:  # served apart, in OpenAI's envelope
        assert provider_for_path(path) is None
    assert DEFAULT_PROVIDER is CHAT


def test_the_protocol_asking_on_a_shared_endpoint() -> None:
    assert provider_for_client(["anthropic-version", "x-api-key"]) is ANTHROPIC
    assert provider_for_client(["authorization"]) is DEFAULT_PROVIDER
    assert provider_for_client([]) is DEFAULT_PROVIDER


def test_models_body_in_each_shape() -> None:
    assert CHAT.codec.models_body(["a", "b"]) == {
        "object": "list",
        "data": [
            {"id": "a", "object": "model", "created": 0, "owned_by": "chaosllm"},
            {"id": "b", "object": "model", "created": 0, "owned_by": "chaosllm"},
        ],
    }
    assert RESPONSES.codec.models_body(["a"]) == CHAT.codec.models_body(["a"])
    listed = ANTHROPIC.codec.models_body(["claude-a", "claude-b"])
    assert listed["has_more"] is False
    assert (listed["first_id"], listed["last_id"]) == ("claude-a", "claude-b")
    assert listed["data"][0] == {
        "type": "model",
        "id": "claude-a",
        "display_name": "claude-a",
        "created_at": "1970-01-01T00:00:00Z",
    }
    assert ANTHROPIC.codec.models_body([])["first_id"] is None


# -- the error envelope -----------------------------------------------------------------


def test_error_body_by_kind_and_by_status() -> None:
    # chaosllm's own errors: typed by the kind, the code as given
    assert CHAT.error_body(404, "m", kind=ErrorKind.NO_MATCH, code="no_recording") == {
        "error": {
            "message": "m",
            "type": "invalid_request_error",
            "param": None,
            "code": "no_recording",
        }
    }
    # a real API's error for a status: its type and default code
    assert RESPONSES.error_body(503, "m") == {
        "error": {
            "message": "m",
            "type": "server_error",
            "param": None,
            "code": "service_unavailable",
        }
    }
    assert ANTHROPIC.error_body(400, "m", kind=ErrorKind.INVALID_REQUEST, code="x") == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "m"},
    }
    assert ANTHROPIC.error_body(500, "m", kind=ErrorKind.SERVER_ERROR)["error"]["type"] == (
        "api_error"
    )
    for provider in PROVIDERS.values():
        plan = provider.render_error(400, "bad", kind=ErrorKind.INVALID_REQUEST, param="p")
        assert plan.status == 400
        assert plan.headers == (("content-type", "application/json"), *provider.error_headers(400))
        assert json.loads(plan.body()) == provider.error_body(
            400, "bad", kind=ErrorKind.INVALID_REQUEST, param="p"
        )
        assert provider.errors.error_answer("m", status=429) == provider.error_body(429, "m")


def test_error_body_for_path_is_the_protocol_on_that_path() -> None:
    assert error_body_for_path("/v1/messages", 413, "too big", "request_too_large") == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "too big"},
    }
    assert error_body_for_path("/chat/completions", 500, "x", "internal_error") == {
        "error": {"message": "x", "type": "server_error", "param": None, "code": "internal_error"}
    }
    assert error_body_for_path("/echo", 400, "x", "bad_request") is None


def test_app_errors_use_the_envelope_of_the_path() -> None:
    anthropic = error_response("/v1/messages", 405, "Method GET is not allowed.")
    assert json.loads(bytes(anthropic.body)) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "Method GET is not allowed."},
    }
    unknown = error_response("/nowhere", 404, "Unknown URL.", code="unknown_url")
    assert unknown.status_code == 404
    assert json.loads(bytes(unknown.body))["error"] == {
        "message": "Unknown URL.",
        "type": "invalid_request_error",
        "param": None,
        "code": "unknown_url",
    }


async def _failing_app(scope: Scope, receive: Receive, send: Send) -> None:
    raise RuntimeError("boom")  # no lifespan either: the server tolerates that


def _raw(host: str, port: int, request: bytes) -> tuple[bytes, Any]:
    with socket.create_connection((host, port), timeout=SOCKET_TIMEOUT) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head, json.loads(body)


def test_the_wire_answers_its_own_errors_in_the_envelope_of_the_path() -> None:
    server = WireServer(_failing_app, max_body_bytes=1024, error_body=error_body_for_path)
    with server.run_in_thread() as (host, port):
        too_big = b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n"
        head, body = _raw(host, port, too_big % b"/v1/messages")
        assert head.startswith(b"HTTP/1.1 413")
        assert body == {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "Request body too large: the limit is 1024 bytes",
            },
        }
        head, body = _raw(host, port, too_big % b"/v1/responses?x=1")
        assert body["error"]["code"] == "request_too_large" and body["error"]["param"] is None
        # no protocol on the path: the envelope it always had
        head, body = _raw(host, port, too_big % b"/echo")
        assert body == {
            "error": {
                "message": "Request body too large: the limit is 1024 bytes",
                "type": "invalid_request_error",
                "code": "request_too_large",
            }
        }
        with httpx.Client(timeout=SOCKET_TIMEOUT) as client:
            failed = client.post(f"http://{host}:{port}/v1/messages", json={})
            assert failed.status_code == 500
            assert failed.json()["error"] == {
                "type": "api_error",
                "message": "Internal server error",
            }
            failed = client.post(f"http://{host}:{port}/v1/chat/completions", json={})
            assert failed.json()["error"]["type"] == "server_error"


# -- rendering and its cache ------------------------------------------------------------

REQUEST = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def exchange(response: RecordedResponse) -> Exchange:
    return Exchange(
        provider=CHAT.name,
        request=RecordedRequest("POST", "/v1/chat/completions", REQUEST),
        response=response,
        digest=CHAT.digest(REQUEST),
        name="t/0001",
        scenario="t",
    )


def test_render_is_pure_and_equal_for_equal_render_keys() -> None:
    ex = exchange(RecordedResponse(200, chat_completion("old")))
    plan = CHAT.render(ex, REQUEST, timing=0)
    assert CHAT.render(ex, REQUEST, timing=0) == plan
    assert CHAT.render(ex, REQUEST, timing=0) is not plan  # uncached
    stream_body = {**REQUEST, "stream": True}
    usage_body = {**stream_body, "stream_options": {"include_usage": True}}
    stream = CHAT.render(ex, stream_body, timing=0)
    usage = CHAT.render(ex, usage_body, timing=0)
    assert stream != plan and usage != stream
    assert usage.frame_count == stream.frame_count + 1
    keys = {CHAT.render_key(ex, body, timing=0) for body in (REQUEST, stream_body, usage_body)}
    assert len(keys) == 3
    # what the key leaves out does not change the rendering
    assert CHAT.render_key(ex, {**REQUEST, "user": "x"}, timing=1) == CHAT.render_key(
        ex, REQUEST, timing=0
    )
    assert CHAT.render(ex, {**stream_body, "user": "x"}, timing=1) == stream
    assert CHAT.render_key(ex, {**stream_body, "user": "x"}, timing=1) == CHAT.render_key(
        ex, stream_body, timing=0
    )


def test_render_keys_are_values() -> None:
    """A render key holds no identity: equal exchanges and requests give equal keys."""
    body = {**REQUEST, "stream": True}
    first = exchange(RecordedResponse(200, chat_completion("old")))
    second = exchange(RecordedResponse(200, chat_completion("old")))
    assert first.response is not second.response
    assert CHAT.render_key(first, body, timing=0) == CHAT.render_key(second, body, timing=0)
    assert hash(CHAT.render_key(first, body, timing=0)) == hash(
        CHAT.render_key(second, dict(body), timing=0)
    )


def test_an_adapted_exchange_renders_its_own_answer() -> None:
    """An exchange copied with a new response (templating, id remapping) once shared the
    original's memo and was served the original's rendering."""
    ex = exchange(RecordedResponse(200, chat_completion("old")))
    assert b'"old"' in CHAT.render(ex, REQUEST, timing=0).body()
    adapted = replace(ex, response=replace(ex.response, body=chat_completion("new")))
    assert b'"new"' in CHAT.render(adapted, REQUEST, timing=0).body()
    assert b'"old"' in CHAT.render(ex, REQUEST, timing=0).body()


def test_recorded_frames_render_per_timing() -> None:
    chunks = (RecordedChunk("data: 1\n\n", 100.0), RecordedChunk("data: [DONE]\n\n", 50.0))
    ex = exchange(RecordedResponse(200, chat_completion("x"), stream=True, chunks=chunks))
    body = {**REQUEST, "stream": True}
    slow, fast = CHAT.render(ex, body, timing=1), CHAT.render(ex, body, timing=0)
    assert [p.delay_ms for p in slow.pieces] == [100.0, 50.0]
    assert [p.delay_ms for p in fast.pieces] == [0.0, 0.0]
    assert CHAT.render(ex, body, timing=1) == slow
    assert CHAT.render_key(ex, body, timing=1) != CHAT.render_key(ex, body, timing=0)


@pytest.mark.parametrize("provider", list(PROVIDERS.values()), ids=list(PROVIDERS))
def test_error_answers_are_never_streamed(provider: Provider) -> None:
    error = provider.error_body(500, "upstream failed")
    ex = replace(exchange(RecordedResponse(500, error)), provider=provider.name)
    plan = provider.render(ex, {"stream": True}, timing=0)
    assert plan.status == 500 and json.loads(plan.body()) == error
