"""Live rate limits in memory: the token buckets on a `ManualClock` (refill, per key and
per session, tokens counted, the exact wait), the strict parsing of ``--rate-limit``, the
profile key, the header renderings and the engine (tests/memory.py EnginePair) in replay
and in a proxy mode."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from chaosllm.config import Mode, RateLimit, ServerConfig, parse_rate_limit
from chaosllm.core.clock import ManualClock
from chaosllm.core.engine import ProviderCall, Proxy, Reply
from chaosllm.core.ratelimit import (
    RateLimiter,
    api_key,
    completion_tokens,
    key_id,
    prompt_tokens,
)
from chaosllm.errors import ConfigError, InvalidFaultSpec
from chaosllm.faults.profiles import parse_profile
from chaosllm.providers import PROVIDERS
from chaosllm.providers.ratelimits import Meter, RateLimitState, openai_duration, rfc3339
from chaosllm.store.profiles import load_profile
from tests.helpers import recording, request_body
from tests.memory import CHAT, MESSAGES, EnginePair

pytestmark = pytest.mark.timeout(60)

CHAT_NAME = "simple-chat/0001"
ANTHROPIC_NAME = "anthropic-text/0001"


# -- the buckets --------------------------------------------------------------------------


def limiter(rpm: int | None = None, tpm: int | None = None) -> tuple[RateLimiter, ManualClock]:
    clock = ManualClock()
    return RateLimiter(RateLimit(rpm=rpm, tpm=tpm), clock), clock


def test_requests_count_down_then_the_wait_is_exact() -> None:
    buckets, clock = limiter(rpm=3)
    caller = ("k", None)
    seen = [buckets.take(caller, 0, 0) for _ in range(3)]
    assert [s.requests.remaining for s in seen if s.requests] == [2, 1, 0]
    assert all(s.allowed for s in seen) and seen[0].tokens is None
    # One request refills in 60/3 = 20 s; after three, the bucket is full in 60 s.
    assert seen[-1].requests is not None and seen[-1].requests.reset == pytest.approx(60.0)
    refused = buckets.take(caller, 0, 0)
    assert not refused.allowed and refused.exhausted == "requests"
    assert refused.retry_after == pytest.approx(20.0)
    clock.advance(19.999)
    assert not buckets.take(caller, 0, 0).allowed  # refused requests cost nothing
    clock.advance(0.001)
    assert buckets.take(caller, 0, 0).allowed
    assert not buckets.take(caller, 0, 0).allowed


def test_refill_is_continuous_and_capped_at_the_limit() -> None:
    buckets, clock = limiter(rpm=60)
    for _ in range(60):
        assert buckets.take(("k", None), 0, 0).allowed
    clock.advance(10)  # one a second
    assert buckets.peek(("k", None)).requests == Meter(limit=60, remaining=10, reset=50.0)
    clock.advance(3600)
    state = buckets.take(("k", None), 0, 0)
    assert state.requests is not None and state.requests.remaining == 59


def test_each_key_and_each_session_has_its_own_buckets() -> None:
    buckets, _ = limiter(rpm=1)
    assert buckets.take(("a", None), 0, 0).allowed
    assert not buckets.take(("a", None), 0, 0).allowed
    assert buckets.take(("b", None), 0, 0).allowed  # another key
    assert buckets.take(("a", "s1"), 0, 0).allowed  # the same key, a session
    assert buckets.take(("a", "s2"), 0, 0).allowed  # another session
    assert not buckets.take(("a", "s1"), 0, 0).allowed
    assert buckets.take((None, "s1"), 0, 0).allowed  # no key: the session's alone
    assert len(buckets) == 5


def test_tokens_count_input_and_output_and_wait_for_what_the_request_needs() -> None:
    buckets, clock = limiter(tpm=600)  # 10 tokens a second
    first = buckets.take(("k", None), 300, 200)
    assert first.allowed and first.requests is None
    assert (first.tokens, first.input_tokens, first.output_tokens) == (
        Meter(600, 100, 50.0),
        Meter(600, 300, 30.0),
        Meter(600, 400, 20.0),
    )
    refused = buckets.take(("k", None), 130, 20)  # needs 150, has 100
    assert not refused.allowed and refused.exhausted == "tokens"
    assert refused.retry_after == pytest.approx(5.0)
    clock.advance(5)
    served = buckets.take(("k", None), 130, 20)
    assert served.allowed and served.tokens is not None and served.tokens.remaining == 0


def test_a_request_larger_than_the_bucket_waits_for_a_full_one() -> None:
    buckets, clock = limiter(tpm=60)
    assert buckets.take(("k", None), 10, 0).allowed
    refused = buckets.take(("k", None), 1000, 0)
    assert refused.retry_after == pytest.approx(10.0)  # until full (60), not 1000
    clock.advance(10)
    debt = buckets.take(("k", None), 1000, 0)
    assert debt.allowed and debt.tokens is not None and debt.tokens.remaining == 0
    assert buckets.take(("k", None), 1, 0).retry_after == pytest.approx(941.0)


def test_the_wait_is_the_longer_of_the_two_buckets() -> None:
    buckets, _ = limiter(rpm=2, tpm=120)
    assert buckets.take(("k", None), 100, 0).allowed
    refused = buckets.take(("k", None), 50, 0)  # requests 1 left; tokens need 30 more
    assert refused.exhausted == "tokens" and refused.retry_after == pytest.approx(15.0)
    assert buckets.take(("k", None), 10, 0).allowed
    refused = buckets.take(("k", None), 10, 0)
    assert refused.exhausted == "requests" and refused.retry_after == pytest.approx(30.0)


def test_the_buckets_kept_are_bounded_oldest_first_out() -> None:
    clock = ManualClock()
    buckets = RateLimiter(RateLimit(rpm=1), clock, max_buckets=3)
    for name in ("a", "b", "c"):
        buckets.take((name, None), 0, 0)
    buckets.take(("a", None), 0, 0)  # seen again: the newest
    buckets.take(("d", None), 0, 0)
    assert buckets.callers() == [("c", None), ("a", None), ("d", None)]
    assert buckets.take(("b", None), 0, 0).allowed  # forgotten: full again


# -- callers, keys and token counts --------------------------------------------------------


def test_the_api_key_comes_from_each_protocols_header_or_the_query() -> None:
    assert api_key([("authorization", "Bearer sk-one")]) == "sk-one"
    assert api_key([("x-api-key", "sk-ant")]) == "sk-ant"
    assert api_key([("api-key", "azure")]) == "azure"
    assert api_key([("x-goog-api-key", "goog")]) == "goog"
    assert api_key([], b"alt=sse&key=goog2") == "goog2"
    sigv4 = "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20250101/us-east-1/bedrock/aws4_request"
    assert api_key([("authorization", sigv4 + ", Signature=abc")]) == "AKIDEXAMPLE"
    assert api_key([("x-mock-llm-delay", "1")]) is None


def test_a_key_is_kept_only_as_a_salted_hash() -> None:
    assert key_id("sk-secret") == key_id("sk-secret") != key_id("sk-other")
    assert "sk-secret" not in key_id("sk-secret") and len(key_id("sk-secret")) == 24
    import hashlib

    plain = {hashlib.sha256(b"sk-secret").hexdigest()[:24], hashlib.md5(b"sk-secret").hexdigest()}
    assert key_id("sk-secret") not in plain


def test_tokens_prompt_estimate_and_completion_usage() -> None:
    chat = PROVIDERS["openai.chat"]
    body = request_body(CHAT_NAME, stream=False)
    canonical = json.dumps(chat.canonical(body), sort_keys=True, separators=(",", ":"))
    assert prompt_tokens(chat, body) == math.ceil(len(canonical) / 4)
    answer = recording(CHAT_NAME)["response"]["body"]
    assert completion_tokens(chat, answer, body) == answer["usage"]["completion_tokens"]
    anthropic = PROVIDERS["anthropic.messages"]
    answer = recording(ANTHROPIC_NAME)["response"]["body"]
    assert completion_tokens(anthropic, answer, {}) == answer["usage"]["output_tokens"]
    no_usage = {k: v for k, v in answer.items() if k != "usage"}
    assert completion_tokens(anthropic, no_usage, {}) == math.ceil(
        len(json.dumps(no_usage, sort_keys=True, separators=(",", ":"), ensure_ascii=False)) / 4
    )


# -- parsing ------------------------------------------------------------------------------


def test_rate_limits_parse_strictly() -> None:
    assert parse_rate_limit("rpm=60,tpm=40000") == RateLimit(60, 40000)
    assert parse_rate_limit(" tpm = 10 ") == RateLimit(None, 10)
    assert parse_rate_limit({"rpm": 5}) == RateLimit(5, None)
    for bad, said in [
        ("rpm=0", "above 0"),
        ("rpm=-1", "above 0"),
        ("rpm=1.5", "above 0"),
        ("rpm=", "above 0"),
        ("rpd=5", "'rpd=5'"),
        ("rpm=1,rpm=2", "twice"),
        ("", "is not rpm=N"),
        ("60", "is not rpm=N"),
    ]:
        with pytest.raises(ConfigError, match=said):
            parse_rate_limit(bad)
    for bad_map in ({"rpm": True}, {"rpm": "5x"}, {"itpm": 5}, {}, {"rpm": None}):
        with pytest.raises(ConfigError):
            parse_rate_limit(bad_map)


def test_a_profile_sets_rate_limits() -> None:
    shipped = load_profile("rate-limited-burst")
    assert shipped.rate_limit == RateLimit(5, 20000) and shipped.specs == []
    mixed = parse_profile({"rate_limit": {"tpm": 100}, "faults": [{"type": "http_503"}]}, "mine")
    assert mixed.rate_limit == RateLimit(None, 100) and len(mixed.specs) == 1
    assert mixed.to_json()["rate_limit"] == {"rpm": None, "tpm": 100}
    assert parse_profile({"faults": [{"type": "http_503"}]}, "plain").rate_limit is None
    with pytest.raises(InvalidFaultSpec, match=r"profile bad: rate_limit: .*rpm"):
        parse_profile({"rate_limit": {"rpm": 0}}, "bad")
    with pytest.raises(InvalidFaultSpec, match="expected an object"):
        parse_profile({"description": "nothing"}, "empty")


# -- the headers --------------------------------------------------------------------------


def test_durations_as_openai_writes_them_and_times_as_anthropic_does() -> None:
    assert [openai_duration(s) for s in (0, 0.006, 0.0061, 1, 17.5, 60, 125.25, 3723)] == [
        "0s",
        "6ms",
        "7ms",
        "1s",
        "17.5s",
        "1m0s",
        "2m5.25s",
        "1h2m3s",
    ]
    assert rfc3339(1_700_000_000.0) == "2023-11-14T22:13:20Z"
    assert rfc3339(1_700_000_000.2) == "2023-11-14T22:13:21Z"


STATE = RateLimitState(
    requests=Meter(60, 59, 1.0),
    tokens=Meter(1000, 900, 6.0),
    input_tokens=Meter(1000, 950, 3.0),
    output_tokens=Meter(1000, 950, 3.0),
    wall=1_700_000_000.0,
)


def test_each_protocol_renders_its_own_live_headers() -> None:
    assert dict(PROVIDERS["openai.chat"].rate_limit_headers(STATE)) == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "900",
        "x-ratelimit-reset-tokens": "6s",
    }
    assert PROVIDERS["openai.responses"].rate_limit_headers(STATE) == PROVIDERS[
        "openai.chat"
    ].rate_limit_headers(STATE)
    anthropic = dict(PROVIDERS["anthropic.messages"].rate_limit_headers(STATE))
    assert anthropic["anthropic-ratelimit-requests-remaining"] == "59"
    assert anthropic["anthropic-ratelimit-requests-reset"] == "2023-11-14T22:13:21Z"
    assert anthropic["anthropic-ratelimit-tokens-limit"] == "1000"
    assert anthropic["anthropic-ratelimit-input-tokens-remaining"] == "950"
    assert anthropic["anthropic-ratelimit-output-tokens-reset"] == "2023-11-14T22:13:23Z"
    assert len(anthropic) == 12
    for azure in ("azure.chat", "azure.responses"):
        assert dict(PROVIDERS[azure].rate_limit_headers(STATE)) == {
            "x-ratelimit-remaining-requests": "59",
            "x-ratelimit-remaining-tokens": "900",
        }
    for silent in ("gemini", "ollama.chat", "ollama.generate", "bedrock.converse"):
        if silent in PROVIDERS:
            assert PROVIDERS[silent].rate_limit_headers(STATE) == ()


# -- the engine ---------------------------------------------------------------------------


def call(
    body: Any, *, path: str = CHAT, key: str | None = "sk-test", session: str | None = None
) -> ProviderCall:
    provider = PROVIDERS["anthropic.messages" if path == MESSAGES else "openai.chat"]
    header = "x-api-key" if path == MESSAGES else "authorization"
    headers: tuple[tuple[str, str], ...] = ()
    if key is not None:
        headers = ((header, key if path == MESSAGES else f"Bearer {key}"),)
    return ProviderCall(
        provider=provider,
        path=path,
        body=json.dumps(body).encode(),
        session=session,
        headers=headers,
    )


def reply(pair: EnginePair, provider_call: ProviderCall) -> Reply:
    decision = pair.engine.handle(provider_call)
    assert isinstance(decision, Reply)
    return decision


def test_replayed_answers_count_down_and_the_429_says_the_exact_wait() -> None:
    pair = EnginePair.of(rate_limit=RateLimit(rpm=2))
    body = request_body(CHAT_NAME, stream=False)
    first, second = reply(pair, call(body)), reply(pair, call(body))
    assert [dict(r.plan.headers)["x-ratelimit-remaining-requests"] for r in (first, second)] == [
        "1",
        "0",
    ]
    assert dict(second.plan.headers)["x-ratelimit-reset-requests"] == "1m0s"
    limited = reply(pair, call(body))
    headers = dict(limited.plan.headers)
    assert limited.plan.status == 429
    assert (headers["retry-after"], headers["retry-after-ms"]) == ("30", "30000")
    error = json.loads(limited.plan.body())["error"]
    assert (error["type"], error["code"]) == ("requests", "rate_limit_exceeded")
    assert "requests per min (RPM): Limit 2" in error["message"]
    record = limited.entry.record
    assert record.rate_limited and record.status == 429 and record.retry_after == 30.0
    assert record.recording == CHAT_NAME and not limited.consumed  # matched, not served
    assert not first.entry.record.rate_limited
    pair.clock.advance(29.999)
    assert reply(pair, call(body)).plan.status == 429
    pair.clock.advance(0.001)
    assert reply(pair, call(body)).plan.status == 200


def test_the_tokens_bucket_counts_prompt_and_completion() -> None:
    pair = EnginePair.of(rate_limit=RateLimit(tpm=100_000))
    body = request_body(CHAT_NAME, stream=False)
    chat = PROVIDERS["openai.chat"]
    cost = (
        prompt_tokens(chat, body)
        + recording(CHAT_NAME)["response"]["body"]["usage"]["completion_tokens"]
    )
    first = dict(reply(pair, call(body)).plan.headers)
    second = dict(reply(pair, call(body)).plan.headers)
    assert int(first["x-ratelimit-remaining-tokens"]) == 100_000 - cost
    assert int(second["x-ratelimit-remaining-tokens"]) == 100_000 - 2 * cost
    assert "x-ratelimit-remaining-requests" not in first


def test_keys_and_sessions_are_limited_apart_in_the_engine() -> None:
    pair = EnginePair.of(rate_limit=RateLimit(rpm=1))
    body = request_body(CHAT_NAME, stream=False)
    assert reply(pair, call(body, key="a")).plan.status == 200
    assert reply(pair, call(body, key="a")).plan.status == 429
    assert reply(pair, call(body, key="b")).plan.status == 200
    assert reply(pair, call(body, key="a", session="s")).plan.status == 200
    assert reply(pair, call(body, key=None)).plan.status == 200
    assert reply(pair, call(body, key=None)).plan.status == 429
    listed = pair.engine.limiter.to_json() if pair.engine.limiter else {}
    assert len(listed["buckets"]) == 4
    assert {b["key"] for b in listed["buckets"]} == {key_id("a"), key_id("b"), None}
    assert pair.engine.limiter and pair.engine.limiter.to_json("s")["buckets"][0]["session"] == "s"


def test_anthropic_answers_carry_anthropics_headers() -> None:
    pair = EnginePair.of(rate_limit=RateLimit(rpm=10, tpm=50_000))
    body = recording(ANTHROPIC_NAME)["request"]["body"]
    answer = reply(pair, call(body, path=MESSAGES))
    headers = dict(answer.plan.headers)
    assert answer.plan.status == 200
    assert headers["anthropic-ratelimit-requests-remaining"] == "9"
    assert headers["anthropic-ratelimit-requests-reset"] == rfc3339(pair.clock.wall() + 6)
    out = recording(ANTHROPIC_NAME)["response"]["body"]["usage"]["output_tokens"]
    assert int(headers["anthropic-ratelimit-output-tokens-remaining"]) == 50_000 - out
    assert not any(name.startswith("x-ratelimit") for name in headers)


def test_a_rate_limited_request_takes_no_fault_and_a_faulted_answer_has_the_headers() -> None:
    pair = EnginePair.of(rate_limit=RateLimit(rpm=1))
    body = request_body(CHAT_NAME, stream=False)
    pair.arm({"type": "http_503", "remaining": 2})
    faulted = reply(pair, call(body))
    assert faulted.plan.status == 503
    assert dict(faulted.plan.headers)["x-ratelimit-remaining-requests"] == "0"
    assert reply(pair, call(body)).plan.status == 429
    assert len(pair.engine.board.armed()) == 1  # the 429 left the fault armed


def test_reset_refills_and_set_rate_limit_turns_it_off() -> None:
    pair = EnginePair.of(rate_limit=RateLimit(rpm=1))
    body = request_body(CHAT_NAME, stream=False)
    reply(pair, call(body))
    assert reply(pair, call(body)).plan.status == 429
    pair.engine.reset()
    assert reply(pair, call(body)).plan.status == 200
    pair.engine.set_rate_limit(None)
    answer = reply(pair, call(body))
    assert answer.plan.status == 200
    assert not any(n.startswith("x-ratelimit") for n, _ in answer.plan.headers)


def test_without_a_limit_nothing_changes() -> None:
    pair = EnginePair.of()
    answer = reply(pair, call(request_body(CHAT_NAME, stream=False)))
    assert pair.engine.limiter is None
    assert not any("ratelimit" in name for name, _ in answer.plan.headers)
    assert answer.entry.record.to_json()["rate_limited"] is False


def test_the_proxy_modes_are_limited_before_asking_the_upstream() -> None:
    pair = EnginePair(
        ServerConfig(
            mode=Mode.PASSTHROUGH, upstream="http://127.0.0.1:9", rate_limit=RateLimit(rpm=1)
        )
    )
    body = request_body(CHAT_NAME, stream=False)
    proxied = pair.engine.handle(call(body))
    assert isinstance(proxied, Proxy)
    assert dict(proxied.headers)["x-ratelimit-remaining-requests"] == "0"
    limited = pair.engine.handle(call(body))
    assert isinstance(limited, Reply) and limited.plan.status == 429
    assert dict(limited.plan.headers)["retry-after-ms"] == "60000"
    assert limited.entry.record.rate_limited and limited.entry.record.match == "upstream"
