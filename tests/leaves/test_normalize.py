"""chaosllm.store.normalize: volatile substrings become placeholders, nothing else moves."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from chaosllm.store.normalize import (
    PLACEHOLDERS,
    normalize_text,
    normalize_tokens,
    tokenize,
    tokenize_bytes,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Provider ids.
        ("id call_abc123XYZ done", "id <id> done"),
        ("chatcmpl-9xYz12AbCdEf", "<id>"),
        ("toolu_01A09q90qw90lq917835lq9", "<id>"),
        ("resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b", "<id>"),
        ("msg_01XFDUDYJgAACzvnptvVoYEL", "<id>"),
        ("(call_ABCDEFGHIJKLMNOPQRSTUVWX)", "(<id>)"),  # long, no digit
        # UUIDs, hex, random tokens.
        ("uuid 123e4567-e89b-12d3-a456-426614174000", "uuid <id>"),
        ("sha 3f786850e387550fdab836ed7e6dc881de23001b", "sha <id>"),
        ("abcdef012345", "<id>"),
        ("token aB3dE5gH7jK9mN1pQ3", "token <id>"),
        # Timestamps.
        ("at 2024-05-01T10:30:00.123Z", "at <ts>"),
        ("at 2024-05-01t10:30:00+05:30.", "at <ts>."),
        ("on 2024-05-01", "on <ts>"),
        ("20240501T103000Z", "<ts>"),
        ("at 12:34:56", "at <time>"),
        ("'2024-05-01 10:30:00'", "'<ts> <time>'"),
        ("epoch 1712345678", "epoch <ts>"),
        ("ms 1712345678123", "ms <ts>"),
        ("fractional 1712345678.25", "fractional <ts>"),
        # Paths.
        ("see /home/alice/project/src/app.py now", "see <path> now"),
        ("/tmp/pytest-of-bob/pytest-12/test0", "<path>"),
        ("/Users/x/y", "<path>"),
        ("/a/b", "<path>"),
        ("file:///home/x/y.txt", "file://<path>"),
        ('"/tmp/a/b"', '"<path>"'),
        ("PATH=/usr/bin:/usr/local/bin", "path=<path>:<path>"),
        ("server:/var/log/x", "server:<path>"),
        (r"C:\Users\Bob\AppData\x.txt", "<path>"),
        ("C:/x/y", "<path>"),
        (r"C:\\Users\\bob", "<path>"),
        # Ports (the host stays).
        ("http://localhost:8080/v1", "http://localhost:<port>/v1"),
        ("http://127.0.0.1:8000/x", "http://127.0.0.1:<port>/x"),
        ("[::1]:9000", "[::1]:<port>"),
        ("http://myhost:1234/", "http://myhost:<port>/"),
        ("api.openai.com:443", "api.openai.com:<port>"),
        ("listening on localhost:8080.", "listening on localhost:<port>."),
        ("host:54321", "host:<port>"),
    ],
)
def test_volatile_parts_become_placeholders(text: str, expected: str) -> None:
    assert normalize_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "call_id tool_call_id file-based msg_handler",
        "step 3 version 1.2.3 at 10:30 abc123 gpt-4o-mini",
        "and/or 1/2/3 src/app.py ~/x/y /usr",
        "https://api.openai.com/v1/chat/completions",
        "internationalization <id> <path>",
        "ratio 16:9 and 2024",
    ],
)
def test_stable_text_is_only_folded(text: str) -> None:
    assert normalize_text(text) == " ".join(text.casefold().split())


def test_case_folded_and_whitespace_collapsed() -> None:
    assert normalize_text("  What IS\tthe\n\n capital   of France?  ") == (
        "what is the capital of france?"
    )
    assert normalize_text("") == ""
    assert normalize_text(" \n\t ") == ""


def test_requests_differing_only_in_volatile_parts_compare_equal() -> None:
    one = (
        "Tool call call_Ab12Cd34Ef56Gh78 returned at 2024-05-01T10:30:00Z from "
        "/tmp/pytest-of-alice/pytest-7/test_x0/out.json via http://127.0.0.1:54321/v1 "
        "(request 123e4567-e89b-12d3-a456-426614174000, t=1712345678)"
    )
    two = (
        "Tool call call_Zz98Yy76Xx54Ww32 returned at 2025-12-31T23:59:59.999Z from "
        "/tmp/pytest-of-bob/pytest-9/test_x0/out.json via http://127.0.0.1:8000/v1 "
        "(request 00000000-0000-4000-8000-000000000000, t=1798765432)"
    )
    assert normalize_text(one) == normalize_text(two)
    assert normalize_text(one) != normalize_text(one.replace("Tool", "Other"))


def test_placeholders_are_listed() -> None:
    found = set(
        normalize_tokens(
            "call_abc123 2024-05-01 12:34:56 /tmp/a/b localhost:8080 "
            "3f786850e387550fdab836ed7e6dc881de23001b"
        )
    )
    assert {"<id>", "<ts>", "<time>", "<path>", "localhost", "<port>"} <= found
    assert set(PLACEHOLDERS) == {"<id>", "<ts>", "<time>", "<path>", "<port>"}


def test_tokens() -> None:
    assert normalize_tokens("Hello, World! It's call_abc123.") == [
        "hello",
        "world",
        "it",
        "s",
        "<id>",
    ]
    assert tokenize("naïve “quoted” — 東京 snake_case") == [
        "naïve",
        "quoted",
        "東京",
        "snake_case",
    ]
    assert tokenize_bytes("Héllo, wörld") == ["héllo".encode(), "wörld".encode()]


_VOLATILE_BITS = st.sampled_from(
    [
        "call_abc123",
        "chatcmpl-",
        "toolu_",
        "2024-05-01",
        "t10:30:00",
        "12:34:56",
        "1712345678",
        "123",
        "/tmp/a/b",
        "/",
        "\\",
        "c:",
        "localhost:8080",
        "127.0.0.1",
        ":",
        ".",
        "-",
        "_",
        "<id>",
        "<",
        ">",
        " ",
        "\n",
        "file://",
        "[::1]",
        "deadbeef0123",
        "ab",
        "x",
        "0",
        "\u0131",  # dotless i
        "ß",
        "İ",
    ]
)
_TEXT = st.one_of(st.text(max_size=80), st.lists(_VOLATILE_BITS, max_size=20).map("".join))


@settings(max_examples=500)
@given(_TEXT)
@example("localhost:8080call_abc123")
@example("1712345678127.0.0.1t10:30:00")
@example("deadbeef0123localhost:8080")
@example("file://1712345678localhost:8080")
@example("127.0.0.1deadbeef0123localhost:8080")
@example("localhost:8080.2024-05-01")
def test_normalize_is_idempotent(text: str) -> None:
    once = normalize_text(text)
    assert normalize_text(once) == once


@settings(max_examples=300)
@given(_TEXT)
def test_normalized_text_is_collapsed(text: str) -> None:
    out = normalize_text(text)
    assert out == " ".join(out.split())


@settings(max_examples=300)
@given(st.text(max_size=60))
def test_tokenize_bytes_matches_tokenize(text: str) -> None:
    assert [t.decode("utf-8", "surrogatepass") for t in tokenize_bytes(text)] == tokenize(text)
