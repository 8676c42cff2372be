"""``match.contains``, ``match.tool`` and ``match.turn``, in memory (tests/memory.py): each
predicate alone and combined, in every protocol, in the proxy modes, and how a bad one is
refused before anything is armed."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from chaosllm.config import Mode
from chaosllm.core.engine import Reply
from chaosllm.errors import InvalidFaultSpec
from chaosllm.faults import parse_fault_spec, spec_from_query
from chaosllm.model import Piece, ResponsePlan
from chaosllm.providers import PROVIDERS
from tests.helpers import RECORDINGS, recording, request_body
from tests.memory import MESSAGES, RESPONSES, EnginePair

pytestmark = pytest.mark.timeout(60)

SIMPLE = "simple-chat/0001"
TOOLS = "tool-call/0001"  # offers get_weather, and its answer calls it


def chat(name: str = SIMPLE) -> dict[str, Any]:
    return request_body(name, stream=False)


def last_user(body: dict[str, Any]) -> str:
    text = PROVIDERS["openai.chat"].faults.last_user_text(body)
    assert text is not None
    return text


# -- the facts each protocol reads ------------------------------------------------------------


def test_each_protocol_reads_the_last_user_message() -> None:
    chat_p, anthropic, responses = (
        PROVIDERS[n] for n in ("openai.chat", "anthropic.messages", "openai.responses")
    )
    body = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "an answer"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is"},
                    {"type": "image_url", "image_url": {"url": "data:,"}},
                    {"type": "text", "text": "the weather?"},
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ]
    }
    assert chat_p.faults.last_user_text(body) == "what is\nthe weather?"
    # Anthropic: a user message of tool results only is no text a user wrote.
    conversation = {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "w"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
        ]
    }
    assert anthropic.faults.last_user_text(conversation) == "Weather in Paris?"
    assert responses.faults.last_user_text({"input": "a bare prompt"}) == "a bare prompt"
    items = {
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "typed"}]},
            {"type": "function_call_output", "call_id": "c", "output": "{}"},
        ]
    }
    assert responses.faults.last_user_text(items) == "typed"
    for provider in (chat_p, anthropic, responses):  # never raises, whatever the body
        odd_bodies: list[Any] = [None, [], {"messages": "x"}, {"input": 3}, {"messages": [1, {}]}]
        for odd in odd_bodies:
            assert provider.faults.last_user_text(odd) is None
            assert provider.faults.tool_names(odd) == frozenset()
            assert provider.faults.called_tool_names(odd) == frozenset()


def test_each_protocol_reads_the_tools_offered_and_called() -> None:
    for name, provider in [
        ("tool-call/0001", "openai.chat"),
        ("anthropic-tools/0001", "anthropic.messages"),
        ("responses-tools/0001", "openai.responses"),
    ]:
        rec = recording(name)
        p = PROVIDERS[provider]
        assert p.faults.tool_names(rec["request"]["body"]) == {"get_weather"}, name
        before = copy.deepcopy(rec["response"]["body"])
        assert p.faults.called_tool_names(rec["response"]["body"]) == {"get_weather"}, name
        assert rec["response"]["body"] == before, "reading the calls changed the answer"
    both = recording("streaming-tools/0001")
    chat_p = PROVIDERS["openai.chat"]
    assert chat_p.faults.called_tool_names(both["response"]["body"]) == {
        "get_weather",
        "get_local_time",
    }
    assert chat_p.faults.tool_names({"functions": [{"name": "legacy"}]}) == {"legacy"}
    hosted = {"tools": [{"type": "web_search"}, {"type": "function", "name": "f"}]}
    assert PROVIDERS["openai.responses"].faults.tool_names(hosted) == {"web_search", "f"}


# -- contains ---------------------------------------------------------------------------------


def test_contains_fires_only_on_requests_whose_last_user_message_holds_it(
    pair: EnginePair,
) -> None:
    weather, simple = chat(TOOLS), chat(SIMPLE)
    word = last_user(weather).split()[-1]  # a word of the tool-call prompt
    assert word not in last_user(simple)
    pair.arm({"type": "http_503", "remaining": 2, "match": {"contains": word}})
    assert pair.send(simple).status == 200
    assert pair.send(weather).status == 503
    assert pair.send(simple).status == 200
    assert pair.send(weather).status == 503
    assert pair.send(weather).status == 200 and pair.engine.board.armed() == []


def test_contains_is_a_case_sensitive_substring_of_the_last_user_message_only(
    pair: EnginePair,
) -> None:
    body = chat(SIMPLE)
    text = last_user(body)
    pair.arm({"type": "http_503", "remaining": 9, "match": {"contains": text.upper()}})
    assert text != text.upper() and pair.send(body).status == 200
    pair.engine.board.disarm()
    # an earlier message holding it is not the last user message
    earlier = {**body, "messages": [{"role": "user", "content": "zebra"}, *body["messages"]]}
    pair.arm({"type": "http_503", "match": {"contains": "zebra"}})
    assert pair.send(earlier).status == 200
    pair.arm({"type": "http_503", "match": {"contains": text[1:-1]}})  # inner substring
    assert pair.send(body).status == 503


@pytest.mark.parametrize(
    ("name", "path"),
    [("anthropic-text/0001", MESSAGES), ("responses-simple/0001", RESPONSES)],
)
def test_contains_in_the_other_protocols(pair: EnginePair, name: str, path: str) -> None:
    body = recording(name)["request"]["body"]
    provider = PROVIDERS[recording(name)["provider"]]
    text = provider.faults.last_user_text(body)
    assert text
    pair.arm({"type": "http_503", "match": {"contains": "not in it at all"}})
    assert pair.send(body, path=path).status == 200
    pair.arm({"type": "http_error", "status": 500, "match": {"contains": text[:5]}})
    assert pair.send(body, path=path).status == 500


# -- tool -------------------------------------------------------------------------------------


def test_tool_fires_on_requests_offering_it(pair: EnginePair) -> None:
    pair.arm(
        [
            {"type": "http_error", "status": 502, "match": {"tool": "get_local_time"}},
            {"type": "http_503", "remaining": 5, "match": {"tool": "get_weather"}},
        ]
    )
    assert pair.send(chat(SIMPLE)).status == 200  # offers no tool
    assert pair.send(chat(TOOLS)).status == 503  # offers get_weather only
    assert pair.send(chat("streaming-tools/0001")).status == 502  # offers both: FIFO


def test_tool_fires_on_answers_calling_it(tmp_path: Path) -> None:
    """A request that offers no tool (here a recording whose request lists none) whose
    answer calls one: the answer's call is what matches."""
    rec = recording(TOOLS)
    rec["request"]["body"].pop("tools")
    (tmp_path / "calls").mkdir()
    (tmp_path / "calls" / "0001.json").write_text(json.dumps(rec))
    pair = EnginePair.of(tmp_path)
    body = rec["request"]["body"]
    assert PROVIDERS["openai.chat"].faults.tool_names(body) == frozenset()
    pair.arm({"type": "malformed_tool_args", "match": {"tool": "something_else"}})
    assert pair.send(body).json()["choices"][0]["message"]["tool_calls"]  # untouched
    pair.engine.board.disarm()
    pair.arm({"type": "malformed_tool_args", "match": {"tool": "get_weather"}})
    call = pair.send(body).json()["choices"][0]["message"]["tool_calls"][0]
    with pytest.raises(json.JSONDecodeError):
        json.loads(call["function"]["arguments"])


@pytest.mark.parametrize(
    ("name", "path"),
    [("anthropic-tools/0001", MESSAGES), ("responses-tools/0001", RESPONSES)],
)
def test_tool_in_the_other_protocols(pair: EnginePair, name: str, path: str) -> None:
    body = recording(name)["request"]["body"]
    pair.arm({"type": "http_503", "match": {"tool": "get_time"}})
    assert pair.send(body, path=path).status == 200
    pair.arm({"type": "http_error", "status": 500, "match": {"tool": "get_weather"}})
    assert pair.send(body, path=path).status == 500
    assert pair.engine.board.armed()[0]["match"] == {"tool": "get_time"}


# -- turn -------------------------------------------------------------------------------------


def test_turn_is_the_sessions_nth_provider_request(pair: EnginePair) -> None:
    pair.arm(
        [
            {"type": "http_503", "match": {"turn": 3, "session": "a"}},
            {"type": "http_error", "status": 500, "match": {"turn": 2}},
        ]
    )
    body = chat()
    got = [(s, pair.send(body, session=s).status) for s in ["a", "b", "a", "b", "a", None]]
    # a: 1st, 2nd (the turn-2 fault, any session), 3rd; b: 1st, 2nd (gone by then)
    assert got == [("a", 200), ("b", 200), ("a", 500), ("b", 200), ("a", 503), (None, 200)]


def test_turn_counts_every_provider_request_and_a_reset_rewinds_it(pair: EnginePair) -> None:
    body = chat()
    assert pair.send(None, raw=b"{not json", session="s").status == 400  # turn 1
    assert pair.send({"no": "model"}, session="s").status == 400  # turn 2
    pair.arm({"type": "http_503", "match": {"turn": 3}})
    assert pair.send(body, session="s").status == 503
    assert pair.send(body, session="t").status == 200  # t's first
    pair.engine.reset()
    pair.arm({"type": "http_503", "match": {"turn": 1, "session": "s"}})
    assert pair.send(body, session="s").status == 503  # counted from 1 again


def test_a_turn_taken_by_an_earlier_fault_is_gone(pair: EnginePair) -> None:
    pair.arm([{"type": "http_429", "retry_after": 0}, {"type": "http_503", "match": {"turn": 1}}])
    assert [pair.send(chat()).status for _ in range(3)] == [429, 200, 200]
    assert [f["match"] for f in pair.engine.board.armed()] == [{"turn": 1}]


# -- combinations -----------------------------------------------------------------------------


def test_predicates_combine_with_and(pair: EnginePair) -> None:
    weather = chat(TOOLS)
    word = last_user(weather).split()[-1]
    pair.arm(
        {
            "type": "http_503",
            "remaining": 9,
            "match": {"contains": word, "tool": "get_weather", "turn": 2, "session": "s"},
        }
    )
    assert pair.send(weather, session="s").status == 200  # turn 1
    assert pair.send(weather, session="t").status == 200  # t
    assert pair.send(weather, session="t").status == 200  # t, turn 2: wrong session
    assert pair.send(weather, session="s").status == 503  # all four
    pair.engine.reset()
    pair.arm({"type": "http_503", "match": {"contains": word, "tool": "get_local_time"}})
    assert pair.send(weather).status == 200  # the text, not the tool


# -- the proxy modes --------------------------------------------------------------------------


def upstream_plan(answer: Any) -> ResponsePlan:
    data = json.dumps(answer).encode()
    return ResponsePlan(
        status=200,
        headers=(("content-type", "application/json"),),
        pieces=(Piece(data, frame=False),),
    )


def test_in_passthrough_a_tool_the_answer_calls_is_matched_on_the_upstream_answer() -> None:
    pair = EnginePair.of(mode=Mode.PASSTHROUGH, upstream="http://127.0.0.1:9")
    rec = recording(TOOLS)
    body = dict(rec["request"]["body"])
    body.pop("tools")
    pair.arm({"type": "http_503", "remaining": 2, "match": {"tool": "get_weather"}})
    proxy = pair.proxy(body)
    assert proxy.faultable  # the answer may call it: read it whole
    calls = rec["response"]["body"]
    plain = recording(SIMPLE)["response"]["body"]
    assert pair.engine.fault_upstream(proxy, upstream_plan(plain), plain).status == 200
    proxy = pair.proxy(body)
    assert pair.engine.fault_upstream(proxy, upstream_plan(calls), calls).status == 503
    # A request offering it: answered alone, the upstream never asked.
    offered = pair.decide(rec["request"]["body"])
    assert isinstance(offered, Reply) and offered.plan.status == 503
    assert pair.engine.board.armed() == []


def test_in_passthrough_contains_and_turn_decide_before_the_upstream_is_asked() -> None:
    pair = EnginePair.of(mode=Mode.PASSTHROUGH, upstream="http://127.0.0.1:9")
    body = chat(SIMPLE)
    text = last_user(body)
    pair.arm({"type": "http_503", "match": {"contains": text + " and more"}})
    assert not pair.proxy(body).faultable  # cannot match: forwarded as it streams
    pair.arm({"type": "http_503", "match": {"contains": text, "turn": 3}})
    assert not pair.proxy(body).faultable  # turn 2
    assert pair.send(body).status == 503  # turn 3, answered alone


# -- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("match", "says"),
    [
        ({"contains": 3}, "match.contains must be a string"),
        ({"contains": ""}, "match.contains must not be empty"),
        ({"tool": ["get_weather"]}, "match.tool must be a string"),
        ({"tool": ""}, "match.tool must not be empty"),
        ({"contains": "\ud800"}, "lone UTF-16 surrogate"),
        ({"turn": 0}, "match.turn must be an integer >= 1"),
        ({"turn": -2}, "match.turn must be an integer >= 1"),
        ({"turn": 1.5}, "match.turn must be an integer >= 1"),
        ({"turn": True}, "match.turn must be an integer >= 1"),
        ({"turn": "2"}, "match.turn must be an integer >= 1"),
        ({"turn": 10**400}, "match.turn must be an integer >= 1"),
        ({"turns": 2}, "match has no field 'turns'"),
    ],
)
def test_bad_predicates_are_refused(match: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidFaultSpec, match=says.replace(".", r"\.").replace("(", r"\(")):
        parse_fault_spec({"type": "http_503", "match": match})


def test_the_predicates_round_trip_and_come_from_a_query_string() -> None:
    spec = parse_fault_spec(
        {"type": "http_503", "match": {"contains": "hi", "tool": "t", "turn": 2}}
    )
    assert spec.to_json()["match"] == {"contains": "hi", "tool": "t", "turn": 2}
    assert parse_fault_spec(spec.to_json()) == spec
    query = spec_from_query(
        "http_503", [("contains", "404"), ("match.tool", "t"), ("turn", "2"), ("stream", "true")]
    )
    assert query["match"] == {"contains": "404", "tool": "t", "turn": 2, "stream": True}
    assert parse_fault_spec(query).match.turn == 2
    with pytest.raises(InvalidFaultSpec, match=r"match\.turn"):
        parse_fault_spec(spec_from_query("http_503", [("turn", "second")]))


def test_the_shipped_recordings_used_here_exist() -> None:
    for name in (SIMPLE, TOOLS, "streaming-tools/0001"):
        assert (RECORDINGS / f"{name}.json").is_file()
