"""OpenAI Realtime over WebSocket (``GET /v1/realtime?model=...``; Azure's
``/openai/realtime?deployment=...``), as the ``openai`` SDK's
``client.realtime.connect()`` speaks it (the GA event names).

Client events: ``session.update``, ``conversation.item.create``,
``input_audio_buffer.append`` / ``commit`` / ``clear``, ``response.create`` (ends the
turn: the replay answers it with the recorded server events), ``response.cancel``.
Server events replayed as recorded: ``response.created``, ``response.output_item.added``,
``response.output_text.delta``, ``response.output_audio.delta``,
``response.output_audio_transcript.delta``, ``response.function_call_arguments.delta`` /
``done``, ``response.done``, ``rate_limits.updated``; answered at once:
``session.created`` on connect, ``session.updated``, ``conversation.item.added``,
``input_audio_buffer.committed`` / ``cleared``; ``error`` for what is wrong (its shape:
``{"type": "error", "event_id", "error": {"type", "code", "message", "param",
"event_id"}}``).

A turn's content: the conversation items created since the last ``response.create``
(role, type, text; audio as its digest; a function call's output and call id), and the
audio committed, as one ``input_audio`` item.
"""

from __future__ import annotations

import hashlib
from typing import Any

from chaosllm.model import JSON
from chaosllm.providers.live import SessionProtocol, TurnState, audio_bytes, audio_digest

__all__ = ["REALTIME", "RealtimeProtocol"]

_ITEM_KEYS = ("type", "role", "call_id", "name", "arguments", "output")
_PART_TEXT = ("text", "transcript")


def _event_id(session_id: str, n: int) -> str:
    return "event_" + hashlib.sha256(f"{session_id}:{n}".encode()).hexdigest()[:20]


def _part(part: JSON) -> JSON:
    if not isinstance(part, dict):
        return part
    out: dict[str, Any] = {"type": part.get("type")}
    for key in _PART_TEXT:
        if isinstance(part.get(key), str):
            out[key] = part[key]
    if isinstance(part.get("audio"), str):
        out["audio"] = audio_digest(part["audio"])
    return out


def _item(item: JSON) -> JSON:
    if not isinstance(item, dict):
        return item
    out: dict[str, Any] = {k: item[k] for k in _ITEM_KEYS if k in item}
    out.setdefault("type", "message")
    content = item.get("content")
    if isinstance(content, list):
        out["content"] = [_part(p) for p in content]
    return out


class RealtimeProtocol(SessionProtocol):
    name = "openai.realtime"
    paths = ("/v1/realtime", "/openai/realtime", "/openai/v1/realtime")

    def model_of(self, query: dict[str, str]) -> str | None:
        return query.get("model") or query.get("deployment")

    def opening(self, model: str | None, session_id: str) -> list[dict[str, Any]]:
        return [
            {
                "type": "session.created",
                "event_id": _event_id(session_id, 0),
                "session": {
                    "type": "realtime",
                    "object": "realtime.session",
                    "id": "sess_" + hashlib.sha256(session_id.encode()).hexdigest()[:20],
                    "model": model or "gpt-realtime",
                    "output_modalities": ["audio"],
                    "instructions": "",
                    "tools": [],
                    "tool_choice": "auto",
                },
            }
        ]

    def ends_turn(self, event: dict[str, Any]) -> bool:
        return event.get("type") == "response.create"

    def take(self, event: dict[str, Any], turn: TurnState) -> None:
        kind = event.get("type")
        if kind == "conversation.item.create":
            turn.items.append(_item(event.get("item")))
        elif kind == "input_audio_buffer.append" and isinstance(event.get("audio"), str):
            chunk = audio_bytes(event["audio"])
            turn.audio.append(chunk)
            turn.audio_bytes += len(chunk)
        elif kind == "input_audio_buffer.commit":
            audio = b"".join(turn.audio)
            turn.audio.clear()
            turn.audio_bytes = 0
            turn.items.append(
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_audio", "audio": audio_digest(audio)}],
                }
            )
        elif kind == "input_audio_buffer.clear":
            turn.audio.clear()
            turn.audio_bytes = 0

    def acks(self, event: dict[str, Any], session_id: str, n: int) -> list[dict[str, Any]]:
        kind = event.get("type")
        eid = _event_id(session_id, n)
        if kind == "session.update":
            session = event.get("session")
            return [
                {
                    "type": "session.updated",
                    "event_id": eid,
                    "session": session if isinstance(session, dict) else {},
                }
            ]
        if kind == "conversation.item.create":
            item = event.get("item")
            item = dict(item) if isinstance(item, dict) else {}
            item.setdefault("id", "item_" + eid[6:])
            item.setdefault("object", "realtime.item")
            item.setdefault("status", "completed")
            return [
                {
                    "type": "conversation.item.added",
                    "event_id": eid,
                    "previous_item_id": event.get("previous_item_id"),
                    "item": item,
                }
            ]
        if kind == "input_audio_buffer.commit":
            return [
                {
                    "type": "input_audio_buffer.committed",
                    "event_id": eid,
                    "previous_item_id": None,
                    "item_id": "item_" + eid[6:],
                }
            ]
        if kind == "input_audio_buffer.clear":
            return [{"type": "input_audio_buffer.cleared", "event_id": eid}]
        return []

    def check(self, event: JSON) -> str | None:
        problem = super().check(event)
        if problem is not None:
            return problem
        assert isinstance(event, dict)
        if event["type"] not in _CLIENT_EVENTS:
            return f"Invalid value: {event['type']!r}. Supported values are: " + ", ".join(
                f"'{name}'" for name in _CLIENT_EVENTS
            )
        return None

    def error_event(self, error_type: str, message: str, code: str | None) -> dict[str, Any]:
        return {
            "type": "error",
            "event_id": "event_" + hashlib.sha256(message.encode()).hexdigest()[:20],
            "error": {
                "type": error_type,
                "code": code,
                "message": message,
                "param": None,
                "event_id": None,
            },
        }

    def expired_event(self) -> dict[str, Any] | None:
        return self.error_event(
            "invalid_request_error",
            "Your session hit the maximum duration of 60 minutes.",
            "session_expired",
        )

    def answer_starts(self, event: dict[str, Any]) -> bool:
        return event.get("type") == "response.created"

    def answer_done(self, event: dict[str, Any]) -> bool:
        """``response.done``, or an ``error`` (a response refused never gets one)."""
        return event.get("type") in ("response.done", "error")

    def going_away(self, event: dict[str, Any]) -> bool:
        error = event.get("error")
        return isinstance(error, dict) and error.get("code") == "session_expired"

    def rate_limits_event(self, remaining: int) -> dict[str, Any] | None:
        return {
            "type": "rate_limits.updated",
            "event_id": "event_rate_limits",
            "rate_limits": [
                {"name": "requests", "limit": 1000, "remaining": remaining, "reset_seconds": 60},
                {"name": "tokens", "limit": 50000, "remaining": remaining, "reset_seconds": 60},
            ],
        }

    def argument_delta(self, event: dict[str, Any]) -> str | None:
        if event.get("type") in ("response.function_call_arguments.delta",):
            delta = event.get("delta")
            return delta if isinstance(delta, str) else None
        if event.get("type") == "response.function_call_arguments.done":
            args = event.get("arguments")
            return args if isinstance(args, str) else None
        return None

    def with_arguments(self, event: dict[str, Any], text: str) -> dict[str, Any]:
        key = "delta" if event.get("type", "").endswith(".delta") else "arguments"
        return {**event, key: text}

    def is_audio_delta(self, event: dict[str, Any]) -> bool:
        return event.get("type") == "response.output_audio.delta"

    def without_audio(self, event: dict[str, Any]) -> dict[str, Any]:
        delta = event.get("delta")
        return {**event, "delta": audio_digest(delta)} if isinstance(delta, str) else event


_CLIENT_EVENTS = (
    "session.update",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "input_audio_buffer.clear",
    "conversation.item.create",
    "conversation.item.retrieve",
    "conversation.item.truncate",
    "conversation.item.delete",
    "response.create",
    "response.cancel",
    "output_audio_buffer.clear",
)

REALTIME = RealtimeProtocol()
