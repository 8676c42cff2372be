"""WebSocket sessions, sans-IO: `LiveSession` turns client events into the steps the wire
executes (`chaosllm.faults.session.Step`), `LiveHub` holds what sessions share."""

from chaosllm.core.live.session import LiveHub, LiveSession

__all__ = ["LiveHub", "LiveSession"]
