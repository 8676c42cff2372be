"""Pure modules, no sockets: each provider (canonical requests, plans, assembly, its
faults), the SSE and event-stream codecs, the fault catalogue, specs, board and
transforms, the store (loading, normalizing, the nearest index, redaction, writing),
strategies and resilience checks."""
