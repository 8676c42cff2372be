"""A naive Anthropic Messages client: the official `anthropic` SDK with its defaults.

    ANTHROPIC_BASE_URL=http://127.0.0.1:8000 ANTHROPIC_API_KEY=test \
        python examples/anthropic_client.py
"""

from __future__ import annotations

import anthropic

client = anthropic.Anthropic(timeout=5.0)

if __name__ == "__main__":
    reply = client.messages.create(
        model="claude-sonnet-4-6",
        max_tokens=1024,
        system="You are a concise assistant.",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
    )
    print("answer:", "".join(b.text for b in reply.content if b.type == "text"), flush=True)
    with client.messages.stream(
        model="claude-sonnet-4-6",
        max_tokens=256,
        messages=[{"role": "user", "content": "Write a haiku about the sea."}],
    ) as stream:
        print("haiku:", "".join(stream.text_stream).replace("\n", " / "), flush=True)
