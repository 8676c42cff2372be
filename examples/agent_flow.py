"""The little agent both example clients run against the shipped recordings.

1. Ask for the weather in Paris with a `get_weather` tool; run the tool call the
   model makes; send the result back; print the final answer.
2. Ask a question with `stream=True`; print the streamed text.

A client plugs in two functions: `chat(request) -> message dict` and
`stream(request) -> text`. The flow prints one line per step, so two runs can
be compared line by line (what `chaosllm probe` does).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

SYSTEM = "You are a helpful assistant. Use the available tools when the user asks for live data."
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a location.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {
                    "type": "string",
                    "description": 'City and country, e.g. "Paris, France"',
                },
                "unit": {
                    "type": "string",
                    "enum": ["celsius", "fahrenheit"],
                    "description": "Temperature unit",
                },
            },
            "required": ["location"],
        },
    },
}
WEATHER_REQUEST: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What's the weather like in Paris right now?"},
    ],
    "tools": [WEATHER_TOOL],
    "tool_choice": "auto",
}
STREAM_REQUEST: dict[str, Any] = {
    "model": "gpt-4o",
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Explain the difference between TCP and UDP in two sentences."},
    ],
    "stream_options": {"include_usage": True},
}

executed_tool_calls: list[str] = []


def get_weather(location: str, unit: str = "celsius") -> str:
    """A stand-in for a real weather API (deterministic)."""
    return json.dumps(
        {
            "location": location,
            "temperature": 18,
            "unit": unit,
            "condition": "Partly cloudy",
            "humidity": 64,
            "wind_kph": 12,
        }
    )


def run(
    chat: Callable[[dict[str, Any]], dict[str, Any]], stream: Callable[[dict[str, Any]], str]
) -> None:
    message = chat(WEATHER_REQUEST)
    messages = list(WEATHER_REQUEST["messages"])
    if message.get("tool_calls"):
        messages.append({"role": "assistant", "content": None, "tool_calls": message["tool_calls"]})
        for call in message["tool_calls"]:
            arguments = json.loads(call["function"]["arguments"])
            executed_tool_calls.append(call["id"])
            print(
                f"tool: {call['function']['name']}({json.dumps(arguments, sort_keys=True)})",
                flush=True,
            )
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": get_weather(**arguments)}
            )
        message = chat({**WEATHER_REQUEST, "messages": messages})
    print(f"weather: {message.get('content')}", flush=True)
    print(f"tcp-udp: {stream(STREAM_REQUEST)}", flush=True)
