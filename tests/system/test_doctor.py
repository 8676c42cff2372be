"""`chaosllm doctor`: each problem it looks for, caught; a clean directory passes."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped, unused-ignore]

from chaosllm.cli import main
from chaosllm.doctor import Problem, diagnose
from chaosllm.store.formats.hashkeyed import request_digest
from chaosllm.store.recordings import shipped_dir
from tests.helpers import recording, write

KEY = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4"


def problems(root: Path, check: str) -> list[Problem]:
    return [p for p in diagnose([root]).problems if p.check == check]


def test_shipped_recordings_are_clean() -> None:
    report = diagnose([shipped_dir("recordings")])
    assert report.problems == [] and report.recordings >= 20 and report.ok(strict=True)
    assert main(["doctor", str(shipped_dir("recordings"))]) == 0


def test_unreadable_file(tmp_path: Path) -> None:
    write(tmp_path / "s" / "0001.json", "{oops")
    write(tmp_path / "s" / "0002.json", {**recording("simple-chat/0001"), "chaosllm": 7})
    found = problems(tmp_path, "unreadable")
    assert len(found) == 2 and all(p.severity == "error" for p in found)
    assert "not valid JSON" in found[0].message and "version 7" in found[1].message


def test_unknown_format(tmp_path: Path) -> None:
    write(tmp_path / "s" / "config.json", {"retries": 3})
    write(tmp_path / "s" / "notes.yaml", "- a list\n")
    found = problems(tmp_path, "unknown_format")
    assert [Path(p.path).name for p in found] == ["config.json", "notes.yaml"]
    assert "unknown format" in found[0].message


def test_stale_digest(tmp_path: Path) -> None:
    rec = recording("simple-chat/0001")
    rec["request"]["body"]["messages"][-1]["content"] += " (edited by hand)"
    write(tmp_path / "s" / "0001.json", rec)
    ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    write(
        tmp_path / "fixtures" / f"{request_digest(ask)}.json",
        {"request_digest": "0" * 64, "response": {"content": "hello"}},
    )
    found = {Path(p.path).parent.name: p for p in problems(tmp_path, "stale_digest")}
    assert sorted(found) == ["fixtures", "s"]
    assert all(p.severity == "error" for p in found.values())
    assert "conflicts with its request" in found["s"].message
    assert "request_digest" in found["fixtures"].message
    assert "its name" in found["fixtures"].message


def test_duplicate_and_ambiguous(tmp_path: Path) -> None:
    rec = recording("simple-chat/0001")
    write(tmp_path / "a" / "0001.json", rec)
    write(tmp_path / "a" / "0002.json", rec)
    other = copy.deepcopy(rec)
    other["response"]["body"]["choices"][0]["message"]["content"] = "A different answer."
    write(tmp_path / "b" / "0001.json", other)
    duplicate = problems(tmp_path, "duplicate")
    assert [Path(p.path).parent.name + "/" + Path(p.path).name for p in duplicate] == [
        "a/0002.json"
    ]
    assert duplicate[0].severity == "warning"
    ambiguous = problems(tmp_path, "ambiguous")
    assert len(ambiguous) == 1 and "b/0001" in ambiguous[0].message


def test_orphan_tool_calls_in_recordings_and_traces(tmp_path: Path) -> None:
    rec = recording("tool-call/0002")
    messages = rec["request"]["body"]["messages"]
    assert messages[-1]["role"] == "tool"
    rec["request"]["body"]["messages"] = messages[:-1] + [{"role": "user", "content": "never mind"}]
    write(tmp_path / "s" / "0001.json", rec)
    write(
        tmp_path / "traces" / "t.json",
        {
            "model_name": "t",
            "turns": [
                {
                    "user_input": "go",
                    "steps": [
                        {
                            "response": {
                                "type": "tool_calls",
                                "tool_calls": [{"id": "c1", "name": "echo", "arguments": {}}],
                            }
                        }
                    ],
                },
                {
                    "user_input": "again",
                    "steps": [
                        {
                            "expected_tool_results": [
                                {"tool_call_id": "c9", "name": "echo", "content": "x"}
                            ],
                            "response": {"type": "text", "content": "ok"},
                        }
                    ],
                },
            ],
        },
    )
    found = problems(tmp_path, "orphan_tool_call")
    messages_found = [p.message for p in found]
    assert any(
        "recorded request" in m and "did not have response messages" in m for m in messages_found
    )
    assert any("turn ends on a tool_calls step (c1)" in m for m in messages_found)
    assert any("'c9', which no earlier step made" in m for m in messages_found)


def test_recordings_that_would_never_match(tmp_path: Path) -> None:
    invalid = recording("simple-chat/0001")
    invalid["request"]["body"]["messages"] = []
    write(tmp_path / "s" / "0001.json", invalid)
    elsewhere = recording("knowledge/0001")
    elsewhere["request"]["path"] = "/v1/completions"
    write(tmp_path / "s" / "0002.json", elsewhere)
    keyed = recording("knowledge/0002")
    keyed["request"]["body"]["messages"][-1]["content"] += f" My key is {KEY}."
    write(tmp_path / "s" / "0003.json", keyed)
    found = problems(tmp_path, "never_matches")
    by_file = {Path(p.path).name: p.message for p in found}
    assert "refuses before matching" in by_file["0001.json"]
    assert "'/v1/completions' is not an endpoint" in by_file["0002.json"]
    assert "redacted before keying" in by_file["0003.json"]


def test_structured_answer_that_breaks_its_schema(tmp_path: Path) -> None:
    rec = recording("structured-output/0001")
    rec["response"]["body"]["choices"][0]["message"]["content"] = json.dumps({"name": "x"})
    write(tmp_path / "s" / "0001.json", rec)
    [found] = problems(tmp_path, "schema_mismatch")
    assert "'date' is a required property" in found.message and "re-record" in found.message


def test_malformed_tool_arguments_are_a_warning(tmp_path: Path) -> None:
    rec = recording("tool-call/0001")
    rec["response"]["body"]["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = (
        '{"city": "Par'
    )
    write(tmp_path / "s" / "0001.json", rec)
    [found] = problems(tmp_path, "malformed_tool_args")
    assert found.severity == "warning"
    assert diagnose([tmp_path]).ok() and not diagnose([tmp_path]).ok(strict=True)


def test_unredacted_secrets(tmp_path: Path) -> None:
    rec = recording("simple-chat/0001")
    rec["response"]["body"]["choices"][0]["message"]["content"] = f"Use {KEY} for that."
    write(tmp_path / "s" / "0001.json", rec)
    request = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})
    cassette = {
        "interactions": [
            {
                "request": {
                    "body": request,
                    "method": "POST",
                    "uri": "https://api.openai.com/v1/chat/completions",
                    "headers": {"authorization": ["Bearer live-token-123456789"]},
                },
                "response": {
                    "body": {
                        "string": json.dumps(recording("simple-chat/0001")["response"]["body"])
                    },
                    "headers": {},
                    "status": {"code": 200, "message": "OK"},
                },
            }
        ],
        "version": 1,
    }
    write(tmp_path / "cassettes" / "c.yaml", yaml.dump(cassette))
    found = problems(tmp_path, "unredacted_secret")
    assert len(found) == 2 and all(p.severity == "error" for p in found)
    assert "sk-pro...M3n4" in found[1].message and "line " in found[1].message
    assert KEY not in " ".join(p.message for p in found)  # never printed whole
    assert "credential header" in found[0].message


def test_cli_exit_status_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path / "s" / "0001.json", recording("simple-chat/0001"))
    assert main(["doctor", str(tmp_path)]) == 0
    assert "0 errors, 0 warnings" in capsys.readouterr().out
    write(tmp_path / "s" / "0002.json", "{oops")
    assert main(["doctor", "--json", str(tmp_path)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["errors"] == 1 and report["problems"][0]["check"] == "unreadable"


def test_trace_and_hash_keyed_dirs_are_checked_too(tmp_path: Path) -> None:
    ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    digest = request_digest(ask)
    write(
        tmp_path / "fixtures" / f"{digest}.json",
        {"request_digest": digest, "response": {"content": "hello"}},
    )
    write(
        tmp_path / "traces" / "t.json",
        {"model_name": "t", "steps": [{"response": {"type": "text", "content": "hi"}}]},
    )
    report = diagnose([tmp_path])
    assert report.problems == [] and report.recordings == 2
    assert hashlib.sha256(b"").hexdigest() != digest
