"""The wire layer: executes `ResponsePlan`s on sockets.

- `WireServer`: chaosllm's own HTTP/1.1 server (h11 + anyio) hosting an ASGI app.
- `send_plan` / `PlanResponse`: how the app hands a plan to the server; under any
  other ASGI server the plan degrades to the nearest thing ASGI can do.
"""

from __future__ import annotations

from chaosllm.wire.asgi import PLAN_EXTENSION, PlanAborted, PlanResponse, send_plan
from chaosllm.wire.server import WireServer

__all__ = ["PLAN_EXTENSION", "PlanAborted", "PlanResponse", "WireServer", "send_plan"]
