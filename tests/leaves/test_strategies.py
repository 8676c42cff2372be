"""`chaosllm.strategies`: valid specs, eager argument validation, shrinking."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import find, given, settings
from hypothesis.errors import InvalidArgument

from chaosllm.faults import FAULT_TYPES, parse_fault_specs
from chaosllm.strategies import SIMPLEST_FIRST, fault_schedules, faults


def test_simplest_first_covers_the_catalogue() -> None:
    assert sorted(SIMPLEST_FIRST) == sorted(FAULT_TYPES)


@given(schedule=fault_schedules(max_faults=4, session="s1", remaining=2))
def test_every_drawn_schedule_is_a_valid_spec_list(schedule: list[dict[str, Any]]) -> None:
    assert len(schedule) <= 4
    if schedule:
        specs = parse_fault_specs(schedule)
        assert all(s.match.session == "s1" and s.remaining == 2 for s in specs)


@given(spec=faults(types=["http_error"], statuses=[502]))
def test_types_and_statuses_are_honoured(spec: dict[str, Any]) -> None:
    assert spec == {"type": "http_error", "status": 502, "remaining": 1}


@given(spec=faults(types=["dropped_connection"], max_after_chunks=2))
def test_after_chunks_range(spec: dict[str, Any]) -> None:
    assert 0 <= spec["after_chunks"] <= 2


@pytest.mark.parametrize(
    ("factory", "kwargs", "fragment"),
    [
        (faults, {"types": []}, "at least one"),
        (faults, {"types": ["nope"]}, "unknown fault type 'nope'"),
        (faults, {"types": "http_503"}, "sequence of fault type names"),
        (faults, {"types": ["http_503", "http_503"]}, "twice"),
        (faults, {"max_after_chunks": -1}, "max_after_chunks"),
        (faults, {"max_retry_after": float("nan")}, "max_retry_after"),
        (faults, {"remaining": 0}, "remaining"),
        (faults, {"statuses": [200]}, "statuses"),
        (faults, {"session": 3}, "session"),
        (fault_schedules, {"min_faults": 3, "max_faults": 1}, "more than max_faults"),
        (fault_schedules, {"max_faults": -1}, "max_faults"),
        (fault_schedules, {"colour": "red"}, "unknown option 'colour'"),
    ],
)
def test_arguments_are_validated_at_once(
    factory: Any, kwargs: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(InvalidArgument, match=fragment):
        factory(**kwargs)  # no example drawn


def test_keyword_only() -> None:
    with pytest.raises(TypeError):
        faults(["http_503"])  # type: ignore[call-arg]


def test_schedules_shrink_to_the_shortest_simplest() -> None:
    quiet = settings(database=None, max_examples=500, derandomize=True)
    smallest = find(fault_schedules(max_faults=4), lambda s: len(s) >= 2, settings=quiet)
    assert smallest == [{"type": "http_503", "retry_after": 0.025, "remaining": 1}] * 2
    smallest = find(
        fault_schedules(max_faults=4),
        lambda s: any(f["type"] == "dropped_connection" for f in s),
        settings=quiet,
    )
    assert smallest == [{"type": "dropped_connection", "after_chunks": 0, "remaining": 1}]
