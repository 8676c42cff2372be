"""The one SSE codec (`chaosllm.providers.sse`): encoding, decoding, the byte splitter the
recorder uses, and every provider's rendered stream read back through it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaosllm.model import Exchange, RecordedRequest, RecordedResponse
from chaosllm.paths import shipped_dir
from chaosllm.providers import PROVIDERS
from chaosllm.providers.sse import (
    DONE_FRAME,
    SSE_HEADERS,
    FrameSplitter,
    data_frame,
    event_frame,
    event_types,
    iter_data,
    iter_events,
    split_frames,
)
from chaosllm.store.formats.session import is_session
from tests.helpers import split_in_pieces

RECORDINGS = shipped_dir("recordings")


def shipped() -> list[tuple[str, dict[str, Any]]]:
    """The shipped recordings (``<scenario>/<NNNN>``, the file's data)."""
    return [
        (path.relative_to(RECORDINGS).with_suffix("").as_posix(), json.loads(path.read_bytes()))
        for path in sorted(RECORDINGS.glob("*/*.json"))
        if not is_session(json.loads(path.read_bytes()))  # WebSocket sessions: no stream
    ]


def test_encoding_is_compact_and_keeps_non_ascii() -> None:
    assert data_frame({"a": [1, 2], "t": "é"}) == 'data: {"a":[1,2],"t":"é"}\n\n'
    assert event_frame({"type": "ping"}) == 'event: ping\ndata: {"type":"ping"}\n\n'
    assert DONE_FRAME == "data: [DONE]\n\n"


def test_decoding_events() -> None:
    frames = [
        'event: a\ndata: {"x":1}\n\n',
        "data:no-space\n\n",
        "data: line one\r\ndata: line two\r\n\r\n",
        ": a comment, no data\n\nevent: lonely\n\n",
        'data: {"n":1}\n\ndata: {"n":2}\n\n',  # two events in one frame
    ]
    assert list(iter_events(frames)) == [
        ("a", '{"x":1}'),
        (None, "no-space"),
        (None, "line one\nline two"),
        (None, '{"n":1}'),
        (None, '{"n":2}'),
    ]
    assert list(iter_data(frames))[1:3] == ["no-space", "line one\nline two"]


def test_event_types_prefer_the_payload_type() -> None:
    frames = [
        'event: named\ndata: {"type":"typed"}\n\n',
        'event: named\ndata: {"no":"type"}\n\n',
        "data: [DONE]\n\n",
        'data: {"type":"bare"}\n\n',
    ]
    assert list(event_types(frames)) == ["typed", "named", None, "bare"]


BODY = b'data: {"a":1}\n\nevent: e\r\ndata: two\r\n\r\ndata: three\r\rdata: unterminated'


def test_split_frames_keeps_every_byte() -> None:
    frames = [data for data, _ in split_frames(BODY)]
    assert frames == [
        b'data: {"a":1}\n\n',
        b"event: e\r\ndata: two\r\n\r\n",
        b"data: three\r\rdata: unterminated",  # what follows the last blank line joins it
    ]
    assert b"".join(frames) == BODY


def test_splitter_times_frames_by_the_bytes_that_complete_them() -> None:
    splitter = FrameSplitter(10.0)
    assert splitter.feed(b"data: 1\n", 10.5) == 0
    assert splitter.feed(b"\ndata: 2\n\nda", 11.0) == 2
    assert splitter.feed(b"ta: 3\n\n", 13.0) == 1
    splitter.finish()
    assert splitter.frames == [
        (b"data: 1\n\n", 1000.0),
        (b"data: 2\n\n", 0.0),
        (b"data: 3\n\n", 2000.0),
    ]
    counting = FrameSplitter(0.0, keep=False)
    assert counting.feed(b"data: 1\n\ndata: 2\n\n", 1.0) == 2
    counting.finish()
    assert counting.frames == []


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=len(BODY)), max_size=12))
def test_splitting_does_not_depend_on_how_the_bytes_arrive(cuts: list[int]) -> None:
    split = split_in_pieces(FrameSplitter(0.0), BODY, cuts)
    assert split == [data for data, _ in split_frames(BODY)]


@pytest.mark.parametrize(("name", "data"), shipped(), ids=[name for name, _ in shipped()])
def test_every_rendered_stream_reads_back_through_the_codec(
    name: str, data: dict[str, Any]
) -> None:
    p = PROVIDERS[data.get("provider", "openai.chat")]
    body: Any = data["response"]["body"]
    if not p.codec.is_answer(body):
        pytest.skip("not an answer body")
    if not p.codec.is_stream(SSE_HEADERS[0][1]):
        pytest.skip("its stream is not SSE")
    request = {**data["request"]["body"], "stream": True}
    exchange = Exchange(
        provider=p.name,
        request=RecordedRequest("POST", data["request"]["path"], data["request"]["body"]),
        response=RecordedResponse(200, body),
        digest=p.digest(data["request"]["body"]),
        name=name,
        scenario=name.split("/")[0],
    )
    plan = p.render(exchange, request, timing=0)
    if not dict(plan.headers)["content-type"].startswith("text/event-stream"):
        pytest.skip("the request asks for another framing (Gemini without alt=sse)")
    frames = [piece.data.decode() for piece in plan.pieces]
    # One event per piece, and the body split again gives the same frames.
    assert all(len(list(iter_events([f]))) == 1 for f in frames)
    assert [d.decode() for d, _ in split_frames(plan.body())] == frames
    for event, payload in iter_events(frames):
        if event is not None:  # a named event is named by its payload's type
            assert json.loads(payload)["type"] == event
    assert p.codec.stream_complete(frames) and not p.codec.stream_complete(frames[:-1])
