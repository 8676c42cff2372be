"""Credentials redacted by what the request carries, not by their shape (issue #23): an
Azure key, a gateway token, an AWS access key id and session token, a ``?key=`` value,
none shaped like ``sk-``/``AIza``, never reach the recording (request or upstream answer),
the journal or the keying; and replay still matches the recording."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import httpx
import pytest

from chaosllm import ChaosServer
from chaosllm.store.redact import credential_values
from tests.helpers import chat_completion, loopback_upstream

pytestmark = pytest.mark.timeout(60)

AZURE = "0123456789abcdef0123456789abcdef"
GATEWAY = "gw-tok-Qm9vYmFy-zzz"
AKID = "AKIAQWERTYUIOPASDFGH"
SESSION = "FwoGZXIvYXdzEJr-session-token-value"
QUERY_KEY = "plainquerykey-778899"
CARRIED = (AZURE, GATEWAY, AKID, SESSION, QUERY_KEY)


class _Echo(BaseHTTPRequestHandler):
    """An upstream whose model quotes the prompt back, and the credential headers too."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        quoted = " ".join(
            [body["messages"][0]["content"], *(self.headers.get(h) or "" for h in ("api-key",))]
        )
        data = json.dumps(chat_completion(f"You said: {quoted}")).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def echo() -> Iterator[str]:
    with loopback_upstream(_Echo) as url:
        yield url


def _ask(url: str) -> httpx.Response:
    prompt = "My keys: " + " / ".join(CARRIED)
    headers = {
        "api-key": AZURE,
        "authorization": (
            f"AWS4-HMAC-SHA256 Credential={AKID}/20260101/us-east-1/bedrock/aws4_request, "
            "SignedHeaders=host, Signature=abc"
        ),
        "x-amz-security-token": SESSION,
        "x-api-key": GATEWAY,
    }
    with httpx.Client(timeout=10) as client:
        return client.post(
            url + f"/v1/chat/completions?key={QUERY_KEY}",
            json={"model": "m", "messages": [{"role": "user", "content": prompt}]},
            headers=headers,
        )


def test_the_credentials_of_each_protocol_are_found() -> None:
    found = credential_values(
        [
            (b"Authorization", b"Bearer gateway-token-123456"),
            (b"api-key", AZURE.encode()),
            (b"x-goog-api-key", b"google-plain-key-000"),
            (b"x-amz-security-token", SESSION.encode()),
            (b"content-type", b"application/json-and-longer"),
        ],
        b"alt=sse&key=" + QUERY_KEY.encode(),
    )
    assert "gateway-token-123456" in found
    assert {AZURE, "google-plain-key-000", SESSION, QUERY_KEY} <= set(found)
    assert "application/json-and-longer" not in found
    sigv4 = credential_values([("authorization", f"AWS4-HMAC-SHA256 Credential={AKID}/x/y")])
    assert AKID in sigv4
    assert credential_values([("authorization", "Bearer sk-test")]) == ()  # too short


@pytest.mark.parametrize("server", ["builtin", "h11", "uvicorn"])
def test_carried_credentials_never_reach_recording_or_journal_and_replay_matches(
    echo: str, tmp_path: Path, server: str
) -> None:
    record_dir = tmp_path / "rec"
    with ChaosServer(mode="record", upstream=echo, record_dir=record_dir, server=server) as proxy:
        answer = _ask(proxy.url)
        journal = json.dumps(proxy.requests())
    assert answer.status_code == 200
    assert AZURE in answer.text  # the client gets the upstream's answer as it is
    files = [p for p in record_dir.rglob("*") if p.is_file()]
    assert files
    for path in files:
        text = path.read_text("utf-8")
        for secret in CARRIED:
            assert secret not in text, (path, secret)
    recorded = json.loads(next(p for p in files if p.suffix == ".json").read_text())
    assert recorded["request"]["body"]["messages"][0]["content"].count("[REDACTED]") == 5
    for secret in CARRIED:
        assert secret not in journal
    with ChaosServer(record_dir, server=server) as replay:
        again = _ask(replay.url)
        assert [e["match"] for e in replay.requests()] == ["exact"]
        assert AZURE not in again.text


def test_a_missed_request_journal_holds_no_carried_credential(tmp_path: Path) -> None:
    with ChaosServer(tmp_path) as replay:
        assert _ask(replay.url).status_code >= 400
        journal = json.dumps(replay.requests())
    for secret in CARRIED:
        assert secret not in journal
