"""Faults: the catalogue, spec validation, the fault board, and each fault as a pure
transformation of a response plan."""

from __future__ import annotations

from chaosllm.faults.board import ArmedFault, FaultBoard, Fired, RequestInfo
from chaosllm.faults.spec import (
    FAULT_TYPES,
    FaultSpec,
    FaultType,
    Match,
    describe_catalogue,
    parse_fault_spec,
    parse_fault_specs,
)
from chaosllm.faults.transform import FaultContext, apply_fault

__all__ = [
    "FAULT_TYPES",
    "ArmedFault",
    "FaultBoard",
    "FaultContext",
    "FaultSpec",
    "FaultType",
    "Fired",
    "Match",
    "RequestInfo",
    "apply_fault",
    "describe_catalogue",
    "parse_fault_spec",
    "parse_fault_specs",
]
