"""The wire layer: executes `ResponsePlan`s on sockets.

- `WireServer`: chaosllm's own HTTP/1.1 server (asyncio protocols + httptools, on uvloop
  where installed) hosting an ASGI app; `H11WireServer`: the same in pure Python (h11 +
  anyio), the fallback.
- `Direct`: the fast path a server asks before the ASGI app.
- `send_plan` / `PlanResponse`: how the app hands a plan to the server; under any
  other ASGI server the plan degrades to the nearest thing ASGI can do.
"""

from __future__ import annotations

import typing as _typing

from chaosllm.lazy import lazy_names as _lazy_names
from chaosllm.wire.asgi import PLAN_EXTENSION, PlanAborted, PlanResponse, send_plan
from chaosllm.wire.common import Direct
from chaosllm.wire.server import WireServer

if _typing.TYPE_CHECKING:
    from chaosllm.wire.h11_server import H11WireServer

__all__ = [
    "PLAN_EXTENSION",
    "Direct",
    "H11WireServer",
    "PlanAborted",
    "PlanResponse",
    "WireServer",
    "send_plan",
]

__getattr__, __dir__ = _lazy_names(globals(), {"H11WireServer": "chaosllm.wire.h11_server"})
"""The fallback server is loaded on first use: it imports h11, which a server on the
default wire never needs."""
