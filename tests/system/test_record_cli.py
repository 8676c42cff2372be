"""`chaosllm serve` as a recording proxy, run as a user runs it; and under uvicorn."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import httpx
import openai
import pytest

from chaosllm import ChaosServer
from chaosllm.store.recordings import shipped_dir
from tests.helpers import CLI, recording_proxy, request_body, serving

pytestmark = pytest.mark.timeout(60)

KEY = "sk-proj-" + "CliPlantedKey0123456" * 3


def test_serve_record_missing_records_then_replays(tmp_path: Path) -> None:
    secret = "a-configured-secret-value"
    body = request_body("simple-chat/0001", stream=True)
    with (
        ChaosServer() as upstream,
        serving(
            "--mode",
            "record-missing",
            "--upstream",
            upstream.url,
            "--record-dir",
            str(tmp_path),
            "--scenario",
            "mine",
            "--secret",
            secret,
            env={"CHAOSLLM_SECRETS": "other-secret-one,other-secret-two"},
        ) as (url, proc),
        openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=10) as client,
    ):
        first = [c.model_dump() for c in client.chat.completions.create(**body)]
        second = [c.model_dump() for c in client.chat.completions.create(**body)]
        assert first == second
        assert len(upstream.requests()) == 1
        journal = httpx.get(url + "/__requests", timeout=10).json()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert proc.stderr is not None
        err = proc.stderr.read()
    assert [(e["match"], e["recording"]) for e in journal["requests"]] == [
        ("upstream", "mine/0001"),
        ("exact", "mine/0001"),
    ]
    assert f"record-missing: proxying to {upstream.url}, recording to {tmp_path}" in err
    [path] = tmp_path.rglob("*.json")
    assert path.relative_to(tmp_path).as_posix() == "mine/0001.json"
    assert KEY not in path.read_text("utf-8")
    assert json.loads(path.read_text("utf-8"))["response"]["stream"] is True


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--mode", "passthrough"], "--mode passthrough needs --upstream URL"),
        (["--mode", "record", "--upstream", "http://127.0.0.1:9"], "give --record-dir DIR"),
        (
            [
                "--mode",
                "record",
                "--upstream",
                "http://127.0.0.1:9",
                "--recordings",
                str(shipped_dir("recordings")),
            ],
            "refusing to record into the shipped recordings",
        ),
        (["--mode", "passthrough", "--upstream", "not a url"], "invalid upstream URL"),
    ],
)
def test_serve_refuses_incomplete_proxy_configurations(args: list[str], fragment: str) -> None:
    result = subprocess.run(
        [*CLI, "serve", "--port", "0", *args], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert fragment in result.stderr


def test_passthrough_under_uvicorn(tmp_path: Path) -> None:
    with (
        recording_proxy("passthrough", server="uvicorn") as (upstream, proxy),
        openai.OpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0, timeout=10) as client,
    ):
        direct = request_body("streaming-tools/0001", stream=True)
        chunks = list(client.chat.completions.create(**direct))
        assert chunks[-1].usage is not None
        completion = client.chat.completions.create(
            **request_body("simple-chat/0001", stream=False)
        )
        assert completion.choices[0].message.content
        upstream.arm("dropped_connection", after_chunks=2)
        with pytest.raises(openai.APIConnectionError):
            list(client.chat.completions.create(**direct))
        proxy.arm("http_503")
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(**request_body("simple-chat/0001", stream=False))
