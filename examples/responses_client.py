"""A naive OpenAI Responses API client: the official `openai` SDK with its defaults.

OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=test python examples/responses_client.py
"""

from __future__ import annotations

import openai

client = openai.OpenAI(timeout=5.0)

if __name__ == "__main__":
    reply = client.responses.create(
        model="gpt-4.1-mini",
        instructions="You are a concise assistant.",
        input="What is the capital of Australia?",
    )
    print("answer:", reply.output_text, flush=True)
    events = client.responses.create(
        model="gpt-4.1-mini",
        stream=True,
        input=[{"role": "user", "content": "Write a haiku about the sea."}],
    )
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    print("haiku:", text.replace("\n", " / "), flush=True)
