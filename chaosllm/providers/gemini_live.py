"""Gemini Live over WebSocket
(``/ws/google.ai.generativelanguage.{v1beta,v1alpha,v1}.GenerativeService.BidiGenerateContent``),
as ``google-genai``'s ``client.aio.live.connect()`` speaks it.

Every message is one JSON object with one top-level key, in proto-JSON camelCase or, as
the SDK sends its client messages, snake_case (``client_content``): both read alike.
The first client message is ``setup`` (answered ``setupComplete``; anything before it
closes the session with 1008). A turn ends with ``clientContent`` whose
``turnComplete`` is true, a ``toolResponse``, or ``realtimeInput`` ending the audio
(``audioStreamEnd``, ``activityEnd``); its content is the turns' parts (text; inline data
as a digest), the audio streamed since the last turn (as a digest) and the function
responses. Server messages replayed as recorded: ``serverContent`` (``modelTurn``
parts, ``turnComplete``, ``interrupted``, ``inputTranscription``/``outputTranscription``),
``toolCall``, ``usageMetadata``; ``goAway`` and ``sessionResumptionUpdate`` are the
server's own. Gemini Live has no error message: a miss or a bad message closes the
session with 1008 and a reason (at most 123 bytes) naming the nearest recordings.
"""

from __future__ import annotations

import re
from typing import Any

from chaosllm.model import JSON
from chaosllm.providers.live import SessionProtocol, TurnState, audio_bytes, audio_digest

__all__ = ["GEMINI_LIVE", "GeminiLiveProtocol", "camel_keys"]

_SNAKE = re.compile(r"_([a-z0-9])")
_CLIENT = ("setup", "clientContent", "realtimeInput", "toolResponse")


def camel_keys(value: JSON) -> Any:
    """`value` with every object key in camelCase (``turn_complete`` -> ``turnComplete``)."""
    if isinstance(value, dict):
        return {_camel(k): camel_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [camel_keys(v) for v in value]
    return value


def _camel(key: str) -> str:
    return _SNAKE.sub(lambda m: m.group(1).upper(), key)


def _kind(event: dict[str, Any]) -> str:
    return _camel(str(next(iter(event), ""))) if event else ""


def _body(event: dict[str, Any]) -> Any:
    return camel_keys(next(iter(event.values()), None)) if event else None


def _part(part: Any) -> Any:
    if isinstance(part, dict):
        if isinstance(part.get("inlineData"), dict):
            data = part["inlineData"].get("data")
            return {"inlineData": audio_digest(data if isinstance(data, str) else "")}
        return {k: v for k, v in part.items() if k in ("text", "functionCall", "functionResponse")}
    return part


class GeminiLiveProtocol(SessionProtocol):
    name = "gemini.live"
    paths = tuple(
        f"/ws/google.ai.generativelanguage.{version}.GenerativeService.BidiGenerateContent"
        for version in ("v1beta", "v1alpha", "v1")
    )
    miss_closes = True
    first_event = "setup"

    def kind_of(self, event: dict[str, Any]) -> str:
        return _kind(event)

    def model_of(self, query: dict[str, str]) -> str | None:
        return None

    def setup(self, event: dict[str, Any]) -> dict[str, Any]:
        body = _body(event)
        return body if isinstance(body, dict) else {}

    def opened(self, setup: dict[str, Any], session_id: str) -> list[dict[str, Any]]:
        return [{"setupComplete": {"sessionId": session_id}}]

    def check(self, event: JSON) -> str | None:
        if not isinstance(event, dict) or len(event) != 1:
            return "a client message is a JSON object with one key"
        if _kind(event) not in _CLIENT:
            return f"unknown client message {_kind(event)!r}; expected one of {', '.join(_CLIENT)}"
        return None

    def ends_turn(self, event: dict[str, Any]) -> bool:
        kind, body = _kind(event), _body(event)
        if not isinstance(body, dict):
            return False
        if kind == "clientContent":
            return bool(body.get("turnComplete"))
        if kind == "toolResponse":
            return True
        if kind == "realtimeInput":
            return bool(body.get("audioStreamEnd")) or "activityEnd" in body
        return False

    def take(self, event: dict[str, Any], turn: TurnState) -> None:
        kind, body = _kind(event), _body(event)
        if not isinstance(body, dict):
            return
        if kind == "clientContent":
            for item in body.get("turns") or []:
                if isinstance(item, dict):
                    turn.items.append(
                        {
                            "role": item.get("role", "user"),
                            "parts": [_part(p) for p in item.get("parts") or []],
                        }
                    )
        elif kind == "realtimeInput":
            chunks = list(body.get("mediaChunks") or [])
            if isinstance(body.get("audio"), dict):
                chunks.append(body["audio"])
            for chunk in chunks:
                if isinstance(chunk, dict) and isinstance(chunk.get("data"), str):
                    data = audio_bytes(chunk["data"])
                    turn.audio.append(data)
                    turn.audio_bytes += len(data)
            if isinstance(body.get("text"), str):
                turn.items.append({"role": "user", "parts": [{"text": body["text"]}]})
            if self.ends_turn(event) and turn.audio:
                turn.items.append({"role": "user", "audio": audio_digest(b"".join(turn.audio))})
                turn.audio.clear()
                turn.audio_bytes = 0
        elif kind == "toolResponse":
            for response in body.get("functionResponses") or []:
                if isinstance(response, dict):
                    turn.items.append(
                        {
                            "functionResponse": {
                                k: response.get(k) for k in ("id", "name", "response")
                            }
                        }
                    )

    def going_away_event(self, time_left_ms: int) -> dict[str, Any] | None:
        return {"goAway": {"timeLeft": f"{time_left_ms / 1000:.3f}s"}}

    def going_away(self, event: dict[str, Any]) -> bool:
        return "goAway" in event

    def answer_starts(self, event: dict[str, Any]) -> bool:
        return "serverContent" in event or "toolCall" in event

    def answer_done(self, event: dict[str, Any]) -> bool:
        """``turnComplete`` (or ``interrupted``), or a ``toolCall``: the model waits for
        the tool response."""
        content = event.get("serverContent")
        if isinstance(content, dict):
            return bool(content.get("turnComplete") or content.get("interrupted"))
        return "toolCall" in event

    def resumption_event(self, handle: str) -> dict[str, Any]:
        return {"sessionResumptionUpdate": {"newHandle": handle, "resumable": True}}

    def offered_handle(self, event: dict[str, Any]) -> str | None:
        update = event.get("sessionResumptionUpdate")
        if not isinstance(update, dict) or not update.get("newHandle"):
            return None
        return str(update["newHandle"])

    def resumption_handle(self, setup: dict[str, Any]) -> str | bool | None:
        """The handle a ``setup`` resumes (False: it does not ask for resumption; None: it
        asks for handles but resumes none)."""
        resumption = setup.get("sessionResumption")
        if not isinstance(resumption, dict):
            return False
        handle = resumption.get("handle")
        return handle if isinstance(handle, str) and handle else None

    def argument_delta(self, event: dict[str, Any]) -> str | None:
        return None

    def is_audio_delta(self, event: dict[str, Any]) -> bool:
        content = event.get("serverContent")
        if not isinstance(content, dict):
            return False
        parts = (content.get("modelTurn") or {}).get("parts") or []
        return any(isinstance(p, dict) and "inlineData" in p for p in parts)

    def without_audio(self, event: dict[str, Any]) -> dict[str, Any]:
        content = dict(event["serverContent"])
        turn = dict(content.get("modelTurn") or {})
        turn["parts"] = [
            {
                **p,
                "inlineData": {
                    **p["inlineData"],
                    "data": audio_digest(str(p["inlineData"].get("data", ""))),
                },
            }
            if isinstance(p, dict) and isinstance(p.get("inlineData"), dict)
            else p
            for p in turn.get("parts") or []
        ]
        content["modelTurn"] = turn
        return {**event, "serverContent": content}


GEMINI_LIVE = GeminiLiveProtocol()
