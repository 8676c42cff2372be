"""The toolkit works for clients of every protocol: `chaosllm probe` on a naive
Anthropic Messages client and a naive OpenAI Responses client, and the fixture's
Anthropic client."""

from __future__ import annotations

import sys

import pytest

from chaosllm.pytest_plugin import ChaosHandle
from chaosllm.testing.probe import probe
from tests.helpers import EXAMPLES

pytestmark = pytest.mark.slow

FAULTS = [
    {"type": t}
    for t in (
        "http_503",
        "dropped_connection",
        "truncated_stream",
        "error_in_200",
        "connection_reset",
        "empty_response",
    )
]
COMMON = {
    "http_503": {"json": "recovered", "stream": "recovered"},
    "dropped_connection": {"json": "recovered", "stream": "failed cleanly"},
    "truncated_stream": {"json": "failed cleanly", "stream": "wrong answer"},
    "connection_reset": {"json": "recovered", "stream": "failed cleanly"},
    "empty_response": {"json": "wrong answer", "stream": "wrong answer"},
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("client", "says", "error_in_200_stream"),
    [
        # Anthropic's SDK raises on an `event: error` mid-stream.
        ("anthropic_client.py", "answer: The capital of France is Paris.", "failed cleanly"),
        # The openai SDK's raw Responses stream passes an `error` event through: the naive
        # client prints what it had and exits 0.
        ("responses_client.py", "answer: ", "wrong answer"),
    ],
    ids=["anthropic", "responses"],
)
def test_probe_a_naive_client(client: str, says: str, error_in_200_stream: str) -> None:
    report = probe([sys.executable, str(EXAMPLES / client)], faults=FAULTS, timeout=15, jobs=3)
    assert says in report.baseline.stdout
    assert report.matrix() == {
        **COMMON,
        "error_in_200": {"json": "failed cleanly", "stream": error_in_200_stream},
    }


def test_fixture_gives_an_anthropic_client(chaosllm: ChaosHandle) -> None:
    chaosllm.arm("http_error", status=529, retry_after=0.01)
    assert chaosllm.env["ANTHROPIC_BASE_URL"] == chaosllm.url
    with chaosllm.anthropic(max_retries=1) as client:
        reply = client.messages.create(
            model="claude-sonnet-4-6",
            max_tokens=1024,
            system="You are a concise assistant.",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
        )
    assert reply.content[0].text
    assert [e["status"] for e in chaosllm.requests()] == [529, 200]
