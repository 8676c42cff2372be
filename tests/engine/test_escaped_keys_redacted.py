"""A key whose characters are written as JSON escapes (``"\\u0073k-..."`` is ``"sk-..."``)
is redacted like a plain one: redaction runs on the decoded strings, so the escaped key
reaches neither the journal, the miss message, the log nor a recording, and the request
is keyed on its redacted form, so that its recording answers it after a restart.

The pure checks drive `Redactor` and the engine in memory; the last two run real servers
(a replaying `ChaosServer` as the upstream, as ``tests/system/test_record_proxy.py`` does).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaosllm import ChaosServer
from chaosllm.config import Mode
from chaosllm.providers import PROVIDERS
from chaosllm.store.redact import REDACTED, Redactor
from tests.helpers import request_body
from tests.memory import EnginePair

pytestmark = pytest.mark.timeout(60)

KEY = "sk-proj-" + "EscapedKey0123456789" * 3
GOOGLE_KEY = "AIza" + "SyD4-abcdefghijklmnopqrstuvwxyz0123"
CORE = "EscapedKey0123456789"
CHAT = "/v1/chat/completions"


def shows_key(text: str) -> bool:
    """Whether `text` shows `KEY` or a piece of it: its start (after the ``s`` an escape
    may hide) or its middle (a miss message cuts long texts)."""
    return KEY[1:12] in text or CORE in text


def escaped(text: str, positions: set[int], *, upper: bool = False) -> str:
    """`text` as JSON string content, the characters at `positions` written as ``\\uXXXX``."""
    out = []
    for i, char in enumerate(text):
        if i in positions:
            units = char.encode("utf-16-be")  # a surrogate pair beyond the BMP
            for at in range(0, len(units), 2):
                code = units[at : at + 2].hex()
                out.append("\\u" + (code.upper() if upper else code))
        else:
            out.append(json.dumps(char)[1:-1])
    return "".join(out)


def raw_with(body: dict[str, Any], secret: str, written: str) -> bytes:
    """`body` serialised, `secret` (somewhere in it) written as `written` in the bytes."""
    text = json.dumps(body)
    assert text.count(secret) == 1
    return text.replace(secret, written).encode()


def asking_with(secret: str) -> dict[str, Any]:
    """The shipped simple-chat request, its question carrying `secret`."""
    body = request_body("simple-chat/0001", stream=False)
    messages = [dict(m) for m in body["messages"]]
    messages[-1]["content"] = f"{messages[-1]['content']} My key is {secret}, keep it safe."
    return {**body, "messages": messages}


FORMS = {
    "s escaped": escaped(KEY, {0}),
    "k escaped": escaped(KEY, {1}),
    "dash escaped": escaped(KEY, {2}),
    "k escaped, upper-case hex": escaped(KEY, {1}, upper=True),
    "dash escaped, upper-case hex": escaped(KEY, {2}, upper=True),
    "marker escaped": escaped(KEY, {0, 1, 2}),
    "whole key escaped": escaped(KEY, set(range(len(KEY)))),
}
GOOGLE_FORMS = {
    f"{GOOGLE_KEY[i]} escaped": escaped(GOOGLE_KEY, {i}, upper=i == 2) for i in range(4)
}


# -- Redactor: the decoded strings decide -----------------------------------------------


@pytest.mark.parametrize(
    ("secret", "written"),
    [(KEY, form) for form in FORMS.values()]
    + [(GOOGLE_KEY, form) for form in GOOGLE_FORMS.values()],
    ids=[*FORMS, *GOOGLE_FORMS],
)
def test_a_key_with_escaped_characters_is_redacted(secret: str, written: str) -> None:
    raw = raw_with({"messages": [{"role": "user", "content": f"key: {secret}"}]}, secret, written)
    assert secret.encode() not in raw
    parsed = json.loads(raw)
    assert parsed["messages"][0]["content"] == f"key: {secret}"
    for redactor in (Redactor(), Redactor(["hunter2"])):
        assert redactor.may_contain_secret(raw)
        assert redactor.request_body(parsed, raw) == {
            "messages": [{"role": "user", "content": f"key: {REDACTED}"}]
        }


def test_an_escaped_key_used_as_an_object_key_is_redacted() -> None:
    raw = ('{"metadata": {"' + FORMS["s escaped"] + '": 1}}').encode()
    assert Redactor().request_body(json.loads(raw), raw) == {"metadata": {REDACTED: 1}}


def test_escapes_of_other_characters_keep_the_fast_path() -> None:
    # Latin text written by ``json.dumps`` (``\u00e9``), newlines and quotes: nothing in
    # them can decode to a key marker, so the body is returned as it is, not walked.
    body = {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": 'Réponds "brièvement".\nMerci, ¡señor!'},
            {"role": "user", "content": "Qu'est-ce qu'un résumé ? \u2019 \U0001f600 \\ / \t"},
        ],
    }
    for raw in (json.dumps(body).encode(), json.dumps(body, ensure_ascii=False).encode()):
        assert b"\\" in raw
        parsed = json.loads(raw)
        assert not Redactor().may_contain_secret(raw)
        assert Redactor().request_body(parsed, raw) is parsed


_TEXT = st.text(st.characters(codec="utf-8"), max_size=12)


@settings(max_examples=300, deadline=None)
@given(
    before=_TEXT,
    after=_TEXT,
    secret=st.sampled_from([KEY, GOOGLE_KEY, "hunter2"]),
    data=st.data(),
)
def test_the_fast_path_never_skips_a_secret_however_the_bytes_are_escaped(
    before: str, after: str, secret: str, data: st.DataObject
) -> None:
    text = f"{before} {secret} {after}"  # a key shape counts after a non-alphanumeric
    positions = set(data.draw(st.lists(st.integers(0, len(text) - 1), max_size=len(text))))
    upper = data.draw(st.booleans())
    raw = ('{"content": "' + escaped(text, positions, upper=upper) + '"}').encode()
    parsed = json.loads(raw)
    assert parsed == {"content": text}
    redactor = Redactor(["hunter2"])
    # Whether or not the walk is skipped, the result is the walk's.
    assert redactor.request_body(parsed, raw) == redactor.body(parsed)
    if secret != "hunter2":
        assert Redactor().request_body(parsed, raw) == Redactor().body(parsed)
        assert secret not in json.dumps(Redactor().request_body(parsed, raw))


# -- the engine, in memory --------------------------------------------------------------


def test_an_escaped_key_is_keyed_as_its_redaction_and_kept_out_of_the_miss(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pair = EnginePair.of()
    body = asking_with(KEY)
    provider = PROVIDERS["openai.chat"]
    expected_digest = provider.digest(Redactor().body(body))
    with caplog.at_level(logging.DEBUG, logger="chaosllm"):
        plain = pair.send(body)
        escapes = [pair.send(None, raw=raw_with(body, KEY, form)) for form in FORMS.values()]
    for answer in [plain, *escapes]:
        assert answer.status == 404
        assert answer.headers["x-chaosllm-digest"] == expected_digest
        message = answer.error["message"]
        assert "No recording matches this request" in message
        assert not shows_key(message) and "\\u00" not in message
    assert "[REDACTED]" in escapes[0].error["message"]  # the differing text, redacted
    assert not shows_key(caplog.text)
    assert sum("miss:" in r.getMessage() for r in caplog.records) == len(FORMS) + 1
    assert not shows_key(json.dumps(pair.journal()))
    assert {e["digest"] for e in pair.journal()} == {expected_digest}


def test_an_escaped_key_in_record_missing_is_keyed_on_the_redacted_request() -> None:
    pair = EnginePair.of(
        mode=Mode.RECORD_MISSING, upstream="http://127.0.0.1:9", record_dir=Path("unused")
    )
    body = asking_with(KEY)
    proxy = pair.proxy(None, raw=raw_with(body, KEY, FORMS["marker escaped"]))
    assert proxy.record
    assert proxy.body == Redactor().body(body)
    assert proxy.digest == PROVIDERS["openai.chat"].digest(Redactor().body(body))


# -- real servers ------------------------------------------------------------------------


def test_a_replay_miss_over_a_socket_never_shows_the_escaped_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    raw = raw_with(asking_with(KEY), KEY, FORMS["s escaped"])
    with (
        caplog.at_level(logging.DEBUG, logger="chaosllm"),
        ChaosServer() as server,
        httpx.Client(timeout=10) as client,
    ):
        response = client.post(
            server.url + CHAT, content=raw, headers={"content-type": "application/json"}
        )
        journal = server.requests()
    assert response.status_code == 404
    assert response.headers["x-chaosllm-match"] == "miss"
    assert not shows_key(response.text)
    assert not shows_key(caplog.text)
    assert not shows_key(json.dumps(journal))


def _files(directory: Path) -> dict[Path, str]:
    return {p: p.read_text("utf-8") for p in sorted(directory.rglob("*.json"))}


def test_record_missing_records_an_escaped_key_once_and_replays_it_after_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    record_dir = tmp_path / "recordings"
    raw = raw_with(asking_with(KEY), KEY, FORMS["marker escaped"])
    headers = {"content-type": "application/json", "authorization": f"Bearer {KEY}"}
    answers = []
    with (
        caplog.at_level(logging.DEBUG, logger="chaosllm"),
        ChaosServer(on_miss="fallback") as upstream,
        httpx.Client(timeout=10) as client,
    ):
        for run in range(2):  # two servers over one record dir: a restart
            with ChaosServer(
                mode="record-missing", upstream=upstream.url, record_dir=record_dir
            ) as server:
                response = client.post(server.url + CHAT, content=raw, headers=headers)
                assert response.status_code == 200, response.text
                answers.append(response.json())
                journal = server.requests(settle=5)
            assert [e["match"] for e in journal] == ["upstream" if run == 0 else "exact"]
            assert len(upstream.requests()) == 1  # the second run asked nobody
            files = _files(record_dir)
            assert len(files) == 1
            assert not shows_key(json.dumps(journal))
        upstream_journal = upstream.requests()
    assert answers[0] == answers[1]
    [text] = files.values()
    assert not shows_key(text) and "\\u00" not in text
    recorded = json.loads(text)["request"]["body"]["messages"][-1]["content"]
    assert recorded.endswith(f"My key is {REDACTED}, keep it safe.")
    assert not shows_key(caplog.text)
    assert not shows_key(json.dumps(upstream_journal))
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and shows_key(p.read_text("utf-8"))]
