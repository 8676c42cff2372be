"""The engine's memo: an anonymous exact replay repeated while nothing else shapes its
answer is answered with the plan and journal record worked out the first time (a memo
lookup). Each test checks that the memo gives what the whole way gives, and that anything
that would change the answer (a fault, a rate limit, a pace, another recording's turn, a
session, a reload, another store) still takes effect at once."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from chaosllm.config import Mode, RateLimit
from chaosllm.model import Piece, ResponsePlan
from chaosllm.providers import PROVIDERS
from chaosllm.providers.base import JSON_HEADERS
from chaosllm.store.recordings import RecordingStore
from tests.helpers import recording, write
from tests.memory import EnginePair

NAME = "simple-chat/0001"
CHAT = PROVIDERS["openai.chat"]


def _body() -> dict[str, Any]:
    body: dict[str, Any] = copy.deepcopy(recording(NAME)["request"]["body"])
    return body


def _with_answer(data: dict[str, Any], text: str) -> dict[str, Any]:
    changed = copy.deepcopy(data)
    changed["response"]["body"]["choices"][0]["message"]["content"] = text
    return changed


def _content(answer: Any) -> str:
    content: str = answer.json()["choices"][0]["message"]["content"]
    return content


def test_a_repeated_replay_is_the_same_bytes_and_journaled_each_time() -> None:
    pair = EnginePair.of()
    first = pair.send(_body())
    repeats = [pair.send(_body()) for _ in range(3)]
    assert pair.engine.memo.hits == 3  # each repeat was a lookup
    for again in repeats:
        assert again.status == 200 and again.body == first.body
        assert again.headers == first.headers
    journal = pair.journal()
    assert [r["seq"] for r in journal] == [1, 2, 3, 4]
    for record in journal[1:]:
        same = {k: v for k, v in record.items() if k not in ("seq", "time", "monotonic")}
        assert same == {
            k: v for k, v in journal[0].items() if k not in ("seq", "time", "monotonic")
        }
    times = [r["monotonic"] for r in journal]
    pair.clock.advance(1.5)
    pair.send(_body())
    assert pair.journal()[-1]["monotonic"] == times[-1] + 1.5  # stamped with the clock


def test_a_fault_armed_after_the_memo_opened_fires_at_once() -> None:
    pair = EnginePair.of()
    pair.send(_body())
    pair.send(_body())
    pair.arm({"type": "http_503"})
    faulted = pair.send(_body())
    assert faulted.status == 503
    assert pair.send(_body()).status == 200  # one-shot: the next one is the recording


def test_faults_armed_that_do_not_match_leave_the_memo_open_and_their_counts_alone() -> None:
    """With faults armed for another session, another model and a ``contains`` the request
    lacks, a repeated replay still takes the memo (the same bytes and journal as the whole
    way), no armed fault counts it, and one armed later that matches fires at once."""
    pair = EnginePair.of()
    whole_way = pair.send(_body())
    pair.engine.memo.clear()
    armed = pair.arm(
        [
            {"type": "http_503", "match": {"session": "other"}},
            {"type": "http_503", "match": {"model": "no-such-model"}},
            {"type": "http_429", "match": {"contains": "never in the request"}},
            {"type": "http_503", "after_requests": 1, "match": {"stream": True}},
        ]
    )
    first = pair.send(_body())
    hits = pair.engine.memo.hits
    repeats = [pair.send(_body()) for _ in range(3)]
    assert pair.engine.memo.hits == hits + 3  # kept with the faults armed
    for answer in (first, *repeats):
        assert (answer.status, answer.body, answer.headers) == (
            whole_way.status,
            whole_way.body,
            whole_way.headers,
        )
    journal = pair.journal()
    for record in journal[1:]:
        assert {k: v for k, v in record.items() if k not in ("seq", "time", "monotonic")} == {
            k: v for k, v in journal[0].items() if k not in ("seq", "time", "monotonic")
        }
    assert [fault.seen for fault in armed] == [0, 0, 0, 0]
    assert len(pair.engine.board) == 4
    pair.arm({"type": "http_429", "match": {"contains": "list and a tuple"}})
    assert pair.send(_body()).status == 429
    assert pair.send(_body()).status == 200


def test_a_fault_that_matches_but_is_not_due_keeps_the_memo_shut() -> None:
    """A matching fault whose schedule has not come yet counts every request: they all take
    the whole way, and it fires on the one it was armed for."""
    pair = EnginePair.of()
    pair.send(_body())
    pair.send(_body())
    [fault] = pair.arm({"type": "http_503", "after_requests": 2})
    assert [pair.send(_body()).status for _ in range(3)] == [200, 200, 503]
    assert fault.seen == 3


def test_recordings_of_one_request_still_take_turns(tmp_path: Path) -> None:
    data = recording(NAME)
    write(tmp_path / "turns" / "0001.json", _with_answer(data, "first"))
    write(tmp_path / "turns" / "0002.json", _with_answer(data, "second"))
    pair = EnginePair.of(tmp_path)
    got = [_content(pair.send(_body())) for _ in range(4)]
    assert got == ["first", "second", "second", "second"]  # the last one repeats


def test_a_rate_limit_set_later_adds_its_headers_and_refuses_in_time() -> None:
    pair = EnginePair.of()
    pair.send(_body())
    pair.send(_body())
    pair.engine.set_rate_limit(RateLimit(rpm=1, tpm=None))
    limited = pair.send(_body())
    assert limited.status == 200 and limited.headers["x-ratelimit-remaining-requests"] == "0"
    assert pair.send(_body()).status == 429
    pair.engine.set_rate_limit(None)
    assert "x-ratelimit-remaining-requests" not in pair.send(_body()).headers


def test_sessions_take_the_whole_way_and_get_fresh_ids() -> None:
    pair = EnginePair.of()
    anonymous = [pair.send(_body()).json()["id"] for _ in range(3)]
    assert len(set(anonymous)) == 1  # anonymous requests always get the recording
    ids = [pair.send(_body(), session="s").json()["id"] for _ in range(3)]
    assert ids[0] == anonymous[0] and len(set(ids)) == 3


def test_a_reload_serves_the_new_recording(tmp_path: Path) -> None:
    data = recording(NAME)
    file = write(tmp_path / "reload" / "0001.json", _with_answer(data, "before"))
    pair = EnginePair.of(tmp_path)
    assert [_content(pair.send(_body())) for _ in range(2)] == ["before", "before"]
    file.write_text(json.dumps(_with_answer(data, "after")), "utf-8")
    pair.engine.reload()
    assert _content(pair.send(_body())) == "after"


def test_a_recording_deleted_is_a_miss_again(tmp_path: Path) -> None:
    file = write(tmp_path / "gone" / "0001.json", recording(NAME))
    pair = EnginePair.of(tmp_path)
    pair.send(_body())
    pair.send(_body())
    file.unlink()
    pair.engine.reload()
    assert pair.send(_body()).status == 404


def test_a_store_swapped_under_the_memo_is_not_trusted(tmp_path: Path) -> None:
    """Even without the engine's own reload (a store changed some other way), the memo
    answers only when the matcher picks the recording it kept."""
    data = recording(NAME)
    write(tmp_path / "a" / "0001.json", _with_answer(data, "kept"))
    pair = EnginePair.of(tmp_path)
    pair.send(_body())
    other = tmp_path / "b"
    write(other / "0001.json", _with_answer(data, "other"))
    store = RecordingStore.load([other], cache=False)
    pair.engine.store = pair.engine.matcher.store = store
    assert _content(pair.send(_body())) == "other"


def test_a_proxied_answer_is_faulted_by_the_model_its_protocol_names() -> None:
    """A fault matching a model fires on a proxied Bedrock answer (the model is the path's
    ``modelId``, `Provider.model_of`), as it is checked before the upstream is asked."""
    data = recording("bedrock-text/0001")
    body = {k: v for k, v in data["request"]["body"].items() if k not in ("modelId", "stream")}
    pair = EnginePair.of(mode=Mode.PASSTHROUGH)
    pair.arm({"type": "truncated_stream", "match": {"model": data["request"]["body"]["modelId"]}})
    proxy = pair.proxy(body, path=data["request"]["path"])
    answer = data["response"]["body"]
    whole = json.dumps(answer).encode()
    plan = ResponsePlan(status=200, headers=JSON_HEADERS, pieces=(Piece(whole, frame=False),))
    faulted = pair.engine.fault_upstream(proxy, plan, answer)
    assert faulted.body() != whole and whole.startswith(faulted.body())
    assert pair.journal()[-1]["fault"]["type"] == "truncated_stream"
