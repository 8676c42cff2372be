"""What `chaosllm` says to a person, line by line: each error is one line on stderr with
its cause first and the documented exit status (0 ok, 1 a failure at run time, 2 a wrong
command line); "did you mean" for mistyped names; no traceback on a closed pipe or a
second Ctrl-C; the one-line answers of `fault arm`, `fault list` and `fault clear`; the
access log and the lines for a fault that fires and a recording written."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from chaosllm import ChaosServer
from chaosllm.errors import ServerError
from tests.helpers import CLI, request_body, serving

pytestmark = pytest.mark.timeout(60)

TIMEOUT = 30.0
ASK = request_body("knowledge/0001", stream=False)


def run(*args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAOSLLM_")}
    if url is not None:
        env["CHAOSLLM_URL"] = url
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=TIMEOUT, env=env)


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The error line: one, the last on stderr (`serve` may have said what it loaded)."""
    lines = result.stderr.splitlines()
    assert "Traceback" not in result.stderr
    errors = [line for line in lines if line.startswith("chaosllm: error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], result.stderr
    assert all(line.startswith("chaosllm: ") for line in lines), result.stderr
    return errors[0]


# -- usage errors: exit 2 -----------------------------------------------------------------


def test_a_mistyped_flag_suggests_the_right_one() -> None:
    result = run("serve", "--prot", "0")
    assert result.returncode == 2
    line = one_line(result)
    assert line.startswith("chaosllm: error: unrecognized arguments: --prot")
    assert "did you mean '--port'" in line


def test_a_mistyped_command_suggests_the_right_one() -> None:
    result = run("sevre")
    assert result.returncode == 2
    assert "invalid choice: 'sevre'" in one_line(result)
    assert "did you mean 'serve'?" in result.stderr


def test_a_mistyped_fault_type_suggests_the_closest() -> None:
    result = run("fault", "arm", "http_530")
    assert result.returncode == 2
    assert one_line(result) == (
        "chaosllm: error: argument TYPE: unknown fault type 'http_530' (did you mean "
        "'http_503' or 'http_429'?) (see `chaosllm fault arm --help`)"
    )


def test_an_unknown_profile_exits_2_with_suggestions() -> None:
    result = run("serve", "--port", "0", "--profile", "flakey")
    assert result.returncode == 2
    line = one_line(result)
    assert line.startswith(
        "chaosllm: error: --profile: unknown profile 'flakey' (did you mean 'flaky-provider'?)"
    )
    assert "shipped profiles: flaky-provider" in line


def test_recordings_that_are_a_file_say_so(tmp_path: Path) -> None:
    afile = tmp_path / "somefile.py"
    afile.write_text("print()\n")
    result = run("serve", "--port", "0", "--recordings", str(afile))
    assert result.returncode == 2
    assert one_line(result).startswith(
        f"chaosllm: error: --recordings {afile} is a file, not a directory"
    )


def test_recordings_that_do_not_exist_say_so(tmp_path: Path) -> None:
    result = run("serve", "--port", "0", "--recordings", str(tmp_path / "nope"))
    assert result.returncode == 2
    assert one_line(result).startswith(
        f"chaosllm: error: --recordings {tmp_path / 'nope'} does not exist"
    )


def test_an_unknown_provider_for_ls_suggests_the_closest() -> None:
    result = run("ls", "--provider", "antropic.messages")
    assert result.returncode == 2
    assert one_line(result).startswith(
        "chaosllm: error: unknown provider 'antropic.messages' (did you mean 'anthropic.messages'?)"
    )


# -- failures at run time: exit 1 -----------------------------------------------------------


def test_a_port_in_use_is_one_line_cause_first() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run("serve", "--port", str(port))
    assert result.returncode == 1
    assert one_line(result) == (
        f"chaosllm: error: port {port} is already in use: cannot listen on 127.0.0.1:{port} "
        f"while another process does; stop it, or pick another port (port 0 picks a free one)"
    )


def test_chaos_server_on_a_port_in_use_names_the_cause_not_a_group() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ServerError) as raised:
            ChaosServer(port=port).start()
    message = str(raised.value)
    assert message.startswith(f"port {port} is already in use")
    assert "ExceptionGroup" not in message and "\n" not in message


def test_a_parameter_the_type_does_not_take_is_one_line() -> None:
    with ChaosServer() as server:
        result = run("fault", "arm", "http_503", "--after-chunks", "2", url=server.url)
    assert result.returncode == 1
    line = one_line(result)
    assert line.startswith(
        "chaosllm: error: http_503 has no parameter 'after_chunks' (a parameter of "
        "truncated_stream, dropped_connection"
    )
    assert "; http_503 takes retry_after, message (400 from " in line


# -- what the fault commands print ----------------------------------------------------------


def test_fault_arm_prints_one_line_and_json_on_request() -> None:
    with ChaosServer() as server:
        armed = run("fault", "arm", "connection_reset", "--after-chunks", "2", url=server.url)
        assert (armed.returncode, armed.stdout) == (
            0,
            "armed connection_reset#1 (after_chunks=2, remaining=1)\n",
        )
        as_json = run("fault", "arm", "http_503", "--json", url=server.url)
        assert as_json.returncode == 0
        assert json.loads(as_json.stdout)["ids"] == ["flt_2"]
        cleared = run("fault", "clear", "#1", url=server.url)
        assert (cleared.returncode, cleared.stdout) == (0, "disarmed 1 fault\n")
        assert [f["id"] for f in server.faults()["armed"]] == ["flt_2"]


def test_an_empty_fault_list_says_so() -> None:
    with ChaosServer() as server:
        result = run("fault", "list", url=server.url)
    assert (result.returncode, result.stdout) == (
        0,
        "no faults armed, none fired since the last reset\n",
    )


# -- no tracebacks --------------------------------------------------------------------------


def test_a_closed_pipe_ends_quietly() -> None:
    """`chaosllm ls | head -1`: the reader went away before the first write."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [*CLI, "ls"], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=TIMEOUT
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 0
    assert proc.stderr == ""


def test_a_second_ctrl_c_stops_at_once_with_one_line() -> None:
    with serving() as (url, proc):
        httpx.post(url + "/__fault", json={"type": "stall", "max_ms": 30000}, timeout=5)

        def stalled() -> None:
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(url + "/v1/chat/completions", json=ASK, timeout=40)

        threading.Thread(target=stalled, daemon=True).start()
        deadline = time.monotonic() + 10
        while not httpx.get(url + "/__requests", timeout=5).json()["requests"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)
        err = proc.stderr.read() if proc.stderr else ""
    assert proc.returncode == 130
    assert "Traceback" not in err
    assert err.splitlines()[-2:] == [
        "chaosllm: received SIGINT: shutting down",
        "chaosllm: SIGINT again: stopped without waiting for open responses",
    ]


# -- logs --------------------------------------------------------------------------------


def test_serve_logs_what_it_loaded_and_each_request() -> None:
    with serving() as (url, proc):
        httpx.post(url + "/__fault", json={"type": "http_503"}, timeout=5)
        httpx.post(url + "/v1/chat/completions", json=ASK, timeout=5)
        httpx.post(url + "/v1/chat/completions", json=ASK, timeout=5)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        err = proc.stderr.read() if proc.stderr else ""
    lines = err.splitlines()
    assert lines[0].startswith("chaosllm: loaded ") and " recordings from " in lines[0]
    access = [line for line in lines if "POST /v1/chat/completions" in line]
    assert access[0].startswith(
        "chaosllm: POST /v1/chat/completions exact knowledge/0001 503 fault=http_503#flt_1 "
    )
    assert access[0].endswith("ms")
    assert (
        access[1]
        == "chaosllm: fault http_503#flt_1 fired on request #1 (POST /v1/chat/completions)"
    )
    assert access[2].startswith(
        "chaosllm: POST /v1/chat/completions exact knowledge/0001 200 fault=- "
    )


def test_quiet_hides_the_access_log_and_verbose_is_accepted() -> None:
    with serving("--quiet") as (url, proc):
        httpx.post(url + "/v1/chat/completions", json=ASK, timeout=5)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        err = proc.stderr.read() if proc.stderr else ""
    assert err == ""
    with serving("-v") as (url, proc):
        assert httpx.get(url + "/health", timeout=5).status_code == 200


def test_an_empty_recordings_directory_is_a_warning_naming_it(tmp_path: Path) -> None:
    with serving("--recordings", str(tmp_path)) as (_url, proc):
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        err = proc.stderr.read() if proc.stderr else ""
    assert (
        f"chaosllm: warning: {tmp_path} holds no recordings: every request will be a miss (404)"
    ) in err


# -- ls ----------------------------------------------------------------------------------


def test_ls_shows_each_recordings_provider_and_question() -> None:
    result = run("ls", "--provider", "anthropic.messages")
    assert result.returncode == 0
    rows = result.stdout.splitlines()
    assert rows[-1].startswith(f"{len(rows) - 1} recordings of provider anthropic.messages")
    text = [r for r in rows if r.startswith("anthropic-text/0001")]
    assert text and "anthropic.messages" in text[0]
    assert "'What is the capital of France?'" in text[0]
    assert all(" anthropic.messages " in r for r in rows[:-1])


def test_a_miss_suggests_ls_for_its_provider() -> None:
    with ChaosServer() as server:
        answer = httpx.post(
            server.url + "/v1/messages",
            json={
                "model": "claude-sonnet-4-6",
                "max_tokens": 64,
                "messages": [{"role": "user", "content": "Hello"}],
            },
            headers={"anthropic-version": "2023-06-01"},
            timeout=10,
        )
    assert answer.status_code == 404
    assert "`chaosllm ls --provider anthropic.messages`" in answer.json()["error"]["message"]
