"""Requests the providers document as the same reach the same recording exactly, in
memory: each rule of ``docs/background/matching.md`` tried pairwise (the recorded form
and the other one), forms that are not the same still apart, the folding idempotent on
every shipped request, and recordings written before the folding (their stored digest
the digest of their request as written, or as earlier rules folded it) loaded, keyed by
the folded digest, matched exactly and passed by ``chaosllm doctor``, with no file
rewritten."""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from chaosllm.config import ServerConfig
from chaosllm.core.clock import ManualClock
from chaosllm.core.engine import Engine, ProviderCall, Reply
from chaosllm.doctor import diagnose
from chaosllm.paths import shipped_dir
from chaosllm.providers import PROVIDERS
from chaosllm.store.recordings import RecordingStore
from tests.helpers import CLIENT_RECORDINGS, RECORDINGS, any_recording

ROOTS = (RECORDINGS, CLIENT_RECORDINGS)
"""The shipped recordings, and the clients' own (google-genai's automatic function
calling, whose request no other SDK sends)."""
STORE = RecordingStore.load(list(ROOTS))


pytestmark = pytest.mark.timeout(60)

PATHS = {
    "openai.chat": "/v1/chat/completions",
    "openai.responses": "/v1/responses",
    "anthropic.messages": "/v1/messages",
    "gemini.generate_content": "/v1beta/models/gemini-2.5-flash:generateContent",
}


def ask(body: Any, provider: str, store: RecordingStore = STORE) -> Reply:
    engine = Engine(
        ServerConfig(recordings=[shipped_dir("recordings")]), store, clock=ManualClock()
    )
    path = PATHS[provider]
    if provider == "gemini.generate_content":  # the model is named by the path
        path = path.replace("gemini-2.5-flash", body.get("model", "gemini-2.5-flash"))
    reply = engine.handle(
        ProviderCall(provider=PROVIDERS[provider], path=path, body=json.dumps(body).encode())
    )
    assert isinstance(reply, Reply)
    return reply


def matched(reply: Reply) -> tuple[str, str] | None:
    headers = dict(reply.plan.headers)
    if headers.get("x-chaosllm-match") != "exact":
        return None
    return headers["x-chaosllm-match"], headers["x-chaosllm-recording"]


Edit = Callable[[dict[str, Any]], None]


def _chat_user_part(b: dict[str, Any]) -> None:
    for m in b["messages"]:
        if isinstance(m.get("content"), str):
            m["content"] = [{"type": "text", "text": m["content"]}]


def _chat_no_tool_choice(b: dict[str, Any]) -> None:
    del b["tool_choice"]


def _responses_message(b: dict[str, Any]) -> None:
    b["input"] = [{"role": "user", "content": b["input"]}]


def _responses_input_text(b: dict[str, Any]) -> None:
    text = b["input"]
    b["input"] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    ]


def _responses_items_input_text(b: dict[str, Any]) -> None:
    for item in b["input"]:
        item["type"] = "message"
        item["content"] = [{"type": "input_text", "text": item["content"]}]


def _responses_string(b: dict[str, Any]) -> None:
    [item] = b["input"]
    b["input"] = item["content"]


def _responses_no_tool_choice(b: dict[str, Any]) -> None:
    del b["tool_choice"]


def _anthropic_system_block(b: dict[str, Any]) -> None:
    b["system"] = [{"type": "text", "text": b["system"]}]


def _anthropic_content_block(b: dict[str, Any]) -> None:
    for m in b["messages"]:
        if isinstance(m["content"], str):
            m["content"] = [{"type": "text", "text": m["content"]}]


def _anthropic_auto(b: dict[str, Any]) -> None:
    b["tool_choice"] = {"type": "auto"}


def _anthropic_auto_parallel(b: dict[str, Any]) -> None:
    b["tool_choice"] = {"type": "auto", "disable_parallel_tool_use": False}


def _anthropic_eager(b: dict[str, Any]) -> None:
    for tool in b["tools"]:
        tool["eager_input_streaming"] = True


def _gemini_camel(b: dict[str, Any]) -> None:
    for tool in b["tools"]:
        for f in tool["functionDeclarations"]:
            f["parametersJsonSchema"] = f.pop("parameters_json_schema")
            f["responseJsonSchema"] = f.pop("response_json_schema")


def _lower_types(schema: dict[str, Any]) -> None:
    schema["type"] = schema["type"].lower()
    for child in schema.get("properties", {}).values():
        _lower_types(child)


def _gemini_lower_types(b: dict[str, Any]) -> None:
    for tool in b["tools"]:
        for f in tool["functionDeclarations"]:
            _lower_types(f["parameters"])


def _gemini_snake(b: dict[str, Any]) -> None:
    b["tools"] = [{"function_declarations": t["functionDeclarations"]} for t in b["tools"]]
    b["generation_config"] = b.pop("generationConfig")


def _chat_strict_false(b: dict[str, Any]) -> None:
    for tool in b["tools"]:
        tool["function"]["strict"] = False


def _chat_calls_empty_text(b: dict[str, Any]) -> None:
    for m in b["messages"]:
        if m.get("tool_calls"):
            m["content"] = ""


def _chat_calls_no_content(b: dict[str, Any]) -> None:
    for m in b["messages"]:
        if m.get("tool_calls"):
            del m["content"]


def _responses_reference(b: dict[str, Any]) -> None:
    b["input"] = [
        {"type": "item_reference", "id": i["id"]} if i.get("type") == "function_call" else i
        for i in b["input"]
    ]


def _gemini_snake_top(b: dict[str, Any]) -> None:
    b["system_instruction"] = b.pop("systemInstruction")
    b["generation_config"] = b.pop("generationConfig")


def _gemini_system_no_role(b: dict[str, Any]) -> None:
    del b["systemInstruction"]["role"]


def _gemini_calling_auto(b: dict[str, Any]) -> None:
    b["toolConfig"] = {"functionCallingConfig": {"mode": "AUTO"}}


# (recording, provider, edit, the rule's name in docs/background/matching.md)
EQUIVALENT: list[tuple[str, str, Edit, str]] = [
    ("simple-chat/0001", "openai.chat", _chat_user_part, "chat content as one text part"),
    ("tool-call/0001", "openai.chat", _chat_no_tool_choice, "chat tool_choice auto"),
    ("tool-call/0001", "openai.chat", _chat_strict_false, "chat function strict false"),
    ("parallel-tools/0002", "openai.chat", _chat_strict_false, "chat function strict false"),
    ("tool-call/0002", "openai.chat", _chat_calls_empty_text, "chat calls with content ''"),
    ("parallel-tools/0002", "openai.chat", _chat_calls_empty_text, "chat calls with content ''"),
    ("tool-call/0002", "openai.chat", _chat_calls_no_content, "chat calls without content"),
    ("responses-simple/0001", "openai.responses", _responses_message, "input one user message"),
    ("responses-simple/0001", "openai.responses", _responses_input_text, "input_text part"),
    ("responses-tools/0001", "openai.responses", _responses_items_input_text, "input_text"),
    ("responses-tools/0001", "openai.responses", _responses_string, "input as a string"),
    ("responses-tools/0001", "openai.responses", _responses_no_tool_choice, "tool_choice auto"),
    ("responses-tools/0002", "openai.responses", _responses_reference, "item_reference"),
    ("anthropic-text/0001", "anthropic.messages", _anthropic_system_block, "system block"),
    ("anthropic-text/0001", "anthropic.messages", _anthropic_content_block, "content block"),
    ("anthropic-tools/0001", "anthropic.messages", _anthropic_content_block, "content block"),
    ("anthropic-tools/0001", "anthropic.messages", _anthropic_auto, "tool_choice auto"),
    ("anthropic-tools/0001", "anthropic.messages", _anthropic_auto_parallel, "auto, parallel"),
    ("anthropic-tools/0001", "anthropic.messages", _anthropic_eager, "eager_input_streaming"),
    ("gemini-afc/0001", "gemini.generate_content", _gemini_camel, "camelCase names"),
    ("gemini-afc/0001", "gemini.generate_content", _gemini_snake, "snake_case names"),
    ("gemini-tools/0001", "gemini.generate_content", _gemini_snake, "snake_case names"),
    ("gemini-tools/0001", "gemini.generate_content", _gemini_lower_types, "type in any case"),
    ("gemini-tools/0002", "gemini.generate_content", _gemini_lower_types, "type in any case"),
    ("gemini-stream/0001", "gemini.generate_content", _gemini_system_no_role, "system role"),
    ("gemini-stream/0001", "gemini.generate_content", _gemini_snake_top, "snake_case fields"),
    ("gemini-tools/0001", "gemini.generate_content", _gemini_calling_auto, "calling mode AUTO"),
    ("gemini-text/0001", "gemini.generate_content", _gemini_calling_auto, "calling mode AUTO"),
]


@pytest.mark.parametrize(
    ("name", "provider", "edit", "rule"), EQUIVALENT, ids=[f"{e[0]}:{e[3]}" for e in EQUIVALENT]
)
def test_both_forms_reach_the_same_recording_exactly(
    name: str, provider: str, edit: Edit, rule: str
) -> None:
    body = any_recording(name)["request"]["body"]
    other = copy.deepcopy(body)
    edit(other)
    assert other != body
    codec = PROVIDERS[provider].codec
    assert codec.digest(other) == codec.digest(body)
    assert matched(ask(body, provider)) == matched(ask(other, provider)) == ("exact", name)


def _two_blocks(b: dict[str, Any]) -> None:
    b["system"] = [{"type": "text", "text": b["system"]}, {"type": "text", "text": "Be brief."}]


def _required(b: dict[str, Any]) -> None:
    b["tool_choice"] = "required"


def _no_parallel(b: dict[str, Any]) -> None:
    b["tool_choice"] = {"type": "auto", "disable_parallel_tool_use": True}


def _property_renamed(b: dict[str, Any]) -> None:
    for tool in b["tools"]:
        for f in tool["functionDeclarations"]:
            schema = (f.get("parameters") or f["parameters_json_schema"])["properties"]
            schema["the_city"] = schema.pop("city")


def _property_retyped(b: dict[str, Any]) -> None:
    for tool in b["tools"]:
        for f in tool["functionDeclarations"]:
            f["parameters"]["properties"]["unit"]["type"] = "number"


def _strict_true(b: dict[str, Any]) -> None:
    for tool in b["tools"]:
        tool["function"]["strict"] = True


def _calling_any(b: dict[str, Any]) -> None:
    b["toolConfig"] = {"functionCallingConfig": {"mode": "ANY"}}


def _calling_auto_named(b: dict[str, Any]) -> None:
    b["toolConfig"] = {
        "functionCallingConfig": {"mode": "AUTO", "allowedFunctionNames": ["get_weather"]}
    }


def _no_system(b: dict[str, Any]) -> None:
    del b["systemInstruction"]


def _system_role_model(b: dict[str, Any]) -> None:
    b["systemInstruction"]["role"] = "model"


def _text_beside_calls(b: dict[str, Any]) -> None:
    for m in b["messages"]:
        if m.get("tool_calls"):
            m["content"] = "Let me check."


def _empty_text_alone(b: dict[str, Any]) -> None:
    b["messages"][1]["content"] = ""


def _other_reference(b: dict[str, Any]) -> None:
    for item in b["input"]:
        if item.get("type") == "function_call":
            item["id"] = "fc_0000000000000000000000000000000000000000"


def _assistant_input_text(b: dict[str, Any]) -> None:
    b["input"] = [{"role": "assistant", "content": b["input"]}]


DIFFERENT: list[tuple[str, str, Edit]] = [
    ("anthropic-text/0001", "anthropic.messages", _two_blocks),
    ("tool-call/0001", "openai.chat", _required),
    ("anthropic-tools/0001", "anthropic.messages", _no_parallel),
    ("gemini-tools/0001", "gemini.generate_content", _property_renamed),
    ("gemini-afc/0001", "gemini.generate_content", _property_renamed),
    ("gemini-tools/0001", "gemini.generate_content", _property_retyped),
    ("responses-simple/0001", "openai.responses", _assistant_input_text),
    ("tool-call/0001", "openai.chat", _strict_true),
    ("responses-tools/0002", "openai.responses", _other_reference),
    ("tool-call/0002", "openai.chat", _text_beside_calls),
    ("simple-chat/0001", "openai.chat", _empty_text_alone),
    ("gemini-tools/0001", "gemini.generate_content", _calling_any),
    ("gemini-tools/0001", "gemini.generate_content", _calling_auto_named),
    ("gemini-stream/0001", "gemini.generate_content", _system_role_model),
    ("gemini-stream/0001", "gemini.generate_content", _no_system),
]


@pytest.mark.parametrize(
    ("name", "provider", "edit"), DIFFERENT, ids=[e[2].__name__ for e in DIFFERENT]
)
def test_forms_that_are_not_the_same_stay_apart(name: str, provider: str, edit: Edit) -> None:
    """Two text blocks are not a string, ``required`` is not the default, a property's
    name is the caller's data (never camelCased), an assistant turn is not user input,
    ``strict: true`` is not the default, nor ``ANY`` or a list of allowed functions, and
    a system instruction in the model's role is not the default one."""
    body = any_recording(name)["request"]["body"]
    other = copy.deepcopy(body)
    edit(other)
    codec = PROVIDERS[provider].codec
    assert codec.digest(other) != codec.digest(body)


def test_folding_is_idempotent_on_every_shipped_request() -> None:
    for exchange in (e for group in STORE.by_digest.values() for e in group):
        codec = PROVIDERS[exchange.provider].codec
        once = codec.canonical(exchange.request.body)
        assert codec.equivalent(once) == once, exchange.name


def test_every_shipped_recording_is_keyed_by_its_folded_digest() -> None:
    """The loader digests each request (folded): the stored digest plays no part."""
    for exchange in (e for group in STORE.by_digest.values() for e in group):
        codec = PROVIDERS[exchange.provider].codec
        assert exchange.digest == codec.digest(exchange.request.body), exchange.name
        assert exchange.stored_digest == exchange.digest, exchange.name


# The digests these shipped files stored before their protocol folded a form (git: the
# files as of 030d57d, before the first folding; gemini-stream's before its system
# instruction's role was folded, responses-tools/0002's before an item passed back with
# its id was folded into a reference): a file written then.
WRITTEN_BEFORE = {
    "responses-tools/0002": "fd6194eaa1d4bb6cd1a43f0f40754d7c64b3387f340922c02d4affb4fe5ab1ab",
    "gemini-stream/0001": "07fc2299e110cd64dc080b5f5cff4011999be10746938505994e6dbb32245164",
    "gemini-afc/0001": "137ad432b3c4ba0e863e815c834f261246ade6225a6b394072653e4310de5e21",
    "parallel-tools/0001": "c9e4eb488e6cc4143ebffe959bf124ca68813e21fda4bb482fb2fae2cb82271a",
    "responses-streaming/0001": "2a1e40dfc42cf199669c0e213fcbf884baab5f2299412a283bffab78037e0e9c",
    "responses-tools/0001": "cbff71e18f18e5659c8ef25822f56c026865a2340229044059cd1ea081b94dcb",
    "tool-call/0002": "b9a3f6353f18346465757fbaa8bb05621b7ed9acfd33fc8a3a28e0c50df3c56c",
}


def test_a_recording_written_before_the_folding_needs_no_rewrite(tmp_path: Path) -> None:
    for name, old in WRITTEN_BEFORE.items():
        data = any_recording(name)
        data["digest"] = old
        target = tmp_path / f"{name}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(data, indent=2, sort_keys=True), "utf-8")
        codec = PROVIDERS[data["provider"]].codec
        assert old in codec.earlier_digests(data["request"]["body"])  # what it stored
    before = {p: p.read_bytes() for p in tmp_path.rglob("*.json")}
    store = RecordingStore.load([tmp_path])
    report = diagnose([tmp_path])
    assert not [p for p in report.problems if p.check == "stale_digest"], report.render()
    for name in WRITTEN_BEFORE:
        data = any_recording(name)
        if data["provider"] not in PATHS:
            continue
        body = data["request"]["body"]
        assert matched(ask(body, data["provider"], store)) == ("exact", name)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*.json")} == before


LOWER_TYPES_BEFORE = "dfce4a493788d1ede9b3d63d7e51685c33b553a7c86a2bfb7e1222d0a53960a5"
"""gemini-tools/0001 with its schema's types in lower case (as the Vercel AI SDK sends
them), digested before a schema's type was read in either case (computed at 11ee9c1)."""


def test_a_gemini_recording_written_before_types_were_folded_needs_no_rewrite(
    tmp_path: Path,
) -> None:
    data = any_recording("gemini-tools/0001")
    _gemini_lower_types(data["request"]["body"])
    data["digest"] = LOWER_TYPES_BEFORE
    target = tmp_path / "gemini-tools" / "0001.json"
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps(data, indent=2, sort_keys=True), "utf-8")
    codec = PROVIDERS["gemini.generate_content"].codec
    assert LOWER_TYPES_BEFORE in codec.earlier_digests(data["request"]["body"])
    assert codec.digest(data["request"]["body"]) != LOWER_TYPES_BEFORE
    report = diagnose([tmp_path])
    assert not [p for p in report.problems if p.check == "stale_digest"], report.render()
    store = RecordingStore.load([tmp_path])
    upper = any_recording("gemini-tools/0001")["request"]["body"]  # google-genai's spelling
    assert matched(ask(upper, "gemini.generate_content", store)) == ("exact", "gemini-tools/0001")


def test_a_recording_whose_request_was_edited_is_still_stale(tmp_path: Path) -> None:
    shutil.copytree(RECORDINGS / "tool-call", tmp_path / "tool-call")
    path = tmp_path / "tool-call" / "0001.json"
    data = json.loads(path.read_text("utf-8"))
    data["request"]["body"]["messages"][-1]["content"] += " Now."
    path.write_text(json.dumps(data), "utf-8")
    assert any(p.check == "stale_digest" for p in diagnose([tmp_path]).problems)
