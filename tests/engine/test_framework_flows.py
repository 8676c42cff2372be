"""The flows the frameworks people use (langchain-openai, pydantic-ai, openai-agents,
litellm, instructor) run, specified on the engine -- request bytes in, a decision out:
faults in the proxy modes, the framing a request asks for, Responses conversations, the
usage chunk, the journal's outcome, fresh ids on a later serve, usage estimates, re-asks
and a scenario per session. The same through the official SDKs over sockets are in
tests/clients/test_framework_flows.py."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from chaosllm.config import Mode, ServerConfig, session_scenario
from chaosllm.core.engine import Proxy, Reply
from chaosllm.model import ResponsePlan
from chaosllm.providers import PROVIDERS
from tests.helpers import recording, request_body, write
from tests.memory import MESSAGES, RESPONSES, Answer, EnginePair

CHAT = PROVIDERS["openai.chat"]
STREAMED = "knowledge/0004"
"""A short answer recorded from a stream: 16 answer frames, finish, usage, [DONE]."""
TOOL = "tool-call/0001"
"""A JSON answer with one tool call; tool-call/0002 answers the tool's result."""


def native(name: str, body: dict[str, Any], response: dict[str, Any], **extra: Any) -> Any:
    """A native recording file's content (provider openai.chat unless `extra` says)."""
    return {
        "chaosllm": 1,
        "provider": extra.pop("provider", "openai.chat"),
        "request": {
            "method": "POST",
            "path": extra.pop("path", "/v1/chat/completions"),
            "body": body,
        },
        "response": response,
        "meta": {"description": name},
    }


def without_stream(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in ("stream", "stream_options")}


# -- 1. a fault that answers alone never asks the upstream ------------------------------------

ALONE = [
    ({"type": "http_503"}, False, 503),
    ({"type": "http_429", "retry_after": 0}, False, 429),
    ({"type": "http_error", "status": 502}, True, 502),
    ({"type": "connection_reset"}, False, None),
    ({"type": "empty_reply"}, True, None),
    ({"type": "garbage"}, False, None),
]


@pytest.mark.parametrize("mode", [Mode.RECORD, Mode.PASSTHROUGH, Mode.RECORD_MISSING])
@pytest.mark.parametrize(("spec", "stream", "status"), ALONE)
def test_a_fault_that_answers_alone_is_a_reply_in_every_proxy_mode(
    tmp_path: Path, mode: Mode, spec: dict[str, Any], stream: bool, status: int | None
) -> None:
    pair = EnginePair.proxying(mode, tmp_path)
    (armed,) = pair.arm(spec)
    decision = pair.decide(request_body(STREAMED, stream=stream), session="s")
    assert isinstance(decision, Reply), decision  # no upstream call, nothing to record
    record = decision.entry.record
    assert record.fault is not None and record.fault["id"] == armed.id
    assert record.status == status and record.match == "upstream" and record.recording is None
    assert record.miss is (mode is Mode.RECORD_MISSING)
    assert decision.fired is not None and decision.fired.request_seq == record.seq
    # Consumed: the client's retry goes to the upstream.
    assert isinstance(pair.decide(request_body(STREAMED, stream=stream), session="s"), Proxy)


@pytest.mark.parametrize(
    ("spec", "stream"),
    [
        ({"type": "truncated_stream"}, True),
        ({"type": "latency", "delay_ms": 1}, False),  # delivers the answer: still asks
        ({"type": "connection_reset", "after_chunks": 0}, True),  # a head first: upstream's
        ({"type": "connection_reset", "after_bytes": 10}, False),
        ({"type": "garbage"}, True),  # after the upstream's head
        ({"type": "malformed_tool_args"}, False),
    ],
)
def test_a_fault_that_transforms_the_answer_still_asks_once_and_records(
    tmp_path: Path, spec: dict[str, Any], stream: bool
) -> None:
    pair = EnginePair.proxying(Mode.RECORD, tmp_path)
    pair.arm(spec)
    proxy = pair.proxy(request_body(STREAMED, stream=stream))
    assert proxy.faultable and proxy.record and proxy.drawn == ()
    assert proxy.entry.record.fault is None and proxy.entry.record.status == 0


def test_fifo_an_earlier_fault_that_needs_the_answer_goes_first(tmp_path: Path) -> None:
    pair = EnginePair.proxying(Mode.PASSTHROUGH, tmp_path)
    pair.arm([{"type": "malformed_tool_args"}, {"type": "http_503"}])
    body = request_body(STREAMED, stream=False)
    proxy = pair.proxy(body)  # malformed_tool_args might fire: the upstream is asked
    answer = recording(STREAMED)["response"]["body"]  # no tool calls: it does not apply
    plan = ResponsePlan(status=200, headers=(), pieces=())
    assert pair.engine.fault_upstream(proxy, plan, answer).status == 503
    assert [f.type for f in pair.engine.board.history()] == ["http_503"]


def test_probability_draws_are_those_of_replay(tmp_path: Path) -> None:
    """A fault drawn before the upstream is asked is not drawn again on its answer: the
    same seed fires the same faults on the same requests in replay and passthrough."""
    specs = [
        {"type": "http_503", "probability": 0.5, "remaining": 100},
        {"type": "truncated_stream", "probability": 0.5, "remaining": 100},
    ]
    body = request_body(STREAMED, stream=True)
    replay = EnginePair.of(seed=7)
    replay.arm(specs)
    expected = []
    for _ in range(40):
        fired = replay.send(body).reply.fired
        expected.append(fired.type if fired else None)
    proxied = EnginePair.proxying(Mode.PASSTHROUGH, tmp_path, seed=7)
    proxied.arm(specs)
    (exchange,) = [e for e in replay.engine.store.exchanges if e.name == STREAMED]
    plan = CHAT.render(exchange, body, timing=0.0)  # the upstream's answer, as a plan
    got = []
    for _ in range(40):
        decision = proxied.decide(body)
        if isinstance(decision, Reply):
            got.append(decision.fired.type if decision.fired else None)
            continue
        proxied.engine.fault_upstream(decision, plan, exchange.response.body)
        fault = decision.entry.record.fault
        got.append(fault["type"] if fault else None)
    assert got == expected
    assert {"http_503", "truncated_stream", None} <= set(got)


# -- 2. the recording of the request's framing --------------------------------------------------


@pytest.fixture
def both_framings(tmp_path: Path) -> Path:
    """One request recorded twice: as JSON (0001) and from a stream (0002)."""
    streamed = recording(STREAMED)
    as_json = copy.deepcopy(streamed)
    as_json["response"].pop("chunks")
    as_json["response"]["stream"] = False
    as_json["response"]["body"]["id"] = "chatcmpl-recordedasjson"
    write(tmp_path / "flow" / "0001.json", as_json)
    write(tmp_path / "flow" / "0002.json", streamed)
    return tmp_path


@pytest.mark.parametrize("order", [("json", "stream"), ("stream", "json")])
def test_a_stream_request_gets_the_recorded_stream_and_json_the_json(
    both_framings: Path, order: tuple[str, str]
) -> None:
    pair = EnginePair.of(both_framings)
    chunks = [c["data"] for c in recording(STREAMED)["response"]["chunks"]]
    for _ in range(2):  # and again after a reset
        for framing in order:
            answer = pair.send(request_body(STREAMED, stream=framing == "stream"))
            if framing == "stream":
                assert answer.reply.recording == "flow/0002" and answer.frames() == chunks
            else:
                assert answer.reply.recording == "flow/0001"
                assert answer.json()["id"] == "chatcmpl-recordedasjson"
        pair.engine.reset()


def test_each_framing_takes_its_own_turn_and_falls_back_to_the_other(tmp_path: Path) -> None:
    streamed = recording(STREAMED)
    for i, (framing, text) in enumerate([("json", "J1"), ("stream", "S1"), ("json", "J2")], 1):
        rec = copy.deepcopy(streamed)
        rec["response"]["body"]["choices"][0]["message"]["content"] = text
        if framing == "json":
            rec["response"].pop("chunks")
            rec["response"]["stream"] = False
        write(tmp_path / "flow" / f"{i:04d}.json", rec)
    pair = EnginePair.of(tmp_path)
    json_body, stream_body = (request_body(STREAMED, stream=s) for s in (False, True))
    served = [pair.send(b).reply.recording for b in (stream_body, json_body, json_body)]
    assert served == ["flow/0002", "flow/0001", "flow/0003"]
    assert pair.send(stream_body).reply.recording == "flow/0002"  # the last one repeats
    # Only JSON recordings: a stream request renders them in turn, as before.
    for i in (1, 3):
        source = tmp_path / "flow" / f"{i:04d}.json"
        write(tmp_path / "json-only" / "flow" / source.name, json.loads(source.read_text()))
    only_json = EnginePair.of(tmp_path / "json-only")
    served = [only_json.send(stream_body).reply.recording for _ in range(3)]
    assert served == ["flow/0001", "flow/0003", "flow/0003"]


# -- 3. Responses: the server-side conversation is part of the request --------------------------


def responses_followup(previous: str, answer: str) -> Any:
    body = {"model": "gpt-4.1-mini", "input": "And tomorrow?", "previous_response_id": previous}
    reply = copy.deepcopy(recording("responses-simple/0001")["response"])
    reply.pop("chunks", None)
    reply["stream"] = False
    reply["body"]["output"][0]["content"][0]["text"] = answer
    return native(answer, body, reply, provider="openai.responses", path=RESPONSES)


def test_two_responses_conversations_each_get_their_own_follow_up(tmp_path: Path) -> None:
    write(tmp_path / "weather" / "0001.json", responses_followup("resp_paris0001", "Paris: rain"))
    write(tmp_path / "weather" / "0002.json", responses_followup("resp_tokyo0002", "Tokyo: sun"))
    pair = EnginePair.of(tmp_path)

    def text(previous: str | None, **extra: Any) -> Answer:
        body = {"model": "gpt-4.1-mini", "input": "And tomorrow?", **extra}
        if previous is not None:
            body["previous_response_id"] = previous
        return pair.send(body, path=RESPONSES)

    for _ in range(3):
        assert text("resp_tokyo0002").json()["output"][0]["content"][0]["text"] == "Tokyo: sun"
        assert text("resp_paris0001").json()["output"][0]["content"][0]["text"] == "Paris: rain"
    # Another conversation is no near match of these (ids are normalised away by nearest).
    other = text("resp_berlin003")
    assert other.status == 404 and "previous_response_id" in other.error["message"]
    assert text(None).status == 404


def test_the_digests_of_requests_without_a_thread_are_unchanged() -> None:
    responses = PROVIDERS["openai.responses"]
    for name in ("responses-simple/0001", "responses-tools/0001", "responses-tools/0002"):
        rec = recording(name)
        assert responses.digest(rec["request"]["body"]) == rec["digest"]
    body = {"model": "m", "input": "hi"}
    assert responses.digest(body) != responses.digest({**body, "conversation": "conv_1"})
    assert responses.digest(body) != responses.digest({**body, "previous_response_id": "resp_1"})
    assert responses.codec.thread(body) is None
    assert "resp_1" in responses.codec.match_text({**body, "previous_response_id": "resp_1"})


# -- 4. the usage chunk if and only if it is asked for -------------------------------------------


def frames_of(pair: EnginePair, body: dict[str, Any]) -> list[str]:
    return pair.send(body).frames()


def usage_chunks(frames: list[str]) -> list[dict[str, Any]]:
    payloads = [json.loads(f[6:]) for f in frames if f.startswith("data: {")]
    return [p for p in payloads if p.get("choices") == [] and p.get("usage")]


def test_a_recorded_usage_chunk_is_sent_only_when_asked() -> None:
    pair = EnginePair.of()
    chunks = [c["data"] for c in recording(STREAMED)["response"]["chunks"]]
    asked = request_body(STREAMED, stream=True)
    assert frames_of(pair, asked) == chunks  # byte for byte
    unasked = dict(without_stream(asked), stream=True)
    got = frames_of(pair, unasked)
    assert usage_chunks(got) == [] and len(got) == len(chunks) - 1
    assert got == [c for c in chunks if not usage_chunks([c])]
    for payload in (json.loads(f[6:]) for f in got if f.startswith("data: {")):
        assert payload["choices"]  # a naive chunk.choices[0] loop never raises


def test_a_usage_chunk_is_rendered_when_asked_and_none_was_recorded(tmp_path: Path) -> None:
    rec = recording(STREAMED)
    chunks = [c for c in rec["response"]["chunks"] if not usage_chunks([c["data"]])]
    bare = copy.deepcopy(rec)
    bare["response"]["chunks"] = chunks
    usage = bare["response"]["body"]["usage"]
    write(tmp_path / "with-usage-body" / "0001.json", bare)
    pair = EnginePair.of(tmp_path)
    asked = request_body(STREAMED, stream=True)
    got = frames_of(pair, asked)
    assert got[:-2] == [c["data"] for c in chunks[:-1]] and got[-1] == "data: [DONE]\n\n"
    (chunk,) = usage_chunks(got)
    assert chunk["usage"] == usage and chunk["id"] == rec["response"]["body"]["id"]
    assert chunk["object"] == "chat.completion.chunk" and chunk["model"]
    assert frames_of(pair, dict(without_stream(asked), stream=True)) == [c["data"] for c in chunks]


# -- 5. the journal says what the client got -------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "stream", "status", "ending"),
    [
        ({"type": "empty_reply"}, False, None, "empty"),
        ({"type": "connection_reset"}, False, None, "reset"),
        ({"type": "garbage"}, False, None, "closed"),
        ({"type": "connection_reset", "after_chunks": 2}, True, 200, "reset"),
        ({"type": "dropped_connection", "after_chunks": 2}, True, 200, "closed"),
        ({"type": "dropped_connection"}, False, 200, "closed"),
        ({"type": "truncated_stream"}, True, 200, "complete"),
        ({"type": "stall", "max_ms": 1}, False, 200, "stalled"),
        ({"type": "http_503"}, True, 503, "complete"),
    ],
)
def test_the_journal_status_and_ending_are_what_the_client_got(
    spec: dict[str, Any], stream: bool, status: int | None, ending: str
) -> None:
    pair = EnginePair.of()
    pair.arm(spec)
    record = pair.send(request_body(STREAMED, stream=stream)).record
    assert (record["status"], record["ending"]) == (status, ending)
    assert pair.send(request_body(STREAMED, stream=stream)).record["ending"] == "complete"


def test_errors_of_chaosllm_end_complete(tmp_path: Path) -> None:
    pair = EnginePair.of()
    bad = pair.send(None, raw=b"{not json")
    miss = pair.send({"model": "m", "messages": [{"role": "user", "content": "unrecorded"}]})
    assert [(a.record["status"], a.record["ending"]) for a in (bad, miss)] == [
        (400, "complete"),
        (404, "complete"),
    ]
    proxied = EnginePair.proxying(Mode.RECORD, tmp_path).proxy(request_body(STREAMED, stream=False))
    assert proxied.entry.record.ending is None  # pending until the upstream answers


# -- 6. fresh ids on a later serve in the same session -------------------------------------------

IDS = re.compile(r'"((?:chatcmpl-|call_|resp_|msg_|fc_|rs_|toolu_)[A-Za-z0-9_-]{8,})"')


def ids(text: str | bytes) -> list[str]:
    return IDS.findall(text.decode() if isinstance(text, bytes) else text)


def shape(value: str) -> tuple[str, int]:
    return (value.split("_")[0] if "_" in value else value.split("-")[0], len(value))


def test_a_later_serve_in_a_session_gets_fresh_ids_consistently() -> None:
    pair = EnginePair.of()
    body = request_body(STREAMED, stream=True)
    chunks = [c["data"] for c in recording(STREAMED)["response"]["chunks"]]
    first = pair.send(body, session="s")
    assert first.frames() == chunks  # the first serve is byte-identical
    second = pair.send(body, session="s").frames()
    recorded_id = recording(STREAMED)["response"]["body"]["id"]
    fresh = {i for frame in second for i in ids(frame)}
    assert len(fresh) == 1 and recorded_id not in fresh  # one id, everywhere in the stream
    assert shape(fresh.pop()) == shape(recorded_id)
    assert [IDS.sub('"X"', f) for f in second] == [IDS.sub('"X"', c) for c in chunks]
    third = pair.send(body, session="s").frames()
    assert ids(third[0]) != ids(second[0])  # every serve mints anew
    # Anonymous requests, and another session's first serve, get the recording.
    assert pair.send(body).frames() == chunks and pair.send(body).frames() == chunks
    assert pair.send(body, session="t").frames() == chunks
    # After a reset the session starts again.
    pair.engine.reset()
    assert pair.send(body, session="s").frames() == chunks


def test_fresh_ids_are_seeded_by_the_server_seed_the_session_and_the_serve() -> None:
    def second(seed: int, session: str) -> bytes:
        pair = EnginePair.of(seed=seed)
        body = request_body(TOOL, stream=False)
        pair.send(body, session=session)
        return pair.send(body, session=session).body

    assert second(1, "s") == second(1, "s")
    assert second(1, "s") != second(2, "s") and second(1, "s") != second(1, "t")


def test_a_json_answer_gets_fresh_ids_and_the_follow_up_still_matches() -> None:
    """openai-agents runs the same flow twice in one session: the second tool call has a
    new id, the client sends its result under that id, and the recorded follow-up (keyed
    by the recorded id) still answers it."""
    pair = EnginePair.of()
    ask = request_body(TOOL, stream=False)
    assert pair.send(ask, session="s").json() == recording(TOOL)["response"]["body"]
    again = pair.send(ask, session="s").json()
    recorded = recording(TOOL)["response"]["body"]
    old_call = recorded["choices"][0]["message"]["tool_calls"][0]["id"]
    new_call = again["choices"][0]["message"]["tool_calls"][0]["id"]
    assert new_call != old_call and shape(new_call) == shape(old_call)
    assert again["id"] != recorded["id"] and shape(again["id"]) == shape(recorded["id"])
    followup = json.loads(
        json.dumps(request_body("tool-call/0002", stream=False)).replace(old_call, new_call)
    )
    answer = pair.send(followup, session="s")
    assert answer.status == 200 and answer.reply.recording == "tool-call/0002"
    assert answer.record["digest"] == recording("tool-call/0002")["digest"]


def test_a_fault_on_a_later_serve_transforms_the_answer_with_its_fresh_ids() -> None:
    """With faults armed that do not match, later serves get the fresh ids they get with
    none armed; a fault that matches breaks that answer, fresh ids and all (a JSON answer
    cut short: the fresh-id answer's first bytes, not the recording's)."""

    def serves(arm: list[dict[str, Any]]) -> tuple[bytes, bytes]:
        pair = EnginePair.of(seed=3)
        ask = request_body(TOOL, stream=False)
        pair.send(ask, session="s")
        if arm:
            pair.arm(arm)
        return pair.send(ask, session="s").body, pair.send(ask, session="s").body

    plain = serves([])
    others = [{"type": "http_503", "match": {"session": f"other-{i}"}} for i in range(5)]
    assert serves(others) == plain
    cut, _ = serves([{"type": "truncated_stream", "match": {"session": "s"}}])
    assert cut != plain[0] and plain[0].startswith(cut)  # the fresh-id answer, cut short
    recorded = json.dumps(recording(TOOL)["response"]["body"]).encode()
    assert ids(cut)[0] == ids(plain[0])[0] and ids(cut)[0] not in ids(recorded)


@pytest.mark.parametrize(
    ("path", "first", "second"),
    [
        (RESPONSES, "responses-tools/0001", "responses-tools/0002"),
        (MESSAGES, "anthropic-tools/0001", "anthropic-tools/0002"),
    ],
)
def test_fresh_ids_in_every_protocol(path: str, first: str, second: str) -> None:
    pair = EnginePair.of()
    ask = recording(first)["request"]["body"]
    pair.send(ask, path=path, session="s")
    recorded = json.dumps(recording(first)["response"]["body"])
    again = pair.send(ask, path=path, session="s")
    old, new = ids(recorded), ids(again.body)
    assert len(old) == len(new) and set(old).isdisjoint(new)
    assert [shape(i) for i in old] == [shape(i) for i in new]
    followup = json.dumps(recording(second)["request"]["body"])
    for o, n in zip(old, new, strict=True):
        followup = followup.replace(o, n)
    answer = pair.send(json.loads(followup), path=path, session="s")
    assert answer.reply.recording == second


# -- 7. what a stream recorded without usage lacks is filled in -----------------------------------


def test_a_json_answer_from_a_stream_without_usage_gets_an_estimate(tmp_path: Path) -> None:
    rec = recording(STREAMED)
    bare = copy.deepcopy(rec)
    bare["response"]["chunks"] = [
        c for c in rec["response"]["chunks"] if not usage_chunks([c["data"]])
    ]
    bare["response"]["body"]["usage"] = None
    bare["response"]["body"]["choices"][0]["message"].pop("refusal")
    write(tmp_path / "bare" / "0001.json", bare)
    pair = EnginePair.of(tmp_path)
    answer = pair.send(request_body(STREAMED, stream=False))
    body = answer.json()
    usage = body["usage"]
    assert set(usage) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert body["choices"][0]["message"]["refusal"] is None
    assert answer.record["estimated"] == ["usage"]
    # The same estimate in a usage chunk asked for; none estimated when none is sent.
    (chunk,) = usage_chunks(pair.send(request_body(STREAMED, stream=True)).frames())
    assert chunk["usage"] == usage
    unasked = dict(without_stream(request_body(STREAMED, stream=True)), stream=True)
    assert pair.send(unasked).record["estimated"] == []
    # A recording with usage: nothing estimated.
    assert EnginePair.of().send(request_body(STREAMED, stream=False)).record["estimated"] == []


# -- re-asks after a fault, and a scenario per session ------------------------------------------


def test_a_miss_after_a_faulted_request_names_the_likely_cause() -> None:
    pair = EnginePair.of()
    pair.arm({"type": "malformed_tool_args"})
    pair.send(request_body(TOOL, stream=False), session="agent")
    reask = request_body(TOOL, stream=False)
    reask["messages"] = [
        *reask["messages"],
        {"role": "user", "content": "Your tool call was not valid JSON, try again."},
    ]
    miss = pair.send(reask, session="agent")
    assert miss.status == 404 and miss.error["code"] == "no_recording"
    message = miss.error["message"]
    assert message.startswith("The previous request of this session (#1) got the fault")
    assert "malformed_tool_args" in message and TOOL in message
    assert "No recording matches this request" in message
    # Without a faulted request before it, a miss says only what it always said; so
    # does one after a fault that still delivered the answer (no re-ask then).
    plain = pair.send(reask, session="other").error["message"]
    assert plain.startswith("No recording matches this request")
    pair.arm({"type": "latency", "delay_ms": 1})
    pair.send(request_body(TOOL, stream=False), session="slow")
    after_latency = pair.send(reask, session="slow").error["message"]
    assert after_latency.startswith("No recording matches this request")
    anthropic = pair.send(
        {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        path=MESSAGES,
    )
    assert anthropic.status == 404 and anthropic.json()["error"]["code"] == "no_recording"


def test_session_scenario_names_are_safe_directory_names() -> None:
    assert session_scenario("tests/test_a.py::test_b[x-1]#2") == "tests-test_a.py-test_b-x-1-2"
    assert session_scenario("..") == "session" and session_scenario("a..b") == "a..b"
    long = session_scenario("x" * 500)
    assert len(long) <= 120 and long != session_scenario("x" * 499)


def test_a_session_names_its_scenario_when_recording_and_replaying(tmp_path: Path) -> None:
    on, off = (
        EnginePair(
            ServerConfig(
                recordings=[tmp_path],
                mode=Mode.RECORD,
                upstream="http://127.0.0.1:9",
                record_dir=tmp_path,
                scenario_from_session=flag,
            )
        )
        for flag in (True, False)
    )
    assert on.engine.recording_scenario("flow a#1") == "flow-a-1"
    assert on.engine.recording_scenario(None) == off.engine.recording_scenario("x") == "recorded"
    # Replay: each session follows the scenario it names, by sequence too.
    for scenario, text in (("flow-a", "A"), ("flow-b", "B")):
        for i in (1, 2):
            rec = copy.deepcopy(recording("simple-chat/0001"))
            rec["response"]["body"]["choices"][0]["message"]["content"] = f"{text}{i}"
            write(tmp_path / "replay" / scenario / f"{i:04d}.json", rec)
    pair = EnginePair(ServerConfig(recordings=[tmp_path / "replay"], scenario_from_session=True))
    body = request_body("simple-chat/0001", stream=False)
    got = {
        s: [pair.send(body, session=s).json()["choices"][0]["message"]["content"] for _ in range(2)]
        for s in ("flow-b", "flow-a")
    }
    assert got == {"flow-b": ["B1", "B2"], "flow-a": ["A1", "A2"]}
    plain = EnginePair(ServerConfig(recordings=[tmp_path / "replay"]))
    assert plain.send(body, session="flow-b").json()["choices"][0]["message"]["content"] == "A1"
