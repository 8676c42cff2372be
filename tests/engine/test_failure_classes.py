"""The named failure classes (SPEC §5) in every protocol's own shape, in memory: for each
provider of `chaosllm.providers.PROVIDERS` and each class, the status, the error envelope
and the headers a real API answers with, for a JSON and a streaming request; the answer a
content filter cuts; an overload in the middle of a stream; what the catalogue says of
them (which a retry cures, which need no upstream); the shipped ``quota-exhausted``
profile; and the request facts fault matching reads for Gemini, Ollama and Bedrock."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from chaosllm.config import ServerConfig
from chaosllm.core.clock import ManualClock
from chaosllm.core.engine import Engine, ProviderCall, Reply
from chaosllm.core.verdict import Tolerances, findings
from chaosllm.faults import FAULT_TYPES, parse_fault_spec, parse_fault_specs
from chaosllm.paths import shipped_dir
from chaosllm.providers import MODEL_PROVIDERS, PROVIDERS, Provider
from chaosllm.store.profiles import load_profile
from chaosllm.store.recordings import RecordingStore
from chaosllm.strategies import RECOVERABLE
from chaosllm.testing.probe import default_faults
from tests.helpers import FAILURE_CLASSES, recording

pytestmark = pytest.mark.timeout(60)

CLASSES = FAILURE_CLASSES
ERRORS = tuple(c for c in CLASSES if c != "content_filter")
BEDROCK_MODEL = "anthropic.claude-3-haiku-20240307-v1:0"
AZURE_QUERY = "api-version=2024-10-21"


@dataclass(frozen=True)
class Case:
    """How a protocol's client asks: a shipped recording, the JSON and stream paths, the
    query a stream (or every request) carries."""

    recording: str
    path: str
    stream_path: str
    query: str = ""
    stream_query: str = ""


CASES: dict[str, Case] = {
    "anthropic.messages": Case("anthropic-text/0001", "/v1/messages", "/v1/messages"),
    "openai.chat": Case("simple-chat/0001", "/v1/chat/completions", "/v1/chat/completions"),
    "openai.responses": Case("responses-simple/0001", "/v1/responses", "/v1/responses"),
    "azure.chat": Case(
        "azure-chat/0001",
        "/openai/deployments/gpt-4o-mini/chat/completions",
        "/openai/deployments/gpt-4o-mini/chat/completions",
        AZURE_QUERY,
        AZURE_QUERY,
    ),
    "azure.responses": Case("azure-responses/0001", "/openai/responses", "/openai/responses"),
    "ollama.chat": Case("ollama-chat/0001", "/api/chat", "/api/chat"),
    "ollama.generate": Case("ollama-generate/0001", "/api/generate", "/api/generate"),
    "bedrock.converse": Case(
        "bedrock-text/0001",
        f"/model/{BEDROCK_MODEL}/converse",
        f"/model/{BEDROCK_MODEL}/converse-stream",
    ),
    "gemini.generate_content": Case(
        "gemini-text/0001",
        "/v1beta/models/gemini-2.5-flash:generateContent",
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent",
        stream_query="alt=sse",
    ),
}

STORE = RecordingStore.load([shipped_dir("recordings")])


@dataclass
class Client:
    """An engine over the shipped recordings, asked the way each protocol's SDK asks."""

    engine: Engine

    @classmethod
    def new(cls) -> Client:
        config = ServerConfig(recordings=[shipped_dir("recordings")])
        return cls(Engine(config, STORE, clock=ManualClock()))

    def arm(self, spec: Any) -> None:
        self.engine.board.arm(parse_fault_specs(spec))

    def send(self, name: str, *, stream: bool, session: str | None = None) -> Reply:
        case = CASES[name]
        body = dict(recording(case.recording)["request"]["body"])
        body["stream"] = stream
        path = case.stream_path if stream else case.path
        query = case.stream_query if stream else case.query
        call = ProviderCall(
            provider=PROVIDERS[name],
            path=path,
            body=json.dumps(body).encode(),
            query=query.encode(),
            session=session,
        )
        reply = self.engine.handle(call)
        assert isinstance(reply, Reply), reply
        return reply


def body_of(reply: Reply) -> Any:
    return json.loads(reply.plan.body())


def frames(provider: Provider, reply: Reply) -> list[str]:
    return [provider.codec.frame_text(p.data) for p in reply.plan.pieces if p.frame]


def signature(name: str, reply: Reply) -> Any:
    """What tells the failure apart in a protocol's answer: its error type and code, RPC
    status and reason, the exception AWS names in a header, Ollama's words."""
    headers = dict(reply.plan.headers)
    body = body_of(reply)
    if name.startswith("openai."):
        return body["error"]["type"], body["error"]["code"]
    if name.startswith("azure."):
        error = body["error"]
        return (error["type"], error["code"]) if "type" in error else error["code"]
    if name == "anthropic.messages":
        assert body["type"] == "error"
        return body["error"]["type"]
    if name == "gemini.generate_content":
        error = body["error"]
        assert error["code"] == reply.plan.status
        reasons = [d.get("reason") for d in error.get("details", []) if "reason" in d]
        return (error["status"], *reasons)
    if name == "bedrock.converse":
        assert set(body) == {"message"}
        return headers["x-amzn-errortype"].split(":", 1)[0]
    assert set(body) == {"error"}
    return body["error"]


OPENAI = {
    "context_length_exceeded": (400, ("invalid_request_error", "context_length_exceeded")),
    "insufficient_quota": (429, ("insufficient_quota", "insufficient_quota")),
    "invalid_api_key": (401, ("invalid_request_error", "invalid_api_key")),
    "model_not_found": (404, ("invalid_request_error", "model_not_found")),
    "overloaded": (503, ("service_unavailable_error", "server_is_overloaded")),
}
AZURE = {
    **OPENAI,  # a 400 is OpenAI's, passed on
    "insufficient_quota": (429, "insufficient_quota"),
    "invalid_api_key": (401, "401"),
    "model_not_found": (404, "DeploymentNotFound"),
    "overloaded": (503, "ServiceUnavailable"),
}
OLLAMA = {
    "context_length_exceeded": (400, "the input length exceeds the context length"),
    "insufficient_quota": (
        429,
        "you have reached your usage limit, upgrade for higher limits: https://ollama.com/upgrade",
    ),
    "invalid_api_key": (401, "unauthorized"),
    "model_not_found": (404, 'model "llama3.2" not found, try pulling it first'),
    "overloaded": (503, "Server overloaded, please retry shortly"),
}
EXPECTED: dict[str, dict[str, tuple[int, Any]]] = {
    "openai.chat": OPENAI,
    "openai.responses": OPENAI,
    "azure.chat": AZURE,
    "azure.responses": AZURE,
    "anthropic.messages": {
        "context_length_exceeded": (400, "invalid_request_error"),
        "insufficient_quota": (400, "invalid_request_error"),  # "credit balance is too low"
        "invalid_api_key": (401, "authentication_error"),
        "model_not_found": (404, "not_found_error"),
        "overloaded": (529, "overloaded_error"),
    },
    "gemini.generate_content": {
        "context_length_exceeded": (400, ("INVALID_ARGUMENT",)),
        "insufficient_quota": (429, ("RESOURCE_EXHAUSTED",)),
        "invalid_api_key": (400, ("INVALID_ARGUMENT", "API_KEY_INVALID")),  # Google's 400
        "model_not_found": (404, ("NOT_FOUND",)),
        "overloaded": (503, ("UNAVAILABLE",)),
    },
    "bedrock.converse": {
        "context_length_exceeded": (400, "ValidationException"),
        "insufficient_quota": (429, "ThrottlingException"),
        "invalid_api_key": (403, "UnrecognizedClientException"),
        "model_not_found": (404, "ResourceNotFoundException"),
        "overloaded": (503, "ServiceUnavailableException"),
    },
    "ollama.chat": OLLAMA,
    "ollama.generate": OLLAMA,
}
MESSAGES = {
    ("openai.chat", "context_length_exceeded"): "This model's maximum context length is 128000",
    ("openai.responses", "context_length_exceeded"): "Your input exceeds the context window",
    ("openai.chat", "insufficient_quota"): "You exceeded your current quota",
    ("openai.chat", "model_not_found"): "The model `gpt-4o-mini` does not exist",
    ("anthropic.messages", "context_length_exceeded"): "prompt is too long: ",
    ("anthropic.messages", "insufficient_quota"): "Your credit balance is too low",
    ("anthropic.messages", "invalid_api_key"): "invalid x-api-key",
    ("anthropic.messages", "model_not_found"): "model: claude-sonnet-4-6",
    ("anthropic.messages", "overloaded"): "Overloaded",
    ("gemini.generate_content", "context_length_exceeded"): "The input token count (",
    ("gemini.generate_content", "invalid_api_key"): "API key not valid.",
    ("gemini.generate_content", "model_not_found"): "models/gemini-2.5-flash is not found",
    ("gemini.generate_content", "overloaded"): "The model is overloaded.",
    ("bedrock.converse", "context_length_exceeded"): "Input is too long for requested model.",
    ("azure.chat", "model_not_found"): "The API deployment for this resource does not exist.",
}


def message_of(name: str, reply: Reply) -> str:
    body = body_of(reply)
    if name == "bedrock.converse":
        return str(body["message"])
    error = body["error"]
    return error if isinstance(error, str) else str(error["message"])


def test_every_provider_has_a_case_and_an_expectation() -> None:
    assert set(CASES) == set(MODEL_PROVIDERS) == set(EXPECTED)
    assert all(set(table) == set(ERRORS) for table in EXPECTED.values())
    assert set(CLASSES) <= set(FAULT_TYPES)


TABLE = [(name, type_) for name in EXPECTED for type_ in ERRORS]


@pytest.mark.parametrize(("name", "type_"), TABLE, ids=[f"{n}-{t}" for n, t in TABLE])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_each_class_in_each_protocols_shape(name: str, type_: str, stream: bool) -> None:
    client = Client.new()
    client.arm({"type": type_})
    reply = client.send(name, stream=stream)
    status, expected = EXPECTED[name][type_]
    assert reply.fired is not None and reply.fired.spec.type == type_
    assert reply.plan.status == status
    assert signature(name, reply) == expected
    headers = dict(reply.plan.headers)
    assert headers["content-type"] == "application/json"
    assert not {"retry-after", "retry-after-ms", "x-should-retry"} & set(headers)
    prefix = MESSAGES.get((name, type_))
    if prefix is not None:
        assert message_of(name, reply).startswith(prefix)
    # the same fault again is gone: the next request gets the recorded answer
    assert client.send(name, stream=stream).plan.status == 200


def test_the_message_parameter_replaces_the_wording() -> None:
    for name in MODEL_PROVIDERS:
        client = Client.new()
        client.arm({"type": "insufficient_quota", "message": "pay up"})
        assert message_of(name, client.send(name, stream=False)) == "pay up", name


def test_a_context_too_long_message_counts_more_tokens_than_the_window() -> None:
    client = Client.new()
    client.arm({"type": "context_length_exceeded"})
    text = message_of("anthropic.messages", client.send("anthropic.messages", stream=False))
    tokens, window = (int(w) for w in text.split() if w.isdigit())
    assert tokens > window == 200_000


def test_an_overload_may_say_when_to_come_back() -> None:
    client = Client.new()
    client.arm({"type": "overloaded", "retry_after": 2.5})
    headers = dict(client.send("anthropic.messages", stream=False).plan.headers)
    assert (headers["retry-after"], headers["retry-after-ms"]) == ("3", "2500")


# -- content_filter --------------------------------------------------------------------------


def finish_reason(name: str, answer: Any) -> Any:
    """Why an answer ended, where each protocol says it."""
    if name.endswith(".chat") and not name.startswith("ollama"):
        return answer["choices"][0]["finish_reason"]
    if name.endswith(".responses"):
        return answer["status"], answer["incomplete_details"]["reason"]
    if name == "anthropic.messages":
        return answer["stop_reason"]
    if name == "gemini.generate_content":
        return answer["candidates"][0]["finishReason"]
    if name == "bedrock.converse":
        return answer["stopReason"]
    return answer["done_reason"]


def answer_text(name: str, answer: Any) -> str:
    if name.endswith(".chat") and not name.startswith("ollama"):
        return answer["choices"][0]["message"]["content"] or ""
    if name.endswith(".responses"):
        return "".join(
            p.get("text", "")
            for item in answer["output"]
            if item["type"] == "message"
            for p in item["content"]
        )
    if name == "anthropic.messages":
        return "".join(b.get("text", "") for b in answer["content"])
    if name == "gemini.generate_content":
        parts = answer["candidates"][0]["content"].get("parts") or []
        return "".join(p.get("text", "") for p in parts)
    if name == "bedrock.converse":
        return "".join(b.get("text", "") for b in answer["output"]["message"]["content"])
    if name == "ollama.chat":
        return str(answer["message"]["content"])
    return str(answer["response"])


FILTERED = {
    "openai.chat": "content_filter",
    "azure.chat": "content_filter",
    "openai.responses": ("incomplete", "content_filter"),
    "azure.responses": ("incomplete", "content_filter"),
    "anthropic.messages": "refusal",
    "gemini.generate_content": "SAFETY",
    "bedrock.converse": "content_filtered",
    "ollama.chat": "stop",  # Ollama has no content filter: a shorter answer, stopped
    "ollama.generate": "stop",
}


@pytest.mark.parametrize("name", sorted(MODEL_PROVIDERS))
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_content_filter_cuts_the_answer_and_says_why(name: str, stream: bool) -> None:
    provider = PROVIDERS[name]
    clean = Client.new().send(name, stream=stream)
    client = Client.new()
    client.arm({"type": "content_filter"})
    reply = client.send(name, stream=stream)
    assert reply.fired is not None and reply.plan.status == 200
    if stream:
        answer = provider.assemble(frames(provider, reply))
        whole = provider.assemble(frames(provider, clean))
        assert provider.codec.stream_complete(frames(provider, reply))  # it ends as streams end
    else:
        answer, whole = body_of(reply), body_of(clean)
    assert finish_reason(name, answer) == FILTERED[name]
    text, full = answer_text(name, answer), answer_text(name, whole)
    assert full.startswith(text) and len(text) < len(full)


def test_azure_marks_the_filtered_category_in_the_answer_and_the_stream() -> None:
    provider = PROVIDERS["azure.chat"]
    for stream in (False, True):
        client = Client.new()
        client.arm({"type": "content_filter"})
        reply = client.send("azure.chat", stream=stream)
        answer = provider.assemble(frames(provider, reply)) if stream else body_of(reply)
        results = answer["choices"][0]["content_filter_results"]
        assert results["violence"] == {"filtered": True, "severity": "high"}
        assert {k for k, v in results.items() if v["filtered"]} == {"violence"}


def test_gemini_rates_the_blocked_category() -> None:
    client = Client.new()
    client.arm({"type": "content_filter"})
    candidate = body_of(client.send("gemini.generate_content", stream=False))["candidates"][0]
    blocked = [r["category"] for r in candidate["safetyRatings"] if r.get("blocked")]
    assert blocked == ["HARM_CATEGORY_DANGEROUS_CONTENT"]


def test_content_filter_drops_the_tool_calls() -> None:
    provider = PROVIDERS["openai.chat"]
    answer = recording("tool-call/0001")["response"]["body"]
    filtered = provider.faults.filtered_answer(answer)
    assert isinstance(filtered, dict)
    assert "tool_calls" not in filtered["choices"][0]["message"]
    assert provider.faults.filtered_answer({"error": {"message": "x"}}) is None  # nothing to cut


def test_content_filter_is_not_consumed_by_an_error_answer() -> None:
    spec = parse_fault_spec({"type": "content_filter"})
    for provider in MODEL_PROVIDERS.values():
        assert not spec.entry.applies(provider, provider.errors.error_answer("boom", status=500))


# -- overloaded mid-stream -------------------------------------------------------------------

OVERLOAD_FRAME = {
    "anthropic.messages": "overloaded_error",
    "openai.chat": "server_is_overloaded",
    "openai.responses": "server_is_overloaded",
    "azure.chat": "ServiceUnavailable",
    "azure.responses": "ServiceUnavailable",
    "gemini.generate_content": "UNAVAILABLE",
    "bedrock.converse": "serviceUnavailableException",
    "ollama.chat": "Server overloaded",
    "ollama.generate": "Server overloaded",
}


@pytest.mark.parametrize("name", sorted(MODEL_PROVIDERS))
def test_overloaded_after_k_frames_is_the_protocols_error_event(name: str) -> None:
    provider = PROVIDERS[name]
    clean = Client.new().send(name, stream=True).plan.pieces
    client = Client.new()
    client.arm({"type": "overloaded", "after_chunks": 1})
    reply = client.send(name, stream=True)
    assert reply.plan.status == 200
    pieces = reply.plan.pieces
    assert len(pieces) == 2 and pieces[0] == clean[0]
    last = provider.codec.frame_text(pieces[-1].data)
    assert OVERLOAD_FRAME[name] in last
    assert provider.faults.frame_finishes(last)  # it ends the answer, as an error event does


def test_anthropic_overload_mid_stream_is_an_error_event() -> None:
    client = Client.new()
    client.arm({"type": "overloaded", "after_chunks": 2})
    last = client.send("anthropic.messages", stream=True).plan.pieces[-1].data.decode()
    assert last == (
        'event: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
        '"message":"Overloaded"}}\n\n'
    )


def test_after_chunks_on_a_json_request_is_the_status() -> None:
    client = Client.new()
    client.arm({"type": "overloaded", "after_chunks": 1})
    assert client.send("anthropic.messages", stream=False).plan.status == 529


# -- what the catalogue says of them ---------------------------------------------------------


def test_which_classes_a_retry_cures() -> None:
    retryable = {name: FAULT_TYPES[name].retryable for name in CLASSES}
    assert retryable == {
        "context_length_exceeded": False,
        "insufficient_quota": False,
        "content_filter": False,
        "invalid_api_key": False,
        "model_not_found": False,
        "overloaded": True,
    }
    assert "overloaded" in RECOVERABLE
    assert not set(RECOVERABLE) & (set(CLASSES) - {"overloaded"})


def test_the_error_classes_need_no_upstream() -> None:
    for name in ERRORS:
        entry = FAULT_TYPES[name]
        spec = parse_fault_spec({"type": name})
        assert entry.answers_alone(spec, False) and entry.answers_alone(spec, True), name
    mid_stream = parse_fault_spec({"type": "overloaded", "after_chunks": 2})
    assert not FAULT_TYPES["overloaded"].answers_alone(mid_stream, True)
    assert FAULT_TYPES["overloaded"].answers_alone(mid_stream, False)
    content = parse_fault_spec({"type": "content_filter"})
    assert not FAULT_TYPES["content_filter"].answers_alone(content, False)


def test_retrying_a_spent_quota_is_a_finding() -> None:
    client = Client.new()
    client.arm({"type": "insufficient_quota", "remaining": 2})
    for _ in range(2):
        assert client.send("openai.chat", stream=False, session="s").plan.status == 429
    engine = client.engine
    found = findings(engine.journal.entries(), engine.board.history(), Tolerances())
    assert [f.name for f in found] == ["retried_non_retryable"]


def test_the_probe_runs_every_class() -> None:
    assert [s["type"] for s in default_faults(stall_ms=10) if s["type"] in CLASSES] == list(CLASSES)


def test_the_quota_exhausted_profile_serves_three_then_refuses() -> None:
    profile = load_profile("quota-exhausted")
    assert [s.type for s in profile.specs] == ["insufficient_quota"]
    client = Client.new()
    client.engine.board.arm(profile.specs)
    statuses = [client.send("openai.chat", stream=False).plan.status for _ in range(6)]
    assert statuses == [200, 200, 200, 429, 429, 429]


# -- the request facts fault matching reads (Gemini, Ollama, Bedrock) ------------------------


def test_gemini_request_facts() -> None:
    gemini = PROVIDERS["gemini.generate_content"]
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "first"}]},
            {"role": "model", "parts": [{"functionCall": {"name": "get_weather", "args": {}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "get_weather"}}]},
            {"parts": [{"text": "thinking", "thought": True}, {"text": "a"}, {"text": "b"}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "get_weather"}}]},
        ],
        "tools": [
            {"functionDeclarations": [{"name": "get_weather"}, {"name": "get_time"}]},
            {"googleSearch": {}},
        ],
    }
    assert gemini.faults.last_user_text(body) == "a\nb"
    assert gemini.faults.last_user_text({"contents": "nope"}) is None
    assert gemini.faults.tool_names(body) == {"get_weather", "get_time", "googleSearch"}
    assert gemini.faults.tool_names([]) == frozenset()
    answer = recording("gemini-tools/0001")["response"]["body"]
    called = {p["functionCall"]["name"] for p in answer["candidates"][0]["content"]["parts"]}
    assert called and gemini.faults.called_tool_names(answer) == called


def test_ollama_request_facts() -> None:
    chat, generate = PROVIDERS["ollama.chat"], PROVIDERS["ollama.generate"]
    tools = recording("ollama-tools/0001")
    body = tools["request"]["body"]
    users = [m["content"] for m in body["messages"] if m["role"] == "user"]
    assert chat.faults.last_user_text(body) == users[-1]
    assert chat.faults.tool_names(body) == {t["function"]["name"] for t in body["tools"]}
    calls = tools["response"]["body"]["message"]["tool_calls"]
    assert chat.faults.called_tool_names(tools["response"]["body"]) == {
        c["function"]["name"] for c in calls
    }
    assert generate.faults.last_user_text({"prompt": "Complete: hi"}) == "Complete: hi"
    assert generate.faults.last_user_text({"prompt": 3}) is None
    assert generate.faults.tool_names({"prompt": "x"}) == frozenset()


def test_bedrock_request_facts() -> None:
    bedrock = PROVIDERS["bedrock.converse"]
    tools = recording("bedrock-tools/0001")
    body = tools["request"]["body"]
    texts = [
        b["text"]
        for m in body["messages"]
        if m["role"] == "user"
        for b in m["content"]
        if "text" in b
    ]
    assert bedrock.faults.last_user_text(body) == texts[-1]
    assert bedrock.faults.last_user_text({"messages": [{"role": "user", "content": "x"}]}) is None
    specs = {t["toolSpec"]["name"] for t in body["toolConfig"]["tools"]}
    assert specs and bedrock.faults.tool_names(body) == specs
    content = tools["response"]["body"]["output"]["message"]["content"]
    called = {b["toolUse"]["name"] for b in content if "toolUse" in b}
    assert called and bedrock.faults.called_tool_names(tools["response"]["body"]) == called


@pytest.mark.parametrize(
    ("name", "contains"),
    [("gemini.generate_content", "capital"), ("bedrock.converse", "capital")],
)
def test_match_contains_reads_them(name: str, contains: str) -> None:
    client = Client.new()
    client.arm({"type": "http_503", "match": {"contains": "no such words"}})
    assert client.send(name, stream=False).plan.status == 200
    client.arm({"type": "http_503", "match": {"contains": contains}})
    assert client.send(name, stream=False).plan.status == 503
