"""The fault board: FIFO, one-shot, remaining, match, seeded probability, atomicity."""

from __future__ import annotations

import threading

from hypothesis import given
from hypothesis import strategies as st

from chaosllm.faults import FaultBoard, RequestInfo, parse_fault_spec

REQ = RequestInfo(path="/v1/chat/completions", model="gpt-4o-mini", session=None, stream=False)


def arm(board: FaultBoard, **spec: object) -> str:
    return board.arm([parse_fault_spec(spec)])[0].id


def fired_type(board: FaultBoard, info: RequestInfo) -> str | None:
    """The type of the fault `take` fires for `info` (None: nothing fired)."""
    fired = board.take(info)
    return None if fired is None else fired.type


def test_one_shot_then_gone() -> None:
    board = FaultBoard()
    arm(board, type="http_503")
    fired = board.take(REQ)
    assert fired is not None and fired.type == "http_503"
    assert board.take(REQ) is None
    assert len(board) == 0 and len(board.history()) == 1


def test_remaining_three_fires_three_times() -> None:
    board = FaultBoard()
    arm(board, type="http_503", remaining=3)
    assert [board.take(REQ) is not None for _ in range(5)] == [True, True, True, False, False]


def test_fifo_order() -> None:
    board = FaultBoard()
    arm(board, type="http_503")
    arm(board, type="http_429")
    arm(board, type="empty_reply")
    fired = [board.take(REQ) for _ in range(4)]
    assert [f.type if f else None for f in fired] == ["http_503", "http_429", "empty_reply", None]


def test_match_rules() -> None:
    board = FaultBoard()
    arm(board, type="http_503", match={"session": "a"})
    arm(board, type="http_429", match={"model": "gpt-4o"})
    arm(board, type="stall", match={"stream": True})
    arm(board, type="latency", match={"path": "/chat/completions"})
    assert fired_type(board, RequestInfo("/v1/chat/completions", "m", "b", False)) == "latency"
    assert board.take(RequestInfo("/v1/chat/completions", "m", "b", False)) is None
    assert fired_type(board, RequestInfo("/v1/chat/completions", "m", "b", True)) == "stall"
    assert fired_type(board, RequestInfo("/v1/chat/completions", "gpt-4o", "b", True)) == "http_429"
    assert fired_type(board, RequestInfo("/v1/chat/completions", "gpt-4o", "a", True)) == "http_503"


def test_not_applicable_is_not_consumed() -> None:
    board = FaultBoard()
    arm(board, type="malformed_tool_args")
    assert board.take(REQ, applies=lambda spec: False) is None
    assert len(board) == 1
    assert board.take(REQ) is not None


def test_disarm_one_and_all() -> None:
    board = FaultBoard()
    first = arm(board, type="http_503")
    arm(board, type="http_429")
    assert board.disarm(first) == 1 and board.disarm("flt_999") == 0
    assert [f["type"] for f in board.armed()] == ["http_429"]
    assert board.disarm() == 1 and board.armed() == []


def decisions(seed: int) -> list[bool]:
    board = FaultBoard(seed=seed)
    arm(board, type="http_503", remaining=1000, probability=0.3)
    return [board.take(REQ) is not None for _ in range(200)]


def test_seeded_probability_is_reproducible() -> None:
    assert decisions(7) == decisions(7)
    assert decisions(7) != decisions(8)
    assert 30 < sum(decisions(7)) < 90


@given(st.integers(min_value=1, max_value=40), st.integers(min_value=1, max_value=8))
def test_remaining_n_fires_exactly_n_times_under_threads(n: int, threads: int) -> None:
    board = FaultBoard()
    arm(board, type="http_503", remaining=n)
    fired: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def worker() -> None:
        start.wait(timeout=10)
        for _ in range(10):
            if board.take(REQ) is not None:
                with lock:
                    fired.append(1)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=10)
    assert len(fired) == min(n, threads * 10)


def test_fifo_across_session_and_model_buckets() -> None:
    board = FaultBoard()
    arm(board, type="latency", match={"session": "s", "model": "m"})
    arm(board, type="http_503")
    arm(board, type="http_429", match={"model": "m"})
    arm(board, type="stall", match={"session": "s"})
    for _ in range(50):  # faults of other sessions and models are never candidates
        arm(board, type="garbage", remaining=100, match={"session": "elsewhere"})
        arm(board, type="garbage", remaining=100, match={"model": "other"})
    request = RequestInfo("/v1/chat/completions", "m", "s", False)
    fired = [board.take(request) for _ in range(5)]
    assert [f.type if f else None for f in fired] == [
        "latency",
        "http_503",
        "http_429",
        "stall",
        None,
    ]
    assert board.disarm("flt_2") == 0 and len(board) == 100
