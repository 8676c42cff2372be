"""A naive client: the official `openai` SDK with its defaults, nothing more.

OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=test python examples/naive_client.py
"""

from __future__ import annotations

from typing import Any

import openai
from agent_flow import run

client = openai.OpenAI(timeout=5.0)


def chat(request: dict[str, Any]) -> dict[str, Any]:
    message = client.chat.completions.create(**request).choices[0].message
    return message.model_dump(exclude_none=True, include={"content", "tool_calls"})


def stream(request: dict[str, Any]) -> str:
    chunks = client.chat.completions.create(**request, stream=True)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


if __name__ == "__main__":
    run(chat, stream)
