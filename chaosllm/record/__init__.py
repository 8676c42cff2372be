"""The recording / passthrough proxy (SPEC §2, §4): forward provider requests to a real
upstream, pass its answers through, record them (redacted, atomically) and let armed
faults apply to live traffic.

- `redact`: what never reaches a recording (pure).
- `writer`: `RecordingWriter`, race-free numbering and atomic writes.
- `proxy`: `Upstream` and `ProxyCall`, the streaming reverse proxy (httpx).
"""

from __future__ import annotations

from chaosllm.record.proxy import FrameSplitter, NotRecordable, ProxyCall, Upstream
from chaosllm.store.redact import (
    REDACTED,
    Redactor,
    kept_response_headers,
    redact_body,
    redact_text,
)
from chaosllm.store.writer import RecordingWriter

__all__ = [
    "REDACTED",
    "FrameSplitter",
    "NotRecordable",
    "ProxyCall",
    "RecordingWriter",
    "Redactor",
    "Upstream",
    "kept_response_headers",
    "redact_body",
    "redact_text",
]
