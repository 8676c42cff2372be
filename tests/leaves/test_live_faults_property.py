"""A live fault's state machine gives what its whole-plan transform gives, on any frames.

For each fault type with a streaming counterpart (`FaultType.live`), hypothesis draws a
stream (answer frames, finishing frames anywhere, [DONE]) and the fault's parameters;
feeding the frames to the machine one at a time (`run_live`) must give the pieces, the
ending and the stall of `apply_fault` on the plan of the same frames. For
``malformed_tool_args`` the assembled answers agree except in the arguments' text, which
is invalid JSON in both: Chat Completions by hand-made frames, and Anthropic, the
Responses API and Bedrock (argument deltas; restatements and stop reasons included) on
the frames each renders of a drawn answer; Gemini (SSE and JSON array) and Ollama, whose
calls come whole, give the buffered answer exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaosllm.faults import FAULT_TYPES, FaultContext, apply_fault, parse_fault_spec
from chaosllm.faults.live import Claimed, LiveContext, run_live
from chaosllm.model import Ending, Framing, Piece, ResponsePlan
from chaosllm.providers.anthropic_messages import AnthropicMessages
from chaosllm.providers.base import Provider
from chaosllm.providers.bedrock import BedrockConverse
from chaosllm.providers.gemini import Gemini, GeminiCodec
from chaosllm.providers.ollama import OllamaChat
from chaosllm.providers.openai_chat import OpenAIChat
from chaosllm.providers.openai_responses import OpenAIResponses

P = OpenAIChat()
REQUEST = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "stream": True}
LIVE = [name for name, entry in FAULT_TYPES.items() if entry.live is not None]


def frame(choices: Any) -> bytes:
    return b"data: " + json.dumps({"id": "c", "choices": choices}).encode() + b"\n\n"


words = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=6)
answer_frame = words.map(lambda w: frame([{"index": 0, "delta": {"content": w}}]))
finishing_frame = st.sampled_from(
    [
        frame([{"index": 0, "delta": {}, "finish_reason": "stop"}]),
        frame([]),  # the usage chunk
        b"data: [DONE]\n\n",
    ]
)
streams = st.lists(st.one_of(answer_frame, answer_frame, finishing_frame), max_size=12)


@st.composite
def specs(draw: st.DrawFn, name: str) -> Any:
    params: dict[str, Any] = {}
    entry = FAULT_TYPES[name]
    if "after_chunks" in entry.params:
        params["after_chunks"] = draw(st.integers(0, 14))
    if "after_bytes" in entry.params:
        after = draw(st.none() | st.integers(0, 120))
        if after is not None:
            params["after_bytes"] = after
    if "data" in entry.params and draw(st.booleans()):
        params["data"] = draw(st.text(min_size=1, max_size=8))
    if "max_ms" in entry.params:
        params["max_ms"] = draw(st.integers(0, 5000))
    if "message" in entry.params and draw(st.booleans()):
        params["message"] = draw(st.text(min_size=1, max_size=8))
    return parse_fault_spec({"type": name, **params})


def plan_of(frames: list[bytes]) -> ResponsePlan:
    return ResponsePlan(
        status=200,
        headers=(("content-type", "text/event-stream"),),
        pieces=tuple(Piece(f) for f in frames),
        framing=Framing.CHUNKED,
    )


def context(answer: Any) -> FaultContext:
    def render(body: Any) -> ResponsePlan:  # pragma: no cover - not used by these types
        raise AssertionError("a cut never renders another answer")

    return FaultContext(provider=P, stream=True, answer=answer, render=render, request=REQUEST)


@pytest.mark.parametrize("name", [n for n in LIVE if n != "malformed_tool_args"])
@settings(max_examples=150, deadline=None)
@given(data=st.data(), frames=streams)
def test_a_live_cut_equals_the_whole_plan_cut(
    name: str, data: st.DataObject, frames: list[bytes]
) -> None:
    spec = data.draw(specs(name))
    machine = FAULT_TYPES[name].live(spec, LiveContext(P, REQUEST))  # type: ignore[misc]
    assert machine is not None
    pieces, end = run_live(machine, frames)
    whole = apply_fault(spec, plan_of(frames), context({"choices": []}))
    assert whole is not None
    assert pieces == whole.pieces
    assert end.ending is whole.ending
    if end.ending is Ending.STALL:
        assert end.stall_ms == whole.stall_ms
    assert whole.status == 200


def tool_frame(call: int, text: str) -> bytes:
    delta = {"tool_calls": [{"index": call, "function": {"arguments": text}}]}
    return frame([{"index": 0, "delta": delta}])


def call_head(call: int) -> bytes:
    function = {"name": f"f{call}", "arguments": ""}
    delta = {
        "tool_calls": [
            {"index": call, "id": f"call_{call}", "type": "function", "function": function}
        ]
    }
    return frame([{"index": 0, "delta": delta}])


@st.composite
def tool_streams(draw: st.DrawFn) -> list[bytes]:
    calls = draw(st.integers(1, 2))
    pieces = {
        c: draw(st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=4))
        for c in range(calls)
    }
    order = draw(st.permutations([(c, i) for c in range(calls) for i in range(len(pieces[c]))]))
    order = sorted(order, key=lambda ci: (ci[1] != 0, 0))  # heads in any order, then deltas
    seen: list[int] = []
    frames: list[bytes] = [frame([{"index": 0, "delta": {"role": "assistant"}}])]
    for c, i in order:
        if c not in seen:
            seen.append(c)
            frames.append(call_head(c))
        frames.append(tool_frame(c, pieces[c][i]))
    frames.append(frame([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]))
    frames.append(b"data: [DONE]\n\n")
    return frames


def masked(answer: Any) -> tuple[Any, list[str]]:
    """The answer without its arguments' text, and those texts."""
    texts: list[str] = []
    copy = json.loads(json.dumps(answer))
    for call in P.faults.tool_calls(copy):
        texts.append(call["arguments"])
        call["arguments"] = "..."
    return copy, texts


def invalid(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return True
    return False


@settings(max_examples=150, deadline=None)
@given(frames=tool_streams())
def test_live_malformed_tool_args_equals_the_whole_answer_broken(frames: list[bytes]) -> None:
    spec = parse_fault_spec({"type": "malformed_tool_args"})
    machine = FAULT_TYPES["malformed_tool_args"].live(spec, LiveContext(P, REQUEST))  # type: ignore[misc]
    assert machine is not None
    pieces, end = run_live(machine, frames)
    assert end.ending is Ending.COMPLETE
    live = P.assemble([p.data.decode() for p in pieces])
    broken = P.faults.break_tool_arguments(P.assemble([f.decode() for f in frames]))
    (live_rest, live_args), (whole_rest, whole_args) = masked(live), masked(broken)
    assert live_rest == whole_rest
    assert len(live_args) == len(whole_args) >= 1
    assert all(invalid(text) for text in live_args + whole_args)
    # Frames without argument text pass byte for byte.
    for sent, got in zip(frames, pieces, strict=True):
        if b'"arguments"' not in sent:
            assert got.data == sent


# -- malformed_tool_args live, protocol by protocol ---------------------------------------------

ANTHROPIC = AnthropicMessages()
RESPONSES = OpenAIResponses()
GEMINI = Gemini()
GEMINI_CODEC = GeminiCodec()  # typed: its stream_frames takes sse
OLLAMA = OllamaChat()
BEDROCK = BedrockConverse()
TOOL_PROTOCOLS = ["anthropic", "responses", "gemini-sse", "gemini-array", "ollama", "bedrock"]
WHOLE_CALLS = {"gemini-sse", "gemini-array", "ollama"}
"""Protocols whose calls come whole in one frame: the live answer is the buffered one."""

keys = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=5)
arguments = st.dictionaries(keys, st.one_of(words, st.integers(), st.booleans()), max_size=3)


def answer_of(protocol: str, text: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """An answer with `text` (when not empty) and a tool call per `calls` (arguments)."""
    names = [f"f{i}" for i in range(len(calls))]
    if protocol == "anthropic":
        blocks: list[Any] = [{"type": "text", "text": text}] if text else []
        blocks += [
            {"type": "tool_use", "id": f"toolu_{i}", "name": n, "input": a}
            for i, (n, a) in enumerate(zip(names, calls, strict=True))
        ]
        return {
            "id": "msg_live",
            "type": "message",
            "role": "assistant",
            "model": "claude-haiku-4-5",
            "content": blocks,
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 5, "output_tokens": 7},
        }
    if protocol == "responses":
        output: list[Any] = []
        if text:
            part = {"type": "output_text", "text": text, "annotations": []}
            output.append(
                {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant"}
                | {"content": [part]}
            )
        output += [
            {
                "type": "function_call",
                "id": f"fc_{i}",
                "call_id": f"call_{i}",
                "name": n,
                "arguments": json.dumps(a),
                "status": "completed",
            }
            for i, (n, a) in enumerate(zip(names, calls, strict=True))
        ]
        usage = {"input_tokens": 5, "output_tokens": 7, "total_tokens": 12}
        return {
            "id": "resp_live",
            "object": "response",
            "status": "completed",
            "model": "gpt-4o-mini",
            "output": output,
            "usage": usage,
        }
    if protocol.startswith("gemini"):
        parts: list[Any] = [{"text": text}] if text else []
        parts += [
            {"functionCall": {"name": n, "args": a}} for n, a in zip(names, calls, strict=True)
        ]
        return {
            "candidates": [
                {"content": {"parts": parts, "role": "model"}, "finishReason": "STOP", "index": 0}
            ],
            "usageMetadata": {
                "promptTokenCount": 3,
                "candidatesTokenCount": 4,
                "totalTokenCount": 7,
            },
            "modelVersion": "gemini-2.5-flash",
        }
    if protocol == "ollama":
        message: dict[str, Any] = {"role": "assistant", "content": text}
        message["tool_calls"] = [
            {"function": {"name": n, "arguments": a}} for n, a in zip(names, calls, strict=True)
        ]
        return {
            "model": "llama3.2",
            "created_at": "2025-01-01T00:00:00Z",
            "message": message,
            "done": True,
            "done_reason": "stop",
            "eval_count": 7,
        }
    assert protocol == "bedrock"
    content: list[Any] = [{"text": text}] if text else []
    content += [
        {"toolUse": {"toolUseId": f"tooluse_{i}", "name": n, "input": a}}
        for i, (n, a) in enumerate(zip(names, calls, strict=True))
    ]
    return {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": "tool_use",
        "usage": {"inputTokens": 5, "outputTokens": 7, "totalTokens": 12},
        "metrics": {"latencyMs": 3},
    }


def provider_of(protocol: str) -> Provider:
    return {
        "anthropic": ANTHROPIC,
        "responses": RESPONSES,
        "gemini-sse": GEMINI,
        "gemini-array": GEMINI,
        "ollama": OLLAMA,
        "bedrock": BEDROCK,
    }[protocol]


def stream_of(protocol: str, answer: Any) -> list[bytes]:
    provider = provider_of(protocol)
    if protocol.startswith("gemini"):
        texts = GEMINI_CODEC.stream_frames(answer, sse=protocol == "gemini-sse")
    else:
        texts = provider.codec.stream_frames(answer)
    return [provider.codec.encode_frame(t) for t in texts]


@dataclass
class Mask:
    """`ArgumentCuts` that blank every argument text and keep what each call's deltas
    said (`deltas`) and what its restatements said (`wholes`)."""

    memo: dict[object, Any] = field(default_factory=dict)
    deltas: dict[object, str] = field(default_factory=dict)
    wholes: dict[object, list[str]] = field(default_factory=dict)

    @property
    def broken(self) -> bool:
        return False

    def __call__(self, key: object, text: str) -> str:
        self.deltas[key] = self.deltas.get(key, "") + text
        return ""

    def whole(self, key: object, text: str) -> str:
        self.wholes.setdefault(key, []).append(text)
        return ""


def masked_answer(provider: Provider, frames: list[bytes]) -> tuple[Any, Mask]:
    """The answer of `frames` with every argument text blanked, and the texts."""
    mask = Mask()
    blank = [provider.faults.break_argument_deltas(f, mask) or f for f in frames]
    return provider.assemble([provider.codec.frame_text(f) for f in blank]), mask


@settings(max_examples=100, deadline=None)
@given(
    data=st.data(),
    protocol=st.sampled_from(TOOL_PROTOCOLS),
    text=st.one_of(st.just(""), words),
)
def test_live_malformed_tool_args_gives_the_buffered_answer_in_every_protocol(
    data: st.DataObject, protocol: str, text: str
) -> None:
    provider = provider_of(protocol)
    whole = protocol in WHOLE_CALLS
    drawn = arguments if whole else arguments.filter(bool)  # a delta needs some text
    calls = data.draw(st.lists(drawn, min_size=1, max_size=3))
    frames = stream_of(protocol, answer_of(protocol, text, calls))
    request: Any = {"stream": True}
    spec = parse_fault_spec({"type": "malformed_tool_args"})
    machine = FAULT_TYPES["malformed_tool_args"].live(spec, LiveContext(provider, request))  # type: ignore[misc]
    assert machine is not None
    claims: list[bool] = []

    def claim() -> bool:
        claims.append(True)
        return True

    pieces, end = run_live(Claimed(machine, claim), frames)
    assert claims == [True]  # taken once, when a frame showed a call
    assert end.ending is Ending.COMPLETE
    live = [p.data for p in pieces]

    def render(body: Any) -> ResponsePlan:
        return plan_of(stream_of(protocol, body))

    ctx = FaultContext(
        provider=provider,
        stream=True,
        answer=provider.assemble([provider.codec.frame_text(f) for f in frames]),
        render=render,
        request=request,
    )
    buffered_plan = apply_fault(spec, plan_of(frames), ctx)
    assert buffered_plan is not None
    buffered = [p.data for p in buffered_plan.pieces]
    if whole:
        # The same answer exactly (Gemini's MALFORMED_FUNCTION_CALL, Ollama's parse error).
        assert provider.assemble([provider.codec.frame_text(f) for f in live]) == provider.assemble(
            [provider.codec.frame_text(f) for f in buffered]
        )
        return
    (live_rest, live_args), (buffered_rest, buffered_args) = (
        masked_answer(provider, live),
        masked_answer(provider, buffered),
    )
    assert live_rest == buffered_rest  # the stop reason too: max_tokens where it says so
    assert sorted(map(str, live_args.deltas)) == sorted(map(str, buffered_args.deltas))
    assert len([t for t in live_args.deltas.values() if t]) == len(calls)
    for key, texts in live_args.deltas.items():
        assert invalid(texts) and invalid(buffered_args.deltas[key])
        # Each restatement says what the deltas made (the client's own view agrees).
        assert all(w == texts for w in live_args.wholes.get(key, []))
    # Frames without argument text pass byte for byte (the stop reason's frame aside).
    for sent in frames:
        if provider.faults.break_argument_deltas(
            sent, Mask()
        ) == sent and not provider.faults.frame_finishes(provider.codec.frame_text(sent)):
            assert sent in live
