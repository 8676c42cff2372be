"""The `chaosllm` command, run as a user runs it: a subprocess."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from chaosllm import ChaosServer
from tests.helpers import CLI, free_port, recording, request_body, serving


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=30, env={**os.environ, **(env or {})}
    )


def test_serve_prints_its_url_serves_and_stops_on_sigterm() -> None:
    with serving() as (url, proc):
        with httpx.Client(timeout=10) as client:
            assert client.get(url + "/health").json()["status"] == "ok"
            r = client.post(
                url + "/v1/chat/completions", json=request_body("simple-chat/0001", stream=False)
            )
            assert r.json() == recording("simple-chat/0001")["response"]["body"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0


def test_serve_with_uvicorn() -> None:
    with serving("--server", "uvicorn") as (url, _), httpx.Client(timeout=10) as client:
        r = client.post(
            url + "/v1/chat/completions", json=request_body("simple-chat/0001", stream=False)
        )
        assert r.status_code == 200


def test_serve_reports_a_corrupt_recording_and_serves_the_rest(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "0001.json").write_text('{"chaosllm": 1, "request": 3}')
    (tmp_path / "s" / "0002.json").write_text(json.dumps(recording("simple-chat/0001")))
    with serving("--recordings", str(tmp_path)) as (url, proc), httpx.Client(timeout=10) as client:
        assert client.get(url + "/health").json()["recordings"] == 1
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        assert proc.stderr is not None
        err = proc.stderr.read()
    assert "0001.json" in err and '"request" must be an object' in err


def test_serve_with_profile_arms_it(tmp_path: Path) -> None:
    with serving("--profile", "rate-limit-burst") as (url, _), httpx.Client(timeout=10) as client:
        armed = client.get(url + "/__fault").json()["armed"]
        assert [(f["type"], f["remaining"]) for f in armed] == [("http_429", 3)]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--recordings", "/nonexistent/dir"], "does not exist"),
        (["--mode", "record"], "needs --upstream URL"),
        (["--mode", "bogus"], "invalid choice 'bogus'"),
        (["--timing", "slowly"], "invalid timing"),
        (["--match", "exact,psychic"], "unknown matcher 'psychic'"),
        (["--port", "70000"], "outside 0-65535"),
        (["--journal-size", "0"], "--journal-size must be at least 1"),
        (["--profile", "no-such-profile"], "unknown profile"),
        (["--profile", "../../etc/passwd"], "bad profile name"),
    ],
)
def test_serve_refuses_bad_flags(args: list[str], fragment: str) -> None:
    result = run("serve", "--port", "0", *args)
    assert result.returncode != 0
    assert fragment in result.stderr


def test_serve_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = run("serve", "--port", str(taken.getsockname()[1]))
    assert result.returncode == 1 and "cannot listen on 127.0.0.1" in result.stderr


def test_ls_lists_recordings_and_fails_on_corrupt_files(tmp_path: Path) -> None:
    result = run("ls")
    assert result.returncode == 0 and "simple-chat/0001" in result.stdout
    listing = json.loads(run("ls", "--json").stdout)
    assert len(listing["recordings"]) >= 20 and listing["errors"] == []
    (tmp_path / "bad.json").write_text("nope")
    result = run("ls", str(tmp_path))
    assert result.returncode == 1 and "not valid JSON" in result.stderr


def test_ls_lists_session_recordings() -> None:
    result = run("ls")
    assert "realtime-tools/0001" in result.stdout and "session 2 turns" in result.stdout
    assert "6 session recordings" in result.stdout
    listing = json.loads(run("ls", "--json").stdout)
    names = {s["name"] for s in listing["sessions"]}
    assert {"realtime-text/0001", "gemini-live-tools/0001"} <= names
    only = run("ls", "--provider", "openai.realtime")
    assert only.returncode == 0 and "realtime-text/0001" in only.stdout
    assert "gemini-live" not in only.stdout and "simple-chat" not in only.stdout


def test_fault_commands_against_a_running_server() -> None:
    with ChaosServer() as server:
        env = {"CHAOSLLM_URL": server.url}
        result = run(
            "fault",
            "arm",
            "http_429",
            "--retry-after",
            "2",
            "--remaining",
            "2",
            "--session",
            "s1",
            "--json",
            env=env,
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["ids"] == ["flt_1"]
        assert server.faults()["armed"][0]["match"] == {"session": "s1"}
        listed = run("fault", "list", env=env).stdout
        assert "flt_1" in listed and "http_429" in listed and "remaining=2" in listed
        bad = run("fault", "arm", "http_503", "--after-chunks", "3", env=env)
        assert bad.returncode == 1 and "has no parameter 'after_chunks'" in bad.stderr
        assert run("fault", "profile", "outage-recovers", env=env).returncode == 0
        assert len(server.faults()["armed"]) == 4
        assert run("fault", "clear", "flt_1", env=env).returncode == 0
        assert run("fault", "clear", env=env).returncode == 0
        assert server.faults()["armed"] == []
        gone = run("fault", "clear", "flt_1", env=env)
        assert gone.returncode == 1 and "No armed fault" in gone.stderr


def test_fault_url_and_token_also_after_the_action() -> None:
    """`--url` and `--token` go before or after the action (after wins), as users type
    them: ``chaosllm fault arm http_503 --url U --token T``."""
    nowhere = "http://127.0.0.1:9"
    env = {"CHAOSLLM_URL": nowhere, "CHAOSLLM_CONTROL_TOKEN": ""}
    with serving("--control-token", "s3cret") as (url, _):
        armed = run(
            "fault", "arm", "http_503", "--url", url, "--token", "s3cret", "--json", env=env
        )
        assert armed.returncode == 0, armed.stderr
        assert json.loads(armed.stdout)["faults"][0]["type"] == "http_503"
        refused = run("fault", "list", "--url", url, env=env)
        assert refused.returncode == 1 and "403" in refused.stderr
        before = run("fault", "--url", url, "--token", "s3cret", "list", env=env)
        assert before.returncode == 0 and "http_503" in before.stdout
        after_wins = run(
            "fault", "--url", nowhere, "--token", "s3cret", "clear", "--url", url, "--json", env=env
        )
        assert after_wins.returncode == 0, after_wins.stderr
        assert json.loads(after_wins.stdout) == {"disarmed": 1}


def test_fault_command_with_no_server() -> None:
    result = run("fault", "list", env={"CHAOSLLM_URL": f"http://127.0.0.1:{free_port()}"})
    assert result.returncode == 1 and "cannot reach the server" in result.stderr


def test_start_up_does_not_import_what_replay_never_needs() -> None:
    """Start-up time is a target (<= 1 s with 10k recordings): the HTTP client, YAML and
    JSON Schema are imported only by the features that use them."""
    code = (
        "import sys, chaosllm.cli; "
        "print(sorted(m for m in ('httpx', 'yaml', 'jsonschema') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30
    )
    assert result.stdout.strip() == "[]", result.stderr
