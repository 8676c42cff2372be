"""`AgentMachine`: a hypothesis state machine for agent loops under faults.

    from chaosllm.stateful import AgentMachine

    class MyAgentMachine(AgentMachine):
        fault_types = ["http_503", "dropped_connection", "empty_response"]

        def make_agent(self):
            client = openai.OpenAI(base_url=self.server.base_url, api_key="test")
            return MyAgent(client)

        def step_agent(self, agent):
            agent.step()  # one model turn

        def executed_tools(self, agent):
            return agent.tool_call_ids_run

    TestMyAgent = MyAgentMachine.TestCase

The machine class starts one `ChaosServer` (``self.server``; `recordings`, or the
shipped ones, and `server_options`) at its first run and keeps it for the runs that
follow (hypothesis makes hundreds while it searches and shrinks): each run begins with
``server.reset()`` (no fault armed, an empty journal and fault history, sequences and
minted ids rewound), so a run sees the server as a fresh one would be; the URL stays the
same, so an expensive client can be built once (``share_server = False``: a server per
run, stopped at its teardown). Each run builds the agent with `make_agent`, then runs
rules in an order hypothesis chooses: ``arm_fault`` arms one fault drawn by
`chaosllm.strategies.faults` (``types=fault_types``, `fault_options`: drawn and shrunk
exactly as `fault_schedules` draws them; armed faults fire in order, one request each),
and ``agent_step`` calls `step_agent`. Cuts of a stream happen after 0..``max_after_chunks``
frames (4 by default): to reach the end of the answers the agent gets, set it to their
frame count less one (``fault_options = {"max_after_chunks": 7}`` for 8 frames). After
every rule the invariants check the journal and the agent through its hooks:

- ``no_tool_call_runs_twice``: the ids `executed_tools` returns are all different;
- ``conversation_is_well_formed``: the request validator found nothing wrong with any
  request the agent sent (orphan tool calls or results, role order...: the journal's
  ``request-validator`` findings of severity ``error``);
- ``no_answer_from_a_faulted_attempt``: an answer `accepted_answers` gained during a step
  came from the step's last request, which must not have been broken by a fault that
  keeps the answer from the client (a fault type whose `delivers_answer` is false).

A hook that returns None (the default of `executed_tools` and `accepted_answers`) turns
its check off. Subclasses add their own ``@invariant()``s and rules. A violation raises
`ResilienceViolation` saying what broke, the steps and faults of the run (hypothesis
shrinks it to the shortest it finds, and prints the steps as code), and the journal;
``teardown`` also notes the journal, for the subclass's own invariants.

A subclass's ``TestCase`` runs with these settings by default: no deadline, no health
checks, one failure reported (not a group, when several invariants break), and no
``explain`` phase (it replays the shrunk failure many more times, each replay real
requests: it was most of what a failure cost). ``@settings(...)`` on the subclass
replaces them; `run_state_machine_as_test` takes its own.
"""

from __future__ import annotations

import atexit
import json
import threading
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from hypothesis import HealthCheck, Phase, currently_in_test_context, note, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from chaosllm.errors import ConfigError, ResilienceViolation
from chaosllm.faults import FAULT_TYPES
from chaosllm.server import ChaosServer
from chaosllm.testing.resilience import format_journal
from chaosllm.testing.strategies import fault_schedules, faults

__all__ = ["AgentMachine"]

_HISTORY = 1000
"""Steps of one run kept for the failure message (a run has stateful_step_count steps)."""


_SERVERS: dict[type[AgentMachine], ChaosServer] = {}
"""The server each machine class shares across its runs (one per class defined)."""
_SERVERS_LOCK = threading.Lock()


@atexit.register
def _stop_servers() -> None:
    with _SERVERS_LOCK:
        servers = list(_SERVERS.values())
        _SERVERS.clear()
    for server in servers:
        server.stop()


_PHASES = tuple(p for p in Phase if p is not Phase.explain)


def _fault_label(spec: Mapping[str, Any]) -> str:
    params = {k: v for k, v in spec.items() if k not in ("type", "remaining")}
    return f"{spec['type']}{json.dumps(params, sort_keys=True) if params else ''}"


class AgentMachine(RuleBasedStateMachine):
    """A `RuleBasedStateMachine` whose rules arm faults and step an agent (see the module
    docstring). Set `fault_types`; implement `make_agent` and `step_agent`."""

    fault_types: ClassVar[Sequence[str]] = ()
    """The fault types ``arm_fault`` may arm (catalogue names; validated when the subclass
    is defined). Faults shrink toward the types listed first."""
    fault_options: ClassVar[Mapping[str, Any]] = {}
    """Keyword arguments for `chaosllm.strategies.faults` (``max_after_chunks``,
    ``max_retry_after``, ``stall_ms``...)."""
    recordings: ClassVar[str | Path | Sequence[str | Path] | None] = None
    """The recordings directory (or directories) the server answers from (None: the
    shipped ones)."""
    server_options: ClassVar[Mapping[str, Any]] = {}
    """Other keyword arguments for the `ChaosServer` (``seed``, ``on_miss``...)."""
    max_armed: ClassVar[int] = 2
    """At most this many faults wait to fire: ``arm_fault`` is not drawn while as many of
    those it armed are waiting (more would only wait, and runs would be spent arming
    rather than stepping)."""
    settle: ClassVar[float] = 1.0
    """At most this many seconds to wait, after a step, for requests still being answered
    (their outcome; the wait ends as soon as every request of the step is answered)."""
    share_server: ClassVar[bool] = True
    """One server for every run of the class, reset at the start of each (False: a server
    per run, stopped in ``teardown``)."""

    server: ChaosServer
    """The running server (reset for this run)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.TestCase.settings = settings(
            deadline=None,
            suppress_health_check=list(HealthCheck),
            report_multiple_bugs=False,
            phases=_PHASES,
        )
        own = vars(cls)
        if "fault_types" not in own and "fault_options" not in own:
            return  # inherits its parent's rule, if any
        # Drawn exactly as `faults` draws them (the shrinking of `fault_schedules`); the
        # strategy validates its arguments here, when the class is defined.
        options = dict(cls.fault_options)
        fault_schedules(types=list(cls.fault_types), **options)  # refuses unknown options
        strategy = faults(types=list(cls.fault_types), **options)

        def arm_fault(self: AgentMachine, fault: dict[str, Any]) -> None:
            self._arm_fault(fault)

        arm_fault.__qualname__ = f"{cls.__qualname__}.arm_fault"
        room = precondition(lambda self: self._waiting() < self.max_armed)
        cls.arm_fault = rule(fault=strategy)(room(arm_fault))

    def __init__(self) -> None:
        super().__init__()
        if not self.fault_types:
            raise ConfigError(f"{type(self).__name__} sets no fault_types")
        self.server = self._server()
        self.history: deque[str] = deque(maxlen=_HISTORY)
        """What the run did so far: one line per rule."""
        self._journal: list[dict[str, Any]] = []
        self._step_requests: list[dict[str, Any]] = []
        self._steps = 0
        self._answers = 0
        self._armed: deque[str] = deque(maxlen=_HISTORY)
        try:
            self.agent = self.make_agent()
        except BaseException:
            if not self.share_server:
                self.server.stop()
            raise

    def _server(self) -> ChaosServer:
        if not self.share_server:
            return ChaosServer(self.recordings, **dict(self.server_options)).start()
        cls = type(self)
        with _SERVERS_LOCK:
            server = _SERVERS.get(cls)
            if server is None:
                server = ChaosServer(self.recordings, **dict(self.server_options)).start()
                _SERVERS[cls] = server
        server.reset()
        profile = self.server_options.get("profile")
        if profile is not None:  # armed as a new server arms it
            server.arm_profile(profile)
        return server

    @classmethod
    def stop_server(cls) -> None:
        """Stop the server the class's runs share (the next run starts another); also done
        at interpreter exit."""
        with _SERVERS_LOCK:
            server = _SERVERS.pop(cls, None)
        if server is not None:
            server.stop()

    # -- the user's hooks -------------------------------------------------------------

    def make_agent(self) -> Any:
        """A new agent for this run (``self.server`` is running: point it there)."""
        raise NotImplementedError(f"{type(self).__name__} must implement make_agent(self)")

    def step_agent(self, agent: Any) -> None:
        """Advance `agent` by one step (say, one model turn and the tools it calls)."""
        raise NotImplementedError(f"{type(self).__name__} must implement step_agent(self, agent)")

    def executed_tools(self, agent: Any) -> Sequence[str] | None:
        """The ids of the tool calls `agent` has run, in order (None: not checked)."""
        return None

    def accepted_answers(self, agent: Any) -> Sequence[Any] | None:
        """The answers `agent` has accepted so far, in order (None: not checked)."""
        return None

    def close_agent(self, agent: Any) -> None:
        """Release what `agent` holds, at teardown (default: its ``close()``, if any)."""
        close = getattr(agent, "close", None)
        if callable(close):
            close()

    # -- rules ------------------------------------------------------------------------

    def _waiting(self) -> int:
        """How many of the faults ``arm_fault`` armed have not fired yet (a profile's
        faults, or those a subclass arms, do not count)."""
        if not self._armed:
            return 0
        armed = {f["id"] for f in self.server.state.board.armed()}
        return sum(1 for i in self._armed if i in armed)

    def _arm_fault(self, fault: dict[str, Any]) -> None:
        (fault_id,) = self.server.arm(fault)
        self._armed.append(fault_id)
        self.history.append(f"arm {_fault_label(fault)} ({fault_id})")

    @rule()
    def agent_step(self) -> None:
        """One step of the agent; the journal is read afterwards for the invariants."""
        self._steps += 1
        first = len(self._journal)
        answers = self.accepted_answers(self.agent)
        self._answers = len(answers) if answers is not None else 0
        try:
            self.step_agent(self.agent)
        finally:
            self._journal = self.server.requests(settle=self.settle)
            new = self._step_requests = self._journal[first:]
            seqs = f"requests #{new[0]['seq']}-#{new[-1]['seq']}" if new else "no request"
            self.history.append(f"step {self._steps} ({seqs})")

    # -- invariants ---------------------------------------------------------------------

    def _violation(self, what: str) -> ResilienceViolation:
        steps = "\n".join(f"  {i}. {line}" for i, line in enumerate(self.history, 1))
        return ResilienceViolation(
            f"{what}\nsteps:\n{steps or '  (none)'}\njournal:\n{format_journal(self._journal)}"
        )

    @invariant()
    def no_tool_call_runs_twice(self) -> None:
        ids = self.executed_tools(self.agent)
        if ids is None:
            return
        twice = sorted(i for i, n in Counter(ids).items() if n > 1)
        if twice:
            raise self._violation(f"tool calls run more than once: {', '.join(twice)}")

    @invariant()
    def conversation_is_well_formed(self) -> None:
        broken = [
            f"#{e['seq']} {f.get('check')}: {f.get('message')}"
            for e in self._journal
            for f in e.get("findings") or []
            if f.get("oracle") == "request-validator" and f.get("severity") == "error"
        ]
        if broken:
            raise self._violation(
                "the agent sent the model a broken conversation:\n  " + "\n  ".join(broken)
            )

    @invariant()
    def no_answer_from_a_faulted_attempt(self) -> None:
        answers = self.accepted_answers(self.agent)
        if answers is None or len(answers) <= self._answers:
            return
        requests = self._step_requests
        fault = requests[-1].get("fault") if requests else None
        if fault and not FAULT_TYPES[fault["type"]].delivers_answer:
            raise self._violation(
                f"the agent accepted {answers[-1]!r} from request #{requests[-1]['seq']}, "
                f"which {fault['type']} broke (outcome {requests[-1].get('outcome')})"
            )

    def teardown(self) -> None:
        try:
            if currently_in_test_context():  # not when a test drives the machine by hand
                note("journal:\n" + format_journal(self.server.requests(settle=0)))
            self.close_agent(self.agent)
        finally:
            if not self.share_server:
                self.server.stop()
