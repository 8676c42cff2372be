"""Placeholder while the new default server is written: the h11 server."""

from __future__ import annotations

__all__ = ["WireServer"]


class _Gone(Exception):
    """The client went away (or the socket is closed): stop writing."""


from chaosllm.wire.common import ErrorBody  # noqa: E402
from chaosllm.wire.h11_server import H11WireServer as WireServer  # noqa: E402

__all__ += ["ErrorBody"]
