"""chaosllm: a fault-injection chaos server for LLM HTTP clients.

>>> from chaosllm import ChaosServer                      # doctest: +SKIP
>>> with ChaosServer() as server:
...     client = openai.OpenAI(base_url=server.base_url, api_key="test")
...     server.arm("http_503")

`ChaosServer` is loaded on first use (PEP 562): ``import chaosllm`` imports no server
library (starlette, anyio, h11...), so the pytest plugin and the pure layers start fast.
"""

import logging as _logging
import typing as _typing

from chaosllm.config import Mode, OnMiss, ServerConfig
from chaosllm.core.verdict import Finding, Tolerances
from chaosllm.errors import (
    ChaosLLMError,
    ConfigError,
    Hung,
    InvalidFaultSpec,
    InvalidRequest,
    NoMatch,
    RecordingError,
    ResilienceViolation,
    ServerError,
    UnknownFormat,
    UnknownScenario,
    UnsafePath,
)
from chaosllm.faults import FAULT_TYPES, FaultSpec, parse_fault_spec
from chaosllm.lazy import lazy_names as _lazy_names
from chaosllm.model import Exchange, ResponsePlan
from chaosllm.store.recordings import RecordingStore

if _typing.TYPE_CHECKING:
    from chaosllm.server import ChaosServer

__version__ = "0.1.0"

__all__ = [
    "FAULT_TYPES",
    "ChaosLLMError",
    "ChaosServer",
    "ConfigError",
    "Exchange",
    "FaultSpec",
    "Finding",
    "Hung",
    "InvalidFaultSpec",
    "InvalidRequest",
    "Mode",
    "NoMatch",
    "OnMiss",
    "RecordingError",
    "RecordingStore",
    "ResilienceViolation",
    "ResponsePlan",
    "ServerConfig",
    "ServerError",
    "Tolerances",
    "UnknownFormat",
    "UnknownScenario",
    "UnsafePath",
    "__version__",
    "parse_fault_spec",
]

__getattr__, __dir__ = _lazy_names(globals(), {"ChaosServer": "chaosllm.server"})
"""Public names that pull in the server libraries are loaded on first use."""


# A library logs; the application decides where it goes (the CLI prints it).
_logging.getLogger("chaosllm").addHandler(_logging.NullHandler())
