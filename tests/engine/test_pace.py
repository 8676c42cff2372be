"""Streaming pace (issue #16): ``--timing "ttft=600ms,tps=50,jitter=0.25"``, the same
from ``ChaosServer(timing=)``, and the ``pace`` fault that paces one answer. The gaps are
a pure plan transform after rendering, jitter drawn from the server's seed: the same seed
gives the same gaps (in memory); on a socket the first frame waits the ttft."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from chaosllm import ChaosServer
from chaosllm.cli import main
from chaosllm.config import Pace, parse_pace, parse_timing_option
from chaosllm.errors import ConfigError
from chaosllm.providers import PROVIDERS
from chaosllm.store.profiles import load_profile
from tests.helpers import CLOCK_SLACK, request_body
from tests.memory import EnginePair

CHAT = PROVIDERS["openai.chat"]


def gaps(pair: EnginePair, body: dict[str, Any], session: str = "s") -> list[float]:
    return [piece.delay_ms for piece in pair.send(body, session=session).reply.plan.pieces]


def stream(name: str = "simple-chat/0001") -> dict[str, Any]:
    body = request_body(name, stream=True)
    body.pop("stream_options")
    return body


# -- parsing --------------------------------------------------------------------------------


def test_timing_parses_a_pace_and_keeps_the_other_forms() -> None:
    assert parse_timing_option("ttft=600ms,tps=50,jitter=0.25") == (
        0.0,
        Pace(ttft_ms=600.0, tps=50.0, jitter=0.25),
    )
    assert parse_pace("ttft=0.6s") == Pace(ttft_ms=600.0)
    assert parse_pace(" ttft = 250 , tps=12.5") == Pace(ttft_ms=250.0, tps=12.5)
    assert parse_pace({"ttft_ms": 100, "tps": 5}) == Pace(ttft_ms=100.0, tps=5.0)
    assert parse_timing_option(Pace(tps=9)) == (0.0, Pace(tps=9))
    assert parse_timing_option("fast") == (0.0, None)
    assert parse_timing_option("recorded") == (1.0, None)
    assert parse_timing_option("0.5") == (0.5, None)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("ttft=-5ms", "ttft must be milliseconds >= 0"),
        ("tps=-1", "tps must be a number >= 0"),
        ("jitter=-0.1", "jitter must be a number >= 0"),
        ("ttft=1,speed=3", "'speed=3' is not ttft=, tps= or jitter="),
        ("ttft=1,ttft=2", "ttft is given twice"),
        ("tps=0", "tps must be above 0"),
        ("jitter=1.5", "jitter must be between 0 and 1"),
        ("tps=5ms", "tps must be a number >= 0"),
        ("ttft", "use fast, recorded, a scale factor such as 0.5 or a pace"),
        ("ttft=inf", "ttft must be milliseconds"),
    ],
)
def test_a_bad_pace_is_a_config_error(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=f"invalid timing {text!r}[:;] .*{says}"):
        parse_timing_option(text)
    with pytest.raises(ConfigError):
        ChaosServer(timing=text)


def test_a_bad_pace_mapping_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown key 'ttft'"):
        parse_pace({"ttft": 5})
    with pytest.raises(ConfigError, match="tps must be a number"):
        parse_pace({"tps": "fast"})


def test_the_cli_exits_2_on_a_bad_pace(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--timing", "ttft=600ms,tps=-3"])
    assert exited.value.code == 2
    assert "tps must be a number >= 0" in capsys.readouterr().err


# -- the gaps, in memory --------------------------------------------------------------------


def test_without_jitter_the_gaps_are_the_ttft_and_each_frames_tokens() -> None:
    pair = EnginePair.of(pace=Pace(ttft_ms=600.0, tps=50.0))
    plan = pair.send(stream(), session="s").reply.plan
    assert plan.pieces[0].delay_ms == 600.0 and plan.head_delay_ms == 0.0
    for piece in plan.pieces[1:]:
        assert piece.delay_ms == pytest.approx(CHAT.faults.frame_tokens(piece.data) * 20.0)
    # a frame's tokens: its text's characters / 4, at least 1 (the finish chunk, [DONE])
    texts = [
        json.loads(p.data[6:])["choices"][0]["delta"].get("content") for p in plan.pieces[1:-2]
    ]
    assert [CHAT.faults.frame_tokens(p.data) for p in plan.pieces[1:-2]] == [
        max(1, -(-len(t or "") // 4)) for t in texts
    ]
    assert [CHAT.faults.frame_tokens(p.data) for p in plan.pieces[-2:]] == [1, 1]


def test_seeded_jitter_repeats_the_same_gaps() -> None:
    pace = Pace(ttft_ms=600.0, tps=50.0, jitter=0.25)
    first, again, other = (EnginePair.of(pace=pace, seed=seed) for seed in (7, 7, 8))
    body = stream()
    runs = [[gaps(pair, body) for _ in range(3)] for pair in (first, again, other)]
    assert runs[0] == runs[1]  # the same seed: the same gaps, request after request
    assert runs[0] != runs[2]  # another seed: others
    assert runs[0][0] != runs[0][1]  # each request draws its own
    nominal = Pace(ttft_ms=600.0, tps=50.0)
    plain = gaps(EnginePair.of(pace=nominal), body)
    for run in runs[0]:
        for gap, base in zip(run, plain, strict=True):
            assert base * 0.75 - 1e-9 <= gap <= base * 1.25 + 1e-9
        assert any(gap != base for gap, base in zip(run, plain, strict=True))


def test_a_json_answer_waits_the_ttft_and_its_tokens_before_its_head() -> None:
    pair = EnginePair.of(pace=Pace(ttft_ms=300.0, tps=100.0))
    answer = pair.send(request_body("simple-chat/0001", stream=False))
    content = answer.json()["choices"][0]["message"]["content"]
    expected = 300.0 + -(-len(content) // 4) * 10.0
    assert answer.reply.plan.head_delay_ms == pytest.approx(expected)


def test_the_pace_fault_paces_one_answer() -> None:
    pair = EnginePair.of(seed=3)
    body = stream()
    assert set(gaps(pair, body)) == {0.0}
    pair.arm({"type": "pace", "ttft_ms": 250, "tps": 100, "jitter": 0.5})
    paced = pair.send(body, session="s")
    assert paced.record["fault"]["type"] == "pace"
    pieces = paced.reply.plan.pieces
    assert 125.0 <= pieces[0].delay_ms <= 375.0 and all(p.delay_ms > 0 for p in pieces)
    assert set(gaps(pair, body)) == {0.0}  # the next one is not paced
    again = EnginePair.of(seed=3)  # the same seed, the same draws
    gaps(again, body)
    again.arm({"type": "pace", "ttft_ms": 250, "tps": 100, "jitter": 0.5})
    assert gaps(again, body) == [p.delay_ms for p in pieces]


def test_the_pace_fault_without_a_rate_only_waits_the_ttft() -> None:
    pair = EnginePair.of()
    pair.arm({"type": "pace", "ttft_ms": 40, "tps": 0})
    assert gaps(pair, stream()) == [40.0] + [0.0] * (len(gaps(EnginePair.of(), stream())) - 1)


def test_a_fault_under_the_pace_keeps_the_paced_gaps() -> None:
    pair = EnginePair.of(pace=Pace(ttft_ms=100.0, tps=50.0))
    pair.arm({"type": "truncated_stream", "after_chunks": 3})
    plan = pair.send(stream()).reply.plan
    assert len(plan.pieces) == 3 and plan.pieces[0].delay_ms == 100.0


# -- on a socket ----------------------------------------------------------------------------


def first_frame_after(server: ChaosServer, body: dict[str, Any]) -> tuple[float, float]:
    """Seconds from the request to the response head, and from the head to the first
    body bytes."""
    with httpx.Client(timeout=10) as client:
        start = time.monotonic()
        with client.stream("POST", f"{server.base_url}/chat/completions", json=body) as r:
            head = time.monotonic()
            next(r.iter_raw())
            first = time.monotonic()
    return head - start, first - head


def test_on_a_socket_the_first_frame_arrives_after_the_ttft() -> None:
    body = stream()
    with ChaosServer(timing="ttft=400ms,tps=100000") as server:
        to_head, to_frame = first_frame_after(server, body)
    assert to_head < 0.4  # the head at once
    assert to_frame >= 0.4 - CLOCK_SLACK
    with ChaosServer() as server:
        _, unpaced = first_frame_after(server, body)
    assert unpaced < 0.4 - CLOCK_SLACK


def test_on_a_socket_the_pace_fault_delays_the_first_frame() -> None:
    with ChaosServer(timing=Pace(tps=100000)) as server:
        server.arm({"type": "pace", "ttft_ms": 300, "tps": 100000})
        _, paced = first_frame_after(server, stream())
        assert paced >= 0.3 - CLOCK_SLACK


def test_the_slow_first_token_profile_paces_three_answers() -> None:
    """Shipped ``faults/slow-first-token``: the next three answers paced (about 5 s to the
    first frame), then the recorded speed again."""
    pair = EnginePair.of(seed=1)
    profile = load_profile("slow-first-token")
    pair.engine.board.arm(profile.specs)
    firsts = [gaps(pair, stream())[0] for _ in range(4)]
    assert all(4000.0 <= first <= 6000.0 for first in firsts[:3]) and firsts[3] == 0.0
