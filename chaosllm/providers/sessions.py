"""The live (WebSocket) protocols, by name and by path: the registry of
`chaosllm.providers.live.SessionProtocol` entries, as `PROVIDERS` is for HTTP."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from chaosllm.providers.gemini_live import GEMINI_LIVE
from chaosllm.providers.live import SessionProtocol
from chaosllm.providers.realtime_openai import REALTIME

__all__ = ["SESSION_PROTOCOLS", "session_protocol_for_path"]

SESSION_PROTOCOLS: Mapping[str, SessionProtocol] = MappingProxyType(
    {protocol.name: protocol for protocol in (REALTIME, GEMINI_LIVE)}
)


def session_protocol_for_path(path: str) -> SessionProtocol | None:
    for protocol in SESSION_PROTOCOLS.values():
        if path in protocol.paths:
            return protocol
    return None
