"""The HTTP layer: the Starlette app (provider routes and the control plane), a thin adapter over
the engine."""
