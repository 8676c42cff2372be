"""The exception tree of chaosllm.

Library code raises these; only the CLI turns them into exit codes.

    ChaosLLMError
    ├── RecordingError (ValueError)       a recording file that cannot be read
    │   └── UnknownFormat                 a file in none of the formats chaosllm reads
    ├── InvalidRequest (ValueError)       a provider request that is malformed
    ├── NoMatch (LookupError)             no recording answers a request
    ├── UnknownScenario (LookupError)     a scenario name that is not loaded
    ├── InvalidFaultSpec (ValueError)     a fault spec that cannot be armed
    ├── UnsafePath (ValueError)           a name that would escape its directory
    └── ServerError (RuntimeError)        the server failed to start or stop
"""

from __future__ import annotations

__all__ = [
    "ChaosLLMError",
    "InvalidFaultSpec",
    "InvalidRequest",
    "NoMatch",
    "RecordingError",
    "ServerError",
    "UnknownFormat",
    "UnknownScenario",
    "UnsafePath",
]


class ChaosLLMError(Exception):
    """Base class of every error chaosllm raises on purpose."""


class RecordingError(ChaosLLMError, ValueError):
    """A recording file is unreadable: the message names the path and what is wrong."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class UnknownFormat(RecordingError):
    """A file in a recordings directory that is in none of the formats chaosllm reads."""


class InvalidRequest(ChaosLLMError, ValueError):
    """A provider request that the real provider would refuse with a 400."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class NoMatch(ChaosLLMError, LookupError):
    """No recording answers a request. `explanation` says why and what is nearest."""

    def __init__(self, digest: str, explanation: str) -> None:
        super().__init__(explanation)
        self.digest = digest
        self.explanation = explanation


class UnknownScenario(ChaosLLMError, LookupError):
    """A scenario name that no loaded recordings directory has."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class InvalidFaultSpec(ChaosLLMError, ValueError):
    """A fault spec that cannot be armed; the message lists valid types and parameters."""


class UnsafePath(ChaosLLMError, ValueError):
    """A file or scenario name that would escape the directory it must stay in."""


class ServerError(ChaosLLMError, RuntimeError):
    """The server could not start (port in use, bad configuration) or stop."""
