"""Session recordings loaded and indexed for matching: `SessionStore`.

A session recording (`chaosllm.store.formats.session`) is the ordered client and server
events of one WebSocket session with their times. It is cut into turns by its protocol
(`chaosllm.providers.live.SessionProtocol.ends_turn`): a turn is the client events up to
one that ends a turn, and its answer the server events after that one, up to the next
client event. Server events before any client event are the opening; those after a
client event that does not end a turn are acknowledgements, which the replay words
itself (`SessionProtocol.acks`).

Matching a turn, in order (as for HTTP, `chaosllm.store.matching`): **exact** (the
digest of the turn's canonical content: the first recording with it), **sequence** (the
next turn of the recording the session is already following), **nearest** (the most
similar turn of the protocol over its text, at or above the threshold). A miss names the
nearest turns.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaosllm.errors import RecordingError
from chaosllm.model import JSON
from chaosllm.paths import shipped_dir
from chaosllm.providers.live import SessionProtocol, TurnState, canonical_digest
from chaosllm.providers.sessions import SESSION_PROTOCOLS
from chaosllm.store.formats import read_data, recording_paths
from chaosllm.store.formats.base import Location
from chaosllm.store.formats.session import is_session
from chaosllm.store.nearest import similarity

__all__ = [
    "SessionEvent",
    "SessionMatch",
    "SessionRecording",
    "SessionStore",
    "SessionTurn",
    "parse_session",
    "session_to_json",
    "turn_key",
    "whole_turns",
]

CLIENT = "client"
SERVER = "server"


@dataclass(frozen=True, slots=True)
class SessionEvent:
    source: str
    """``client`` or ``server``."""
    t_ms: float
    """Milliseconds since the session opened."""
    event: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SessionTurn:
    index: int
    digest: str
    text: str
    answer: tuple[SessionEvent, ...]
    ended_ms: float
    """When the client event that ended it was sent."""


@dataclass(frozen=True, slots=True)
class SessionRecording:
    name: str
    provider: str
    path: str
    model: str | None
    events: tuple[SessionEvent, ...]
    turns: tuple[SessionTurn, ...]
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SessionMatch:
    recording: SessionRecording
    turn: SessionTurn
    how: str
    """``exact``, ``sequence`` or ``nearest``."""


def turn_key(protocol: SessionProtocol, turn: TurnState) -> tuple[str, str]:
    """The digest and the text of a turn's content."""
    return canonical_digest(turn.items), protocol.text_of(turn.items)


def parse_session(data: JSON, *, source: str, name: str) -> SessionRecording:
    """A session recording from its JSON; `RecordingError` says what is wrong."""
    if not is_session(data):
        raise RecordingError(source, 'a session recording needs "chaosllm": 1 and "session"')
    assert isinstance(data, dict)
    provider = data.get("provider")
    protocol = SESSION_PROTOCOLS.get(str(provider))
    if protocol is None:
        known = ", ".join(sorted(SESSION_PROTOCOLS))
        raise RecordingError(source, f"unknown session provider {provider!r}; known: {known}")
    session = data["session"]
    raw = session.get("events")
    if not isinstance(raw, list):
        raise RecordingError(source, '"session.events" must be a list')
    events: list[SessionEvent] = []
    for i, item in enumerate(raw):
        if (
            not isinstance(item, dict)
            or item.get("from") not in (CLIENT, SERVER)
            or not isinstance(item.get("event"), dict)
        ):
            raise RecordingError(
                source, f'session event {i} must be {{"from": "client"|"server", "event": {{}}}}'
            )
        t_ms = item.get("t_ms", 0)
        if not isinstance(t_ms, (int, float)) or t_ms < 0:
            raise RecordingError(source, f"session event {i}: t_ms must be a number >= 0")
        events.append(SessionEvent(item["from"], float(t_ms), item["event"]))
    meta = data.get("meta")
    return SessionRecording(
        name=name,
        provider=protocol.name,
        path=str(session.get("path") or protocol.paths[0]),
        model=session.get("model") if isinstance(session.get("model"), str) else None,
        events=tuple(events),
        turns=_turns(protocol, events),
        source=source,
        meta=dict(meta) if isinstance(meta, dict) else {},
    )


def _turns(protocol: SessionProtocol, events: list[SessionEvent]) -> tuple[SessionTurn, ...]:
    turns: list[SessionTurn] = []
    state = TurnState()
    answer: list[SessionEvent] | None = None
    ended = 0.0
    key = ("", "")

    def close_turn() -> None:
        if answer is not None:
            turns.append(SessionTurn(len(turns), key[0], key[1], tuple(answer), ended))

    for item in events:
        if item.source == SERVER:
            if answer is not None:
                answer.append(item)
            continue
        close_turn()
        answer = None
        protocol.take(item.event, state)
        if protocol.ends_turn(item.event):
            key = turn_key(protocol, state)
            state = TurnState()
            answer = []
            ended = item.t_ms
    close_turn()
    return tuple(turns)


def session_to_json(recording: SessionRecording) -> dict[str, Any]:
    return {
        "chaosllm": 1,
        "provider": recording.provider,
        "session": {
            "path": recording.path,
            "model": recording.model,
            "events": [
                {"from": e.source, "t_ms": round(e.t_ms, 3), "event": e.event}
                for e in recording.events
            ],
        },
        "meta": recording.meta,
    }


class SessionStore:
    """Every session recording of the recordings directories."""

    def __init__(self, dirs: Iterable[Path]) -> None:
        self.dirs = [Path(d) for d in dirs]
        self.recordings: list[SessionRecording] = []
        self.errors: list[RecordingError] = []
        self._exact: dict[tuple[str, str], list[tuple[SessionRecording, SessionTurn]]] = {}
        self.reload()

    @classmethod
    def shipped(cls) -> SessionStore:
        return cls([shipped_dir("recordings")])

    def reload(self) -> None:
        recordings: list[SessionRecording] = []
        errors: list[RecordingError] = []
        for root in self.dirs:
            if not root.is_dir():
                continue
            for path in recording_paths(root):
                if not path.endswith(".json"):
                    continue
                try:
                    data = read_data(Path(path))
                except RecordingError:
                    continue  # the request store reports it
                if not is_session(data):
                    continue
                at = Location.of(Path(path), root=root, holds_run=False)
                try:
                    recordings.append(
                        parse_session(data, source=at.source, name=f"{at.scenario}/{at.stem}")
                    )
                except RecordingError as exc:
                    errors.append(exc)
        self.recordings = recordings
        self.errors = errors
        self._exact = {}
        for recording in recordings:
            for turn in recording.turns:
                self._exact.setdefault((recording.provider, turn.digest), []).append(
                    (recording, turn)
                )

    def add(self, recording: SessionRecording) -> None:
        self.recordings.append(recording)
        for turn in recording.turns:
            self._exact.setdefault((recording.provider, turn.digest), []).append((recording, turn))

    def match(
        self,
        protocol: SessionProtocol,
        digest: str,
        text: str,
        following: SessionRecording | None,
        position: int,
        *,
        threshold: float = 0.9,
    ) -> SessionMatch | None:
        """The recorded turn that answers a turn (module docstring); None: a miss."""
        found = self._exact.get((protocol.name, digest))
        if found:
            if following is not None:  # the session's own recording first
                for recording, turn in found:
                    if recording is following and turn.index >= position:
                        return SessionMatch(recording, turn, "exact")
            recording, turn = found[0]
            return SessionMatch(recording, turn, "exact")
        if following is not None and position < len(following.turns):
            return SessionMatch(following, following.turns[position], "sequence")
        best = self.nearest(protocol, text, 1)
        if best and best[0][0] >= threshold:
            _, recording, turn = best[0]
            return SessionMatch(recording, turn, "nearest")
        return None

    def nearest(
        self, protocol: SessionProtocol, text: str, limit: int = 3
    ) -> Sequence[tuple[float, SessionRecording, SessionTurn]]:
        scored = [
            (similarity(text, turn.text), recording, turn)
            for recording in self.recordings
            if recording.provider == protocol.name
            for turn in recording.turns
        ]
        scored.sort(key=lambda item: (-item[0], item[1].name, item[2].index))
        return scored[:limit]


def session_from_events(
    protocol: SessionProtocol,
    path: str,
    model: str | None,
    events: Sequence[tuple[str, float, str]],
    redact: Callable[[JSON], JSON],
    *,
    upstream: str = "",
    no_audio: bool = False,
) -> SessionRecording | None:
    """A session recording of relayed frames (source, ms since the start, text), each
    event redacted (and with `no_audio`, each server audio delta's audio replaced by its
    digest); frames that are not JSON objects are left out. None: no event."""
    kept: list[dict[str, Any]] = []
    for source, t_ms, text in events:
        try:
            event = json.loads(text)
        except ValueError:
            continue
        if isinstance(event, dict):
            if no_audio and source == SERVER and protocol.is_audio_delta(event):
                event = protocol.without_audio(event)
            kept.append({"from": source, "t_ms": round(t_ms, 3), "event": redact(event)})
    if not kept:
        return None
    data = {
        "chaosllm": 1,
        "provider": protocol.name,
        "session": {"path": path, "model": model, "events": kept},
        "meta": {
            "upstream": upstream,
            "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        },
    }
    return parse_session(data, source="", name="")


def whole_turns(
    protocol: SessionProtocol, events: Sequence[tuple[str, float, str]]
) -> list[tuple[str, float, str]]:
    """Relayed frames (source, ms, text) without a last turn whose answer never ended
    (`SessionProtocol.answer_done`: a fault or the client ended the session mid-answer),
    from that turn's first client event on: a recording never replays a cut answer as
    the whole one."""
    ends: list[int] = []
    starts: list[int] = []
    """Where each turn's client events begin (the session's `first_event` is none's)."""
    done = True
    for i, (source, _, text) in enumerate(events):
        try:
            event = json.loads(text)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        if source == CLIENT:
            if protocol.first_event is not None and protocol.kind_of(event) == protocol.first_event:
                continue
            if len(starts) == len(ends):
                starts.append(i)
            if protocol.ends_turn(event):
                ends.append(i)
                done = False
        elif protocol.answer_done(event):
            done = True
    if done or not ends:
        return list(events)
    return list(events[: starts[len(ends) - 1]])


def dumps(recording: SessionRecording) -> str:
    return json.dumps(session_to_json(recording), indent=2, ensure_ascii=False) + "\n"
