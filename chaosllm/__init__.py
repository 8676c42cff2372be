"""chaosllm: a fault-injection chaos server for LLM HTTP clients."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
