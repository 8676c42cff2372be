"""`doctor` passes what real projects commit, and the cassette and fixture shapes they
write load: a trace turn ending on tool_calls, what `chaosllm import` writes, vcrpy
filter placeholders, OpenAI account ids and Cloudflare cookies (a real key shape still
fails), pydantic-ai's ``parsed_body`` cassettes, a missing body said so, and DocsGPT's
``_comment`` shown by ``ls`` and kept by ``import``. Fixtures are written here in the
real shapes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped, unused-ignore]

from chaosllm import ChaosServer
from chaosllm.cli import main
from chaosllm.doctor import diagnose
from chaosllm.store.recordings import RecordingStore
from tests.formats.test_hashkeyed import ASK as HASHED_ASK
from tests.formats.test_hashkeyed import write_fixture
from tests.formats.test_trace_bindings import BOUND, INTERLEAVED, LEGACY, TEMPLATED, TOOLS, write
from tests.formats.test_vcr import ASK, COMPLETION, URI
from tests.helpers import openai_client

# A trace whose turns end on tool calls: the user denies the approval, and an auth gate.
APPROVAL_DENIED: dict[str, Any] = {
    "model_name": "approval-denied",
    "turns": [
        {
            "user_input": "Delete the production database",
            "steps": [
                {
                    "response": {
                        "type": "tool_calls",
                        "tool_calls": [
                            {"id": "call_rm", "name": "shell", "arguments": {"cmd": "dropdb"}}
                        ],
                        "input_tokens": 90,
                        "output_tokens": 12,
                    }
                }
            ],
        },
        {
            "user_input": "Connect my calendar",
            "steps": [
                {
                    "response": {
                        "type": "tool_calls",
                        "tool_calls": [
                            {"id": "call_auth", "name": "oauth_connect", "arguments": {}}
                        ],
                        "input_tokens": 95,
                        "output_tokens": 9,
                    }
                }
            ],
        },
    ],
}


def ironclaw_tree(root: Path) -> Path:
    traces: dict[str, dict[str, Any]] = {
        "coverage/approval_denied": APPROVAL_DENIED,
        "spot/bound": BOUND,
        "spot/templated": TEMPLATED,
        "engine_v2/mission": INTERLEAVED,
        "recorded/legacy": LEGACY,
    }
    for name, trace in traces.items():
        write(root, name, trace)
    return root


def report_of(root: Path) -> tuple[list[str], list[str]]:
    report = diagnose([root])
    return (
        [f"{p.path}: {p.message}" for p in report.errors],
        [f"{p.path}: {p.message}" for p in report.warnings],
    )


# -- traces ----------------------------------------------------------------------------


def test_a_turn_ending_on_tool_calls_passes(tmp_path: Path) -> None:
    root = ironclaw_tree(tmp_path / "llm_traces")
    errors, warnings = report_of(root)
    assert errors == []
    assert len(warnings) == 2 and all("fine when the agent stops there" in w for w in warnings)
    assert main(["doctor", str(root)]) == 0


def test_what_import_writes_passes_and_replays(tmp_path: Path) -> None:
    src, out = ironclaw_tree(tmp_path / "llm_traces"), tmp_path / "native"
    assert main(["import", "trace", str(src), str(out)]) == 0
    errors, _ = report_of(out)
    assert errors == []  # no stale digests, no "orphan" calls of one-step files
    assert main(["doctor", str(out)]) == 0
    # ... and it replays as the traces did, bindings resolved.
    with ChaosServer(out) as server, openai_client(server) as client:
        first = client.chat.completions.create(
            model="bound-results", messages=[{"role": "user", "content": "go"}], tools=TOOLS
        )
        [call] = first.choices[0].message.tool_calls or []
        result = {"file": {"id": "f-imported", "sizes": [3, 4]}}
        second = client.chat.completions.create(
            model="bound-results",
            messages=[
                {"role": "user", "content": "go"},
                first.choices[0].message.model_dump(exclude_none=True),  # type: ignore[list-item]
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)},
            ],
            tools=TOOLS,
        )
    [bound] = second.choices[0].message.tool_calls or []
    assert bound.type == "function"
    assert json.loads(bound.function.arguments) == {"file_id": "f-imported", "sizes": [4]}


def test_a_model_name_clash_is_a_warning(tmp_path: Path) -> None:
    write(tmp_path, "a/first", BOUND)
    write(tmp_path, "b/second", BOUND)
    report = diagnose([tmp_path])
    [clash] = [p for p in report.problems if p.check == "model_name_clash"]
    assert clash.severity == "warning" and clash.path.endswith("second.json")
    assert "'bound-results'" in clash.message and "first.json" in clash.message
    assert report.ok() and not report.ok(strict=True)


# -- cassettes -------------------------------------------------------------------------


def vcr_interaction(
    request_headers: dict[str, list[str]], response_headers: dict[str, list[str]]
) -> dict[str, Any]:
    return {
        "request": {
            "body": json.dumps({"messages": ASK, "model": "gpt-4o-mini"}),
            "headers": request_headers,
            "method": "POST",
            "uri": URI,
        },
        "response": {
            "body": {"string": json.dumps(COMPLETION)},
            "headers": response_headers,
            "status": {"code": 200, "message": "OK"},
        },
    }


CLOUDFLARE = [
    "__cf_bm=Hk4.zT8mQ2_vLr9wXp1c6bN0aJf3sYd7eGu5iOk-1747310000-1.0.1.1-AbCdEfGhIjKlMnOpQrStUv;"
    " path=/; expires=Thu, 15-May-25 12:30:00 GMT; domain=.api.openai.com; HttpOnly; Secure;"
    " SameSite=None",
    "_cfuvid=Qm3nZ8pL1vXr7cT2wYb9hJ4kF6sD0aGe5iUo-1747310000000-0.0.1.1-604800000; path=/;"
    " domain=.api.openai.com; HttpOnly; Secure; SameSite=None",
]
RESPONSE_HEADERS = {
    "Content-Type": ["application/json"],
    "openai-organization": ["user-4xq9zt2bml0c8v7n"],
    "openai-project": ["proj_Zr8kQ2mW5vX1bN7cJ4tY9pLs"],
    "openai-processing-ms": ["312"],
    "Set-Cookie": CLOUDFLARE,
}


def write_cassette(path: Path, cassette: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.dump(cassette, Dumper=yaml.Dumper), "utf-8")


def test_filter_placeholders_account_ids_and_cloudflare_cookies_are_not_secrets(
    tmp_path: Path,
) -> None:
    request_headers = {
        "authorization": ["AUTHORIZATION-XXX"],
        "openai-organization": ["org-Ab12Cd34Ef56Gh78Ij90"],
        "openai-project": ["proj_Zr8kQ2mW5vX1bN7cJ4tY9pLs"],
        "content-type": ["application/json"],
    }
    write_cassette(
        tmp_path / "test_chat.yaml",
        {"interactions": [vcr_interaction(request_headers, RESPONSE_HEADERS)], "version": 1},
    )
    errors, warnings = report_of(tmp_path)
    assert errors == [] and warnings == []
    assert main(["doctor", str(tmp_path)]) == 0


def test_a_real_key_or_session_cookie_still_fails(tmp_path: Path) -> None:
    key = "sk-proj-" + "R3alKeyShape" * 4
    write_cassette(
        tmp_path / "key.yaml",
        {
            "interactions": [
                vcr_interaction({"authorization": [f"Bearer {key}"]}, RESPONSE_HEADERS)
            ],
            "version": 1,
        },
    )
    write_cassette(
        tmp_path / "cookie.yaml",
        {
            "interactions": [
                vcr_interaction(
                    {"cookie": ["session=9f8e7d6c5b4a; __cf_bm=abc"]}, {"Content-Type": ["a/json"]}
                )
            ],
            "version": 1,
        },
    )
    found = {p.path.rsplit("/", 1)[-1]: p.message for p in diagnose([tmp_path]).errors}
    assert set(found) == {"key.yaml", "cookie.yaml"}
    assert "shaped like an API key" in found["key.yaml"]
    assert "credential header" in found["cookie.yaml"]


@pytest.mark.parametrize(
    ("value", "secret"),
    [
        ("AUTHORIZATION-XXX", False),
        ("Bearer <OPENAI_API_KEY>", False),
        ("***", False),
        ("DUMMY", False),
        ("Bearer a9XXXq2ZrT7mWvB1", True),  # XXX inside a token is not a placeholder
        ("Bearer eyJhbGciOiJIUzI1NiJ9.e30.xXx", True),
    ],
)
def test_only_whole_placeholders_pass(tmp_path: Path, value: str, secret: bool) -> None:
    write_cassette(
        tmp_path / "c.yaml",
        {"interactions": [vcr_interaction({"authorization": [value]}, {})], "version": 1},
    )
    assert bool(diagnose([tmp_path]).errors) is secret


def pydantic_ai_cassette() -> dict[str, Any]:
    """As pydantic-ai's JSON-body serializer writes a cassette: JSON bodies kept parsed
    (``parsed_body``) instead of vcrpy's raw ``body``."""
    return {
        "interactions": [
            {
                "request": {
                    "headers": {"content-type": ["application/json"]},
                    "method": "POST",
                    "parsed_body": {"messages": ASK, "model": "gpt-4o-mini"},
                    "uri": URI,
                },
                "response": {
                    "headers": {"content-type": ["application/json"]},
                    "parsed_body": COMPLETION,
                    "status": {"code": 200, "message": "OK"},
                },
            }
        ],
        "version": 1,
    }


def test_pydantic_ai_cassettes_load_and_replay(tmp_path: Path) -> None:
    write_cassette(tmp_path / "test_openai" / "test_request_simple.yaml", pydantic_ai_cassette())
    store = RecordingStore.load([tmp_path])
    assert store.errors == [] and len(store.exchanges) == 1
    assert main(["doctor", str(tmp_path)]) == 0
    with ChaosServer(tmp_path) as server, openai_client(server) as client:
        completion = client.chat.completions.create(model="gpt-4o-mini", messages=ASK)
    assert completion.choices[0].message.content == "Bonjour !"
    assert completion.id == COMPLETION["id"]


@pytest.mark.parametrize("part", ["request", "response"])
def test_a_really_missing_body_says_so(tmp_path: Path, part: str) -> None:
    cassette = pydantic_ai_cassette()
    del cassette["interactions"][0][part]["parsed_body"]
    write_cassette(tmp_path / "gone.yaml", cassette)
    [problem] = diagnose([tmp_path]).errors
    assert problem.check == "unreadable"
    assert f"interactions[0].{part}.body is missing" in problem.message
    assert "is not JSON" not in problem.message


# -- DocsGPT's _comment ----------------------------------------------------------------


def test_comment_is_shown_by_ls_and_kept_by_import(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fixtures = tmp_path / "mock_llm_fixtures"
    comment = "onboarding summary, used by the e2e chat spec"
    write_fixture(
        fixtures,
        HASHED_ASK,
        {
            "_comment": comment,
            "response": {"content": "Here is a summary.", "finish_reason": "stop"},
        },
    )
    assert main(["ls", str(fixtures)]) == 0
    assert comment in capsys.readouterr().out
    out = tmp_path / "native"
    assert main(["import", "hash-keyed", str(fixtures), str(out)]) == 0
    [exchange] = RecordingStore.load([out]).exchanges
    assert exchange.meta["comment"] == comment
    capsys.readouterr()
    assert main(["ls", str(out)]) == 0
    assert comment in capsys.readouterr().out
    with ChaosServer(out) as server, openai_client(server) as client:
        answer = client.chat.completions.create(**HASHED_ASK)
    assert answer.choices[0].message.content == "Here is a summary."


def test_doctor_counts_session_recordings_and_reports_bad_ones(tmp_path: Path) -> None:
    from tests.helpers import RECORDINGS

    good = json.loads((RECORDINGS / "realtime-text/0001.json").read_text("utf-8"))
    (tmp_path / "good").mkdir()
    (tmp_path / "good/0001.json").write_text(json.dumps(good), encoding="utf-8")
    silent = {**good, "session": {**good["session"], "events": good["session"]["events"][:1]}}
    (tmp_path / "silent").mkdir()
    (tmp_path / "silent/0001.json").write_text(json.dumps(silent), encoding="utf-8")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad/0001.json").write_text(
        json.dumps({**good, "provider": "openai.telepathy"}), encoding="utf-8"
    )
    report = diagnose([tmp_path])
    assert report.sessions == 2 and report.recordings == 0
    found = {(p.severity, p.check, Path(p.path).parent.name) for p in report.problems}
    assert found == {
        ("error", "bad_session", "bad"),
        ("warning", "session_without_turns", "silent"),
    }
    assert "2 session recordings" in report.render()
    shipped = diagnose([RECORDINGS])
    assert shipped.sessions == 6 and shipped.ok(strict=True)
