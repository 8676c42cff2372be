"""The exception tree of chaosllm.

Library code raises these; only the CLI turns them into exit codes. Every error chaosllm
raises on purpose is a `ChaosLLMError`, and where it refines a builtin it mixes that
builtin in (in brackets), so ``except ValueError`` written before the tree still works.

    ChaosLLMError
    ├── ConfigError (ValueError)          a configuration that is refused: a `ServerConfig`,
    │                                     `ChaosServer(...)` argument or CLI flag
    │   └── BadBaseline                   `chaosllm probe --baseline`: a file that is not
    │                                     a readable probe report
    ├── RecordingError (ValueError)       a recording file that cannot be read
    │   └── UnknownFormat                 a file in none of the formats chaosllm reads
    ├── InvalidRequest (ValueError)       a provider request that is malformed
    ├── NoMatch (LookupError)             no recording answers a request
    ├── UnknownScenario (LookupError)     a scenario name that is not loaded
    ├── InvalidFaultSpec (ValueError)     a fault spec that cannot be armed
    ├── TooManyFaults (RuntimeError)      arming past the board's bound (--max-faults)
    ├── UnsafePath (ValueError)           a name that would escape its directory
    ├── EventStreamError (ValueError)     bytes that are not an AWS event-stream message
    ├── ServerError (RuntimeError)        the server failed to start or stop
    ├── PlanAborted                       `send_plan` under a plain ASGI server: abort
    │                                     the connection (the server logs it)
    ├── NotRecordable                     an upstream answer that is not written
    ├── UpstreamError                     the recording proxy's upstream failed
    │   ├── ConnectFailed                 no connection (refused, unknown host, TLS)
    │   ├── UpstreamTimeout               connecting, sending or waiting took too long
    │   ├── ClosedBeforeAnswer            closed (or not HTTP) before an answer
    │   ├── ResetBeforeAnswer             reset before an answer
    │   ├── DroppedMidAnswer              the answer stopped before its end
    │   └── UpstreamTooLarge              a head, body or decoded body over its bound
    ├── ResilienceViolation (AssertionError)   a client broke a resilience property
    │   └── Hung                          a call did not finish within its bound
    └── BaselineFailed (RuntimeError)     `chaosllm probe`: the program fails with no fault

All of them are defined here except `BaselineFailed`, which carries the `ProbeRun` of the
failed baseline and so lives in `chaosllm.testing.probe` (this module imports nothing of
chaosllm). The upstream errors, `PlanAborted` and `NotRecordable` refine `Exception` alone:
an `OSError` or `TimeoutError` base would let the transports' own ``except OSError`` and
``except TimeoutError`` catch them. The one exception class outside the tree is the private
``_Gone`` of `chaosllm.wire.server`, a signal that the client left, raised and caught inside
`WireServer` and never seen by a caller.
"""

from __future__ import annotations

__all__ = [
    "BadBaseline",
    "ChaosLLMError",
    "ClosedBeforeAnswer",
    "ConfigError",
    "ConnectFailed",
    "DroppedMidAnswer",
    "EventStreamError",
    "Hung",
    "InvalidFaultSpec",
    "InvalidRequest",
    "NoMatch",
    "NotRecordable",
    "PlanAborted",
    "RecordingError",
    "ResetBeforeAnswer",
    "ResilienceViolation",
    "ServerError",
    "TooManyFaults",
    "UnknownFormat",
    "UnknownScenario",
    "UnsafePath",
    "UpstreamError",
    "UpstreamTimeout",
    "UpstreamTooLarge",
]


class ChaosLLMError(Exception):
    """Base class of every error chaosllm raises on purpose."""


class ConfigError(ChaosLLMError, ValueError):
    """A configuration that is refused (a mode without its upstream, an unknown matcher, a
    bad timing...); the message names the setting and the valid values."""


class BadBaseline(ConfigError):
    """`chaosllm probe --baseline FILE`: the file cannot be read, is not JSON, or is not a
    probe report (``--json`` output); the message says which."""


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


class TooManyFaults(ChaosLLMError, RuntimeError):
    """Arming these faults would put more on the board than its bound (``--max-faults``);
    nothing was armed."""


class UnsafePath(ChaosLLMError, ValueError):
    """A file or scenario name that would escape the directory it must stay in."""


class EventStreamError(ChaosLLMError, ValueError):
    """Bytes that are not an AWS event-stream message (`chaosllm.providers.eventstream`): a
    length out of range, a prelude or message CRC32 that does not match, a header of an
    unknown type, or a frame text that does not parse; the message says which."""


class ServerError(ChaosLLMError, RuntimeError):
    """The server could not start (port in use, bad configuration) or stop."""


class PlanAborted(ChaosLLMError):
    """Raised by `send_plan` under a plain ASGI server to make it abort the connection."""

    reset: bool = False
    """Abort it with an RST (SO_LINGER 0) rather than a FIN, once the bytes sent are
    flushed (chaosllm's own servers; a live stream's ``connection_reset``)."""


class NotRecordable(ChaosLLMError):
    """An upstream answer that is not written (the reason is the message)."""


class UpstreamError(ChaosLLMError):
    """The upstream failed; the subclass says how."""


class ConnectFailed(UpstreamError):
    """No connection could be made (refused, unknown host, TLS handshake failed)."""


class UpstreamTimeout(UpstreamError):
    """Connecting, sending or waiting for the answer took too long."""


class ClosedBeforeAnswer(UpstreamError):
    """The upstream closed the connection (or sent something that is not HTTP) before
    an answer."""


class ResetBeforeAnswer(UpstreamError):
    """The upstream reset the connection before an answer."""


class DroppedMidAnswer(UpstreamError):
    """The answer stopped before its end (connection closed or reset mid-body)."""


class UpstreamTooLarge(UpstreamError):
    """The upstream's answer is over a bound the proxy keeps: a head over 1 MiB, a body
    over the size read whole, or a body that decodes to too much (a compression bomb)."""


class ResilienceViolation(ChaosLLMError, AssertionError):
    """A client broke a resilience property."""


class Hung(ResilienceViolation):
    """A call did not finish within its bound."""
