"""What a live (WebSocket) protocol is to chaosllm: `SessionProtocol`, its parts as data
and small pure functions, as `chaosllm.providers.base.Provider` is for HTTP.

A session is a list of JSON events both ways. A protocol says which client events end a
turn (the replay answers those with the recorded server events of the turn), what each
client event adds to the turn's content (what matching keys on: its canonical form, ids
and audio bytes replaced by digests), what the server answers at once to an event that
does not end a turn (an acknowledgement), and how it words the events and closes the
session faults and a miss need. Pure: no I/O, no state but the caller's.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from chaosllm.model import JSON

__all__ = ["SessionProtocol", "TurnState", "audio_bytes", "audio_digest", "canonical_digest"]


def audio_bytes(data: str) -> bytes:
    """A base64 payload's bytes, in either alphabet (google-genai sends the URL-safe one;
    proto JSON reads both); text that is not base64 as its UTF-8."""
    text = data.strip().replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except ValueError:
        return data.encode("utf-8", "replace")


def audio_digest(data: str | bytes) -> str:
    """An audio payload (base64 text, or its bytes) as matching and ``--no-audio``
    recordings keep it."""
    raw = audio_bytes(data) if isinstance(data, str) else data
    return "sha256:" + hashlib.sha256(raw).hexdigest()[:32]


def canonical_digest(content: JSON) -> str:
    return hashlib.sha256(
        json.dumps(content, sort_keys=True, separators=(",", ":")).encode("utf-8")
    ).hexdigest()


@dataclass
class TurnState:
    """What a session has told the server since its last turn ended (the protocol fills
    it as events arrive)."""

    items: list[JSON] = field(default_factory=list)
    """The turn's content, canonical, in order."""
    audio: list[bytes] = field(default_factory=list)
    """Audio appended to the input buffer, not yet committed (decoded)."""
    audio_bytes: int = 0


class SessionProtocol:
    """A WebSocket protocol's parts; subclasses fill them in."""

    name: str = ""
    paths: tuple[str, ...] = ()
    miss_closes: bool = False
    """Whether a miss closes the session (1008, the reason naming the nearest), for a
    protocol with no error event (Gemini Live); else an `error_event` says it."""
    max_audio_bytes: int = 16 * 1024 * 1024
    """Input audio buffered before a commit, at most."""
    first_event: str | None = None
    """The kind of client event that must come first (Gemini's ``setup``); None: any."""

    def kind_of(self, event: dict[str, Any]) -> str:
        """What kind of event it is (Realtime: its ``type``)."""
        kind = event.get("type")
        return kind if isinstance(kind, str) else ""

    def setup(self, event: dict[str, Any]) -> dict[str, Any]:
        """The settings a `first_event` carries."""
        return {}

    def opened(self, setup: dict[str, Any], session_id: str) -> list[dict[str, Any]]:
        """The server's answer to the `first_event`."""
        return []

    def resumption_event(self, handle: str) -> dict[str, Any] | None:
        """The event offering a handle to resume the session from (None: no resumption)."""
        return None

    def offered_handle(self, event: dict[str, Any]) -> str | None:
        """The resumption handle a server event offers (None: it offers none)."""
        return None

    def resumption_handle(self, setup: dict[str, Any]) -> str | bool | None:
        """The handle a setup resumes from (False: it asks for no handles)."""
        return False

    def model_of(self, query: dict[str, str]) -> str | None:
        return query.get("model")

    def opening(self, model: str | None, session_id: str) -> list[dict[str, Any]]:
        """The server events on connect (before any client event)."""
        return []

    def ends_turn(self, event: dict[str, Any]) -> bool:
        raise NotImplementedError

    def take(self, event: dict[str, Any], turn: TurnState) -> None:
        """Add what `event` says to `turn` (its canonical content)."""

    def acks(self, event: dict[str, Any], session_id: str, n: int) -> list[dict[str, Any]]:
        """The server's immediate answer to a client event that does not end a turn."""
        return []

    def check(self, event: JSON) -> str | None:
        """What is wrong with a client event (None: it is one)."""
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            return "a client event is a JSON object with a string 'type'"
        return None

    def error_event(self, error_type: str, message: str, code: str | None) -> dict[str, Any]:
        raise NotImplementedError

    def expired_event(self) -> dict[str, Any] | None:
        """The event that says the session has expired (None: the protocol has none)."""
        return None

    def going_away_event(self, time_left_ms: int) -> dict[str, Any] | None:
        return None

    def going_away(self, event: dict[str, Any]) -> bool:
        """Whether a server event tells the client the session is ending."""
        return False

    def answer_starts(self, event: dict[str, Any]) -> bool:
        """Whether a server event is the first of a turn's answer (not an acknowledgement
        or a trailer): where a proxied session's relayed answer begins."""
        return False

    def answer_done(self, event: dict[str, Any]) -> bool:
        """Whether a server event ends a turn's answer (what a broken turn's rest is
        dropped up to, on a proxied session)."""
        return False

    def rate_limits_event(self, remaining: int) -> dict[str, Any] | None:
        return None

    def argument_delta(self, event: dict[str, Any]) -> str | None:
        """The tool-call argument text an event carries (None: it carries none)."""
        return None

    def with_arguments(self, event: dict[str, Any], text: str) -> dict[str, Any]:
        return event

    def is_audio_delta(self, event: dict[str, Any]) -> bool:
        return False

    def without_audio(self, event: dict[str, Any]) -> dict[str, Any]:
        """An audio delta with its audio replaced by the audio's digest (``--no-audio``)."""
        return event

    def text_of(self, items: list[JSON]) -> str:
        """The turn's content as text, for nearest matching."""
        return json.dumps(items, sort_keys=True)
