"""Legal-but-nasty wire quirks (issue #16), on real sockets: each leaves a stream the
official SDKs read as the same answer, and each breaks a naive line parser (written here:
split on blank lines, ``event[6:]`` for the data, ``chunk["choices"][0]``, each read
decoded on its own as UTF-8). Which requests each fires on is checked in memory."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from chaosllm import ChaosServer
from chaosllm.faults import CATALOGUE, FAULT_TYPES
from chaosllm.paths import shipped_dir
from chaosllm.providers import PROVIDERS
from tests.helpers import openai_client, request_body
from tests.memory import MESSAGES, RESPONSES, EnginePair

RECORDINGS = shipped_dir("recordings")
TEXT = "Grüße aus Köln — 東京の天気は晴れ 🌤️, très bien."
"""An answer with two-, three- and four-byte UTF-8 characters."""

SSE_QUIRKS = ("keepalive_comments", "crlf_frames", "data_no_space", "split_utf8")
CHAT_QUIRKS = ("restated_tool_args", "filter_frames", "usage_only_frame")
QUIRKS = (*SSE_QUIRKS, *CHAT_QUIRKS)


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped chat tool call and Anthropic text answer, and a chat answer and an
    Anthropic answer whose text is `TEXT` (beyond ASCII)."""
    root = tmp_path_factory.mktemp("quirks")
    for name in ("tool-call", "anthropic-text"):
        shutil.copytree(RECORDINGS / name, root / name)
    chat = json.loads((RECORDINGS / "simple-chat/0001.json").read_text("utf-8"))
    chat["response"]["body"]["choices"][0]["message"]["content"] = TEXT
    (root / "utf8-chat").mkdir()
    (root / "utf8-chat/0001.json").write_text(json.dumps(chat), "utf-8")
    claude = json.loads((RECORDINGS / "anthropic-text/0001.json").read_text("utf-8"))
    claude["request"]["body"]["messages"][0]["content"] = "Say hello in German."
    claude["response"]["body"]["content"][0]["text"] = TEXT
    (root / "utf8-claude").mkdir()
    (root / "utf8-claude/0001.json").write_text(json.dumps(claude), "utf-8")
    return root


@pytest.fixture(scope="module")
def server(recordings: Path) -> Iterator[ChaosServer]:
    with ChaosServer(recordings) as running:
        yield running


@pytest.fixture(autouse=True)
def _clean(server: ChaosServer) -> None:
    server.reset()


def fired(server: ChaosServer) -> str | None:
    """The type of the last fault that fired (from the journal: it names each request's)."""
    entries = [e for e in server.requests() if e.get("fault")]
    return entries[-1]["fault"]["type"] if entries else None


def chat_body(name: str, *, usage: bool = False) -> dict[str, Any]:
    path = RECORDINGS / f"{name}.json" if name != "utf8-chat" else None
    source = "simple-chat/0001" if path is None else name
    body = request_body(source, stream=True)
    if not usage:
        body.pop("stream_options")
    return body


def claude_body(*, utf8: bool) -> dict[str, Any]:
    body = request_body("anthropic-text/0001", stream=False)
    if utf8:
        body["messages"] = [{"role": "user", "content": "Say hello in German."}]
    return body


def quirk_body(quirk: str) -> dict[str, Any]:
    """The chat request each quirk is shown on: a tool call for the restated arguments,
    the non-ASCII answer otherwise."""
    return chat_body("tool-call/0001" if quirk == "restated_tool_args" else "utf8-chat")


# -- what the official SDKs read --------------------------------------------------------------


def sdk_chat(server: ChaosServer, body: dict[str, Any]) -> tuple[str, dict[int, str], int]:
    """The text, the tool calls' arguments (joined as the deltas come) and the number of
    chunks the openai SDK yields for a streamed chat request."""
    text, count = "", 0
    arguments: dict[int, str] = {}
    kwargs = {k: v for k, v in body.items() if k != "stream"}
    with openai_client(server) as client:
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            count += 1
            for choice in chunk.choices:
                text += choice.delta.content or ""
                for call in choice.delta.tool_calls or []:
                    fragment = call.function.arguments if call.function else None
                    arguments[call.index] = arguments.get(call.index, "") + (fragment or "")
    return text, arguments, count


def sdk_claude(server: ChaosServer, body: dict[str, Any]) -> tuple[str, str | None]:
    """The final message's text and stop reason, through the anthropic SDK's stream."""
    client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=10)
    with client, client.messages.stream(**body) as stream:
        message = stream.get_final_message()
    text = "".join(block.text for block in message.content if block.type == "text")
    return text, message.stop_reason


@pytest.mark.parametrize("quirk", QUIRKS)
def test_the_openai_sdk_reads_the_same_answer(server: ChaosServer, quirk: str) -> None:
    body = quirk_body(quirk)
    clean_text, clean_arguments, clean_count = sdk_chat(server, body)
    server.arm({"type": quirk})
    text, arguments, count = sdk_chat(server, body)
    assert fired(server) == quirk  # it fired
    assert text == clean_text
    if quirk == "restated_tool_args":
        # every chunk parses; joined as they come, the arguments are there twice: the
        # finish chunk carries them whole again (a client must take them, not add them)
        (whole,) = clean_arguments.values()
        assert json.loads(whole) and arguments == {0: whole + whole}
    else:
        assert arguments == clean_arguments
        assert clean_text == TEXT
    # the filter frames and the usage frame are chunks too (with no choices)
    extra = {"filter_frames": 2, "usage_only_frame": 1}.get(quirk, 0)
    assert count == clean_count + extra


def test_the_openai_sdk_stream_helper_keeps_the_arguments_once_parsed(
    server: ChaosServer,
) -> None:
    """``chat.completions.stream()`` accumulates the deltas: with the arguments restated it
    joins them twice (what a gateway's restatement does to a client that adds deltas)."""
    body = quirk_body("restated_tool_args")
    body.pop("stream")
    server.arm({"type": "restated_tool_args"})
    with openai_client(server) as client, client.chat.completions.stream(**body) as stream:
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls or []
    (clean,) = [
        c["function"]["arguments"]
        for c in json.loads((RECORDINGS / "tool-call/0001.json").read_text("utf-8"))["response"][
            "body"
        ]["choices"][0]["message"]["tool_calls"]
    ]
    assert call.function.arguments == clean + clean
    with pytest.raises(json.JSONDecodeError):
        json.loads(call.function.arguments)


@pytest.mark.parametrize("quirk", SSE_QUIRKS)
def test_the_anthropic_sdk_reads_the_same_answer(server: ChaosServer, quirk: str) -> None:
    body = claude_body(utf8=True)
    clean = sdk_claude(server, body)
    assert clean == (TEXT, "end_turn")
    server.arm({"type": quirk})
    assert sdk_claude(server, body) == clean
    assert fired(server) == quirk


# -- what a naive parser makes of it ----------------------------------------------------------


class NaiveError(Exception):
    """The naive parser's own complaint: the stream ended without ``[DONE]``."""


def naive_chat(server: ChaosServer, body: dict[str, Any]) -> tuple[str, dict[int, Any]]:
    """A hand-written client as many are: each read decoded as UTF-8 on its own, events
    split on ``\\n\\n``, the data after ``data: `` (``event[6:]``), ``choices[0]``, the
    arguments joined and parsed at the end."""
    text, buffer = "", ""
    arguments: dict[int, str] = {}
    with httpx.stream("POST", f"{server.base_url}/chat/completions", json=body, timeout=10) as r:
        for read in r.iter_raw():
            buffer += read.decode("utf-8")
            *events, buffer = buffer.split("\n\n")
            for event in events:
                data = event[6:]
                if data == "[DONE]":
                    return text, {i: json.loads(a) for i, a in arguments.items()}
                delta = json.loads(data)["choices"][0]["delta"]
                text += delta.get("content") or ""
                for call in delta.get("tool_calls") or []:
                    fragment = call["function"].get("arguments") or ""
                    arguments[call["index"]] = arguments.get(call["index"], "") + fragment
    raise NaiveError("the stream ended without [DONE]")


NAIVE_FAILURES: dict[str, type[Exception]] = {
    "keepalive_comments": json.JSONDecodeError,  # ": PROCESSING"[6:] is no JSON
    "crlf_frames": NaiveError,  # no "\n\n" in "\r\n\r\n": not one event
    "data_no_space": json.JSONDecodeError,  # 'data:{"id"...'[6:] lost its "{"
    "split_utf8": UnicodeDecodeError,  # half a character in one read
    "restated_tool_args": json.JSONDecodeError,  # the arguments twice: '{...}{...}'
    "filter_frames": IndexError,  # the prompt's filter frame has choices: []
    "usage_only_frame": IndexError,  # the usage frame has choices: []
}


def test_the_naive_parser_reads_the_clean_streams(server: ChaosServer) -> None:
    """Without a quirk it works: what fails below fails because of the quirk alone."""
    assert naive_chat(server, quirk_body("split_utf8")) == (TEXT, {})
    text, arguments = naive_chat(server, quirk_body("restated_tool_args"))
    assert text == "" and arguments == {0: {"location": "Paris, France"}}


@pytest.mark.parametrize("quirk", QUIRKS)
def test_each_quirk_breaks_the_naive_parser(server: ChaosServer, quirk: str) -> None:
    server.arm({"type": quirk, "gap_ms": 200} if quirk == "split_utf8" else {"type": quirk})
    with pytest.raises(NAIVE_FAILURES[quirk]):
        naive_chat(server, quirk_body(quirk))
    assert fired(server) == quirk


# -- the bytes on the wire ---------------------------------------------------------------------


def raw_stream(server: ChaosServer, body: dict[str, Any]) -> list[bytes]:
    """The body's reads, as they came."""
    with httpx.stream("POST", f"{server.base_url}/chat/completions", json=body, timeout=10) as r:
        return list(r.iter_raw())


def test_the_bytes_each_quirk_puts_on_the_wire(server: ChaosServer) -> None:
    body = quirk_body("keepalive_comments")
    server.arm({"type": "keepalive_comments", "every_frames": 2, "comment": "OPENROUTER"})
    wire = b"".join(raw_stream(server, body))
    events = wire.split(b"\n\n")
    assert events[2] == b": OPENROUTER" and events[5] == b": OPENROUTER"
    assert b": OPENROUTER\n\ndata: [DONE]" in wire or wire.endswith(b"data: [DONE]\n\n")
    server.arm({"type": "crlf_frames"})
    wire = b"".join(raw_stream(server, body))
    assert wire.count(b"\r\n\r\n") == wire.count(b"data: ") and b"\n\n" not in wire
    server.arm({"type": "data_no_space"})
    wire = b"".join(raw_stream(server, body))
    assert b"data: " not in wire and wire.endswith(b"data:[DONE]\n\n")


def test_split_utf8_writes_the_halves_apart(server: ChaosServer) -> None:
    server.arm({"type": "split_utf8", "gap_ms": 200})
    reads = raw_stream(server, quirk_body("split_utf8"))
    broken = [i for i, read in enumerate(reads) if not _decodes(read)]
    assert broken == [broken[0], broken[0] + 1]  # the character's two halves, one read each
    assert b"".join(reads[broken[0] : broken[0] + 2]).decode("utf-8")
    assert "ü".encode() in reads[broken[0]][-1:] + reads[broken[0] + 1][:1]


def _decodes(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# -- where each one fires ---------------------------------------------------------------------


@pytest.mark.parametrize("quirk", QUIRKS)
def test_a_quirk_is_not_consumed_by_a_json_request(quirk: str) -> None:
    pair = EnginePair.of()
    pair.arm({"type": quirk})
    body = request_body("tool-call/0001", stream=False)
    answer = pair.send(body)
    assert answer.status == 200 and answer.record["fault"] is None
    assert len(pair.engine.board) == 1


@pytest.mark.parametrize("quirk", CHAT_QUIRKS)
def test_chat_quirks_do_not_fire_on_other_protocols(quirk: str) -> None:
    pair = EnginePair.of()
    pair.arm({"type": quirk})
    claude = {**request_body("anthropic-tools/0001", stream=False), "stream": True}
    assert pair.send(claude, path=MESSAGES).record["fault"] is None
    responses = request_body("responses-tools/0001", stream=False)
    assert pair.send({**responses, "stream": True}, path=RESPONSES).record["fault"] is None
    assert len(pair.engine.board) == 1


@pytest.mark.parametrize("quirk", [q for q in SSE_QUIRKS if q != "split_utf8"])
def test_sse_quirks_fire_on_anthropic_responses_and_azure_streams(quirk: str) -> None:
    pair = EnginePair.of()
    for name, path in (
        ("anthropic-text/0001", MESSAGES),
        ("responses-simple/0001", RESPONSES),
        ("azure-stream/0001", "/openai/v1/chat/completions"),
    ):
        pair.arm({"type": quirk})
        body = {**request_body(name, stream=False), "stream": True}
        answer = pair.send(body, path=path)
        assert answer.record["fault"]["type"] == quirk, name
        assert answer.frames()  # still a stream


def test_sse_quirks_apply_to_sse_streams_only() -> None:
    """Gemini's stream is SSE with ``alt=sse`` only (else a JSON array); Ollama streams
    NDJSON and Bedrock AWS's event stream: no SSE quirk fires on them."""
    gemini, ollama, bedrock = (
        PROVIDERS[n] for n in ("gemini.generate_content", "ollama.chat", "bedrock.converse")
    )
    for quirk in SSE_QUIRKS:
        on_request = FAULT_TYPES[quirk].on_request
        assert on_request(gemini, {"model": "m", "stream": True, "alt": "sse"}, True)
        assert not on_request(gemini, {"model": "m", "stream": True}, True)
        assert not on_request(ollama, {"model": "m", "stream": True}, True)
        assert not on_request(bedrock, {"modelId": "m", "stream": True}, True)
        assert not on_request(PROVIDERS["openai.chat"], {"model": "m"}, False)


def test_quirks_are_catalogue_entries_that_deliver_the_answer() -> None:
    for quirk in QUIRKS:
        entry = FAULT_TYPES[quirk]
        assert entry in CATALOGUE and entry.delivers_answer and entry.retryable is None


def test_the_nasty_sse_profile_fires_each_quirk_once(server: ChaosServer) -> None:
    """Shipped ``faults/nasty-sse``: one quirk per chat stream, in order; the SDK reads
    every one of them."""
    server.arm_profile("nasty-sse")
    for quirk in QUIRKS:
        body = quirk_body(quirk)
        clean = TEXT if quirk != "restated_tool_args" else ""
        text, _, _ = sdk_chat(server, body)
        assert fired(server) == quirk and text == clean
    assert server.faults()["armed"] == []
