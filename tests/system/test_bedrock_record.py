"""Recording Bedrock through the proxy: boto3 -> ``chaosllm serve --mode record`` -> a small
upstream on loopback that speaks Converse (JSON and AWS's event stream, written here on
`http.server`). The upstream sees the path as botocore signed it (the model id
percent-encoded); the recordings keep the bound request and the exact frames and never the
SigV4 ``Authorization`` or any ``X-Amz-*`` header; a fresh server replays them equal."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import closing, contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote

import boto3
import pytest
from botocore.config import Config

from chaosllm import ChaosServer
from chaosllm.providers import PROVIDERS
from tests.clients.test_bedrock import assembled
from tests.helpers import loopback_upstream, write_chunk

BEDROCK = PROVIDERS["bedrock.converse"]
MODEL = "anthropic.claude-3-5-sonnet-20240620-v1:0"
ARN = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-haiku:0"
TOKEN = "IQoJb3JpZ2luX2VjEXAMPLESESSIONTOKEN"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
ANSWER = {
    "output": {
        "message": {
            "role": "assistant",
            "content": [
                {"text": "Let me look that up."},
                {
                    "toolUse": {
                        "toolUseId": "tooluse_upstream0000000001",
                        "name": "lookup",
                        "input": {"q": "tides"},
                    }
                },
            ],
        }
    },
    "stopReason": "tool_use",
    "usage": {"inputTokens": 31, "outputTokens": 22, "totalTokens": 53},
    "metrics": {"latencyMs": 250},
}


class Upstream(BaseHTTPRequestHandler):
    """Converse as Bedrock answers it (any model id), noting what each request carried."""

    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[tuple[str, dict[str, str]]]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        self.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
        if self.path.endswith("/converse-stream"):
            self.send_response(200)
            self.send_header("content-type", "application/vnd.amazon.eventstream")
            self.send_header("transfer-encoding", "chunked")
            self.send_header("x-amzn-requestid", "5f2c0f3e-0000-4000-8000-000000000001")
            self.end_headers()
            for text in BEDROCK.codec.stream_frames(ANSWER):
                frame = BEDROCK.codec.encode_frame(text)
                write_chunk(self, frame)
            self.wfile.write(b"0\r\n\r\n")
        else:
            data = json.dumps(ANSWER).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def upstream() -> Iterator[str]:
    Upstream.seen = []
    with loopback_upstream(Upstream) as url:
        yield url


def client(url: str) -> Any:
    return boto3.client(
        "bedrock-runtime",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="AKIAIOSFODNN7EXAMPLE",
        aws_secret_access_key=SECRET,
        aws_session_token=TOKEN,
        config=Config(retries={"total_max_attempts": 1}, read_timeout=10),
    )


def ask(model: str) -> dict[str, Any]:
    return {
        "modelId": model,
        "messages": [{"role": "user", "content": [{"text": "When is high tide?"}]}],
        "toolConfig": {
            "tools": [
                {
                    "toolSpec": {
                        "name": "lookup",
                        "inputSchema": {"json": {"type": "object"}},
                    }
                }
            ]
        },
    }


def events(sdk: Any, model: str) -> list[dict[str, Any]]:
    stream = sdk.converse_stream(**ask(model))["stream"]
    try:
        return list(stream)
    finally:
        stream.close()


def strip(response: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in response.items() if k != "ResponseMetadata"}


def test_record_then_replay_equal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    record_dir = tmp_path / "recorded"
    with (
        upstream() as url,
        ChaosServer(mode="record", upstream=url, record_dir=record_dir) as proxy,
        closing(client(proxy.url)) as sdk,
    ):
        live = strip(sdk.converse(**ask(MODEL)))
        streamed = events(sdk, MODEL)
        arn_live = strip(sdk.converse(**ask(ARN)))
    assert live == arn_live == ANSWER
    assert assembled(streamed) == ANSWER

    # The upstream got the path botocore signed: the model id percent-encoded whole.
    paths = [path for path, _ in Upstream.seen]
    assert paths == [
        "/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse",
        "/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse-stream",
        "/model/" + ARN.replace(":", "%3A").replace("/", "%2F") + "/converse",
    ]
    assert all(h["authorization"].startswith("AWS4-HMAC-SHA256 ") for _, h in Upstream.seen)
    assert all(h["x-amz-security-token"] == TOKEN for _, h in Upstream.seen)

    files = sorted(record_dir.rglob("*.json"))
    assert len(files) == 3
    recorded = [json.loads(f.read_text("utf-8")) for f in files]
    for file, data in zip(files, recorded, strict=True):
        text = file.read_text("utf-8")
        for secret in (TOKEN, SECRET, "AWS4-HMAC-SHA256", "AKIAIOSFODNN7EXAMPLE", "Signature="):
            assert secret not in text, (file, secret)
        assert "x-amz-" not in text.lower() and "authorization" not in text.lower()
        assert data["provider"] == "bedrock.converse"
        assert unquote(paths[recorded.index(data)]) == data["request"]["path"]
    by_path = {d["request"]["path"]: d for d in recorded}
    stream = by_path[f"/model/{MODEL}/converse-stream"]
    assert stream["request"]["body"]["modelId"] == MODEL
    assert stream["request"]["body"]["stream"] is True
    chunks = stream["response"]["chunks"]
    assert [c["data"] for c in chunks] == BEDROCK.codec.stream_frames(ANSWER)  # the exact frames
    assert stream["response"]["body"] == ANSWER
    assert by_path[f"/model/{ARN}/converse"]["request"]["body"]["modelId"] == ARN
    logged = caplog.text
    assert TOKEN not in logged and "AWS4-HMAC-SHA256" not in logged

    with ChaosServer(recordings=[record_dir]) as replay, closing(client(replay.url)) as sdk:
        assert strip(sdk.converse(**ask(MODEL))) == live
        assert events(sdk, MODEL) == streamed
        assert strip(sdk.converse(**ask(ARN))) == arn_live
        journal = replay.requests()
    assert [r["match"] for r in journal] == ["exact"] * 3
