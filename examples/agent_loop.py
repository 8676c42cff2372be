"""A small agent loop, advanced one model turn at a time, over the reference resilient client.

Each `AgentLoop.step()` sends the conversation so far to the model once (through a
`turn(request) -> message dict` function), runs the tool calls the answer asks for and
appends their results, or, when the answer is text, accepts it and stops. A turn that
fails (the client gave up) changes nothing: the next step asks again.

    client = ResilientClient(openai.OpenAI(max_retries=0), max_attempts=4)
    agent = AgentLoop(client.chat)
    while not agent.done:
        agent.step()

`tests/clients/test_agent_machine.py` drives it with `chaosllm.stateful.AgentMachine`: faults armed
between steps never make it run a tool call twice, send a broken conversation, or accept
an answer from a faulted attempt. It runs the weather question of `agent_flow.py` against
the shipped recordings.

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=test python examples/agent_loop.py
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import openai
from agent_flow import WEATHER_REQUEST, get_weather
from resilient_client import ResilientClient, RetryBudgetExceeded

__all__ = ["AgentLoop", "resilient_agent"]

Turn = Callable[[dict[str, Any]], dict[str, Any]]
TOOLS: dict[str, Callable[..., str]] = {"get_weather": get_weather}


class AgentLoop:
    """The conversation, the tool calls run (by id, in order) and the answers accepted."""

    def __init__(
        self,
        turn: Turn,
        *,
        request: Mapping[str, Any] = WEATHER_REQUEST,
        tools: Mapping[str, Callable[..., str]] = TOOLS,
        gives_up: tuple[type[Exception], ...] = (RetryBudgetExceeded,),
        tasks: int = 1,
    ) -> None:
        self.turn = turn
        self.request = dict(request)
        self.messages: list[dict[str, Any]] = list(request["messages"])
        self.tools = dict(tools)
        self.gives_up = gives_up
        self.executed: list[str] = []
        """The ids of the tool calls run, in order (each should appear once)."""
        self.answers: list[str] = []
        """The final answers accepted, one per task (the loop then stops)."""
        self.failed_turns = 0
        self.tasks = tasks
        """How many times to ask the question, each time in a new conversation."""
        self.done = False

    def step(self) -> None:
        """One model turn: run its tool calls, or accept its text answer."""
        if self.done:
            return
        try:
            message = self.turn({**self.request, "messages": self.messages})
        except self.gives_up:
            self.failed_turns += 1  # nothing changed: the next step asks again
            return
        self.take(message)

    def take(self, message: Mapping[str, Any]) -> None:
        """Act on a whole answer: run its tool calls and append their results, or accept
        its text."""
        calls = list(message.get("tool_calls") or [])
        if not calls:
            self.answers.append(str(message.get("content") or ""))
            self.done = len(self.answers) >= self.tasks
            self.messages = list(self.request["messages"])  # the next task starts afresh
            return
        self.messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        for call in calls:
            self.messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": self.run_tool(call)}
            )

    def run_tool(self, call: Mapping[str, Any]) -> str:
        arguments = json.loads(call["function"]["arguments"])
        self.executed.append(call["id"])
        return self.tools[call["function"]["name"]](**arguments)


def resilient_agent(client: openai.OpenAI, **options: Any) -> tuple[AgentLoop, ResilientClient]:
    """An `AgentLoop` whose turns go through a `ResilientClient` over `client` (its own
    retries off); `options` go to the `ResilientClient`."""
    resilient = ResilientClient(client.with_options(max_retries=0), **options)
    return AgentLoop(resilient.chat), resilient


def main() -> None:
    with openai.OpenAI(max_retries=0) as client:
        agent, _ = resilient_agent(client, max_attempts=4, attempt_timeout=2.0)
        for _ in range(10):
            agent.step()
            if agent.done:
                break
    print(f"tools run: {agent.executed}")
    print(f"answer: {agent.answers[0] if agent.answers else None}")


if __name__ == "__main__":
    main()
