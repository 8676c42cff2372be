"""The pytest plugin: a `chaosllm` fixture, registered by the ``pytest11`` entry point.

    def test_retries_a_503(chaosllm):
        client = openai.OpenAI(base_url=chaosllm.base_url, api_key="test")
        chaosllm.arm("http_503")
        client.chat.completions.create(...)
        assert len(chaosllm.requests()) == 2

By default each test gets its own server. With ``@pytest.mark.chaosllm(shared=True)``
or ``--chaosllm-shared``, tests share one server for the whole run and each gets
a fresh session id instead (faults it arms match only its session; its journal
and sequences are its own), which is much faster. A test's session ids are its node
id, ``#1`` for the first, ``#2`` after a `ChaosHandle.reset`..., the same in every run,
and the shared server has ``scenario_from_session``: recordings made for a test (a
`chaosllm_server` overridden to record) go to a scenario of its own, and it replays
from there. The marker also takes
`recordings`, `seed`, `on_miss`, `timing`, `match` and `profile` (these need a
server of their own, so they ignore `shared`); the options
``--chaosllm-recordings DIR`` and ``--chaosllm-seed N`` set the defaults.

Verdicts (`chaosllm.core.verdict`): ``chaosllm.verdict()`` lists the findings about the
client's behaviour in the test's sessions. With ``@pytest.mark.chaosllm(verdict="strict")``
(or ``--chaosllm-verdict strict``) a test that passes fails when there are any, printing
them and the journal; with ``"warn"`` they are listed in the terminal summary; ``"off"``
(the default) leaves the test alone. The marker's ``tolerances={...}`` sets `Tolerances`.

The plugin is loaded by every pytest run in an environment where chaosllm is installed,
so it imports no server module: `ChaosServer` is imported inside the fixtures.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from chaosllm.core.verdict import Finding
    from chaosllm.server import ChaosServer

__all__ = [
    "VERDICT_MODES",
    "ChaosHandle",
    "chaosllm",
    "chaosllm_server",
    "pytest_pyfunc_call",
    "pytest_terminal_summary",
]

SESSION_HEADER = "X-Chaosllm-Session"
_SERVER_OPTIONS = ("recordings", "seed", "on_miss", "timing", "match", "profile")
_HANDLE_OPTIONS = ("shared", "verdict", "tolerances")
VERDICT_MODES = ("off", "warn", "strict")
"""What a test's findings do: nothing (the default), a line in the terminal summary, or
fail the test."""
_counters: dict[str, itertools.count[int]] = {}
"""Per test (node id), how many sessions it had: its ids are the same in every run."""

AZURE_API_VERSION = "2024-10-21"
"""The ``api-version`` the fixture's Azure client and env use."""


class ChaosHandle:
    """What the `chaosllm` fixture gives a test: a server, seen through one session."""

    def __init__(self, server: ChaosServer, session_prefix: str | None = None) -> None:
        self.server = server
        self._prefix = session_prefix
        self.session: str | None = None
        self._mine: list[str] = []
        self._sessions: list[str] = []
        self._new_session()

    def _new_session(self) -> None:
        if self._prefix is not None:
            counter = _counters.setdefault(self._prefix, itertools.count(1))
            self.session = f"{self._prefix}#{next(counter)}"
            self._sessions.append(self.session)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (``.../v1``)."""
        return self.server.base_url

    @property
    def headers(self) -> dict[str, str]:
        """Headers a client must send (the session header on a shared server)."""
        return {SESSION_HEADER: self.session} if self.session else {}

    @property
    def env(self) -> dict[str, str]:
        """Environment for a client program: the official SDKs read these."""
        return {
            "OPENAI_BASE_URL": self.base_url,
            "OPENAI_API_KEY": "sk-chaosllm-test",
            "ANTHROPIC_BASE_URL": self.url,
            "ANTHROPIC_API_KEY": "sk-ant-chaosllm-test",
            "GOOGLE_GEMINI_BASE_URL": self.url,
            "GOOGLE_VERTEX_BASE_URL": self.url,
            "GEMINI_API_KEY": "chaosllm-gemini-test",
            "OLLAMA_HOST": self.url,
            "AZURE_OPENAI_ENDPOINT": self.url,
            "AZURE_OPENAI_API_KEY": "chaosllm-azure-test",
            "OPENAI_API_VERSION": AZURE_API_VERSION,
            "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": self.url,
            "AWS_ACCESS_KEY_ID": "chaosllm-aws-test",
            "AWS_SECRET_ACCESS_KEY": "chaosllm-aws-test",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def realtime(self, **options: Any) -> Any:
        """An ``openai.OpenAI`` client whose ``realtime.connect()`` reaches this server
        (with the session header on a shared server)."""
        options.setdefault("default_headers", self.headers)
        return self.server.realtime(**options)

    def live(self, **options: Any) -> Any:
        """A ``google.genai.Client`` whose ``aio.live.connect()`` reaches this server
        (which must serve TLS: google-genai dials ``wss://``)."""
        if self.headers:
            from google.genai import types

            options.setdefault("http_options", types.HttpOptions(headers=self.headers))
        return self.server.live(**options)

    def arm(
        self,
        spec: str | Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        /,
        **params: Any,
    ) -> list[str]:
        """Arm faults (as `ChaosServer.arm`); on a shared server they match only this
        test's session."""
        if isinstance(spec, str):
            specs: list[dict[str, Any]] = [{"type": spec, **params}]
        elif spec is None:
            specs = [dict(params)]
        elif isinstance(spec, Mapping):
            specs = [dict(spec)]
        else:
            specs = [dict(s) for s in spec]
        if self.session is not None:
            for s in specs:
                s["match"] = {**(s.get("match") or {}), "session": self.session}
        ids = self.server.arm(specs) if specs else []
        self._mine.extend(ids)
        return ids

    def disarm(self, fault_id: str | None = None) -> int:
        if self.session is None:
            return self.server.disarm(fault_id)
        ids = [fault_id] if fault_id is not None else list(self._mine)
        return sum(self.server.disarm(i) for i in ids)

    def faults(self) -> dict[str, Any]:
        faults = self.server.faults()
        if self.session is None:
            return faults
        return {
            "armed": [f for f in faults["armed"] if f["id"] in self._mine],
            "fired": [f for f in faults["fired"] if f["session"] == self.session],
        }

    def requests(self, *, settle: float = 2.0) -> list[dict[str, Any]]:
        """This test's journal (its session's, on a shared server)."""
        return self.server.requests(self.session, settle=settle)

    def verdict(self, *, settle: float = 2.0, **tolerances: Any) -> list[Finding]:
        """The findings about the client's behaviour in this test (all its sessions, on a
        shared server), as `ChaosServer.verdict`; keyword arguments set `Tolerances`."""
        if self.session is None:
            return self.server.verdict(None, settle=settle, **tolerances)
        found = [
            finding
            for session in self._sessions
            for finding in self.server.verdict(session, settle=settle, **tolerances)
        ]
        return sorted(found, key=lambda f: f.seqs)

    def journal_of_sessions(self, *, settle: float = 2.0) -> list[dict[str, Any]]:
        """The journal of every session this test had (all of it on its own server)."""
        if self.session is None:
            return self.server.requests(None, settle=settle)
        entries = [e for s in self._sessions for e in self.server.requests(s, settle=settle)]
        return sorted(entries, key=lambda e: int(e["seq"]))

    def use_scenario(self, scenario: str | None) -> None:
        self.server.use_scenario(scenario, self.session)

    def reset(self) -> None:
        """Start afresh: faults disarmed, journal and sequences empty. On a shared server
        this moves to a new session (other tests' state is untouched)."""
        if self.session is None:
            self.server.reset()
        else:
            self.disarm()
            self._new_session()
        self._mine.clear()

    def openai(self, **kwargs: Any) -> Any:
        """An `openai.OpenAI` client for this server and session."""
        import openai

        kwargs.setdefault("api_key", "sk-chaosllm-test")
        kwargs["default_headers"] = {**self.headers, **kwargs.get("default_headers", {})}
        return openai.OpenAI(base_url=self.base_url, **kwargs)

    def anthropic(self, **kwargs: Any) -> Any:
        """An `anthropic.Anthropic` client for this server and session."""
        import anthropic

        kwargs.setdefault("api_key", "sk-ant-chaosllm-test")
        kwargs["default_headers"] = {**self.headers, **kwargs.get("default_headers", {})}
        return anthropic.Anthropic(base_url=self.url, **kwargs)

    def gemini(self, **kwargs: Any) -> Any:
        """A `google.genai.Client` for this server and session (``generate_content`` and
        ``generate_content_stream``, sync and through ``.aio``); ``http_options`` given
        keep their other settings (retry options, timeout...)."""
        from google import genai
        from google.genai import types

        kwargs.setdefault("api_key", "chaosllm-gemini-test")
        options = kwargs.pop("http_options", None) or types.HttpOptions()
        if isinstance(options, dict):
            options = types.HttpOptions(**options)
        headers = {**self.headers, **(options.headers or {})}
        options = options.model_copy(update={"base_url": self.url, "headers": headers})
        return genai.Client(http_options=options, **kwargs)

    def azure_openai(self, **kwargs: Any) -> Any:
        """An `openai.AzureOpenAI` client for this server and session (pass
        ``azure_deployment=`` to name a deployment in the base URL, or name it as
        ``model=``)."""
        import openai

        kwargs.setdefault("api_key", "chaosllm-azure-test")
        kwargs.setdefault("api_version", AZURE_API_VERSION)
        kwargs["default_headers"] = {**self.headers, **kwargs.get("default_headers", {})}
        return openai.AzureOpenAI(azure_endpoint=self.url, **kwargs)

    def bedrock(self, **kwargs: Any) -> Any:
        """A `boto3` ``bedrock-runtime`` client for this server and session (``converse``,
        ``converse_stream``), with dummy credentials; ``config=`` (a `botocore.config.Config`:
        retries, timeouts) and other `boto3.client` arguments pass through."""
        import boto3

        kwargs.setdefault("region_name", "us-east-1")
        kwargs.setdefault("aws_access_key_id", "chaosllm-aws-test")
        kwargs.setdefault("aws_secret_access_key", "chaosllm-aws-test")
        client = boto3.client("bedrock-runtime", endpoint_url=self.url, **kwargs)
        headers = self.headers

        def add_headers(request: Any, **_: Any) -> None:
            for name, value in headers.items():
                request.headers[name] = value

        if headers:
            client.meta.events.register("before-sign.bedrock-runtime", add_headers)
        return client

    def ollama(self, **kwargs: Any) -> Any:
        """An `ollama.Client` for this server and session (``chat``, ``generate``, ``embed``,
        ``list``...); other `ollama.Client` arguments (``timeout``...) pass through."""
        import ollama

        kwargs["headers"] = {**self.headers, **(kwargs.get("headers") or {})}
        return ollama.Client(host=self.url, **kwargs)

    def async_ollama(self, **kwargs: Any) -> Any:
        """An `ollama.AsyncClient` for this server and session (`ollama`'s twin)."""
        import ollama

        kwargs["headers"] = {**self.headers, **(kwargs.get("headers") or {})}
        return ollama.AsyncClient(host=self.url, **kwargs)

    def async_openai(self, **kwargs: Any) -> Any:
        """An `openai.AsyncOpenAI` client for this server and session."""
        import openai

        kwargs.setdefault("api_key", "sk-chaosllm-test")
        kwargs["default_headers"] = {**self.headers, **kwargs.get("default_headers", {})}
        return openai.AsyncOpenAI(base_url=self.base_url, **kwargs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("chaosllm", "chaosllm fault-injection server")
    group.addoption(
        "--chaosllm-recordings",
        action="append",
        metavar="DIR",
        default=None,
        help="recordings directory for the chaosllm fixture (repeatable; "
        "default: the shipped recordings)",
    )
    group.addoption(
        "--chaosllm-seed",
        type=int,
        default=0,
        metavar="N",
        help="seed of the chaosllm fixture's fault draws (default 0)",
    )
    group.addoption(
        "--chaosllm-shared",
        action="store_true",
        default=False,
        help="share one chaosllm server across tests, a session id per test",
    )
    group.addoption(
        "--chaosllm-verdict",
        choices=VERDICT_MODES,
        default="off",
        help="what findings about a client's retry behaviour do to a test using the "
        "chaosllm fixture: off (default), warn (listed in the summary), strict (the test "
        "fails)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "chaosllm(shared=False, recordings=None, seed=None, on_miss=None, timing=None, "
        "match=None, profile=None, verdict=None, tolerances=None): configure the chaosllm "
        "fixture's server; verdict off/warn/strict says what findings about the client's "
        "behaviour do to the test",
    )


def _defaults(config: pytest.Config) -> dict[str, Any]:
    options: dict[str, Any] = {"seed": config.getoption("chaosllm_seed")}
    recordings = config.getoption("chaosllm_recordings")
    if recordings:
        options["recordings"] = [Path(r) for r in recordings]
    return options


@pytest.fixture(scope="session")
def chaosllm_server(pytestconfig: pytest.Config) -> Iterator[ChaosServer]:
    """One chaosllm server for the whole test run (what shared tests use): each test's
    session names its scenario (``scenario_from_session``)."""
    from chaosllm.server import ChaosServer

    with ChaosServer(**_defaults(pytestconfig), scenario_from_session=True) as server:
        yield server


@pytest.fixture
def chaosllm(request: pytest.FixtureRequest) -> Iterator[ChaosHandle]:
    """A chaosllm server for this test (or this test's session of a shared server)."""
    from chaosllm.server import ChaosServer

    marker = request.node.get_closest_marker("chaosllm")
    options: dict[str, Any] = dict(marker.kwargs) if marker is not None else {}
    valid = ", ".join((*_HANDLE_OPTIONS, *_SERVER_OPTIONS))
    if marker is not None and marker.args:
        raise pytest.UsageError("@pytest.mark.chaosllm takes keyword arguments only: " + valid)
    unknown = set(options) - {*_HANDLE_OPTIONS, *_SERVER_OPTIONS}
    if unknown:
        raise pytest.UsageError(
            f"@pytest.mark.chaosllm has no option {sorted(unknown)[0]!r}; valid: " + valid
        )
    judge = _judge_of(request.config, options.pop("verdict", None), options.pop("tolerances", None))
    shared = options.pop("shared", None)
    if shared is None:
        shared = request.config.getoption("chaosllm_shared")
    if shared and not options:
        server: ChaosServer = request.getfixturevalue("chaosllm_server")
        handle = ChaosHandle(server, session_prefix=request.node.nodeid)
        if judge is not None:
            request.node.stash[_JUDGED] = _Judged(handle, *judge)
        try:
            yield handle
        finally:
            handle.disarm()
        return
    with ChaosServer(**{**_defaults(request.config), **options}) as own:
        handle = ChaosHandle(own)
        if judge is not None:
            request.node.stash[_JUDGED] = _Judged(handle, *judge)
        yield handle


# -- verdicts ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Judged:
    """A test whose findings are judged: its handle, the mode, the tolerances."""

    handle: ChaosHandle
    mode: str
    tolerances: Mapping[str, Any]


_JUDGED = pytest.StashKey[_Judged]()
_WARNED = pytest.StashKey[list[tuple[str, list["Finding"]]]]()
MAX_WARNED = 1000
"""How many tests' findings the terminal summary lists (the first)."""


def _judge_of(
    config: pytest.Config, mode: Any, tolerances: Any
) -> tuple[str, Mapping[str, Any]] | None:
    """The verdict mode (the marker's, else ``--chaosllm-verdict``) and tolerances of a
    test; None when off. `pytest.UsageError` for a bad mode or tolerance."""
    if mode is None:
        mode = config.getoption("chaosllm_verdict")
    if mode not in VERDICT_MODES:
        raise pytest.UsageError(
            f"@pytest.mark.chaosllm(verdict={mode!r}): give one of " + ", ".join(VERDICT_MODES)
        )
    if tolerances is None:
        tolerances = {}
    if not isinstance(tolerances, Mapping):
        raise pytest.UsageError(
            "@pytest.mark.chaosllm(tolerances=...) takes a dict of tolerance names to values"
        )
    from chaosllm.core.verdict import Tolerances
    from chaosllm.errors import ConfigError

    try:
        Tolerances().with_(**tolerances)
    except ConfigError as exc:
        raise pytest.UsageError(f"@pytest.mark.chaosllm(tolerances=...): {exc}") from None
    return None if mode == "off" else (mode, dict(tolerances))


def _verdict_text(judged: _Judged, found: Sequence[Finding]) -> str:
    from chaosllm.core.verdict import format_findings
    from chaosllm.testing.resilience import format_journal

    return (
        f"chaosllm verdict ({judged.mode}): {len(found)} finding"
        + ("s" if len(found) != 1 else "")
        + " about the client's behaviour\n"
        + format_findings(found)
        + "\njournal:\n"
        + format_journal(judged.handle.journal_of_sessions())
    )


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Generator[None, object, object]:
    """After a test that uses the `chaosllm` fixture with a verdict mode: strict fails it
    when it passed and its sessions have findings; warn keeps them for the summary."""
    judged = pyfuncitem.stash.get(_JUDGED, None)
    if judged is None:
        return (yield)
    try:
        result = yield
    except BaseException:
        if judged.mode == "warn":
            with contextlib.suppress(Exception):  # the test's own failure comes first
                _warn(pyfuncitem, judged)
        raise
    if judged.mode == "warn":
        _warn(pyfuncitem, judged)
        return result
    found = judged.handle.verdict(**judged.tolerances)
    if found:
        pytest.fail(_verdict_text(judged, found), pytrace=False)
    return result


def _warn(item: pytest.Function, judged: _Judged) -> None:
    found = judged.handle.verdict(**judged.tolerances)
    if not found:
        return
    warned = item.config.stash.setdefault(_WARNED, [])
    if len(warned) < MAX_WARNED:
        warned.append((item.nodeid, found))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """The findings of the tests in warn mode."""
    from chaosllm.core.verdict import format_findings

    warned = config.stash.get(_WARNED, [])
    if not warned:
        return
    terminalreporter.write_sep("=", "chaosllm verdict (warn)")
    for nodeid, found in warned:
        terminalreporter.write_line(f"{nodeid}: {len(found)} finding" + "s" * (len(found) != 1))
        terminalreporter.write_line(format_findings(found))
