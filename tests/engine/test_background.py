"""Stored responses in memory (`chaosllm.core.background`): a background create answered
``queued``, its status as the engine's clock advances at the recorded pace, polls,
cancels and resumed streams with their own sequence numbers, the API's errors, the
faults that fire on the next operation and what they leave behind, the memo."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chaosllm.config import ServerConfig
from chaosllm.core.background import Stored, StoredResponses
from chaosllm.core.engine import ProviderCall, Reply
from chaosllm.errors import InvalidFaultSpec
from chaosllm.paths import shipped_dir
from chaosllm.providers import PROVIDERS, provider_for_path
from chaosllm.providers.sse import iter_events
from tests.memory import RESPONSES, Answer, EnginePair

pytestmark = pytest.mark.timeout(60)

HAIKU = {
    "input": [{"content": "Write a haiku about the sea.", "role": "user"}],
    "model": "gpt-4.1-mini",
}
"""responses-streaming/0001: 22 events, the first after 180 ms, the rest 0 or 24 ms apart."""
LAST = 21
RID = "resp_68c1a3d2b1f08190a6e5d4c3b2a19087"
"""Its response id (a request without a session gets the recorded ids)."""
RECORDED_S = 0.18 + 19 * 0.024


def pair(**config: Any) -> EnginePair:
    config.setdefault("timing", 1.0)  # the recorded pace
    return EnginePair(ServerConfig(recordings=[shipped_dir("recordings")], **config))


def operation(
    p: EnginePair, path: str, query: str = "", *, method: str = "GET", session: str | None = None
) -> Answer:
    provider = provider_for_path(path)
    assert provider is PROVIDERS["openai.responses.stored"]
    call = ProviderCall(
        provider=provider, path=path, body=b"", method=method, query=query.encode(), session=session
    )
    decision = p.engine.handle(call)
    assert isinstance(decision, Reply)
    return Answer(decision)


def poll(p: EnginePair, rid: str, **kwargs: Any) -> Answer:
    return operation(p, f"/v1/responses/{rid}", **kwargs)


def resume(p: EnginePair, rid: str, after: int | None = None, **kwargs: Any) -> Answer:
    query = "stream=true" + (f"&starting_after={after}" if after is not None else "")
    return operation(p, f"/v1/responses/{rid}", query, **kwargs)


def cancel(p: EnginePair, rid: str, **kwargs: Any) -> Answer:
    return operation(p, f"/v1/responses/{rid}/cancel", method="POST", **kwargs)


def events(answer: Answer) -> list[dict[str, Any]]:
    return [json.loads(data) for _, data in iter_events(answer.frames())]


def text(evts: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in evts if e["type"] == "response.output_text.delta")


def create(p: EnginePair, *, stream: bool = False, **extra: Any) -> Answer:
    return p.send({**HAIKU, "background": True, "stream": stream, **extra}, path=RESPONSES)


# -- the create and the poll ------------------------------------------------------------


def test_a_background_create_is_queued_then_in_progress_then_completed_on_the_clock() -> None:
    p = pair()
    created = create(p)
    assert created.status == 200
    body = created.json()
    assert (body["status"], body["output"], body["background"]) == ("queued", [], True)
    rid = body["id"]
    assert poll(p, rid).json()["status"] == "queued"  # no time has passed
    p.clock.advance(0.2)  # the first event is due at 180 ms
    progress = poll(p, rid).json()
    assert progress["status"] == "in_progress" and progress["id"] == rid
    p.clock.advance(RECORDED_S)
    done = poll(p, rid).json()
    assert done["status"] == "completed"
    assert done["output"][0]["content"][0]["text"].startswith("Waves")


def test_fast_timing_completes_at_the_first_poll_after_any_time() -> None:
    p = pair(timing=0.0)
    rid = create(p).json()["id"]
    p.clock.advance(0.001)
    assert poll(p, rid).json()["status"] == "completed"


def test_a_poll_is_never_memoised_the_same_bytes_see_the_clock() -> None:
    p = pair()
    rid = create(p).json()["id"]
    statuses = []
    for _ in range(3):
        statuses.append(poll(p, rid).json()["status"])
        p.clock.advance(0.4)
    assert statuses == ["queued", "in_progress", "completed"]


def test_a_stored_response_is_retrievable_completed() -> None:
    p = pair()
    answer = p.send({**HAIKU, "store": True}, path=RESPONSES)
    rid = answer.json()["id"]
    got = poll(p, rid)
    assert got.status == 200 and got.json() == answer.json()


def test_an_unknown_id_gets_the_apis_404() -> None:
    got = poll(pair(), "resp_nope")
    assert got.status == 404
    assert got.error == {
        "message": "Response with id 'resp_nope' not found.",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }


# -- resuming a stream -------------------------------------------------------------------


def test_a_resume_sends_the_events_after_the_cursor_with_their_own_numbers() -> None:
    p = pair()
    whole = events(create(p, stream=True))
    rid = whole[0]["response"]["id"]
    resumed = events(resume(p, rid, after=5))
    assert [e["sequence_number"] for e in resumed] == list(range(6, LAST + 1))
    assert resumed == whole[6:]


def test_a_resume_waits_for_events_not_due_and_sends_the_rest_at_once() -> None:
    p = pair()
    create(p, stream=True)
    p.clock.advance(0.19 + 2 * 0.024)  # events 0..4 are due (0..2 at 180 ms, then 24 ms)
    answer = resume(p, RID, after=2)
    gaps = [piece.delay_ms for piece in answer.reply.plan.pieces]
    assert gaps[:2] == [0.0, 0.0]  # events 3 and 4 were due already
    assert gaps[2:4] == [pytest.approx(14.0), pytest.approx(24.0)]


def test_a_dropped_background_stream_resumed_from_its_last_event_gives_the_whole_text() -> None:
    p = pair()
    uninterrupted = text(events(create(p, stream=True)))
    p.arm({"type": "dropped_connection", "after_chunks": 7})
    cut = events(create(p, stream=True))
    assert len(cut) == 7
    rid = cut[0]["response"]["id"]
    rest = events(resume(p, rid, after=cut[-1]["sequence_number"]))
    assert text(cut + rest) == uninterrupted
    assert rest[-1]["type"] == "response.completed"


def test_resume_errors_are_the_apis_400s() -> None:
    p = pair()
    rid = create(p).json()["id"]
    refused = resume(p, rid, after=1)
    assert refused.status == 400 and refused.error["type"] == "invalid_request_error"
    assert "cannot be streamed" in refused.error["message"]
    create(p, stream=True)
    past = resume(p, rid, after=LAST + 1)
    assert past.status == 400 and past.error["param"] == "starting_after"
    assert f"sequence_number {LAST}" in past.error["message"]
    bad = operation(p, f"/v1/responses/{rid}", "stream=true&starting_after=x")
    assert bad.status == 400 and bad.error["param"] == "starting_after"


# -- cancel ------------------------------------------------------------------------------


def test_a_cancel_stops_the_response_and_it_stays_cancelled() -> None:
    p = pair()
    rid = create(p).json()["id"]
    p.clock.advance(0.2)
    assert cancel(p, rid).json()["status"] == "cancelled"
    p.clock.advance(5)
    assert poll(p, rid).json()["status"] == "cancelled"


def test_a_cancel_of_a_finished_response_returns_it_as_it_ended() -> None:
    p = pair()
    rid = create(p).json()["id"]
    p.clock.advance(5)
    assert cancel(p, rid).json()["status"] == "completed"


# -- faults on the next operation --------------------------------------------------------


@pytest.mark.parametrize("status", ["failed", "incomplete"])
def test_background_failed_fires_on_the_next_poll_and_the_response_stays_failed(
    status: str,
) -> None:
    p = pair()
    rid = create(p).json()["id"]
    p.arm({"type": "background_failed", "status": status})
    first = poll(p, rid).json()
    assert first["status"] == status
    if status == "failed":
        assert first["error"]["code"] == "server_error"
    else:
        assert first["incomplete_details"] == {"reason": "max_output_tokens"}
    p.clock.advance(5)
    assert poll(p, rid).json()["status"] == status  # for good, the fault spent


def test_background_failed_ends_a_resumed_stream_with_response_failed() -> None:
    p = pair()
    create(p, stream=True)
    rid = RID
    p.arm({"type": "background_failed"})
    evts = events(resume(p, rid, after=4))
    assert [(e["type"], e["sequence_number"]) for e in evts] == [("response.failed", 5)]


def test_background_failed_status_is_failed_or_incomplete() -> None:
    with pytest.raises(InvalidFaultSpec, match="failed, incomplete"):
        pair().arm({"type": "background_failed", "status": "done"})


def test_stored_faults_never_fire_on_a_model_request() -> None:
    p = pair()
    p.arm({"type": "response_expired"})
    assert create(p).status == 200
    assert len(p.engine.board) == 1  # still armed, for the next operation


def test_resume_refused_is_the_apis_no_longer_streamable_400() -> None:
    p = pair()
    create(p, stream=True)
    rid = RID
    p.arm({"type": "resume_refused"})
    assert poll(p, rid).status == 200  # a poll is no resume: not consumed
    refused = resume(p, rid, after=3)
    assert refused.status == 400
    assert refused.error["message"] == (
        "This response can no longer be streamed because it is more than 5 minutes old"
    )


def test_cancel_ignored_answers_cancelled_and_the_response_runs_on() -> None:
    p = pair()
    rid = create(p).json()["id"]
    p.arm({"type": "cancel_ignored"})
    assert cancel(p, rid).json()["status"] == "cancelled"
    p.clock.advance(5)
    assert poll(p, rid).json()["status"] == "completed"


def test_response_expired_is_404_from_then_on() -> None:
    p = pair()
    rid = create(p).json()["id"]
    p.arm({"type": "response_expired"})
    assert poll(p, rid).status == 404
    again = poll(p, rid)
    assert again.status == 404 and again.record["fault"] is None


# -- state -------------------------------------------------------------------------------


def test_the_store_is_bounded_by_count_and_bytes() -> None:
    store = StoredResponses(max_entries=3, max_bytes=1000)
    for i in range(5):
        store.put(Stored(f"r{i}", 0.0, {}, (), False, True, size=100))
    assert len(store) == 3 and store.get("r0") is None and store.get("r4") is not None
    store.put(Stored("big", 0.0, {}, (), False, True, size=2000))
    assert store.get("big") is None
    store.put(Stored("half", 0.0, {}, (), False, True, size=900))
    assert store.bytes == 1000 and store.get("r3") is None and store.get("r4") is not None


def test_a_reset_forgets_the_stored_responses() -> None:
    p = pair()
    rid = create(p).json()["id"]
    p.engine.reset()
    assert poll(p, rid).status == 404


def test_sessions_get_fresh_ids_and_each_its_own_response() -> None:
    p = pair()
    a = p.send({**HAIKU, "background": True}, path=RESPONSES, session="s")
    b = p.send({**HAIKU, "background": True}, path=RESPONSES, session="s")
    ra, rb = a.json()["id"], b.json()["id"]
    assert ra != rb
    p.clock.advance(5)
    assert poll(p, ra, session="s").json()["id"] == ra
    assert poll(p, rb, session="s").json()["id"] == rb
