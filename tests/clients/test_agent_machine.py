"""`chaosllm.stateful.AgentMachine` on real agent loops over the official SDK, real sockets:
the reference resilient client's agent (`examples/agent_loop.py`) keeps every invariant;
a naive streaming agent that runs a tool call as soon as its arguments arrive, and runs
it again when the stream then drops and it retries, is caught with a shrunk example of at
most three steps; so are an agent that accepts an empty answer and one that forgets tool
results."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator, Mapping
from typing import Any, cast

import openai
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import invariant, run_state_machine_as_test

from chaosllm.errors import ConfigError, ResilienceViolation
from chaosllm.stateful import AgentMachine
from tests.helpers import EXAMPLES

sys.path.insert(0, str(EXAMPLES))

from agent_loop import AgentLoop, resilient_agent

pytestmark = pytest.mark.slow

FAST = settings(
    derandomize=True,
    max_examples=12,
    stateful_step_count=6,
    deadline=None,
    report_multiple_bugs=False,
    database=None,
    suppress_health_check=list(HealthCheck),
    phases=[p for p in Phase if p is not Phase.explain],
)
"""Small, deterministic runs: each example makes real requests."""


TASKS = 3
"""Each agent asks the weather question three times, each in a new conversation: within a
session the server mints fresh ids each time it serves a recording whole, as the API does
(a retry of a broken answer gets the ids it had)."""


_SDKS: dict[str, openai.OpenAI] = {}
"""One SDK client per server: a machine class's runs share its server, and building a client
costs more than a run (its TLS context)."""


def _sdk(machine: AgentMachine) -> openai.OpenAI:
    url = machine.server.base_url
    sdk = _SDKS.get(url)
    if sdk is None:
        sdk = _SDKS[url] = openai.OpenAI(
            base_url=url,
            api_key="test",
            max_retries=0,
            default_headers={"X-Chaosllm-Session": "agent"},
        )
    return sdk


def _machines(cls: type[AgentMachine] = AgentMachine) -> Iterator[type[AgentMachine]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _machines(sub)


@pytest.fixture(autouse=True, scope="module")
def _close_shared() -> Iterator[None]:
    yield
    for machine in list(_machines()):
        machine.stop_server()
    while _SDKS:
        _SDKS.popitem()[1].close()


class _LoopMachine(AgentMachine):
    """The hooks every machine here shares: `AgentLoop`'s own record of its run."""

    sdk: openai.OpenAI

    def step_agent(self, agent: AgentLoop) -> None:
        agent.step()

    def executed_tools(self, agent: AgentLoop) -> list[str]:
        return agent.executed

    def accepted_answers(self, agent: AgentLoop) -> list[str]:
        return agent.answers

    def close_agent(self, agent: AgentLoop) -> None:
        pass  # the SDK client is shared by the class's runs


# -- the reference resilient client ----------------------------------------------------


class ResilientAgentMachine(_LoopMachine):
    fault_types = [
        "http_503",
        "http_429",
        "dropped_connection",
        "connection_reset",
        "truncated_stream",
        "empty_response",
        "error_in_200",
        "malformed_tool_args",
        "empty_reply",
    ]

    def make_agent(self) -> AgentLoop:
        self.sdk = _sdk(self)
        agent, _ = resilient_agent(
            self.sdk, max_attempts=4, attempt_timeout=2.0, total_timeout=10.0, backoff=0.005
        )
        agent.tasks = TASKS
        return agent

    @invariant()
    def finishes_with_the_recorded_answer(self) -> None:
        agent: AgentLoop = self.agent
        assert set(agent.answers) <= {WEATHER_ANSWER}
        assert len(agent.executed) <= len(agent.answers) + 1


WEATHER_CALL = "call_HdGLg6eLoNRww7Ez7vF7dRdD"
WEATHER_ANSWER = (
    "It's currently 18 °C and partly cloudy in Paris, with 64% humidity and a light wind of "
    "12 km/h."
)


@pytest.mark.timeout(60)
def test_the_resilient_agent_keeps_every_invariant() -> None:
    many = settings(FAST, max_examples=60, stateful_step_count=10)  # runs share a server
    run_state_machine_as_test(ResilientAgentMachine, settings=many)


def test_the_recorded_answer_is_what_the_agent_gets_without_faults() -> None:
    machine = ResilientAgentMachine()
    try:
        for _ in range(2 * TASKS):
            machine.agent_step()
        assert machine.agent.answers == [WEATHER_ANSWER] * TASKS
        executed = machine.agent.executed
        # The recorded id first, then fresh ones: each task's call is its own.
        assert executed[0] == WEATHER_CALL and len(set(executed)) == TASKS
        assert all(re.fullmatch(r"call_\w{24}", i) for i in executed)
        machine.no_tool_call_runs_twice()
        machine.conversation_is_well_formed()
    finally:
        machine.teardown()


# -- a naive streaming agent -------------------------------------------------------------


class EagerStreamingAgent(AgentLoop):
    """Streams each turn and runs a tool call the moment its arguments are complete JSON
    (to save time); when anything then goes wrong it asks again, and runs the call again."""

    def __init__(self, client: openai.OpenAI) -> None:
        super().__init__(self._turn)
        self.client = client

    def _turn(self, request: dict[str, Any]) -> dict[str, Any]:
        for attempt in range(3):
            try:
                return self._stream(request)
            except (openai.APIError, ValueError):
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _stream(self, request: dict[str, Any]) -> dict[str, Any]:
        calls: dict[int, dict[str, Any]] = {}
        results: dict[str, str] = {}
        text: list[str] = []
        for chunk in self.client.chat.completions.create(**request, stream=True):
            for choice in chunk.choices:
                text.append(choice.delta.content or "")
                for delta in choice.delta.tool_calls or []:
                    call = calls.setdefault(
                        delta.index,
                        {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                    )
                    call["id"] = delta.id or call["id"]
                    if delta.function is not None:
                        call["function"]["name"] += delta.function.name or ""
                        call["function"]["arguments"] += delta.function.arguments or ""
            for call in calls.values():  # the bug: run as soon as the arguments parse
                if call["id"] not in results and _parses(call["function"]["arguments"]):
                    results[call["id"]] = super().run_tool(call)
        for call in calls.values():
            if call["id"] not in results:
                results[call["id"]] = super().run_tool(call)  # ValueError: arguments cut short
        self.results = results
        if calls:
            return {"content": None, "tool_calls": list(calls.values())}
        return {"content": "".join(text)}

    def run_tool(self, call: Mapping[str, Any]) -> str:
        """The result `take` sends back: the one the call got as it streamed."""
        return self.results[call["id"]]


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


class NaiveStreamingMachine(_LoopMachine):
    fault_types = ["dropped_connection"]
    # Cuts anywhere in the weather call's 8 frames: its arguments are complete after 6.
    fault_options = {"max_after_chunks": 7}

    def make_agent(self) -> AgentLoop:
        self.sdk = _sdk(self)
        agent = EagerStreamingAgent(self.sdk)
        agent.gives_up = (openai.APIError, ValueError)
        return agent  # one task: its first turn is the tool call, then the answer


CATCH = settings(
    NaiveStreamingMachine.TestCase.settings,
    derandomize=True,
    database=None,
    max_examples=100,
    stateful_step_count=10,
)
"""The machine's own defaults (no explain phase...), deterministic, runs of up to ten steps."""


@pytest.mark.timeout(60)
def test_the_naive_streaming_agent_is_caught_running_a_tool_twice() -> None:
    with pytest.raises(ResilienceViolation) as info:
        run_state_machine_as_test(NaiveStreamingMachine, settings=CATCH)
    message = str(info.value)
    assert message.startswith(f"tool calls run more than once: {WEATHER_CALL}\n"), message
    # The shrunk run: arm a drop after the arguments arrived (6 frames: the least that
    # fails), then one step - the dropped stream and the retry that ran the call again.
    steps = re.findall(r"^  \d+\. (.*)$", message.split("journal:")[0], re.M)
    assert len(steps) <= 3, message
    assert [s.split(" (")[0] for s in steps] == [
        'arm dropped_connection{"after_chunks": 6}',
        "step 1",
    ], message
    assert steps[1] == "step 1 (requests #1-#2)"
    journal = message.split("journal:\n")[1].splitlines()
    assert len(journal) == 2, message
    assert "#1 session=agent" in journal[0] and "recording=tool-call/0001" in journal[0]
    assert "fault=dropped_connection" in journal[0] and "frames=6 " in journal[0]
    assert "#2 session=agent" in journal[1] and "fault=- frames=8 " in journal[1]
    # hypothesis prints the same shrunk steps as code (the invariants' calls between them).
    notes = "\n".join(getattr(info.value, "__notes__", []))
    printed = re.findall(r"^state\.(arm_fault|agent_step)\((.*)\)$", notes, re.M)
    assert printed == [
        ("arm_fault", "fault={'type': 'dropped_connection', 'after_chunks': 6, 'remaining': 1}"),
        ("agent_step", ""),
    ], notes


def test_the_machine_runs_without_the_explain_phase_by_default() -> None:
    defaults = NaiveStreamingMachine.TestCase.settings
    assert Phase.explain not in defaults.phases and Phase.shrink in defaults.phases
    assert defaults.deadline is None and defaults.report_multiple_bugs is False

    @settings(max_examples=3)
    class Mine(NaiveStreamingMachine):
        pass

    assert Mine.TestCase.settings.max_examples == 3  # the user's settings replace them
    assert Phase.explain in Mine.TestCase.settings.phases


def test_runs_share_one_server_reset_at_the_start_of_each() -> None:
    first = NaiveStreamingMachine()
    try:
        first._arm_fault({"type": "http_503", "remaining": 5})
        first.agent_step()
        assert first.server.requests(settle=0)
    finally:
        first.teardown()
    second = NaiveStreamingMachine()
    try:
        assert second.server is first.server
        assert second.server.requests(settle=0) == [] and second.server.faults()["armed"] == []
        second.agent_step()  # fresh: the recorded ids, no fault left from the last run
        assert second.agent.executed == [WEATHER_CALL]
        assert [e["seq"] for e in second.server.requests(settle=0)] == [1]
    finally:
        second.teardown()


def test_a_shared_server_arms_its_profile_again_for_each_run() -> None:
    class Flaky(NaiveStreamingMachine):
        server_options = {"profile": "flaky-provider"}

    profile = ["http_503", "http_error", "dropped_connection"]
    try:
        for _ in range(2):
            run = Flaky()
            try:
                assert [f["type"] for f in run.server.faults()["armed"]] == profile
                # The profile's faults leave room for those the rules arm.
                assert run._waiting() == 0
                run._arm_fault({"type": "http_503", "remaining": 1})
                run._arm_fault({"type": "http_429", "remaining": 1})
                assert run._waiting() == 2 == run.max_armed
            finally:
                run.teardown()
    finally:
        Flaky.stop_server()


def test_a_machine_that_does_not_share_gets_a_server_per_run() -> None:
    class Own(NaiveStreamingMachine):
        share_server = False

        def make_agent(self) -> AgentLoop:
            self.own = openai.OpenAI(base_url=self.server.base_url, api_key="t", max_retries=0)
            self.sdk = self.own
            return EagerStreamingAgent(self.own)

        def close_agent(self, agent: AgentLoop) -> None:
            self.own.close()

    runs = [Own(), Own()]
    try:
        assert runs[0].server is not runs[1].server
        runs[0].agent_step()
        assert runs[0].agent.executed == [WEATHER_CALL]
    finally:
        for run in runs:
            run.teardown()
    for run in runs:  # each stopped at its teardown: it starts again
        run.server.start().stop()


# -- the other invariants, each caught ---------------------------------------------------------


class _NaiveJsonAgent(AgentLoop):
    def __init__(self, client: openai.OpenAI) -> None:
        super().__init__(self._turn, gives_up=(openai.APIError,))
        self.client = client

    def _turn(self, request: dict[str, Any]) -> dict[str, Any]:
        message = self.client.chat.completions.create(**request).choices[0].message
        return cast(
            "dict[str, Any]",
            message.model_dump(exclude_none=True, include={"content", "tool_calls"}),
        )


class EmptyAnswerMachine(_LoopMachine):
    """The SDK takes an empty answer for a real one, and so does this agent."""

    fault_types = ["http_503", "empty_response"]

    def make_agent(self) -> AgentLoop:
        self.sdk = _sdk(self)
        return _NaiveJsonAgent(self.sdk)


class _ForgetfulAgent(_NaiveJsonAgent):
    def take(self, message: Mapping[str, Any]) -> None:
        calls = message.get("tool_calls")
        if not calls:
            super().take(message)
            return
        self.messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        for call in calls:
            self.run_tool(call)  # ... and forgets to send the result back


class ForgetfulMachine(_LoopMachine):
    fault_types = ["http_503"]

    def make_agent(self) -> AgentLoop:
        self.sdk = _sdk(self)
        return _ForgetfulAgent(self.sdk)


@pytest.mark.timeout(60)
def test_an_agent_that_accepts_an_empty_answer_is_caught() -> None:
    # The search is derandomised: enough examples that finding the bug does not hang on
    # which seed the code's shape gives it.
    with pytest.raises(ResilienceViolation, match="the agent accepted '' from request #1") as info:
        run_state_machine_as_test(EmptyAnswerMachine, settings=settings(FAST, max_examples=60))
    assert "which empty_response broke" in str(info.value)


@pytest.mark.timeout(60)
def test_an_agent_that_forgets_a_tool_result_is_caught() -> None:
    with pytest.raises(ResilienceViolation, match="a broken conversation") as info:
        run_state_machine_as_test(ForgetfulMachine, settings=FAST)
    assert "orphan_tool_call" in str(info.value)


# -- definitions checked at once ---------------------------------------------------------------


def test_fault_types_are_checked_when_the_class_is_defined() -> None:
    with pytest.raises(InvalidArgument, match="unknown fault type 'http_999'"):

        class Bad(AgentMachine):
            fault_types = ["http_999"]

    with pytest.raises(InvalidArgument, match="unknown option"):

        class AlsoBad(AgentMachine):
            fault_types = ["http_503"]
            fault_options = {"max_chunks": 3}


def test_a_machine_without_fault_types_is_refused() -> None:
    class NoFaults(_LoopMachine):
        def make_agent(self) -> AgentLoop:
            raise AssertionError("not reached")

    with pytest.raises(ConfigError, match="NoFaults sets no fault_types"):
        run_state_machine_as_test(NoFaults, settings=settings(FAST, phases=[Phase.generate]))
