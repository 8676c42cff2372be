"""Session recordings (WebSocket: OpenAI Realtime, Gemini Live) in the recordings
directories: ``{"chaosllm": 1, "provider": "openai.realtime", "session": {"path",
"model", "events": [{"from": "client"|"server", "t_ms", "event"}, ...]}}``.

They hold no HTTP exchange: the request store skips them (this entry parses them to
none, ahead of the native format they would otherwise be mistaken for), and
`chaosllm.store.sessions.SessionStore` loads them."""

from __future__ import annotations

from pathlib import Path

from chaosllm.model import JSON, Exchange
from chaosllm.store.formats.base import FixtureFormat, Location

__all__ = ["FORMAT", "is_session"]


def is_session(data: JSON) -> bool:
    return isinstance(data, dict) and "chaosllm" in data and isinstance(data.get("session"), dict)


def _detect(path: Path, data: JSON) -> bool:
    return is_session(data)


def _parse(data: JSON, at: Location) -> list[Exchange]:
    return []


FORMAT = FixtureFormat(
    name="session",
    shape='a session recording (a JSON object with "chaosllm": 1 and "session")',
    detect=_detect,
    parse=_parse,
    importable=False,
)
