"""chaosllm.store.diff: where two JSON values differ, by path, in a stable order."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from chaosllm.store.diff import json_differences

RECORDED = {
    "model": "gpt-4o",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
    ],
    "temperature": 0.2,
}
INCOMING = {
    "model": "gpt-4o-mini",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the capital of Spain?"},
    ],
    "temperature": 0.2,
    "tools": [],
}


def test_request_differences_by_path() -> None:
    assert json_differences(RECORDED, INCOMING) == [
        "messages: 3 items != 2 items",
        "messages[1].content: 'What is the capital of France?' != 'What is the capital of Spain?'",
        "model: 'gpt-4o' != 'gpt-4o-mini'",
        "tools: missing != present",
    ]
    assert json_differences(INCOMING, RECORDED)[-1] == "tools: present != missing"


def test_equal_values_have_no_differences() -> None:
    assert json_differences(RECORDED, json.loads(json.dumps(RECORDED))) == []
    assert json_differences(1, 1.0) == []
    assert json_differences(None, None) == []


def test_limit() -> None:
    a = {f"k{i:02}": i for i in range(20)}
    b = {f"k{i:02}": -i for i in range(20)}
    assert json_differences(a, b) == [f"k{i:02}: {i} != {-i}" for i in range(1, 6)]
    assert len(json_differences(a, b, limit=100)) == 19
    assert json_differences(a, b, limit=0) == []


def test_long_strings_are_cut_around_the_first_difference() -> None:
    a = "x" * 100 + "The quick brown fox jumps over the lazy dog" + "y" * 100
    b = a.replace("fox", "cat")
    (line,) = json_differences({"text": a}, {"text": b})
    left, right = line.removeprefix("text: ").split(" != ")
    assert left == "'…" + "x" * 14 + "The quick brown fox jumps over the lazy dogyyy…'"
    assert right == "'…" + "x" * 14 + "The quick brown cat jumps over the lazy dogyyy…'"
    # A difference at the start: no leading cut.
    (line,) = json_differences("A" + "z" * 100, "B" + "z" * 100)
    assert line == "$: 'A" + "z" * 29 + "…' != 'B" + "z" * 29 + "…'"
    # One string extends the other.
    (line,) = json_differences("z" * 100, "z" * 100 + "!")
    assert line == "$: '…" + "z" * 30 + "' != '…" + "z" * 30 + "!'"


def test_scalars_and_types() -> None:
    assert json_differences([1, True, None, 1.5], [1.0, 1, False, "1.5"], limit=10) == [
        "[1]: true != 1",
        "[2]: null != false",
        "[3]: 1.5 != '1.5'",
    ]
    assert json_differences({"content": "hi"}, {"content": [{"type": "text"}]}) == [
        """content: 'hi' != [{"type":"text"}]"""
    ]
    big = {"k": list(range(50))}
    assert json_differences(big, {"k": "x"}) == ["k: [50 items] != 'x'"]
    assert json_differences({"k": {str(i): i for i in range(30)}}, {"k": 0}) == [
        "k: {30 keys} != 0"
    ]
    assert json_differences("a", "b") == ["$: 'a' != 'b'"]
    assert json_differences([1], [1, 2]) == ["$: 1 item != 2 items"]


def test_paths_quote_keys_that_are_not_identifiers() -> None:
    assert json_differences({"x-trace id": {"a.b": 1}}, {"x-trace id": {"a.b": 2}}) == [
        '["x-trace id"]["a.b"]: 1 != 2'
    ]
    assert json_differences([{"a": [0, 1]}], [{"a": [0, 2]}]) == ["[0].a[1]: 1 != 2"]


def test_deep_nesting_does_not_recurse() -> None:
    a: Any = "left"
    b: Any = "right"
    for _ in range(5000):
        a, b = [a], [b]
    (line,) = json_differences(a, b)
    assert line == "[0]" * 5000 + ": 'left' != 'right'"


def test_order_does_not_depend_on_key_insertion_order() -> None:
    a = {"b": 1, "a": 1, "c": {"y": 1, "x": 1}}
    b = {"c": {"x": 2, "y": 2}, "a": 2, "b": 2}
    assert json_differences(a, b, limit=10) == [
        "a: 1 != 2",
        "b: 1 != 2",
        "c.x: 1 != 2",
        "c.y: 1 != 2",
    ]


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=80),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300)
@given(_JSON)
def test_a_value_equals_itself(value: Any) -> None:
    assert json_differences(value, value) == []
    assert json_differences(value, json.loads(json.dumps(value))) == []


@settings(max_examples=300)
@given(_JSON, _JSON)
def test_differences_are_symmetric_and_bounded(a: Any, b: Any) -> None:
    forward = json_differences(a, b, limit=1000)
    backward = json_differences(b, a, limit=1000)
    assert len(forward) == len(backward)
    assert json_differences(a, b, limit=3) == forward[:3]
    if json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True):
        assert forward == []
    for line in forward:
        assert " != " in line
