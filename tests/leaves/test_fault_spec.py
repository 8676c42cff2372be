"""Fault spec validation: all or nothing, and errors that list what is valid."""

from __future__ import annotations

from typing import Any

import pytest

from chaosllm.errors import InvalidFaultSpec
from chaosllm.faults import FAULT_TYPES, parse_fault_spec, parse_fault_specs
from tests.helpers import FAILURE_CLASSES, MCP_FAULTS, QUIRKS, SESSION_FAULTS

SPEC_NAMES = [
    "empty_response",
    "truncated_stream",
    "dropped_connection",
    "error_in_200",
    "http_503",
    "malformed_tool_args",
    "http_429",
    "http_error",
    "connection_reset",
    "empty_reply",
    "latency",
    "slow_stream",
    "stall",
    "garbage",
    *FAILURE_CLASSES,
    *QUIRKS,
    *SESSION_FAULTS,
    *MCP_FAULTS,
    *("background_failed", "resume_refused", "cancel_ignored", "response_expired"),
    *("openrouter_credits", "openrouter_midstream_error", "vllm_stream_error"),
    *("reasoning_preamble", "unsupported_param"),
]


def test_catalogue_has_every_spec_type_in_order() -> None:
    assert list(FAULT_TYPES) == SPEC_NAMES


def test_defaults_and_alias() -> None:
    spec = parse_fault_spec({"type": "dropped_connection", "afterChunks": 3})
    assert spec.remaining == 1 and spec.probability == 1.0
    assert spec.param("after_chunks") == 3
    assert spec.param("after_bytes") is None
    assert parse_fault_spec({"type": "http_429"}).param("retry_after") == 1.0


def test_full_spec() -> None:
    spec = parse_fault_spec(
        {
            "type": "http_error",
            "status": 502,
            "remaining": 3,
            "probability": 0.5,
            "retry_after": 2,
            "match": {
                "path": "/v1/chat/completions",
                "model": "gpt-4o-mini",
                "session": "s1",
                "stream": True,
            },
        }
    )
    assert spec.to_json() == {
        "type": "http_error",
        "status": 502,
        "remaining": 3,
        "probability": 0.5,
        "retry_after": 2.0,
        "match": {
            "path": "/v1/chat/completions",
            "model": "gpt-4o-mini",
            "session": "s1",
            "stream": True,
        },
    }
    assert parse_fault_spec(spec.to_json()) == spec


@pytest.mark.parametrize(
    ("data", "fragments"),
    [
        (
            {"type": "nope"},
            ["unknown fault type 'nope'", "http_503", "stall (after_chunks, max_ms)"],
        ),
        ({}, ["unknown fault type missing", "Valid fault types"]),
        ([], ["must be a JSON object"]),
        ({"type": "http_503", "remaining": -1}, ["remaining must be an integer >= 1"]),
        ({"type": "http_503", "remaining": 0}, ["remaining must be an integer >= 1"]),
        ({"type": "http_503", "remaining": 1.5}, ["remaining must be an integer"]),
        ({"type": "http_503", "probability": 1.5}, ["probability must be a number within 0..1"]),
        ({"type": "http_503", "probability": -0.1}, ["probability"]),
        (
            {"type": "http_503", "after_chunks": 2},
            ["http_503 has no parameter 'after_chunks'", "retry_after", "message"],
        ),
        (
            {"type": "empty_reply", "delay_ms": 2},
            ["empty_reply has no parameter 'delay_ms'", "no parameters of its own"],
        ),
        ({"type": "http_503", "colour": "red"}, ["no parameter 'colour'"]),
        ({"type": "truncated_stream", "after_chunks": -1}, ["after_chunks must be >= 0"]),
        ({"type": "truncated_stream", "after_chunks": "3"}, ["after_chunks must be an integer"]),
        ({"type": "http_error", "status": 200}, ["status must be within 400..599"]),
        ({"type": "http_503", "match": {"host": "x"}}, ["match has no field 'host'"]),
        ({"type": "http_503", "match": "s1"}, ["match must be an object"]),
        ({"type": "latency", "delay_ms": True}, ["delay_ms must be a number"]),
        ({"type": "dropped_connection", "afterChunks": 1, "after_chunks": 2}, ["both"]),
    ],
)
def test_bad_specs_explain_themselves(data: Any, fragments: list[str]) -> None:
    with pytest.raises(InvalidFaultSpec) as info:
        parse_fault_spec(data)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_array_is_all_or_nothing_and_names_the_bad_item() -> None:
    with pytest.raises(InvalidFaultSpec, match=r"fault \[1\]: unknown fault type"):
        parse_fault_specs([{"type": "http_503"}, {"type": "bogus"}])
    assert [s.type for s in parse_fault_specs([{"type": "http_503"}, {"type": "stall"}])] == [
        "http_503",
        "stall",
    ]
    with pytest.raises(InvalidFaultSpec, match="empty array"):
        parse_fault_specs([])


def test_invalid_fault_spec_is_a_value_error() -> None:
    assert issubclass(InvalidFaultSpec, ValueError)
