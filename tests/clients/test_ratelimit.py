"""Live rate limits on real sockets: through the openai and anthropic SDKs on a server
driven by a `ManualClock` (the headers count down, the 429's ``retry-after-ms`` is the
computed wait, the clock moved by exactly that serves again: no sleeping), the control
plane's ``/__ratelimit``, ``ChaosServer(rate_limit=)`` and the CLI's ``--rate-limit``."""

from __future__ import annotations

import subprocess
import time
from typing import Any

import anthropic
import httpx
import openai
import pytest

from chaosllm import ChaosServer
from chaosllm.core.clock import ManualClock
from chaosllm.errors import ConfigError, ServerError
from chaosllm.providers.ratelimits import rfc3339
from tests.helpers import CLI, chat_messages, openai_client, recording, request_body, serving

pytestmark = pytest.mark.timeout(60)

CHAT = "simple-chat/0001"
MESSAGES = recording("anthropic-text/0001")["request"]["body"]


def chat(client: openai.OpenAI, **extra: Any) -> Any:
    body = request_body(CHAT, stream=False)
    return client.chat.completions.with_raw_response.create(
        model=body["model"],
        messages=chat_messages(body["messages"]),
        temperature=body["temperature"],
        **extra,
    )


def test_the_openai_sdk_sees_the_headers_count_down_and_the_exact_wait() -> None:
    clock = ManualClock()
    with (
        ChaosServer(rate_limit="rpm=3,tpm=100000", clock=clock) as server,
        openai_client(server) as client,
    ):
        answers = [chat(client) for _ in range(3)]
        remaining = [a.headers["x-ratelimit-remaining-requests"] for a in answers]
        assert remaining == ["2", "1", "0"]
        tokens = [int(a.headers["x-ratelimit-remaining-tokens"]) for a in answers]
        assert tokens[0] > tokens[1] > tokens[2] and tokens[0] - tokens[1] == tokens[1] - tokens[2]
        assert answers[0].headers["x-ratelimit-limit-requests"] == "3"
        assert answers[0].headers["x-ratelimit-reset-requests"] == "20s"
        assert answers[2].headers["x-ratelimit-reset-requests"] == "1m0s"
        assert answers[2].parse().choices[0].message.content
        with pytest.raises(openai.RateLimitError) as caught:
            chat(client)
        response = caught.value.response
        # One request comes back in 60 s / 3 = 20 s: exactly what the 429 says.
        assert response.headers["retry-after-ms"] == "20000"
        assert response.headers["retry-after"] == "20"
        assert response.headers["x-ratelimit-remaining-requests"] == "0"
        assert caught.value.code == "rate_limit_exceeded"
        clock.advance(19.999)
        with pytest.raises(openai.RateLimitError) as again:
            chat(client)
        assert again.value.response.headers["retry-after-ms"] == "1"
        clock.advance(0.001)
        assert chat(client).headers["x-ratelimit-remaining-requests"] == "0"
        journal = server.requests()
        assert [e["rate_limited"] for e in journal] == [False] * 3 + [True, True, False]
        assert [e["status"] for e in journal] == [200, 200, 200, 429, 429, 200]
        assert journal[3]["retry_after"] == 20.0


def test_the_openai_sdk_retries_the_429_after_the_wait_it_was_told() -> None:
    """The SDK sleeps ``retry-after-ms`` (1 s here) and retries; the test's clock moves by
    the wait the 429 announced as the SDK receives it, so the retry is served."""
    clock = ManualClock()
    waits: list[str] = []

    def on_response(response: httpx.Response) -> None:
        if response.status_code == 429:
            waits.append(response.headers["retry-after-ms"])
            clock.advance(int(response.headers["retry-after-ms"]) / 1000)

    with (
        ChaosServer(rate_limit="rpm=60", clock=clock) as server,
        httpx.Client(event_hooks={"response": [on_response]}) as http,
        openai_client(server, max_retries=1, http_client=http) as client,
    ):
        for _ in range(60):
            chat(client)
        answer = chat(client)  # refused once, then served after the wait it was told
        assert waits == ["1000"]
        assert answer.status_code == 200 and answer.retries_taken == 1
        assert [e["status"] for e in server.requests()][-2:] == [429, 200]


def test_keys_and_sessions_have_their_own_buckets_on_the_wire() -> None:
    clock = ManualClock()
    with ChaosServer(rate_limit={"rpm": 1}, clock=clock) as server:
        with openai_client(server, api_key="sk-a") as a, openai_client(server, api_key="sk-b") as b:
            assert chat(a).status_code == 200
            with pytest.raises(openai.RateLimitError):
                chat(a)
            assert chat(b).status_code == 200
            session = {"extra_headers": {"X-Chaosllm-Session": "t1"}}
            assert chat(a, **session).status_code == 200
        state = httpx.get(f"{server.url}/__ratelimit", timeout=10).json()
        assert state["rate_limit"] == {"rpm": 1, "tpm": None}
        assert len(state["buckets"]) == 3
        assert {b["session"] for b in state["buckets"]} == {None, "t1"}
        shown = repr(state) + repr(server.requests())
        assert "sk-a" not in shown and "sk-b" not in shown
        only = server.rate_limits("t1")["buckets"]
        assert len(only) == 1 and only[0]["requests"]["remaining"] == 0
        assert only[0]["requests"]["reset_ms"] == 60000


def test_the_anthropic_sdk_sees_anthropics_headers_and_its_429() -> None:
    clock = ManualClock()
    with (
        ChaosServer(rate_limit="rpm=2,tpm=30000", clock=clock) as server,
        anthropic.Anthropic(base_url=server.url, api_key="sk-ant", max_retries=0) as client,
    ):
        answers = [client.messages.with_raw_response.create(**MESSAGES) for _ in range(2)]
        assert [a.headers["anthropic-ratelimit-requests-remaining"] for a in answers] == [
            "1",
            "0",
        ]
        first = answers[0].headers
        assert first["anthropic-ratelimit-requests-limit"] == "2"
        assert first["anthropic-ratelimit-requests-reset"] == rfc3339(clock.wall() + 30)
        out = answers[0].parse().usage.output_tokens
        assert int(first["anthropic-ratelimit-output-tokens-remaining"]) == 30000 - out
        assert int(first["anthropic-ratelimit-input-tokens-remaining"]) < 30000
        total = int(first["anthropic-ratelimit-tokens-remaining"])
        inputs = int(first["anthropic-ratelimit-input-tokens-remaining"])
        assert total == inputs - out
        assert not any(name.startswith("x-ratelimit") for name in first)
        with pytest.raises(anthropic.RateLimitError) as caught:
            client.messages.create(**MESSAGES)
        assert caught.value.response.headers["retry-after-ms"] == "30000"
        assert caught.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
        clock.advance(30)
        assert client.messages.create(**MESSAGES).content


def test_the_control_plane_sets_reads_and_clears_the_limits() -> None:
    clock = ManualClock()
    with (
        ChaosServer(clock=clock) as server,
        httpx.Client(base_url=server.url, timeout=10) as control,
        openai_client(server) as client,
    ):
        assert control.get("/__ratelimit").json() == {"rate_limit": None, "buckets": []}
        assert "x-ratelimit-remaining-requests" not in chat(client).headers
        for bad in ({"rpm": 0}, {"rpm": 5, "rpd": 1}, {}, [1], {"tpm": "many"}):
            refused = control.post("/__ratelimit", json=bad)
            assert refused.status_code == 400, bad
            assert refused.json()["error"]["code"] == "invalid_rate_limit"
        assert (
            control.post(
                "/__ratelimit", content=b"{", headers={"content-type": "application/json"}
            ).status_code
            == 400
        )
        assert control.get("/__ratelimit").json()["rate_limit"] is None  # nothing applied
        set_ = control.post("/__ratelimit", json={"rpm": 1})
        assert set_.status_code == 200 and set_.json() == {"rate_limit": {"rpm": 1, "tpm": None}}
        assert chat(client).headers["x-ratelimit-remaining-requests"] == "0"
        with pytest.raises(openai.RateLimitError):
            chat(client)
        assert control.post("/__reset").status_code == 200  # every bucket full again
        assert chat(client).status_code == 200
        assert control.delete("/__ratelimit").json() == {"rate_limit": None, "disabled": True}
        assert "x-ratelimit-remaining-requests" not in chat(client).headers
        armed = control.post("/__profile", json={"profile": "rate-limited-burst"})
        assert armed.status_code == 201
        assert armed.json()["rate_limit"] == {"rpm": 5, "tpm": 20000}
        assert chat(client).headers["x-ratelimit-remaining-requests"] == "4"
        server.set_rate_limit(None)
        assert server.rate_limits() == {"rate_limit": None, "buckets": []}
        with pytest.raises(ConfigError):
            server.set_rate_limit("rpm=-1")


def test_chaos_server_refuses_a_bad_limit_and_takes_a_profiles() -> None:
    with pytest.raises(ServerError, match="rpm must be a whole number above 0"):
        ChaosServer(rate_limit="rpm=0")
    with pytest.raises(ServerError, match="'burst=3' is not rpm=N"):
        ChaosServer(rate_limit="burst=3")
    with ChaosServer(profile="rate-limited-burst") as server:
        assert server.rate_limits()["rate_limit"] == {"rpm": 5, "tpm": 20000}


def test_the_cli_flag_parses_strictly_and_serves_live_headers() -> None:
    for bad in ("rpm=0", "rpm=5,tpm=x", "rps=5", "rpm=1,rpm=2"):
        done = subprocess.run(
            [*CLI, "serve", "--port", "0", "--rate-limit", bad],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 2, (bad, done.stderr)
        assert "--rate-limit: invalid rate limit" in done.stderr
    with serving("--rate-limit", "rpm=1") as (url, _), httpx.Client(timeout=10) as client:
        body = request_body(CHAT, stream=False)
        started = time.monotonic()
        first = client.post(f"{url}/v1/chat/completions", json=body)
        assert first.headers["x-ratelimit-remaining-requests"] == "0"
        assert first.headers["x-ratelimit-reset-requests"] == "1m0s"
        limited = client.post(f"{url}/v1/chat/completions", json=body)
        elapsed_ms = (time.monotonic() - started) * 1000
        # The real clock: the wait is the first answer's reset (60 s) less the time since.
        wait = int(limited.headers["retry-after-ms"])
        assert limited.status_code == 429 and 60000 - elapsed_ms - 1 <= wait <= 60000
        assert limited.headers["retry-after"] == "60"
