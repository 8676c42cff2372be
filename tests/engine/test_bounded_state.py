"""What a long-running server remembers is bounded: the fired-fault history keeps the
newest ``--fault-history-size`` firings and counts the rest; per-session state (the
matcher's cursors and scenario, the board's draw ranks) is kept for at most
``--max-sessions`` sessions, the least recently used forgotten first, and a forgotten
session seen again starts fresh while the live ones keep their state.

The 50k loops run in memory against the board, the matcher and the app (no sockets);
one test runs ``chaosllm serve`` with the flags.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import tracemalloc
from collections.abc import Callable

import anyio
import httpx
import pytest

from chaosllm import ChaosServer
from chaosllm.cli import main
from chaosllm.config import ServerConfig, Strategy
from chaosllm.errors import ConfigError, ServerError
from chaosllm.faults import parse_fault_specs
from chaosllm.faults.board import FaultBoard, RequestInfo
from chaosllm.faults.spec import FaultSpec
from chaosllm.http.app import create_app
from chaosllm.http.state import ChaosState
from chaosllm.paths import shipped_dir
from chaosllm.providers import PROVIDERS
from chaosllm.store.matching import Matcher
from chaosllm.store.recordings import RecordingStore
from tests.helpers import request_body, serving
from tests.memory import EnginePair

pytestmark = pytest.mark.timeout(180)  # a hang guard: 50k sessions take ~30 s under load

CHAT = "/v1/chat/completions"
N = 50_000
PROVIDER = PROVIDERS["openai.chat"]
BODY = request_body("simple-chat/0001", stream=False)
DIGEST = PROVIDER.digest(BODY)
STEADY_SLACK = 64 * 1024
"""How much memory may still grow once a structure is at its bound: 40k more firings or
sessions kept unbounded would hold megabytes (about 206 B per firing, 725 B per
session)."""


def growth(step: Callable[[int], None], warm: int, total: int) -> int:
    """How much more memory is allocated after running `step` `total` times than after
    its first `warm` runs (by then the structure is at its bound)."""
    gc.collect()
    tracemalloc.start()
    try:
        for i in range(warm):
            step(i)
        gc.collect()
        at_bound = tracemalloc.get_traced_memory()[0]
        for i in range(warm, total):
            step(i)
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - at_bound
    finally:
        tracemalloc.stop()


def info(session: str | None = None) -> RequestInfo:
    return RequestInfo(path=CHAT, model="gpt-4o-mini", session=session, stream=False)


def spec(session: str | None = None, **fields: object) -> FaultSpec:
    [parsed] = parse_fault_specs({"type": "http_503", **fields})
    return dataclasses.replace(parsed, match=dataclasses.replace(parsed.match, session=session))


@pytest.fixture(scope="module")
def store() -> RecordingStore:
    return RecordingStore.load([shipped_dir("recordings")])


# -- the fault history ------------------------------------------------------------------


def test_50k_firings_keep_the_newest_history_and_count_the_rest() -> None:
    board = FaultBoard()
    assert board.history_size == 1000
    board.arm([spec(remaining=N)])

    def fire(_: int) -> None:
        assert board.take(info()) is not None

    assert growth(fire, 10_000, N) < STEADY_SLACK
    history = board.history()
    assert len(history) == 1000
    assert [h.left for h in history] == list(range(999, -1, -1))  # the newest, in order
    assert board.counts() == {"fired_total": N, "fired_dropped": N - 1000}
    assert len(board) == 0
    board.reset()
    assert board.counts() == {"fired_total": 0, "fired_dropped": 0} and board.history() == []


def test_a_history_of_size_zero_only_counts() -> None:
    board = FaultBoard(history_size=0)
    board.arm([spec(remaining=3)])
    for _ in range(3):
        assert board.take(info()) is not None
    assert board.history() == []
    assert board.counts() == {"fired_total": 3, "fired_dropped": 3}


@pytest.mark.parametrize(
    "bounds", [{"history_size": -1}, {"max_sessions": 0}, {"history_size": 1.5}]
)
def test_bad_bounds_are_refused(bounds: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        FaultBoard(**bounds)  # type: ignore[arg-type]


def test_get_fault_stays_small_after_50k_firings_and_counts_them() -> None:
    state = ChaosState.from_config(ServerConfig())
    state.board.arm([spec(remaining=N - 10), spec(session="s1", remaining=10)])
    for _ in range(N - 10):
        assert state.board.take(info()) is not None
    for _ in range(10):
        assert state.board.take(info("s1")) is not None
    app = create_app(state=state)

    async def get(path: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            return await c.get(path)

    listing = anyio.run(get, "/__fault")
    assert listing.status_code == 200
    # Unbounded, this body was 11 MB after 50k firings.
    assert len(listing.content) < 400_000, len(listing.content)
    data = listing.json()
    assert len(data["fired"]) == 1000
    assert data["fired_total"] == N and data["fired_dropped"] == N - 1000
    assert [f["session"] for f in data["fired"][-10:]] == ["s1"] * 10
    mine = anyio.run(get, "/__fault?session=s1").json()
    assert len(mine["fired"]) == 10 and mine["fired_total"] == N  # counts are all sessions'


# -- per-session state: the fault board ------------------------------------------------


def test_50k_sessions_arming_and_firing_keep_the_board_within_its_bound() -> None:
    board = FaultBoard(max_sessions=1000, history_size=100)

    def session_fires(i: int) -> None:
        board.arm([spec(f"s{i}")])
        assert board.take(info(f"s{i}")) is not None

    assert growth(session_fires, 5_000, N) < STEADY_SLACK
    assert len(board._ranks) == 1000
    assert board._buckets == {} and board._live == {}  # nothing armed is left behind
    assert board.counts() == {"fired_total": N, "fired_dropped": N - 100}


def test_the_ranks_of_a_forgotten_session_start_again_as_after_a_reset() -> None:
    board = FaultBoard(max_sessions=2)
    [first] = board.arm([spec("a")])
    assert first.draw_key == "'a':1"
    assert board.take(info("a")) is not None
    for other in "bcd":  # each fires at once: nothing armed, so forgettable
        board.arm([spec(other)])
        assert board.take(info(other)) is not None
    assert list(board._ranks) == ["c", "d"]  # a, then b, least recently armed: forgotten
    [again] = board.arm([spec("a")])
    assert again.draw_key == "'a':1"  # as on a fresh board (kept, it would be 'a':2)
    [kept] = board.arm([spec("d")])
    assert kept.draw_key == "'d':2"


def test_sessions_with_armed_faults_and_unsessioned_faults_keep_their_ranks() -> None:
    board = FaultBoard(max_sessions=2)
    board.arm([spec(None, match={"model": "another-model"}), spec("live")])
    for i in range(50):
        board.arm([spec(f"s{i}")])
        assert board.take(info(f"s{i}")) is not None
    [unsessioned] = board.arm([spec(None)])
    [live] = board.arm([spec("live")])
    assert (unsessioned.draw_key, live.draw_key) == ("None:2", "'live':2")
    assert list(board._ranks) == ["s49", None, "live"]  # least recently armed first


def draws(board: FaultBoard, interleave: int) -> list[bool]:
    """Whether a p=0.5 fault of session ``live`` fires on each of 200 requests, with
    `interleave` other sessions arming and firing a fault between two of them."""
    board.arm([spec("live", probability=0.5, remaining=1000)])
    fired = []
    for i in range(200):
        fired.append(board.take(info("live")) is not None)
        for j in range(interleave):
            board.arm([spec(f"other-{i}-{j}")])
            assert board.take(info(f"other-{i}-{j}")) is not None
    return fired


def test_evicting_other_sessions_does_not_change_a_live_sessions_draws() -> None:
    alone = draws(FaultBoard(seed=3), 0)
    crowded_board = FaultBoard(seed=3, max_sessions=3)
    crowded = draws(crowded_board, 5)
    assert crowded == alone and 0 < sum(alone) < 200
    assert len(crowded_board._ranks) == 3


# -- per-session state: the matcher -------------------------------------------------------


def test_50k_sessions_keep_the_matcher_within_its_bound(
    store: RecordingStore, caplog: pytest.LogCaptureFixture
) -> None:
    matcher = Matcher(store, max_sessions=1000)

    def ask(i: int) -> None:
        assert matcher.match(PROVIDER, BODY, DIGEST, f"s{i}").exchange.name == "simple-chat/0001"

    with caplog.at_level(logging.WARNING, logger="chaosllm"):
        assert growth(ask, 5_000, N) < STEADY_SLACK
    assert len(matcher._sessions) == 1000
    assert matcher.session_counts() == {"sessions": 1000, "sessions_dropped": N - 1000}
    forgotten = [r.getMessage() for r in caplog.records if "--max-sessions" in r.getMessage()]
    assert len(forgotten) == 1 and "more than 1000 sessions" in forgotten[0]  # said once
    matcher.reset()
    assert matcher.session_counts() == {"sessions": 0, "sessions_dropped": 0}


def test_a_live_session_keeps_its_place_and_a_forgotten_one_starts_fresh(
    store: RecordingStore,
) -> None:
    matcher = Matcher(store, order=(Strategy.SEQUENCE,), max_sessions=10)
    matcher.set_scenario("multi-turn")  # the default: every session follows it

    def served(session: str | None) -> str:
        return matcher.match(PROVIDER, BODY, DIGEST, session).exchange.name

    steps = [e.name for e in store.by_scenario["multi-turn"]]
    assert len(steps) == 3
    assert served(None) == steps[0]
    live = []
    for round_ in range(3):
        live.append(served("live"))
        for j in range(9):  # fewer than max_sessions between two of live's requests
            assert served(f"other-{round_}-{j}") == steps[0]
    assert live == steps
    counts = matcher.session_counts()
    assert counts == {"sessions": 10, "sessions_dropped": 28 - 10}
    # other-0-0 was forgotten: seen again it starts at the first step (kept, it would be
    # at the second); the requests without a session were never forgotten.
    assert served("other-0-0") == steps[0]
    assert served(None) == steps[1]


def test_bad_session_bounds_are_refused(store: RecordingStore) -> None:
    for bad in (0, -5, True):
        with pytest.raises(ConfigError):
            Matcher(store, max_sessions=bad)


# -- the engine, the ChaosServer arguments and the flags ---------------------------------


def test_the_engine_takes_its_bounds_from_the_config() -> None:
    defaults = EnginePair.of().engine
    assert (defaults.board.history_size, defaults.board.max_sessions) == (1000, 10_000)
    assert defaults.matcher.max_sessions == 10_000
    pair = EnginePair.of(fault_history_size=5, max_sessions=7)
    pair.arm({"type": "http_503", "remaining": 40})
    for i in range(40):
        assert pair.send(BODY, session=f"s{i}").status == 503
    engine = pair.engine
    assert len(engine.board.history()) == 5
    assert engine.board.counts() == {"fired_total": 40, "fired_dropped": 35}
    assert engine.matcher.session_counts() == {"sessions": 7, "sessions_dropped": 33}


def test_chaos_server_passes_its_bounds_and_refuses_bad_ones() -> None:
    server = ChaosServer(fault_history_size=3, max_sessions=2)
    assert server.state.board.history_size == 3
    assert server.state.board.max_sessions == server.state.matcher.max_sessions == 2
    with pytest.raises(ServerError, match="max sessions"):
        ChaosServer(max_sessions=0)
    with pytest.raises(ServerError, match="fault history size"):
        ChaosServer(fault_history_size=-1)


def test_the_memo_is_bounded_as_asked() -> None:
    server = ChaosServer(memo_bytes=1 << 20)
    assert server.state.memo.max_bytes == 1 << 20
    assert ChaosServer().state.memo.max_bytes == 32 << 20


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--fault-history-size", "-1", "--fault-history-size must be at least 0"),
        ("--max-sessions", "0", "--max-sessions must be at least 1"),
        ("--memo-bytes", "-1", "--memo-bytes must be at least 0"),
    ],
)
def test_serve_refuses_bad_bounds(
    flag: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--port", "0", flag, value]) == 2
    assert message in capsys.readouterr().err


def test_serve_flags_bound_the_history_and_the_sessions_over_a_socket() -> None:
    with (
        serving("--fault-history-size", "3", "--max-sessions", "2") as (url, _),
        httpx.Client(timeout=10) as client,
    ):
        armed = client.post(url + "/__fault", json={"type": "http_503", "remaining": 10})
        assert armed.status_code == 201
        for i in range(10):
            answer = client.post(url + CHAT, json=BODY, headers={"x-chaosllm-session": f"s{i}"})
            assert answer.status_code == 503
        listing = client.get(url + "/__fault").json()
    assert [f["session"] for f in listing["fired"]] == ["s7", "s8", "s9"]
    assert (listing["fired_total"], listing["fired_dropped"]) == (10, 7)
    assert (listing["sessions"], listing["sessions_dropped"]) == (2, 8)
