"""`chaosllm import FORMAT SRC DEST`: hash-keyed fixtures, traces and cassettes become native
recordings that replay exactly as their source did."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import httpx
import pytest
import yaml  # type: ignore[import-untyped, unused-ignore]
from openai.types.chat import ChatCompletionMessageParam

from chaosllm import ChaosServer
from chaosllm.cli import main
from chaosllm.doctor import diagnose
from chaosllm.model import Keying
from chaosllm.store.formats.importer import import_recordings
from chaosllm.store.recordings import RecordingStore
from tests.formats.test_hashkeyed import ASK, WEATHER, compute_hash
from tests.formats.test_trace import RECORDED, STEERING, TOOLS
from tests.formats.test_vcr import cassette
from tests.helpers import openai_client


@pytest.fixture
def hashed(tmp_path: Path) -> Path:
    src = tmp_path / "src" / "mock_llm_fixtures"
    src.mkdir(parents=True)
    for request, response in (
        (ASK, {"content": "Short answer.", "usage": {"prompt_tokens": 4, "completion_tokens": 2}}),
        (
            WEATHER,
            {
                "content": "",
                "finish_reason": "tool_calls",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                    }
                ],
            },
        ),
    ):
        digest = compute_hash(request)
        (src / f"{digest}.json").write_text(
            json.dumps({"request_digest": digest, "response": response}), "utf-8"
        )
    return src


def frames(server: ChaosServer, body: Mapping[str, object]) -> str:
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        return client.post("/chat/completions", json={**body, "stream": True}).text


def test_hash_keyed_import_replays_identically(
    hashed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "native"
    assert main(["import", "hash-keyed", str(hashed), str(dest)]) == 0
    assert "imported 2 recordings (hash-keyed)" in capsys.readouterr().out
    written = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*.json"))
    assert written == sorted(f"mock_llm_fixtures/{compute_hash(r)}.json" for r in (ASK, WEATHER))
    data = json.loads((dest / written[0]).read_text("utf-8"))
    assert data["chaosllm"] == 1 and data["keyed_by"] == "hash-keyed"
    store = RecordingStore.load([dest])
    assert store.errors == [] and all(e.keyed_by == Keying.HASH_KEYED for e in store.exchanges)
    assert diagnose([dest]).problems == []
    with ChaosServer(hashed) as before, ChaosServer(dest) as after:
        for body in (ASK, WEATHER):
            assert frames(before, body) == frames(after, body)
        with openai_client(after) as sdk:
            assert sdk.chat.completions.create(**ASK).choices[0].message.content == "Short answer."


def test_trace_import_keeps_order_and_extras(tmp_path: Path) -> None:
    src = tmp_path / "traces"
    (src / "advanced").mkdir(parents=True)
    (src / "advanced" / "steering.json").write_text(json.dumps(STEERING), "utf-8")
    (src / "recorded.json").write_text(json.dumps(RECORDED), "utf-8")
    result = import_recordings("trace", src, tmp_path / "native")
    assert result.errors == [] and len(result.written) == 6
    store = RecordingStore.load([tmp_path / "native"])
    assert store.errors == []
    assert store.sequence_scenarios == {
        "advanced/steering": "advanced-steering",
        "recorded": "recorded-claude-3-5-sonnet",
    }
    assert store.scenario_info["recorded"]["http_exchanges"] == RECORDED["http_exchanges"]
    with (
        ChaosServer(tmp_path / "native") as server,
        openai_client(server) as sdk,
    ):
        ask: list[ChatCompletionMessageParam] = [
            {"role": "user", "content": "Write hello to /tmp/test.txt"}
        ]
        first = sdk.chat.completions.create(tools=TOOLS, model="advanced-steering", messages=ask)
        second = sdk.chat.completions.create(tools=TOOLS, model="advanced-steering", messages=ask)
    assert (first.choices[0].message.tool_calls or [])[0].id == "c1"
    assert second.choices[0].message.content == "Done."


def test_vcr_import_replays(tmp_path: Path) -> None:
    src = tmp_path / "cassettes"
    src.mkdir()
    (src / "chat.yaml").write_text(yaml.dump(cassette()), "utf-8")
    result = import_recordings("vcr", src / "chat.yaml", tmp_path / "native")
    assert [p.relative_to(tmp_path / "native").as_posix() for p in result.written] == [
        "chat/0001.json",
        "chat/0002.json",
    ]
    with ChaosServer(src) as before, ChaosServer(tmp_path / "native") as after:
        body = {
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": "Count to three."}],
        }
        assert frames(before, body) == frames(after, body)


def test_existing_files_are_kept_unless_forced(
    hashed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "native"
    assert main(["import", "hash-keyed", str(hashed), str(dest)]) == 0
    assert main(["import", "hash-keyed", str(hashed), str(dest)]) == 1
    assert "left alone (--force overwrites)" in capsys.readouterr().err
    assert main(["import", "hash-keyed", "--force", str(hashed), str(dest)]) == 0


def test_wrong_format_and_escaping_paths_are_refused(
    hashed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["import", "trace", str(hashed), str(tmp_path / "a")]) == 1
    assert "not a trace file (it looks like a hash-keyed file)" in capsys.readouterr().err
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    os.symlink(outside, dest / "mock_llm_fixtures")  # DEST/<scenario> points elsewhere
    result = import_recordings("hash-keyed", hashed, dest)
    assert result.written == [] and len(result.errors) == 2
    assert "escapes" in str(result.errors[0])
    assert list(outside.iterdir()) == []
