"""Loading recordings: forgiving of bad files, strict about what is wrong."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from chaosllm.errors import RecordingError, UnsafePath
from chaosllm.providers.openai_chat import OpenAIChat
from chaosllm.store.recordings import (
    RecordingStore,
    exchange_to_json,
    parse_exchange,
    safe_child,
    shipped_dir,
)

P = OpenAIChat()
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hello"},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": None,
}


def recording(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "chaosllm": 1,
        "provider": "openai.chat",
        "request": {"method": "POST", "path": "/v1/chat/completions", "body": BODY},
        "response": {"status": 200, "body": ANSWER},
    }
    data.update(overrides)
    return data


def write(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")


def test_loader_computes_the_digest_and_keeps_a_stale_one_for_doctor(tmp_path: Path) -> None:
    write(tmp_path / "s" / "0001.json", recording(digest="stale"))
    store = RecordingStore.load([tmp_path])
    [exchange] = store.exchanges
    assert exchange.digest == P.digest(BODY)
    assert exchange.stored_digest == "stale"
    assert exchange.name == "s/0001" and exchange.scenario == "s"
    assert store.by_digest[("openai.chat", P.digest(BODY))] == [exchange]


def test_corrupt_files_are_reported_and_the_rest_loads(tmp_path: Path) -> None:
    write(tmp_path / "ok" / "0001.json", recording())
    write(tmp_path / "bad" / "0001.json", "{not json")
    write(tmp_path / "bad" / "0002.json", recording(chaosllm=99))
    write(tmp_path / "bad" / "0003.json", recording(response={"status": "x", "body": ANSWER}))
    write(tmp_path / "bad" / "0004.json", recording(provider="acme.chat"))
    write(tmp_path / "bad" / "0005.json", [1, 2])
    store = RecordingStore.load([tmp_path])
    assert [e.name for e in store.exchanges] == ["ok/0001"]
    problems = {Path(e.path).name: e.problem for e in store.errors}
    assert "not valid JSON" in problems["0001.json"] and "line 1" in problems["0001.json"]
    assert "unsupported format version 99" in problems["0002.json"]
    assert "response.status" in problems["0003.json"]
    assert "unknown provider 'acme.chat'" in problems["0004.json"]
    assert "JSON object" in problems["0005.json"]
    assert all(str(tmp_path) in e.path for e in store.errors)


def test_missing_body_is_assembled_from_chunks(tmp_path: Path) -> None:
    frames = P.stream_frames(ANSWER, include_usage=False)
    write(
        tmp_path / "s" / "0001.json",
        recording(
            response={
                "status": 200,
                "stream": True,
                "chunks": [{"data": f, "delay_ms": 1} for f in frames],
            }
        ),
    )
    [exchange] = RecordingStore.load([tmp_path]).exchanges
    assert exchange.response.body["choices"][0]["message"]["content"] == "hello"
    assert exchange.response.chunks is not None and len(exchange.response.chunks) == len(frames)


def test_roundtrip_through_json(tmp_path: Path) -> None:
    data = recording(meta={"description": "d"})
    exchange = parse_exchange(data, source="x", scenario="s", name="s/0001")
    again = parse_exchange(exchange_to_json(exchange), source="x", scenario="s", name="s/0001")
    assert again == dataclasses.replace(exchange, stored_digest=exchange.digest)


def test_missing_dir_is_an_error_not_a_crash(tmp_path: Path) -> None:
    store = RecordingStore.load([tmp_path / "nope"])
    assert store.exchanges == [] and "not a directory" in store.errors[0].problem


def test_recording_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"x\.json: "):
        parse_exchange({"chaosllm": 1}, source="x.json", scenario="s", name="s/1")
    assert issubclass(RecordingError, ValueError)


@pytest.mark.parametrize("name", ["../etc", "/abs", "a/../../b", "", "a\x00b"])
def test_safe_child_rejects_traversal(tmp_path: Path, name: str) -> None:
    with pytest.raises(UnsafePath):
        safe_child(tmp_path, name)


def test_safe_child_accepts_plain_names(tmp_path: Path) -> None:
    assert safe_child(tmp_path, "a/b.json") == (tmp_path / "a" / "b.json").resolve()


def test_shipped_recordings_all_load() -> None:
    store = RecordingStore.load([shipped_dir("recordings")])
    assert store.errors == []
    assert len(store.exchanges) >= 20
    scenarios = set(store.by_scenario)
    assert {
        "simple-chat",
        "multi-turn",
        "tool-call",
        "parallel-tools",
        "streaming-usage",
        "structured-output",
        "reasoning",
        "refusal",
        "knowledge",
    } <= scenarios
    for exchange in store.exchanges:
        assert exchange.stored_digest in (None, exchange.digest), exchange.name
