"""The ASGI app in process, its direct fast path, and the control plane (arming, listing,
access) over HTTP."""
