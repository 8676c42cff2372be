"""Verdicts (issue #17) of real clients through the official `openai` SDK on real sockets:
four careless clients (`examples/careless_clients.py`) each get exactly the finding they
deserve, the reference resilient client (`examples/resilient_client.py`) none; and
``GET /__verdict`` over HTTP. Retry-After values and backoffs are a few hundredths of a
second; the tests themselves never sleep."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from chaosllm import ChaosServer, Finding
from chaosllm.errors import ConfigError
from tests.helpers import EXAMPLES, openai_client, request_body

sys.path.insert(0, str(EXAMPLES))
from careless_clients import gives_up_at_once, ignores_retry_after, no_backoff, retries_everything
from resilient_client import ResilientClient, RetryBudgetExceeded

pytestmark = pytest.mark.timeout(60)

CHAT = "simple-chat/0001"
STREAMED = "long-answer/0001"
_sessions = itertools.count(1)


@pytest.fixture(scope="module")
def chaos() -> Iterator[ChaosServer]:
    with ChaosServer() as server:
        yield server


@pytest.fixture
def session() -> str:
    return f"verdict-{next(_sessions)}"


@pytest.fixture
def sdk(chaos: ChaosServer, session: str) -> Iterator[openai.OpenAI]:
    with openai_client(chaos, default_headers={"X-Chaosllm-Session": session}) as client:
        yield client


def arm(chaos: ChaosServer, session: str, spec: dict[str, Any]) -> None:
    chaos.arm({**spec, "match": {"session": session}})


def names(found: list[Finding]) -> list[str]:
    return [f.name for f in found]


Client = Callable[[openai.OpenAI, dict[str, Any]], Any]


@pytest.mark.parametrize(
    ("client", "spec", "deserved"),
    [
        (ignores_retry_after, {"type": "http_429", "retry_after": 0.5}, "retry_after_ignored"),
        (no_backoff, {"type": "http_503", "remaining": 2}, "no_backoff"),
        (retries_everything, {"type": "http_error", "status": 400}, "retried_non_retryable"),
        (gives_up_at_once, {"type": "http_503"}, "gave_up_early"),
    ],
    ids=["ignores_retry_after", "no_backoff", "retries_everything", "gives_up_at_once"],
)
def test_each_careless_client_gets_the_finding_it_deserves(
    chaos: ChaosServer,
    sdk: openai.OpenAI,
    session: str,
    client: Client,
    spec: dict[str, Any],
    deserved: str,
) -> None:
    arm(chaos, session, spec)
    try:
        client(sdk, request_body(CHAT, stream=False))
    except openai.APIStatusError:
        assert deserved == "gave_up_early"
    found = chaos.verdict(session)
    assert names(found) == [deserved], found
    assert found[0].session == session
    journal = chaos.requests(session)
    assert set(found[0].seqs) <= {e["seq"] for e in journal}


@pytest.mark.parametrize(
    "client", [ignores_retry_after, no_backoff, retries_everything, gives_up_at_once]
)
def test_without_faults_no_client_is_found_wanting(
    chaos: ChaosServer, sdk: openai.OpenAI, session: str, client: Client
) -> None:
    client(sdk, request_body(CHAT, stream=False))
    assert chaos.verdict(session) == []


def test_the_resilient_client_earns_no_finding(chaos: ChaosServer) -> None:
    """Under a 429 with Retry-After, two 503s, a 400, a stream dropped before any frame,
    an error in a 200 and an empty answer: it waits, backs off, stops at the 400 and asks
    again for the broken answers."""
    faults: list[tuple[dict[str, Any], bool]] = [
        ({"type": "http_429", "retry_after": 0.05}, False),
        ({"type": "http_503", "remaining": 2}, False),
        ({"type": "http_error", "status": 400}, False),
        ({"type": "dropped_connection", "after_chunks": 0}, True),
        ({"type": "error_in_200"}, False),
        ({"type": "empty_response"}, False),
    ]
    sessions = []
    for spec, stream in faults:
        session = f"verdict-{next(_sessions)}"
        sessions.append(session)
        arm(chaos, session, spec)
        headers = {"X-Chaosllm-Session": session}
        with openai_client(chaos, default_headers=headers) as sdk:
            client = ResilientClient(sdk, max_attempts=4, attempt_timeout=5.0)
            try:
                if stream:
                    client.stream_text(request_body(STREAMED, stream=False))
                else:
                    client.chat(request_body(CHAT, stream=False))
            except RetryBudgetExceeded:
                assert spec.get("status") == 400
        expected = 1 if spec.get("status") == 400 else 1 + spec.get("remaining", 1)
        assert len(chaos.requests(session)) == expected
    for session in sessions:
        assert chaos.verdict(session) == [], (session, chaos.requests(session))


def test_a_stream_asked_again_mid_answer_is_stated(chaos: ChaosServer, session: str) -> None:
    """The resilient client asks again for a stream dropped after two frames: true, and
    stated (what it then shows its user is its own business). The frames are the ones
    the wire sent."""
    arm(chaos, session, {"type": "dropped_connection", "after_chunks": 2})
    with openai_client(chaos, default_headers={"X-Chaosllm-Session": session}) as sdk:
        text = ResilientClient(sdk).stream_text(request_body(STREAMED, stream=False))
    assert text
    journal = chaos.requests(session)
    assert journal[0]["frames_sent"] == 2
    (found,) = chaos.verdict(session)
    assert found.name == "stream_restarted_mid_answer"
    assert found.seqs == (journal[0]["seq"], journal[1]["seq"])


def test_the_official_sdk_honours_retry_after(chaos: ChaosServer, session: str) -> None:
    arm(chaos, session, {"type": "http_429", "retry_after": 0.05, "remaining": 2})
    headers = {"X-Chaosllm-Session": session}
    with openai_client(chaos, max_retries=2, default_headers=headers) as sdk:
        sdk.chat.completions.create(**request_body(CHAT, stream=False))
    assert len(chaos.requests(session)) == 3
    assert chaos.verdict(session) == []
    assert chaos.verdict(session, retry_after_tolerance=0.0) == []


def test_verdict_tolerances_are_checked(chaos: ChaosServer) -> None:
    with pytest.raises(ConfigError, match="no tolerance 'floor'"):
        chaos.verdict(floor=1.0)
    with pytest.raises(ConfigError, match="min_attempts must be >= 1"):
        chaos.verdict(min_attempts=0)


def test_get_verdict_over_http(chaos: ChaosServer, sdk: openai.OpenAI, session: str) -> None:
    arm(chaos, session, {"type": "http_503", "remaining": 2})
    with pytest.raises(openai.InternalServerError):
        gives_up_at_once(sdk, request_body(CHAT, stream=False))
    seq = chaos.requests(session)[0]["seq"]
    with httpx.Client(base_url=chaos.url, timeout=10) as http:
        answer = http.get("/__verdict", params={"session": session})
        assert answer.status_code == 200
        data = answer.json()
        assert data["findings"] == [
            {
                "name": "gave_up_early",
                "seqs": [seq],
                "explanation": data["findings"][0]["explanation"],
                "session": session,
            }
        ]
        assert "503" in data["findings"][0]["explanation"]
        assert data["tolerances"]["min_attempts"] == 2
        # A tolerance set by a query parameter: one attempt is enough here.
        relaxed = http.get("/__verdict", params={"session": session, "min_attempts": "1"})
        assert relaxed.json() == {
            "findings": [],
            "tolerances": {**data["tolerances"], "min_attempts": 1},
        }
        # Other sessions' findings are not this one's.
        assert http.get("/__verdict", params={"session": "nobody"}).json()["findings"] == []
        for query, param in [
            ({"min_attempts": "soon"}, "min_attempts"),
            ({"no_backoff_floor": "-1"}, "no_backoff_floor"),
            ({"no_such_tolerance": "1"}, "no_such_tolerance"),
            ({"min_attempts": "3", "bogus": "1"}, "bogus"),
        ]:
            refused = http.get("/__verdict", params=query)
            assert refused.status_code == 400, query
            error = refused.json()["error"]
            assert error["code"] == "invalid_tolerance"
            assert error["param"] == param
            assert param in error["message"]
