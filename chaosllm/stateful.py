"""Public home of `chaosllm.testing.stateful` (SPEC §7): the implementation lives there."""

from chaosllm.testing.stateful import AgentMachine

__all__ = ["AgentMachine"]
