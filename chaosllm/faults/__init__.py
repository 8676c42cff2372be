"""Faults: the catalogue (one entry per fault type), spec validation, the fault board,
and each fault as a pure transformation of a response plan."""

from __future__ import annotations

from chaosllm.faults.board import ArmedFault, FaultBoard, Fired, RequestInfo
from chaosllm.faults.catalogue import CATALOGUE, Draw, Param
from chaosllm.faults.spec import (
    FAULT_TYPES,
    FaultSpec,
    FaultType,
    Match,
    describe_catalogue,
    parse_fault_spec,
    parse_fault_specs,
    spec_from_query,
)
from chaosllm.faults.transform import FaultContext, apply_fault, fault_applies

__all__ = [
    "CATALOGUE",
    "FAULT_TYPES",
    "ArmedFault",
    "Draw",
    "FaultBoard",
    "FaultContext",
    "FaultSpec",
    "FaultType",
    "Fired",
    "Match",
    "Param",
    "RequestInfo",
    "apply_fault",
    "describe_catalogue",
    "fault_applies",
    "parse_fault_spec",
    "parse_fault_specs",
    "spec_from_query",
]
