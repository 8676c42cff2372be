"""A live fault's state machine gives what its whole-plan transform gives, on any frames.

For each fault type with a streaming counterpart (`FaultType.live`), hypothesis draws a
stream (answer frames, finishing frames anywhere, [DONE]) and the fault's parameters;
feeding the frames to the machine one at a time (`run_live`) must give the pieces, the
ending and the stall of `apply_fault` on the plan of the same frames. For
``malformed_tool_args`` the assembled answers agree except in the arguments' text, which
is invalid JSON in both.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaosllm.faults import FAULT_TYPES, FaultContext, apply_fault, parse_fault_spec
from chaosllm.faults.live import LiveContext, run_live
from chaosllm.model import Ending, Framing, Piece, ResponsePlan
from chaosllm.providers.openai_chat import OpenAIChat

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
    for call in P.tool_calls(copy):
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
    broken = P.break_tool_arguments(P.assemble([f.decode() for f in frames]))
    (live_rest, live_args), (whole_rest, whole_args) = masked(live), masked(broken)
    assert live_rest == whole_rest
    assert len(live_args) == len(whole_args) >= 1
    assert all(invalid(text) for text in live_args + whole_args)
    # Frames without argument text pass byte for byte.
    for sent, got in zip(frames, pieces, strict=True):
        if b'"arguments"' not in sent:
            assert got.data == sent
