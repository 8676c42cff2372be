"""The engine in memory: request bytes in, a decision (plan, proxy instruction, journal
record) out -- no sockets, no event loop, time from a clock the test sets.

The behaviour of matching, misses, bad input, faults and their firing semantics, the
oracles and the proxy decisions is specified here; the socket and SDK suites keep one
test per feature on top."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chaosllm.config import Mode, OnMiss
from chaosllm.core.engine import Proxy, Reply
from chaosllm.errors import InvalidFaultSpec
from chaosllm.model import Ending, ResponsePlan
from tests.helpers import ROOT, recording, request_body
from tests.memory import MESSAGES, RESPONSES, EnginePair

NAME = "knowledge/0004"


@pytest.fixture
def pair() -> EnginePair:
    return EnginePair.of()


def statuses(pair: EnginePair, count: int, *, name: str = NAME, **kwargs: Any) -> list[int]:
    stream = kwargs.pop("stream", False)
    return [pair.send(request_body(name, stream=stream), **kwargs).status for _ in range(count)]


# -- matching ---------------------------------------------------------------------------------


def test_exact_match_serves_the_recording(pair: EnginePair) -> None:
    answer = pair.send(request_body("simple-chat/0001", stream=False))
    assert answer.status == 200
    assert answer.json() == recording("simple-chat/0001")["response"]["body"]
    assert answer.headers["x-chaosllm-recording"] == "simple-chat/0001"
    assert answer.headers["x-chaosllm-match"] == "exact"
    assert answer.reply.recording == "simple-chat/0001" and answer.reply.consumed
    record = answer.record
    assert record["match"] == "exact" and record["score"] == 1.0 and record["status"] == 200
    assert record["digest"] == answer.headers["x-chaosllm-digest"]
    assert record["model"] == "gpt-4o-mini" and record["stream"] is False


def test_recorded_frames_replay_byte_for_byte(pair: EnginePair) -> None:
    rec = recording("streaming-usage/0001")
    body = dict(rec["request"]["body"], stream=True)
    answer = pair.send(body)
    assert answer.frames() == [c["data"] for c in rec["response"]["chunks"]]
    assert answer.record["stream"] is True


@pytest.mark.parametrize(
    ("path", "name"),
    [(MESSAGES, "anthropic-text/0001"), (RESPONSES, "responses-simple/0001")],
)
def test_every_protocol_goes_through_the_same_engine(path: str, name: str) -> None:
    pair = EnginePair.of()
    rec = recording(name)
    answer = pair.send(rec["request"]["body"], path=path)
    assert answer.status == 200 and answer.reply.recording == name
    assert answer.json() == rec["response"]["body"]


def test_several_recordings_of_one_digest_rotate_per_session(tmp_path: Path) -> None:
    rec = recording("simple-chat/0001")
    scenario = tmp_path / "twice"
    scenario.mkdir()
    for i, text in enumerate(["first", "second"], 1):
        copy = json.loads(json.dumps(rec))
        copy["response"]["body"]["choices"][0]["message"]["content"] = text
        copy["response"].pop("chunks", None)
        (scenario / f"{i:04d}.json").write_text(json.dumps(copy))
    pair = EnginePair.of(tmp_path)
    body = rec["request"]["body"]

    def texts(session: str) -> list[str]:
        return [
            pair.send(body, session=session).json()["choices"][0]["message"]["content"]
            for _ in range(3)
        ]

    assert texts("a") == ["first", "second", "second"]
    assert texts("b") == ["first", "second", "second"]


def test_sequence_matching_per_session(pair: EnginePair) -> None:
    pair.engine.matcher.set_scenario("multi-turn", "a")
    anything = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "next?"}]}
    served = [pair.send(anything, session="a").reply.recording for _ in range(3)]
    assert served == ["multi-turn/0001", "multi-turn/0002", "multi-turn/0003"]
    assert pair.send(anything, session="b").status == 404  # no scenario for session b
    assert pair.send(anything, session="a").status == 404  # used up
    pair.engine.reset()
    pair.engine.matcher.set_scenario("multi-turn", "a")
    assert pair.send(anything, session="a").reply.recording == "multi-turn/0001"


def test_a_miss_names_the_digest_and_the_nearest_recordings(pair: EnginePair) -> None:
    body = request_body("knowledge/0001", stream=False)
    body["messages"][-1]["content"] = "What is the capital of Peru?"
    answer = pair.send(body)
    assert answer.status == 404
    error = answer.error
    assert error["code"] == "no_recording"
    digest = answer.headers["x-chaosllm-digest"]
    assert digest[:8] in error["message"] and "knowledge/0001" in error["message"]
    assert "'What is the capital of France?' != 'What is the capital of Peru?'" in error["message"]
    assert answer.headers["x-chaosllm-match"] == "miss"
    # Paths relative to the recordings directory: a client reads no path of the machine.
    assert "(similarity 0.70, recordings/knowledge/0001.json)" in error["message"]
    assert str(ROOT) not in error["message"]
    record = answer.record
    assert record["miss"] is True and record["status"] == 404 and record["recording"] is None


def test_fallback_on_miss_is_deterministic_and_journaled() -> None:
    pair = EnginePair.of(on_miss=OnMiss.FALLBACK)
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "unheard of"}]}
    first, second = pair.send(body), pair.send(body)
    assert first.body == second.body
    assert "[chaosllm fallback]" in first.json()["choices"][0]["message"]["content"]
    assert [e["match"] for e in pair.journal()] == ["fallback", "fallback"]
    assert all(e["miss"] for e in pair.journal())
    assert first.reply.recording is None and not first.reply.consumed


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "param", "fragment"),
    [
        (b"{not json", None, "could not parse the JSON body"),
        (b"\xff\xfe", None, "could not parse the JSON body"),
        (b'{"model": "gpt-4o-mini"}', "messages", "Missing required parameter: 'messages'"),
        (b'{"model": "gpt-4o-mini", "messages": "hi"}', "messages", "expected an array"),
        (b"[]", "body", "JSON object"),
    ],
)
def test_bad_requests_get_the_providers_400(
    pair: EnginePair, raw: bytes, param: str | None, fragment: str
) -> None:
    answer = pair.send(None, raw=raw)
    assert answer.status == 400
    assert answer.error["type"] == "invalid_request_error" and answer.error["param"] == param
    assert fragment in answer.error["message"]
    record = answer.record
    assert record["status"] == 400 and fragment in record["error"] and record["digest"] is None
    assert pair.send(request_body("simple-chat/0001", stream=False)).status == 200


def test_a_bad_anthropic_request_gets_anthropics_envelope(pair: EnginePair) -> None:
    answer = pair.send({"model": "claude"}, path=MESSAGES)
    assert answer.status == 400
    assert answer.json()["type"] == "error"
    assert answer.json()["error"]["type"] == "invalid_request_error"


# -- faults: how they fire ----------------------------------------------------------------------


def test_one_shot_then_served_normally(pair: EnginePair) -> None:
    pair.arm({"type": "http_503"})
    assert statuses(pair, 3) == [503, 200, 200]
    assert pair.engine.board.armed() == []


def test_remaining_three_fires_three_times(pair: EnginePair) -> None:
    pair.arm({"type": "http_503", "remaining": 3})
    assert statuses(pair, 5) == [503, 503, 503, 200, 200]


def test_fifo_skips_faults_that_do_not_match(pair: EnginePair) -> None:
    pair.arm(
        [
            {"type": "http_error", "status": 500, "match": {"stream": True}},
            {"type": "http_429", "retry_after": 0, "remaining": 2},
            {"type": "http_error", "status": 502, "match": {"model": "gpt-4o"}},
        ]
    )
    # JSON requests skip the stream-only fault: the 429 (twice), then the 502.
    assert statuses(pair, 3) == [429, 429, 502]
    assert statuses(pair, 1, stream=True) == [500]
    assert statuses(pair, 1) == [200] and pair.engine.board.armed() == []


def test_match_session_isolates_sessions(pair: EnginePair) -> None:
    pair.arm({"type": "http_503", "remaining": 5, "match": {"session": "alice"}})
    mixed = [(statuses(pair, 1, session=s)[0], s) for s in ["alice", "bob"] * 6]
    assert [code for code, s in mixed if s == "alice"] == [503] * 5 + [200]
    assert [code for code, s in mixed if s == "bob"] == [200] * 6
    assert [e["status"] for e in pair.journal("bob")] == [200] * 6


def test_a_fault_that_destroys_the_answer_does_not_consume_the_recording(
    pair: EnginePair,
) -> None:
    pair.engine.matcher.set_scenario("multi-turn", "s")
    anything = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "next?"}]}
    pair.arm({"type": "connection_reset"})
    broken = pair.send(anything, session="s")
    assert broken.reply.plan.ending is Ending.RESET and not broken.reply.consumed
    assert broken.reply.fired is not None and broken.reply.fired.request_seq == 1
    retry = pair.send(anything, session="s")
    assert retry.reply.recording == "multi-turn/0001" and retry.reply.consumed


def test_an_answer_that_still_arrives_consumes_it(pair: EnginePair) -> None:
    pair.engine.matcher.set_scenario("multi-turn", "s")
    anything = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "next?"}]}
    pair.arm({"type": "latency", "delay_ms": 5})
    slow = pair.send(anything, session="s")
    assert slow.reply.plan.head_delay_ms == 5 and slow.reply.consumed
    assert pair.send(anything, session="s").reply.recording == "multi-turn/0002"


def test_malformed_tool_args_waits_for_an_answer_with_tool_calls(pair: EnginePair) -> None:
    pair.arm({"type": "malformed_tool_args"})
    plain = pair.send(request_body(NAME, stream=False))
    assert plain.status == 200 and plain.record["fault"] is None
    tools = pair.send(request_body("tool-call/0001", stream=False))
    arguments = tools.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    with pytest.raises(json.JSONDecodeError):
        json.loads(arguments)
    assert tools.record["fault"]["type"] == "malformed_tool_args"
    assert pair.engine.board.armed() == []


def test_the_journal_records_the_fault_with_its_effective_parameters(pair: EnginePair) -> None:
    (armed,) = pair.arm({"type": "dropped_connection", "after_chunks": 3})
    answer = pair.send(request_body(NAME, stream=True))
    fault = answer.record["fault"]
    assert fault["id"] == armed.id and fault["type"] == "dropped_connection"
    assert fault["params"]["after_chunks"] == 3
    assert answer.reply.plan.ending is Ending.CLOSE
    assert answer.reply.plan.frame_count == 3


def draws(pair: EnginePair, session: str | None = None, count: int = 30) -> list[bool]:
    spec: dict[str, Any] = {"type": "http_503", "probability": 0.5, "remaining": 1000}
    if session is not None:
        spec["match"] = {"session": session}
    pair.arm(spec)
    return [code == 503 for code in statuses(pair, count, session=session)]


def test_seeded_chaos_is_reproducible() -> None:
    first = draws(EnginePair.of(seed=1234))
    assert first == draws(EnginePair.of(seed=1234))
    assert 0 < sum(first) < len(first)  # a real mix of firing and not
    assert draws(EnginePair.of(seed=99)) != first


def test_seeded_chaos_is_reproducible_after_a_reset_and_across_sessions(
    pair: EnginePair,
) -> None:
    """A shared server reset between tests gives each test the draws of a fresh server,
    whatever faults other sessions arm meanwhile."""
    first = draws(pair, "a")
    pair.engine.reset()
    pair.arm(
        [{"type": "latency", "delay_ms": 0, "probability": 0.5, "match": {"session": "b"}}] * 3
    )
    assert draws(pair, "a") == first


def test_reset_disarms_and_clears(pair: EnginePair) -> None:
    pair.arm({"type": "http_503", "remaining": 5})
    assert statuses(pair, 1) == [503]
    pair.engine.reset()
    assert pair.engine.board.armed() == [] and pair.engine.board.history() == []
    assert pair.journal() == []
    assert statuses(pair, 1) == [200]
    assert pair.journal()[0]["seq"] == 1


def test_a_bad_spec_arms_nothing(pair: EnginePair) -> None:
    with pytest.raises(InvalidFaultSpec):
        pair.arm([{"type": "http_503"}, {"type": "no_such_fault"}])
    assert pair.engine.board.armed() == []


# -- the journal -----------------------------------------------------------------------------


def test_the_journal_takes_its_time_from_the_clock(pair: EnginePair) -> None:
    pair.send(request_body(NAME, stream=False))
    pair.clock.advance(2.5)
    pair.send(request_body(NAME, stream=False))
    first, second = pair.journal()
    assert second["monotonic"] - first["monotonic"] == 2.5
    assert second["time"] - first["time"] == 2.5
    assert [first["seq"], second["seq"]] == [1, 2]


def test_journal_records_are_frozen(pair: EnginePair) -> None:
    answer = pair.send(request_body(NAME, stream=False))
    with pytest.raises(AttributeError):
        answer.reply.entry.record.status = 500  # type: ignore[misc]


# -- the oracles -----------------------------------------------------------------------------

ORPHAN_RESULT = {
    "model": "gpt-4o-mini",
    "messages": [
        {"role": "user", "content": "hi"},
        {"role": "tool", "tool_call_id": "call_nobody", "content": "42"},
    ],
}


def test_findings_are_journaled(pair: EnginePair) -> None:
    answer = pair.send(ORPHAN_RESULT)
    assert answer.status == 404  # not recorded; the finding is still there
    assert [f["check"] for f in answer.record["findings"]] == ["orphan_tool_result"]


def test_strict_refuses_before_consuming_anything() -> None:
    pair = EnginePair.of(strict=True)
    answer = pair.send(ORPHAN_RESULT)
    assert answer.status == 400 and answer.headers["x-chaosllm-match"] == "refused"
    assert answer.record["error"] == "refused by --strict: orphan_tool_result"
    assert (
        "must be a response to a preceeding message with 'tool_calls'" in (answer.error["message"])
    )
    assert pair.engine.matcher.unused() != []


def test_a_recorded_structured_answer_that_breaks_its_schema_is_refused(
    tmp_path: Path, pair: EnginePair
) -> None:
    rec = recording("structured-output/0001")
    schema = rec["request"]["body"]["response_format"]["json_schema"]["schema"]
    schema["required"] = [*schema.get("required", []), "never_recorded"]
    schema.setdefault("properties", {})["never_recorded"] = {"type": "string"}
    rec["request"]["body"]["response_format"]["json_schema"]["schema"] = schema
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "0001.json").write_text(json.dumps(rec))
    pair = EnginePair.of(tmp_path)
    answer = pair.send(rec["request"]["body"])
    assert answer.status == 422 and answer.error["code"] == "recording_schema_mismatch"
    assert answer.headers["x-chaosllm-recording"] == "s/0001"
    assert answer.record["error"] == "schema mismatch"
    assert [f["check"] for f in answer.record["findings"]] == ["schema_mismatch"]


# -- the proxy modes -------------------------------------------------------------------------


def test_record_missing_proxies_a_miss_and_replays_a_hit(tmp_path: Path) -> None:
    pair = EnginePair.proxying(Mode.RECORD_MISSING, tmp_path)
    body = request_body(NAME, stream=False)
    proxy = pair.proxy(body, session="s")
    assert proxy.record and proxy.digest is not None and not proxy.faultable
    assert proxy.body == body and proxy.call.session == "s"
    record = proxy.entry.record
    assert record.match == "upstream" and record.miss is True and record.status == 0
    assert ("x-chaosllm-match", "upstream") in proxy.headers


def test_record_forwards_what_is_not_json_without_recording_it(tmp_path: Path) -> None:
    pair = EnginePair.proxying(Mode.RECORD, tmp_path)
    proxy = pair.proxy(None, raw=b"not json at all")
    assert proxy.body is None and proxy.digest is None and not proxy.record
    assert proxy.entry.record.error == (
        "the request body is not a JSON object: forwarded, not recorded"
    )


def test_passthrough_redacts_before_keying(tmp_path: Path) -> None:
    pair = EnginePair.proxying(Mode.PASSTHROUGH, tmp_path)
    body = request_body(NAME, stream=False)
    secret = dict(body, user="sk-" + "a" * 40)
    proxy = pair.proxy(secret)
    assert not proxy.record
    assert proxy.body is not None and "sk-" not in json.dumps(proxy.body)


def test_a_fault_on_a_proxied_answer_is_journaled_by_the_engine(tmp_path: Path) -> None:
    # A fault that transforms the upstream's answer (one that answers alone never asks it:
    # tests/engine/test_framework_flows.py).
    pair = EnginePair.proxying(Mode.PASSTHROUGH, tmp_path)
    (armed,) = pair.arm({"type": "error_in_200", "message": "boom"})
    body = request_body(NAME, stream=False)
    proxy = pair.proxy(body)
    assert proxy.faultable
    answer = recording(NAME)["response"]["body"]
    upstream = ResponsePlan(status=200, headers=(), pieces=())
    faulted = pair.engine.fault_upstream(proxy, upstream, answer)
    assert faulted.status == 200 and b"boom" in faulted.body()
    record = proxy.entry.record
    assert record.status == 200 and record.fault is not None and record.fault["id"] == armed.id
    assert record.ending == "complete"
    assert pair.engine.board.history()[0].request_seq == record.seq
    pair.engine.amend(proxy.entry, error="seen")
    assert proxy.entry.record.error == "seen" and proxy.entry.record.status == 200


def test_a_fault_that_does_not_match_leaves_the_proxy_streaming(tmp_path: Path) -> None:
    pair = EnginePair.proxying(Mode.PASSTHROUGH, tmp_path)
    pair.arm({"type": "http_503", "match": {"session": "other"}})
    assert not pair.proxy(request_body(NAME, stream=False), session="me").faultable


def test_decisions_are_replies_or_proxies(pair: EnginePair) -> None:
    assert isinstance(pair.decide(request_body(NAME, stream=False)), Reply)
    assert not isinstance(pair.decide(request_body(NAME, stream=False)), Proxy)


# -- layering ----------------------------------------------------------------------------------


def test_the_engine_runs_without_any_server_library() -> None:
    """Driving the engine end to end (load, match, fault, render) imports no server or HTTP
    client library: the core is sans-IO."""
    code = (
        "import json, sys\n"
        "from tests.memory import EnginePair\n"
        "body = json.load(open('recordings/knowledge/0004.json'))['request']['body']\n"
        "pair = EnginePair.of()\n"
        "pair.arm({'type': 'http_503'})\n"
        "assert pair.send(body).status == 503\n"
        "assert pair.send(dict(body, stream=True)).status == 200\n"
        "bad = {'starlette', 'anyio', 'h11', 'httpx', 'uvicorn', 'httptools', 'uvloop'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in bad))\n"
    )
    root = ROOT
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=60,
        check=True,
    )
    loaded = out.stdout.strip().splitlines()[-1]
    assert loaded == "[]", (loaded, out.stderr)
