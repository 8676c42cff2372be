"""chaosllm: a fault-injection chaos server for LLM HTTP clients.

>>> from chaosllm import ChaosServer                      # doctest: +SKIP
>>> with ChaosServer() as server:
...     client = openai.OpenAI(base_url=server.base_url, api_key="test")
...     server.arm("http_503")
"""

from __future__ import annotations

import logging

from chaosllm.config import Mode, OnMiss, ServerConfig
from chaosllm.errors import (
    ChaosLLMError,
    InvalidFaultSpec,
    InvalidRequest,
    NoMatch,
    RecordingError,
    ServerError,
    UnknownScenario,
    UnsafePath,
)
from chaosllm.faults import FAULT_TYPES, FaultSpec, parse_fault_spec
from chaosllm.model import Exchange, ResponsePlan
from chaosllm.server import ChaosServer
from chaosllm.store.recordings import RecordingStore

__version__ = "0.1.0"

__all__ = [
    "FAULT_TYPES",
    "ChaosLLMError",
    "ChaosServer",
    "Exchange",
    "FaultSpec",
    "InvalidFaultSpec",
    "InvalidRequest",
    "Mode",
    "NoMatch",
    "OnMiss",
    "RecordingError",
    "RecordingStore",
    "ResponsePlan",
    "ServerConfig",
    "ServerError",
    "UnknownScenario",
    "UnsafePath",
    "__version__",
    "parse_fault_spec",
]

# A library logs; the application decides where it goes (the CLI prints it).
logging.getLogger("chaosllm").addHandler(logging.NullHandler())
