"""Loading recordings: forgiving of bad files, strict about what is wrong."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from chaosllm.errors import InvalidFaultSpec, RecordingError, UnsafePath
from chaosllm.providers.openai_chat import OpenAIChat, OpenAIChatCodec
from chaosllm.store import recordings
from chaosllm.store.formats import native
from chaosllm.store.profiles import list_profiles, load_profile
from chaosllm.store.recordings import (
    RecordingStore,
    exchange_to_json,
    parse_exchange,
    safe_child,
    shipped_dir,
)
from tests.helpers import ROOT, chat_completion, write

P = OpenAIChat()
CODEC = OpenAIChatCodec()  # typed: its stream_frames takes include_usage
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ANSWER = chat_completion("hello", usage=None)


def recording(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "chaosllm": 1,
        "provider": "openai.chat",
        "request": {"method": "POST", "path": "/v1/chat/completions", "body": BODY},
        "response": {"status": 200, "body": ANSWER},
    }
    data.update(overrides)
    return data


def test_loader_computes_the_digest_and_keeps_a_stale_one_for_doctor(tmp_path: Path) -> None:
    write(tmp_path / "s" / "0001.json", recording(digest="stale"))
    store = RecordingStore.load([tmp_path])
    [exchange] = store.exchanges
    assert exchange.digest == P.digest(BODY)
    assert exchange.stored_digest == "stale"
    assert exchange.name == "s/0001" and exchange.scenario == "s"
    assert store.by_digest[("openai.chat", P.digest(BODY))] == [exchange]


def test_models_follow_loads_reloads_and_learned_recordings(tmp_path: Path) -> None:
    write(tmp_path / "s" / "0001.json", recording())
    store = RecordingStore.load([tmp_path])
    assert store.models() == ["m"]
    learned = dataclasses.replace(
        store.exchanges[0],
        request=dataclasses.replace(store.exchanges[0].request, body={**BODY, "model": "a"}),
    )
    store.add(learned)
    assert store.models() == ["a", "m"]
    write(
        tmp_path / "s" / "0001.json",
        recording(request={**recording()["request"], "body": {**BODY, "model": "z"}}),
    )
    store.reload()
    assert store.models() == ["z"]


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
    frames = CODEC.stream_frames(ANSWER, include_usage=False)
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


def test_the_native_format_is_re_exported_by_recordings() -> None:
    assert recordings.parse_exchange is native.parse_exchange
    assert recordings.exchange_to_json is native.exchange_to_json
    assert recordings.FORMAT_VERSION == native.FORMAT_VERSION == 1


def test_shipped_profiles_load_by_name() -> None:
    names = list_profiles()
    assert names == sorted(names) and "flaky-provider" in names
    profile = load_profile("flaky-provider")
    assert profile.name == "flaky-provider" and profile.description
    assert [s.type for s in profile.specs][:2] == ["http_503", "http_error"]
    assert profile.to_json()["faults"][0]["type"] == "http_503"


def test_a_profile_file_of_ones_own_loads_by_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.json"
    path.write_text('{"description": "d", "faults": [{"type": "http_429"}]}', "utf-8")
    profile = load_profile(str(path))
    assert profile.name == "mine" and [s.type for s in profile.specs] == ["http_429"]
    assert list_profiles(tmp_path) == ["mine"] and list_profiles(tmp_path / "none") == []
    assert load_profile("mine", directory=tmp_path).to_json() == profile.to_json()


@pytest.mark.parametrize("name", ["../recordings/simple-chat/0001", "/etc/passwd", "a\x00b"])
def test_a_profile_name_never_leaves_the_profiles_directory(name: str) -> None:
    with pytest.raises(InvalidFaultSpec, match="bad profile name"):
        load_profile(name)


def test_bad_profiles_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(InvalidFaultSpec, match=r"unknown profile 'nope'.*flaky-provider"):
        load_profile("nope")
    (tmp_path / "broken.json").write_text("{oops", "utf-8")
    with pytest.raises(InvalidFaultSpec, match=r"broken\.json: cannot read it"):
        load_profile("broken", directory=tmp_path)
    (tmp_path / "odd.json").write_text('{"faults": [{"type": "no_such_fault"}]}', "utf-8")
    with pytest.raises(InvalidFaultSpec, match="profile odd: "):
        load_profile("odd", directory=tmp_path)


def test_the_faults_package_reads_no_profile_files() -> None:
    """`chaosllm.faults.profiles` is pure (SPEC): parsing only; reading is the store's."""
    source = ROOT / "chaosllm" / "faults" / "profiles.py"
    imported: set[str] = set()
    calls: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
            calls.add(node.func.id if isinstance(node.func, ast.Name) else node.func.attr)
    assert not {m for m in imported if m.split(".")[0] in ("json", "os", "pathlib", "io")}
    assert not {m for m in imported if m.startswith(("chaosllm.store", "chaosllm.paths"))}
    assert not calls & {"open", "read_text", "read_bytes", "glob", "is_file"}
