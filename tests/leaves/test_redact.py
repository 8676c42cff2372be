"""Redaction: what never reaches a recording (pure)."""

from __future__ import annotations

import json

from chaosllm.providers import PROVIDERS
from chaosllm.store.redact import (
    REDACTED,
    Redactor,
    kept_response_headers,
    redact_body,
    redact_text,
)

OPENAI_KEY = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0" * 3
ANTHROPIC_KEY = "sk-ant-api03-" + "Zy9Xw8Vu7Ts6Rq5Po4" * 4
GOOGLE_KEY = "AIza" + "SyD4-abcdefghijklmnopqrstuvwxyz0123"


def test_well_known_key_shapes_are_redacted_anywhere_in_a_string() -> None:
    text = f"keys: {OPENAI_KEY}, {ANTHROPIC_KEY} and {GOOGLE_KEY}."
    assert redact_text(text) == f"keys: {REDACTED}, {REDACTED} and {REDACTED}."


def test_words_that_merely_contain_sk_dash_are_left_alone() -> None:
    for text in (
        "task-force",
        "ask-me-anything",
        "sk-learn",
        "risk-free",
        "sk-short123",
        "the desk-lamp-with-a-very-long-name-indeed",
    ):
        assert redact_text(text) == text


def test_configured_secrets_are_redacted_longest_first() -> None:
    redactor = Redactor(["hunter2", "hunter2-and-more", "  ", ""])
    assert redactor.secrets == ("hunter2-and-more", "hunter2")
    assert redactor.text("a hunter2-and-more b hunter2 c") == f"a {REDACTED} b {REDACTED} c"


def test_bodies_are_redacted_recursively_without_touching_the_input() -> None:
    body = {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "user", "content": f"my key is {OPENAI_KEY}"},
            {"role": "user", "content": [{"type": "text", "text": "password: s3cr3t-value"}]},
        ],
        "metadata": {OPENAI_KEY: 1, "n": 3, "flag": True, "none": None},
    }
    original = json.loads(json.dumps(body))
    redacted = redact_body(body, ["s3cr3t-value"])
    assert body == original
    assert redacted["messages"][0]["content"] == f"my key is {REDACTED}"
    assert redacted["messages"][1]["content"][0]["text"] == f"password: {REDACTED}"
    assert redacted["metadata"] == {REDACTED: 1, "n": 3, "flag": True, "none": None}
    assert OPENAI_KEY not in json.dumps(redacted) and "s3cr3t" not in json.dumps(redacted)


def test_the_fast_path_skips_bodies_that_cannot_hold_a_secret() -> None:
    redactor = Redactor(["hunter2"])
    clean = {"messages": [{"role": "user", "content": "hello"}]}
    raw = json.dumps(clean).encode()
    assert not redactor.may_contain_secret(raw)
    assert redactor.request_body(clean, raw) is clean
    assert redactor.may_contain_secret(b'{"content": "hunter2"}')
    # An escape could hide a configured value: parse-level redaction then runs.
    escaped = b'{"content": "hunter\\u0032"}'
    assert redactor.may_contain_secret(escaped)
    assert redactor.request_body(json.loads(escaped), escaped) == {"content": REDACTED}
    assert Redactor().may_contain_secret(f'"{OPENAI_KEY}"'.encode())


def test_the_digest_is_the_same_for_the_key_and_its_redaction() -> None:
    provider = PROVIDERS["openai.chat"]
    sent = {"model": "m", "messages": [{"role": "user", "content": f"use {OPENAI_KEY}"}]}
    stored = redact_body(sent)
    assert provider.digest(
        Redactor().request_body(sent, json.dumps(sent).encode())
    ) == provider.digest(stored)


def test_only_informative_response_headers_are_kept() -> None:
    headers = [
        ("X-Request-Id", "req_1"),
        ("openai-processing-ms", "120"),
        ("openai-version", "2020"),
        ("x-ratelimit-remaining-tokens", "999"),
        ("x-ratelimit-reset-requests", "1s"),
        ("retry-after", "2"),
        ("anthropic-ratelimit-requests-remaining", "4"),
        ("request-id", "req_2"),
        ("set-cookie", "__cf_bm=secret"),
        ("openai-organization", "org-secret"),
        ("authorization", "Bearer x"),
        ("content-type", "application/json"),
        ("cf-ray", "abc"),
        ("date", "today"),
        ("content-length", "10"),
    ]
    assert kept_response_headers(headers) == (
        ("anthropic-ratelimit-requests-remaining", "4"),
        ("openai-processing-ms", "120"),
        ("openai-version", "2020"),
        ("request-id", "req_2"),
        ("retry-after", "2"),
        ("x-ratelimit-remaining-tokens", "999"),
        ("x-ratelimit-reset-requests", "1s"),
        ("x-request-id", "req_1"),
    )
