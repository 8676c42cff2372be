from __future__ import annotations

import base64
import math
import struct

import pytest

from chaosllm.errors import InvalidRequest
from chaosllm.providers.embeddings import embed, embeddings_response


def test_same_input_same_vector_different_input_different_vector() -> None:
    assert embed("m", "a", 8) == embed("m", "a", 8)
    assert embed("m", "a", 8) != embed("m", "b", 8)
    assert embed("m", "a", 8) != embed("other", "a", 8)


@pytest.mark.parametrize("text", ["", "x", "hello world"])
def test_unit_length_never_zero(text: str) -> None:
    vector = embed("m", text, 64)
    assert math.isclose(math.sqrt(sum(v * v for v in vector)), 1.0, rel_tol=1e-9)
    assert vector[0] != 0.0 and any(v != 0.0 for v in vector)


def test_dimensions_honoured_and_defaults() -> None:
    r = embeddings_response(
        {"model": "text-embedding-3-small", "input": ["a", "b"], "dimensions": 256}
    )
    assert [len(d["embedding"]) for d in r["data"]] == [256, 256]
    assert [d["index"] for d in r["data"]] == [0, 1]
    r = embeddings_response({"model": "text-embedding-3-large", "input": "a"})
    assert len(r["data"][0]["embedding"]) == 3072


def test_base64_is_little_endian_float32() -> None:
    r = embeddings_response(
        {"model": "m", "input": "a", "dimensions": 4, "encoding_format": "base64"}
    )
    raw = base64.b64decode(r["data"][0]["embedding"])
    decoded = struct.unpack("<4f", raw)
    expected = embed("m", "a", 4)
    assert all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(decoded, expected, strict=True))


@pytest.mark.parametrize(
    "body",
    [
        {"input": "a"},
        {"model": "m"},
        {"model": "m", "input": []},
        {"model": "m", "input": 3},
        {"model": "m", "input": "a", "dimensions": 0},
        {"model": "m", "input": "a", "encoding_format": "hex"},
        [],
    ],
)
def test_bad_requests(body: object) -> None:
    with pytest.raises(InvalidRequest):
        embeddings_response(body)
