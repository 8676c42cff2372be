"""DocsGPT's mock LLM (arc53/DocsGPT ``scripts/e2e/mock_llm.py``), feature for feature:
its fixture hash (``_compute_request_digest``), usage defaults, in-band directives, its
surface (``/healthz``, ``/v1/v1/embeddings``, 768 dimensions, CORS preflight), fixtures
saved while serving, its delay headers, the miss fallback and its log lines. Fixtures of
the real shapes, written here; the official openai SDK on real sockets, and the engine
in memory."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam

from chaosllm import ChaosServer
from chaosllm.config import OnMiss
from chaosllm.core import mock_llm
from chaosllm.core.engine import ProviderCall, Reply
from chaosllm.providers import PROVIDERS
from chaosllm.store.formats import hashkeyed
from tests.helpers import openai_client
from tests.memory import CHAT, EnginePair

# -- the stub's digest, re-implemented from its code ----------------------------------


def canonical_messages(messages: Any) -> list[dict[str, Any]]:
    """``_canonical_messages`` of DocsGPT's stub, as its code reads."""
    if not messages:
        return []
    out: list[dict[str, Any]] = []
    for msg in messages:
        if not isinstance(msg, dict):
            continue
        entry: dict[str, Any] = {"role": msg.get("role"), "content": msg.get("content")}
        for key in ("name", "tool_call_id", "tool_calls"):
            if key in msg:
                entry[key] = msg[key]
        out.append(entry)
    return out


def stub_digest(payload: dict[str, Any]) -> str:
    """``_compute_request_digest`` of DocsGPT's stub, as its code reads."""
    canonical = {
        "model": payload.get("model"),
        "messages": canonical_messages(payload.get("messages")),
        "tool_choice": payload.get("tool_choice"),
    }
    blob = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


TOOLS: list[ChatCompletionFunctionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "run_command",
            "description": "Run a shell command on the remote device",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]

WHOAMI: dict[str, Any] = {
    "model": "docsgpt-local",
    "messages": [
        {"role": "system", "content": "You are DocsGPT. Today's date is 2026-12-01."},
        {"role": "user", "content": "please run whoami on my remote device"},
    ],
}
WHOAMI_FIXTURE: dict[str, Any] = {
    "_comment": "run_command tool call (whoami), as DocsGPT's tester fixtures are written",
    "response": {
        "content": "",
        "tool_calls": [
            {
                "id": "call_tester_whoami_1",
                "type": "function",
                "function": {
                    "name": "run_command",
                    "arguments": '{"command":"whoami","working_directory":"/tmp"}',
                },
            }
        ],
        "finish_reason": "tool_calls",
    },
}
# The follow-up turn, as the openai SDK sends it: the assistant turn has no ``content``.
AFTER_CALL: dict[str, Any] = {
    "model": "docsgpt-local",
    "messages": [
        *WHOAMI["messages"],
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_tester_whoami_1",
                    "type": "function",
                    "function": {"name": "run_command", "arguments": '{"command":"whoami"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_tester_whoami_1", "content": "docsgpt"},
    ],
}
AFTER_CALL_FIXTURE: dict[str, Any] = {
    "_comment": "the answer after the tool result",
    "response": {"content": "The remote user is docsgpt.", "finish_reason": "stop"},
}


def write(directory: Path, request: dict[str, Any], fixture: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{stub_digest(request)}.json"
    path.write_text(json.dumps(fixture, indent=2), "utf-8")
    return path


@pytest.fixture
def fixtures(tmp_path: Path) -> Path:
    directory = tmp_path / "mock_llm_fixtures"
    write(directory, WHOAMI, WHOAMI_FIXTURE)
    write(directory, AFTER_CALL, AFTER_CALL_FIXTURE)
    (directory / "README.md").write_text("# fixtures\n", "utf-8")
    return directory


def estimate(text: str) -> int:
    return max(1, len(text) // 4) if text else 0


def prompt_text(request: dict[str, Any]) -> str:
    return "\n".join(m["content"] for m in request["messages"] if isinstance(m.get("content"), str))


# -- the digest -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        WHOAMI,
        AFTER_CALL,
        {"model": "m", "messages": [{"role": "assistant", "tool_calls": []}, "not an object"]},
        {
            "model": "m",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hé"}], "x": 1}],
            "tool_choice": "auto",
            "tools": TOOLS,
            "temperature": 0.1,
        },
        {"model": "m"},
        {"messages": [{"content": "no role"}]},
    ],
)
def test_the_digest_is_the_stubs(payload: dict[str, Any]) -> None:
    assert hashkeyed.request_digest(payload) == stub_digest(payload)


def test_a_message_without_content_hashes_as_one_with_content_none() -> None:
    without = {"model": "m", "messages": [{"role": "assistant", "tool_calls": []}]}
    with_none = {
        "model": "m",
        "messages": [{"role": "assistant", "content": None, "tool_calls": []}],
    }
    assert hashkeyed.request_digest(without) == hashkeyed.request_digest(with_none)


def test_the_sdks_tool_call_turn_finds_its_fixture(sdk: openai.OpenAI) -> None:
    completion = sdk.chat.completions.create(**AFTER_CALL, tools=TOOLS)
    assert completion.choices[0].message.content == "The remote user is docsgpt."


# -- usage and model ------------------------------------------------------------------


def test_usage_defaults_are_the_stubs(sdk: openai.OpenAI) -> None:
    completion = sdk.chat.completions.create(**WHOAMI, tools=TOOLS)
    [call] = completion.choices[0].message.tool_calls or []
    assert call.id == "call_tester_whoami_1"
    assert completion.usage is not None
    prompt = estimate(prompt_text(WHOAMI))
    assert prompt > 0
    assert (
        completion.usage.prompt_tokens,
        completion.usage.completion_tokens,
        completion.usage.total_tokens,
    ) == (prompt, 0, prompt)
    text = sdk.chat.completions.create(**AFTER_CALL)
    assert text.usage is not None
    done = estimate("The remote user is docsgpt.")
    assert (text.usage.completion_tokens, text.usage.total_tokens) == (
        done,
        estimate(prompt_text(AFTER_CALL)) + done,
    )


def test_the_requests_model_is_echoed(sdk: openai.OpenAI) -> None:
    assert sdk.chat.completions.create(**AFTER_CALL).model == "docsgpt-local"
    with sdk.chat.completions.create(**AFTER_CALL, stream=True) as stream:
        chunks = list(stream)
    assert {c.model for c in chunks} == {"docsgpt-local"}
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == (
        "The remote user is docsgpt."
    )


# -- directives -----------------------------------------------------------------------


def ask(text: str, model: str = "docsgpt-local") -> dict[str, Any]:
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": "Today's date is 2026-12-01."},
            {"role": "user", "content": text},
        ],
    }


def test_emit_pins_the_reply_and_the_last_one_wins(sdk: openai.OpenAI) -> None:
    request = ask(f"[[MOCK_LLM_EMIT:{b64('first')}]] then [[MOCK_LLM_EMIT:{b64('sk-SECRET')}]]")
    completion = sdk.chat.completions.create(**request)
    assert completion.choices[0].message.content == "sk-SECRET"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == estimate("sk-SECRET")
    with sdk.chat.completions.create(**request, stream=True) as stream:
        text = "".join(c.choices[0].delta.content or "" for c in stream)
    assert text == "sk-SECRET"


def test_emit_wins_over_a_fixture_in_the_hash_keyed_mode(
    sdk: openai.OpenAI, server: ChaosServer
) -> None:
    request = json.loads(json.dumps(AFTER_CALL))
    request["messages"][0]["content"] += f" [[MOCK_LLM_EMIT:{b64('pinned')}]]"
    write(Path(server.config.recordings[0]), request, AFTER_CALL_FIXTURE)
    server.reload()
    completion = sdk.chat.completions.create(**request)
    assert completion.choices[0].message.content == "pinned"
    [entry] = server.requests()[-1:]
    assert entry["match"] == "directive"


def test_a_bad_payload_is_logged_not_fatal(
    fixtures: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pair = EnginePair.of(fixtures, on_miss=OnMiss.FALLBACK)
    with caplog.at_level(logging.WARNING, "chaosllm"):
        answer = pair.send(ask("[[MOCK_LLM_EMIT:@@@]] [[MOCK_LLM_EMIT:a]]"))
    assert answer.status == 200
    assert answer.json()["choices"][0]["message"]["content"] == mock_llm.FALLBACK_TEXT
    bad = [r.getMessage() for r in caplog.records if "bad MOCK_LLM_EMIT" in r.getMessage()]
    assert len(bad) == 1 and "payload 'a'" in bad[0]
    with caplog.at_level(logging.WARNING, "chaosllm"):
        call = pair.send({**ask("[[MOCK_LLM_TOOLCALL:note_view:once:a]]"), "tools": TOOLS})
    [tool] = call.json()["choices"][0]["message"]["tool_calls"]
    assert tool["function"] == {"name": "note_view", "arguments": "{}"}
    assert any("bad MOCK_LLM_TOOLCALL args 'a'" in r.getMessage() for r in caplog.records)


ARGS = '{"note_id":"n-42","with_history":true}'


def stream_calls(sdk: openai.OpenAI, request: dict[str, Any]) -> list[Any]:
    with sdk.chat.completions.create(**request, tools=TOOLS, stream=True) as stream:
        chunks = list(stream)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    return [call for c in chunks for call in c.choices[0].delta.tool_calls or []]


@pytest.mark.parametrize(
    ("mode", "pieces"),
    [
        ("once", [ARGS]),
        ("repeat", [ARGS, ARGS]),
        ("delta", [ARGS[: len(ARGS) // 2], ARGS[len(ARGS) // 2 :]]),
        ("truncated", [ARGS[:-1]]),
    ],
)
def test_toolcall_frames_the_arguments_as_the_mode_says(
    sdk: openai.OpenAI, mode: str, pieces: list[str]
) -> None:
    request = ask(f"open it [[MOCK_LLM_TOOLCALL:note_view:{mode}:{b64(ARGS)}]]")
    calls = stream_calls(sdk, request)
    assert [c.function.arguments for c in calls] == pieces
    assert {c.index for c in calls} == {0}
    assert calls[0].id and calls[0].function.name == "note_view"
    assert all(c.id is None and c.function.name is None for c in calls[1:])
    merged = "".join(c.function.arguments for c in calls)
    if mode in ("once", "delta"):
        assert json.loads(merged) == json.loads(ARGS)
    else:
        with pytest.raises(json.JSONDecodeError):
            json.loads(merged)
    completion = sdk.chat.completions.create(**request, tools=TOOLS)
    [call] = completion.choices[0].message.tool_calls or []
    assert call.function.arguments == ARGS
    assert completion.usage is not None and completion.usage.completion_tokens == 8


def test_toolcall_without_tools_gets_the_text_answer(sdk: openai.OpenAI) -> None:
    request = ask(f"[[MOCK_LLM_TOOLCALL:note_view:once]] [[MOCK_LLM_EMIT:{b64('done, no tool')}]]")
    completion = sdk.chat.completions.create(**request)
    assert completion.choices[0].message.content == "done, no tool"
    assert not completion.choices[0].message.tool_calls
    zero = stream_calls(sdk, ask("[[MOCK_LLM_TOOLCALL:note_view:once]]"))
    assert [c.function.arguments for c in zero] == ["{}"]


def test_directives_answer_a_miss_without_hash_keyed_fixtures(tmp_path: Path) -> None:
    pair = EnginePair.of(tmp_path)
    answer = pair.send(ask(f"[[MOCK_LLM_EMIT:{b64('from a directive')}]]"))
    assert answer.status == 200
    assert answer.json()["choices"][0]["message"]["content"] == "from a directive"
    assert answer.json()["model"] == "docsgpt-local"
    assert answer.record["match"] == "directive"
    assert pair.send(ask("no directive")).status == 404


# -- the stub's surface ---------------------------------------------------------------


def test_healthz_cors_and_preflight(fixtures: Path) -> None:
    """The stub answers CORS for every origin: chaosllm does when asked (``--cors '*'``),
    never on the control plane, and not at all by default."""
    asking = {"Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST"}
    with ChaosServer(fixtures, cors=["*"]) as server, httpx.Client(base_url=server.url) as http:
        health = http.get("/healthz")
        assert health.status_code == 200 and health.json() == {"ok": True}
        for path in ("/v1/chat/completions", "/v1/embeddings", "/v1/v1/embeddings"):
            preflight = http.options(path, headers=asking)
            assert preflight.status_code == 204, path
            assert preflight.headers["access-control-allow-origin"] == "*"
            assert "POST" in preflight.headers["access-control-allow-methods"]
        assert http.options("/__requests", headers=asking).status_code != 204
        answered = http.post("/v1/chat/completions", json=AFTER_CALL, headers=asking)
        assert answered.status_code == 200
        assert answered.headers["access-control-allow-origin"] == "*"
        assert "access-control-allow-origin" not in http.get("/__requests").headers
    with ChaosServer(fixtures) as server, httpx.Client(base_url=server.url) as http:
        assert http.options("/v1/chat/completions", headers=asking).status_code != 204
        answered = http.post("/v1/chat/completions", json=AFTER_CALL, headers=asking)
        assert "access-control-allow-origin" not in answered.headers


def test_embeddings_where_docsgpt_posts_them(server: ChaosServer) -> None:
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="k", max_retries=0) as client:
        first = client.embeddings.create(model="all-mpnet-base-v2", input=["a", ""])
        again = client.embeddings.create(model="all-mpnet-base-v2", input="a")
    vectors = [d.embedding for d in first.data]
    assert [len(v) for v in vectors] == [768, 768]
    assert all(any(x != 0 for x in v) for v in vectors)
    assert again.data[0].embedding == vectors[0] and vectors[0] != vectors[1]
    assert first.model == "all-mpnet-base-v2"


def test_a_fixture_saved_while_serving_is_used_without_a_reload(tmp_path: Path) -> None:
    directory = tmp_path / "empty"
    directory.mkdir()
    request = ask("a question asked before its fixture existed")
    with ChaosServer(directory) as server, openai_client(server) as sdk:
        with pytest.raises(openai.NotFoundError):
            sdk.chat.completions.create(**request)
        write(directory, request, {"response": {"content": "saved since"}})
        first = sdk.chat.completions.create(**request)
        second = sdk.chat.completions.create(**request)
    assert first.choices[0].message.content == "saved since"
    assert second.choices[0].message.content == "saved since"


def test_the_delay_headers_map_onto_the_plans_latency(fixtures: Path) -> None:
    pair = EnginePair.of(fixtures)
    provider = PROVIDERS["openai.chat"]
    body = json.dumps({**AFTER_CALL, "stream": True}).encode()
    decision = pair.engine.handle(
        ProviderCall(
            provider=provider,
            path=CHAT,
            body=body,
            headers=(
                (mock_llm.TOTAL_DELAY_HEADER, "250"),
                (mock_llm.CHUNK_DELAY_HEADER, "40"),
            ),
        )
    )
    assert isinstance(decision, Reply)
    plan = decision.plan
    assert plan.head_delay_ms == 250
    frames = [p for p in plan.pieces if p.frame]
    assert [p.delay_ms for p in frames[:-1]] == [40] * (len(frames) - 1)
    assert frames[-1].data == b"data: [DONE]\n\n" and frames[-1].delay_ms == 0
    capped = mock_llm.delays([(mock_llm.TOTAL_DELAY_HEADER, "99999999")])
    assert capped == (mock_llm.MAX_DELAY_MS, 0)
    assert mock_llm.delays([(mock_llm.TOTAL_DELAY_HEADER, "-5"), ("x", "1")]) == (0, 0)


def test_the_delay_headers_on_a_real_socket(sdk: openai.OpenAI) -> None:
    started = time.monotonic()
    sdk.chat.completions.create(**AFTER_CALL, extra_headers={"X-Mock-LLM-Total-Delay-Ms": "300"})
    assert time.monotonic() - started >= 0.3
    started = time.monotonic()
    with sdk.chat.completions.create(
        **AFTER_CALL, stream=True, extra_headers={"X-Mock-LLM-Stream-Chunk-Delay-Ms": "60"}
    ) as stream:
        chunks = list(stream)
    assert time.monotonic() - started >= 0.06 * len(chunks)


# -- misses ---------------------------------------------------------------------------


def test_the_miss_fallback_and_the_stubs_two_log_lines(
    fixtures: Path, caplog: pytest.LogCaptureFixture
) -> None:
    unknown = ask("unheard of")
    with (
        ChaosServer(fixtures, on_miss="fallback") as server,
        openai_client(server) as sdk,
        caplog.at_level(logging.WARNING, "chaosllm"),
    ):
        completion = sdk.chat.completions.create(**unknown)
    assert completion.choices[0].message.content == mock_llm.FALLBACK_TEXT
    assert completion.model == "docsgpt-local"
    assert completion.usage is not None
    prompt, done = estimate(prompt_text(unknown)), estimate(mock_llm.FALLBACK_TEXT)
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (prompt, done)
    messages = [r.getMessage() for r in caplog.records]
    first = messages.index(f"[mock-llm] unknown fixture hash {stub_digest(unknown)}")
    second = messages[first + 1]
    assert second.startswith("[mock-llm] request: ")
    dumped = second.removeprefix("[mock-llm] request: ")
    assert json.loads(dumped)["messages"] == unknown["messages"]
    assert dumped == json.dumps(json.loads(dumped), sort_keys=True, ensure_ascii=False)
