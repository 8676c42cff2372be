"""Workspace templating and id remapping: replaying a recording in a new workspace. Pure.

Why (seeds/completion-test-api.md): an agent's recorded tool calls carry the
absolute path of the workspace it was recorded in, and ids minted during that
run (tool-call ids, a session id a tool returned) that later requests echo
back. Replayed somewhere else, both differ.

Workspace templating
    Recordings say ``<WORKSPACE>`` where the record-time workspace was. The test
    tells chaosllm the live one (``POST /__workspace {"path": ...}``). Incoming
    requests are keyed with the live path turned back into ``<WORKSPACE>``
    (`tokenize_workspace`), so they match their recordings exactly, and answers
    are served with ``<WORKSPACE>`` replaced by the live path
    (`substitute_workspace`; JSON-escaped inside tool-call arguments and other
    JSON text, so a Windows path stays valid JSON).

Id remapping
    When a recording is served for a request that is not identical to it (nearest
    or sequence matching), the recording's own request is aligned with the incoming
    conversation, message by message: differing tool-call ids and tool_call_ids
    pair directly, and two texts that are the same once their id-shaped tokens
    (UUIDs, ``prefix_123``/``prefix-abc1`` ids, long letter-and-digit tokens) are
    masked pair those tokens in order (`learn_id_map`). The answer is served with
    every recorded id replaced by the live one (`remap_ids`), so a multi-step flow
    refers to the ids of this run.

`adapt` does both to an exchange: body, and recorded stream frames when they
can be rewritten frame by frame (a token split across two frames cannot: the
frames are then dropped, and the provider renders the stream from the body).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from chaosllm.model import JSON, Exchange, RecordedChunk

__all__ = [
    "WORKSPACE_TOKEN",
    "adapt",
    "learn_id_map",
    "remap_ids",
    "substitute_workspace",
    "tokenize_workspace",
]

WORKSPACE_TOKEN = "<WORKSPACE>"

_ID = re.compile(
    r"""
    (?<![\w-])(?:
        [0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}
      | [A-Za-z][A-Za-z0-9]*[_-](?=[A-Za-z0-9_-]*[0-9])[A-Za-z0-9][A-Za-z0-9_-]*
      | (?=[A-Za-z]*[0-9])(?=[0-9]*[A-Za-z])[A-Za-z0-9]{12,}
    )(?![\w-])""",
    re.VERBOSE,
)
"""Tokens shaped like ids minted at run time."""

_MASK = "\x00"


def _escaped(text: str) -> str:
    """`text` as it appears inside a JSON string."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _walk(value: JSON, fix: Callable[[str, str | None], str], key: str | None = None) -> JSON:
    """`value` with every string value passed through ``fix(string, its key)``; the same
    object when nothing changed."""
    if isinstance(value, str):
        return fix(value, key)
    if isinstance(value, dict):
        changed = False
        out: dict[str, Any] = {}
        for k, v in value.items():
            new = _walk(v, fix, k)
            changed = changed or new is not v
            out[k] = new
        return out if changed else value
    if isinstance(value, list):
        items = [_walk(v, fix, key) for v in value]
        return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
    return value


def tokenize_workspace(body: JSON, workspace: str | None) -> JSON:
    """`body` with the live `workspace` path (raw, or JSON-escaped inside JSON text)
    replaced by ``<WORKSPACE>`` in every string; `body` itself when it has none."""
    if not workspace:
        return body
    root = workspace.rstrip("/\\") or workspace
    variants = sorted({root, _escaped(root)}, key=len, reverse=True)
    pattern = re.compile(
        r"(?<![\w.-])(?:" + "|".join(re.escape(v) for v in variants) + r")(?![\w.-])"
    )

    def fix(text: str, key: str | None) -> str:
        if not any(v in text for v in variants):
            return text
        new = pattern.sub(WORKSPACE_TOKEN, text)
        return new if new != text else text

    return _walk(body, fix)


def _is_json_text(text: str, key: str | None) -> bool:
    if key == "arguments":
        return True
    stripped = text.lstrip()
    if not stripped.startswith(("{", "[")):
        return False
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def substitute_workspace(value: JSON, workspace: str | None) -> JSON:
    """`value` with ``<WORKSPACE>`` replaced by the live path (JSON-escaped in tool-call
    arguments and other JSON text); `value` itself when it has no token."""
    if not workspace:
        return value
    root = workspace.rstrip("/\\") or workspace
    escaped = _escaped(root)

    def fix(text: str, key: str | None) -> str:
        if WORKSPACE_TOKEN not in text:
            return text
        return text.replace(WORKSPACE_TOKEN, escaped if _is_json_text(text, key) else root)

    return _walk(value, fix)


def _texts(content: JSON) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        ]
    return []


class _IdMap:
    def __init__(self) -> None:
        self.mapping: dict[str, str] = {}

    def pair(self, recorded: Any, live: Any) -> None:
        if (
            isinstance(recorded, str)
            and isinstance(live, str)
            and recorded != live
            and recorded
            and live
        ):
            self.mapping.setdefault(recorded, live)

    def pair_text(self, recorded: str, live: str) -> None:
        if recorded == live:
            return
        old, new = _ID.findall(recorded), _ID.findall(live)
        if not old or len(old) != len(new):
            return
        if _ID.sub(_MASK, recorded) != _ID.sub(_MASK, live):
            return
        for a, b in zip(old, new, strict=True):
            self.pair(a, b)


def learn_id_map(recorded: JSON, live: JSON) -> dict[str, str]:
    """``{recorded id: live id}`` from aligning a recording's request with the incoming
    one (both canonical request bodies), message by message from the start."""
    ids = _IdMap()
    old = recorded.get("messages") if isinstance(recorded, dict) else None
    new = live.get("messages") if isinstance(live, dict) else None
    if not isinstance(old, list) or not isinstance(new, list):
        return {}
    for a, b in zip(old, new, strict=False):
        if not isinstance(a, dict) or not isinstance(b, dict) or a.get("role") != b.get("role"):
            continue
        ids.pair(a.get("tool_call_id"), b.get("tool_call_id"))
        calls_a, calls_b = a.get("tool_calls"), b.get("tool_calls")
        if isinstance(calls_a, list) and isinstance(calls_b, list) and len(calls_a) == len(calls_b):
            for x, y in zip(calls_a, calls_b, strict=True):
                if not isinstance(x, dict) or not isinstance(y, dict):
                    continue
                ids.pair(x.get("id"), y.get("id"))
                fx, fy = x.get("function"), y.get("function")
                if (
                    isinstance(fx, dict)
                    and isinstance(fy, dict)
                    and isinstance(fx.get("arguments"), str)
                    and isinstance(fy.get("arguments"), str)
                ):
                    ids.pair_text(fx["arguments"], fy["arguments"])
        texts_a, texts_b = _texts(a.get("content")), _texts(b.get("content"))
        if len(texts_a) == len(texts_b):
            for x, y in zip(texts_a, texts_b, strict=True):
                ids.pair_text(x, y)
    return ids.mapping


def remap_ids(value: JSON, mapping: Mapping[str, str]) -> JSON:
    """`value` with every whole-token occurrence of a recorded id replaced by its live id;
    `value` itself when none occurs."""
    if not mapping:
        return value
    keys = sorted(mapping, key=len, reverse=True)
    pattern = re.compile(r"(?<![\w-])(?:" + "|".join(re.escape(k) for k in keys) + r")(?![\w-])")

    def fix(text: str, key: str | None) -> str:
        new = pattern.sub(lambda m: mapping[m.group(0)], text)
        return text if new == text else new

    return _walk(value, fix)


def _rewrite_frame(frame: str, rewrite: Callable[[JSON], JSON]) -> str:
    lines = frame.split("\n")
    changed = False
    for i, line in enumerate(lines):
        if not line.startswith("data:"):
            continue
        payload = line[5:].removeprefix(" ")
        try:
            data = json.loads(payload)
        except ValueError:
            continue
        new = rewrite(data)
        if new is not data:
            lines[i] = "data: " + json.dumps(new, separators=(",", ":"), ensure_ascii=False)
            changed = True
    return "\n".join(lines) if changed else frame


def adapt(
    exchange: Exchange,
    live: JSON,
    *,
    workspace: str | None,
    remap: bool,
    assemble: Callable[[Sequence[str]], JSON],
) -> tuple[Exchange, dict[str, str]]:
    """`exchange` as it must be served for the live request `live` (its keyed body): the
    workspace substituted, and, with `remap`, the ids learnt from aligning its recorded
    request with `live` remapped. Returns the exchange (itself when nothing changes)
    and the id map."""
    mapping = learn_id_map(exchange.request.body, live) if remap else {}
    if not workspace and not mapping:
        return exchange, mapping

    def rewrite(value: JSON) -> JSON:
        return remap_ids(substitute_workspace(value, workspace), mapping)

    response = exchange.response
    body = rewrite(response.body)
    chunks = response.chunks
    if chunks is not None:
        frames = [_rewrite_frame(c.data, rewrite) for c in chunks]
        pairs = list(zip(frames, chunks, strict=True))
        if body is not response.body or any(f is not c.data for f, c in pairs):
            try:
                faithful = assemble(frames) == rewrite(assemble([c.data for c in chunks]))
            except (ValueError, TypeError, AttributeError):
                faithful = False
            chunks = tuple(RecordedChunk(f, c.delay_ms) for f, c in pairs) if faithful else None
    if body is response.body and chunks is response.chunks:
        return exchange, mapping
    return replace(exchange, response=replace(response, body=body, chunks=chunks)), mapping
