"""The engine's one memo (`chaosllm.core.memo`): a memoised engine answers exactly as one
without a memo, whatever requests and state changes come in whatever order (a hypothesis
state machine drives both side by side); the memo keeps inside its bounds in entries and
bytes; and repeated large or hash-keyed requests leave the process's memory flat."""

from __future__ import annotations

import base64
import gc
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from chaosllm.config import RateLimit, ServerConfig
from chaosllm.core.call import Reply
from chaosllm.core.engine import ProviderCall
from chaosllm.core.memo import Memo
from chaosllm.model import StateVersion
from chaosllm.paths import shipped_dir
from chaosllm.providers import PROVIDERS, provider_for_path
from tests.helpers import recording, write
from tests.memory import CHAT, EnginePair

# -- the memo itself ------------------------------------------------------------------


def test_entries_are_bounded_by_count_and_bytes_oldest_first() -> None:
    memo = Memo(max_bytes=10_000, max_entries=3)
    for i in range(5):
        memo.put(("k", i), i, 100)
    assert len(memo) == 3 and memo.get(("k", 0)) is None and memo.get(("k", 4)) == 4
    memo.put(("big",), "x", 2400)  # with its overhead, over a quarter: not kept
    assert memo.get(("big",)) is None
    for i in range(20):
        memo.put(("b", i), i, 2000)
    assert memo.bytes <= memo.max_bytes and len(memo) <= 3


def test_a_stateful_entry_holds_only_until_the_version_changes() -> None:
    version = StateVersion()
    memo = Memo(version)
    memo.put("pure", 1, 10)
    memo.put("kept", 2, 10, stateful=True)
    assert (memo.get("pure"), memo.get("kept")) == (1, 2)
    version.bump()
    assert (memo.get("pure"), memo.get("kept")) == (1, None)
    memo.clear()
    assert memo.get("pure") is None and len(memo) == 0 and memo.bytes == 0


def test_keys_are_values_not_identities() -> None:
    memo = Memo()
    memo.put(("body", b"{}" * 10), "kept", 20)
    assert memo.get(("body", bytes(bytearray(b"{}" * 10)))) == "kept"  # another object


def test_a_memo_of_no_bytes_keeps_nothing() -> None:
    memo = Memo(max_bytes=0)
    memo.put("k", 1, 0)
    assert memo.get("k") is None


# -- memoised == plain ----------------------------------------------------------------

SHIPPED = [
    "simple-chat/0001",
    "knowledge/0001",
    "knowledge/0004",
    "anthropic-text/0001",
    "responses-simple/0001",
]


def _call(name: str, *, stream: bool | None) -> tuple[str, bytes]:
    data = recording(name)
    body = dict(data["request"]["body"])
    if stream:
        body["stream"] = True
    return data["request"]["path"], json.dumps(body).encode()


REQUESTS = [
    *(_call(name, stream=s) for name in SHIPPED for s in (None, True)),
    (
        CHAT,
        json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "?"}]}).encode(),
    ),
    (CHAT, b'{"model": "gpt-4o", "messages": ['),  # not JSON: a 400
]
FAULTS: list[dict[str, Any]] = [
    {"type": "http_503"},
    {"type": "http_429", "retry_after": 2},
    {"type": "error_in_200", "after_chunks": 1},
    {"type": "truncated_stream", "after_chunks": 2},
    {"type": "http_503", "match": {"session": "s1"}},
    {"type": "http_503", "match": {"model": "no-such-model"}},
    {"type": "http_503", "match": {"turn": 3}},
    {"type": "http_503", "after_requests": 1, "remaining": 2},
    {"type": "http_503", "probability": 0.5, "remaining": 3},
    {"type": "error_in_200", "reask": True},
    {"type": "latency", "delay_ms": 5},
    {"type": "http_429", "match": {"contains": "France"}},
]


def _plain(reply: Any) -> Any:
    """A decision as it is compared: the plan whole, the journal record whole."""
    if not isinstance(reply, Reply):
        return ("proxy", reply)
    return (reply.plan, reply.entry.record, reply.recording, reply.consumed)


class MemoisedMatchesPlain(RuleBasedStateMachine):
    """Two engines over the same recordings, one with the memo and one without: every
    request gets the same plan and journal record from both, after any state change."""

    def __init__(self) -> None:
        super().__init__()
        dirs = [shipped_dir("recordings")]
        self.pairs = (
            EnginePair(ServerConfig(recordings=dirs)),
            EnginePair(ServerConfig(recordings=dirs, memo_bytes=0)),
        )

    def _both(self, method: str, *args: Any) -> list[Any]:
        return [getattr(pair.engine, method)(*args) for pair in self.pairs]

    @rule(
        which=st.sampled_from(REQUESTS),
        session=st.sampled_from([None, None, "s1"]),
        repeat=st.integers(1, 3),
    )
    def request(self, which: tuple[str, bytes], session: str | None, repeat: int) -> None:
        path, body = which
        provider = provider_for_path(path) or PROVIDERS["openai.chat"]
        for _ in range(repeat):
            got = [
                _plain(pair.engine.handle(ProviderCall(provider, path, bytes(body), session)))
                for pair in self.pairs
            ]
            assert got[0] == got[1]

    @rule(spec=st.sampled_from(FAULTS))
    def arm(self, spec: dict[str, Any]) -> None:
        for pair in self.pairs:
            pair.arm(spec)

    @rule()
    def disarm(self) -> None:
        for pair in self.pairs:
            pair.engine.board.disarm()

    @rule(limit=st.sampled_from([None, RateLimit(rpm=3, tpm=None)]))
    def rate_limit(self, limit: RateLimit | None) -> None:
        self._both("set_rate_limit", limit)

    @rule(seconds=st.sampled_from([0.5, 30.0, 61.0]))
    def advance(self, seconds: float) -> None:
        for pair in self.pairs:
            pair.clock.advance(seconds)

    @rule(scenario=st.sampled_from([None, "knowledge"]))
    def scenario(self, scenario: str | None) -> None:
        for pair in self.pairs:
            pair.engine.matcher.set_scenario(scenario)

    @rule(path=st.sampled_from([None, "/tmp/ws"]))
    def workspace(self, path: str | None) -> None:
        for pair in self.pairs:
            pair.engine.matcher.set_workspace(path)

    @rule()
    def reset(self) -> None:
        self._both("reset")

    @rule()
    def reload(self) -> None:
        self._both("reload")

    @invariant()
    def same_journal(self) -> None:
        journals = [pair.journal() for pair in self.pairs]
        assert journals[0] == journals[1]


MemoisedMatchesPlain.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_memoised_engine_answers_as_the_plain_one = pytest.mark.timeout(180)(  # a hang guard
    MemoisedMatchesPlain.TestCase
)


# -- memory ---------------------------------------------------------------------------


def _rss() -> int:
    """This process's resident set, in bytes."""
    gc.collect()
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    import resource

    return pages * resource.getpagesize()


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc")
def test_a_large_request_repeated_keeps_the_memo_in_its_bound_and_memory_flat(
    tmp_path: Path,
) -> None:
    """1,000 identical replays of a 300 KiB request body: one memo entry each for what
    they share, the memo inside its byte bound, the process's memory flat."""
    data = recording("simple-chat/0001")
    data["request"]["body"]["messages"][-1]["content"] = "x" * (300 << 10)
    write(tmp_path / "big" / "0001.json", data)
    pair = EnginePair.of(tmp_path)
    raw = json.dumps(data["request"]["body"]).encode()
    provider = PROVIDERS["openai.chat"]
    first = pair.engine.handle(ProviderCall(provider, CHAT, bytes(raw)))
    assert isinstance(first, Reply) and first.plan.status == 200
    before = _rss()
    for _ in range(1000):
        reply = pair.engine.handle(ProviderCall(provider, CHAT, bytes(raw)))  # a new object
        assert isinstance(reply, Reply) and reply.plan == first.plan
    grown = _rss() - before
    memo = pair.engine.memo
    assert memo.bytes <= memo.max_bytes and len(memo) <= 4
    assert memo.hits >= 1000
    assert grown < 40 << 20, f"RSS grew {grown / 2**20:.1f} MiB"


def _emit(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc")
def test_hash_keyed_requests_leave_every_cache_in_its_bound(tmp_path: Path) -> None:
    """1,000 DocsGPT hash-keyed requests (a fixture's, repeated, and in-band directives,
    each a new answer) keep the memo inside its bounds and the process's memory flat: no
    cache grows by request."""
    directory = tmp_path / "mock_llm_fixtures"
    directory.mkdir()
    base = {"model": "docsgpt-local", "messages": [{"role": "user", "content": "hello"}]}
    from chaosllm.store.formats.hashkeyed import request_digest

    (directory / f"{request_digest(base)}.json").write_text(
        json.dumps({"response": {"content": "hi", "finish_reason": "stop"}}), "utf-8"
    )
    pair = EnginePair.of(directory, memo_bytes=1 << 20)
    provider = PROVIDERS["openai.chat"]

    def ask(i: int) -> None:
        if i % 2:
            body = base
        else:
            text = f"[[MOCK_LLM_EMIT:{_emit(f'answer {i} ' + 'y' * 60_000)}]] {i}"
            body = {"model": "docsgpt-local", "messages": [{"role": "user", "content": text}]}
        reply = pair.engine.handle(ProviderCall(provider, CHAT, json.dumps(body).encode()))
        assert isinstance(reply, Reply) and reply.plan.status == 200

    for i in range(200):
        ask(i)
    before = _rss()
    for i in range(200, 1200):
        ask(i)
    grown = _rss() - before
    memo = pair.engine.memo
    assert memo.bytes <= memo.max_bytes and len(memo) <= memo.max_entries
    assert grown < 16 << 20, f"RSS grew {grown / 2**20:.1f} MiB"
