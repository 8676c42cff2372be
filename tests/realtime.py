"""What the OpenAI Realtime tests send: the questions of the shipped sessions and the
client event that asks one."""

from __future__ import annotations

from typing import Any

QUESTION = "What is the capital of France?"
"""The question of the shipped text session (realtime-text)."""
WEATHER = "What is the weather in Paris?"
"""The question of the shipped tool-call session (realtime-tools)."""


def item(text: str) -> dict[str, Any]:
    """A ``conversation.item.create`` of a user message `text`."""
    return {
        "type": "conversation.item.create",
        "item": {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": text}],
        },
    }
