"""Run the app: in the foreground (the CLI) or in a background thread (`ChaosServer`).

Three servers host the same Starlette app: chaosllm's own (``builtin``: asyncio
protocols and httptools, on uvloop where installed, provider requests answered by the
engine without the app; it executes every plan exactly, socket-level faults included),
its pure-Python fallback (``h11``: h11 + anyio, every request through the app, the same
bytes on the wire) and ``uvicorn`` (socket-level endings degrade to the nearest thing
ASGI can do).
"""

from __future__ import annotations

import contextlib
import enum
import errno
import gc
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread
import anyio.lowlevel
from starlette.applications import Starlette

from chaosllm.config import (
    DEFAULT_RECORD_SCENARIO,
    Mode,
    OnMiss,
    Pace,
    RateLimit,
    ServerConfig,
    parse_rate_limit,
    parse_timing_option,
    proxy_dirs,
    secrets_from_env,
)
from chaosllm.core.clock import Clock
from chaosllm.core.verdict import Finding, Tolerances
from chaosllm.errors import ConfigError, ServerError
from chaosllm.faults import parse_fault_specs
from chaosllm.http.app import create_app
from chaosllm.http.control import HostRule, loopback_bound, parse_allow_hosts
from chaosllm.http.cors import parse_cors
from chaosllm.http.direct import DirectFront, DirectHandler
from chaosllm.http.state import ChaosState
from chaosllm.providers import error_body_for_path
from chaosllm.store.matching import DEFAULT_ORDER, Strategy
from chaosllm.store.profiles import load_profile
from chaosllm.wire import PlanAborted, WireServer
from chaosllm.wire.common import backend_options

if TYPE_CHECKING:
    from chaosllm.wire.h11_server import H11WireServer

__all__ = ["ChaosServer", "ServerKind", "run_server"]

log = logging.getLogger("chaosllm")


class ServerKind(str, enum.Enum):
    BUILTIN = "builtin"
    UVICORN = "uvicorn"
    H11 = "h11"
    """The builtin server's pure-Python fallback (h11 + anyio)."""


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio sets TCP_NODELAY only on accepted sockets whose proto is
    # IPPROTO_TCP, and without it every response waited ~40 ms for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise _start_failure(exc, host, port) from None
    return sock


def _cause(exc: BaseException) -> BaseException:
    """The error that stopped a server, out of the task groups it was raised through: the
    first `ServerError` or `OSError` in `exc` (an exception group's leaves, depth first),
    else `exc` itself, so that a message names the cause rather than the group."""
    stack = [exc]
    while stack:
        found = stack.pop(0)
        inner = getattr(found, "exceptions", None)
        if isinstance(inner, tuple):
            stack[:0] = list(inner)
        elif isinstance(found, (ServerError, OSError)):
            return found
    return exc


def _start_failure(exc: BaseException, host: str, port: int) -> ServerError:
    """One readable line for why a server could not start, the cause first: a port in use
    says so and what to do, other errors keep their own message."""
    cause = _cause(exc)
    text = str(cause)
    if (isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE) or (
        "Address already in use" in text
    ):
        return ServerError(
            f"port {port} is already in use: cannot listen on {host}:{port} while another "
            f"process does; stop it, or pick another port (port 0 picks a free one)"
        )
    if isinstance(cause, OSError):
        return ServerError(f"cannot listen on {host}:{port}: {cause.strerror or cause}")
    if isinstance(cause, ServerError):
        return cause
    return ServerError(f"{type(cause).__name__}: {cause}")


def _url(host: str, port: int, tls: bool = False) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"{'https' if tls else 'http'}://{shown}:{port}"


def _tls(config: ServerConfig) -> Any:
    """The servers' TLS context, when the configuration asks for TLS."""
    if config.certfile is None or config.keyfile is None:
        return None
    from chaosllm.wire.tls import server_context

    return server_context(config.certfile, config.keyfile)


async def _serve_builtin(
    app: Starlette,
    host: str,
    port: int,
    config: ServerConfig,
    ready: Any,
    stop: anyio.Event,
    kind: ServerKind = ServerKind.BUILTIN,
) -> None:
    server: WireServer | H11WireServer
    if kind is ServerKind.H11:
        from chaosllm.wire.h11_server import H11WireServer  # imports h11: only when asked

        server = H11WireServer(
            app,
            host=host,
            port=port,
            max_body_bytes=config.max_body_bytes,
            max_connections=config.max_connections,
            error_body=error_body_for_path,
            ssl=_tls(config),
        )
    else:
        server = WireServer(
            app,
            host=host,
            port=port,
            max_body_bytes=config.max_body_bytes,
            max_connections=config.max_connections,
            error_body=error_body_for_path,
            direct=DirectHandler(
                app.state.chaos,
                hosts=HostRule(config.allow_hosts) if loopback_bound(host) else None,
            ),
            memo=app.state.chaos.memo,
            ssl=_tls(config),
        )
    async with anyio.create_task_group() as tg:
        bound = await tg.start(server.serve)
        ready(bound)
        await stop.wait()
        server.request_shutdown()


UVICORN_DEGRADED = (
    "under --server uvicorn socket-level faults degrade to what ASGI allows: "
    "connection_reset closes (FIN) instead of resetting (RST); empty_reply, and garbage on "
    "non-streaming requests, become a 500 from uvicorn; dropped_connection, stall and "
    "garbage mid-stream end the response by aborting it. Use --server builtin for exact "
    "faults."
)


def tls_files(tls: bool, certfile: str | Path | None, keyfile: str | Path | None) -> Any:
    """The certificate and key to serve TLS with (made now, self-signed, for `tls`)."""
    if certfile is not None or keyfile is not None:
        if certfile is None or keyfile is None:
            raise ServerError("give both certfile and keyfile (or tls=True alone)")
        return {"certfile": Path(certfile), "keyfile": Path(keyfile)}
    if not tls:
        return {}
    import tempfile

    from chaosllm.wire.tls import self_signed

    cert, key = self_signed(Path(tempfile.mkdtemp(prefix="chaosllm-tls-")))
    return {"certfile": cert, "keyfile": key}


class _HidePlanAborts(logging.Filter):
    """uvicorn logs a traceback for every aborted response; an abort that executes a
    fault is intended, so it is not an application error."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], PlanAborted))


def _uvicorn_server(app: Starlette, config: ServerConfig) -> Any:
    try:
        import uvicorn
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ServerError(
            "--server uvicorn needs uvicorn: pip install -e '.[uvicorn]' from a clone "
            "(or pip install uvicorn)"
        ) from exc
    from chaosllm.http.uvicorn_guard import (
        GRACEFUL_TIMEOUT_S,
        MAX_HEAD,
        guarded_protocol,
        guarded_server,
    )

    loop = "uvloop" if _has("uvloop") else "asyncio"
    http = "httptools" if _has("httptools") else "h11"
    # The same guarantees as the builtin server (chaosllm.http.uvicorn_guard): read
    # deadlines and a connection cap in the protocol, a shutdown that cancels stalls,
    # sparse logs at the open-file limit; the body limit is the app's BodyLimit.
    uv_config = uvicorn.Config(
        # Provider requests take the hot path the builtin server takes, before the app.
        DirectFront(app, app.state.chaos, config.max_body_bytes),
        loop=loop,
        http=guarded_protocol(http, config.max_connections),
        log_level="warning",
        access_log=False,
        lifespan="auto",
        h11_max_incomplete_event_size=MAX_HEAD,
        ws="wsproto",  # the WebSocket library chaosllm depends on (chaosllm.wire.websocket)
        ssl_certfile=config.certfile,
        ssl_keyfile=config.keyfile,
        timeout_graceful_shutdown=GRACEFUL_TIMEOUT_S,
    )
    error_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _HidePlanAborts) for f in error_log.filters):
        error_log.addFilter(_HidePlanAborts())
    log.warning(UVICORN_DEGRADED)
    return guarded_server(uv_config)


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def run_server(
    config: ServerConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    kind: ServerKind = ServerKind.BUILTIN,
    state: ChaosState | None = None,
    on_listening: Any = None,
) -> None:
    """Serve in the foreground until interrupted. `on_listening(url)` is called once bound."""
    app = create_app(config, state=state)
    # The recordings live as long as the process: move them out of the collector's
    # sight, so full collections stay short however many are loaded. (No collection
    # first: loading makes no cycles, and walking 10k recordings costs start-up time.)
    gc.freeze()
    if kind is ServerKind.UVICORN:
        sock = _bind(host, port)
        server = _uvicorn_server(app, config)
        if on_listening is not None:
            on_listening(_url(host, sock.getsockname()[1], config.certfile is not None))
        try:
            server.run(sockets=[sock])
        finally:
            sock.close()
        return

    async def main() -> None:
        stop = anyio.Event()

        def ready(bound: tuple[str, int]) -> None:
            if on_listening is not None:
                on_listening(_url(bound[0], bound[1], config.certfile is not None))

        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    log.info("received %s: shutting down", signal.Signals(signum).name)
                    break
            # A second Ctrl-C while the shutdown waits on open responses (a stall holds
            # one for its max_ms): stop now, with one line rather than the tracebacks of
            # every task the interrupt would tear through.
            previous.update(
                {sig: signal.signal(sig, _stop_now) for sig in (signal.SIGINT, signal.SIGTERM)}
            )
            stop.set()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(stop_on_signal)
                await _serve_builtin(app, host, port, config, ready, stop, kind)
                tg.cancel_scope.cancel()
        except Exception as exc:
            cause = _cause(exc)
            if isinstance(cause, (ServerError, OSError)):
                raise _start_failure(cause, host, port) from None
            raise

    previous: dict[int, Any] = {}
    try:
        anyio.run(main, backend_options=backend_options())
    except KeyboardInterrupt:  # before the signal receiver was listening
        log.info("interrupted: stopped")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stop_now(signum: int, frame: Any) -> None:
    log.warning("%s again: stopped without waiting for open responses", signal.Signals(signum).name)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(130)


class ChaosServer:
    """A chaosllm server in a background thread, for tests and scripts.

    >>> with ChaosServer() as server:                     # doctest: +SKIP
    ...     client = openai.OpenAI(base_url=server.base_url, api_key="test")
    """

    def __init__(
        self,
        recordings: str | Path | Sequence[str | Path] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        server: str | ServerKind = ServerKind.BUILTIN,
        on_miss: str | OnMiss = OnMiss.ERROR,
        seed: int = 0,
        timing: str | float | Pace = "fast",
        match: str | Sequence[Strategy] = DEFAULT_ORDER,
        nearest_threshold: float = 0.9,
        mode: str | Mode = Mode.REPLAY,
        upstream: str | None = None,
        mcp_upstreams: Mapping[str, str] | None = None,
        record_dir: str | Path | None = None,
        record_scenario: str = DEFAULT_RECORD_SCENARIO,
        scenario_from_session: bool = False,
        secrets: Sequence[str] = (),
        max_body_bytes: int = 16 * 1024 * 1024,
        max_connections: int = 10_000,
        journal_size: int = 10_000,
        fault_history_size: int = 1000,
        max_sessions: int = 10_000,
        max_faults: int = 10_000,
        memo_bytes: int = 32 << 20,
        profile: str | None = None,
        strict: bool = False,
        gateway: str | None = None,
        control_token: str | None = None,
        allow_hosts: Sequence[str] = (),
        cors: Sequence[str] = (),
        rate_limit: str | Mapping[str, Any] | RateLimit | None = None,
        clock: Clock | None = None,
        tls: bool = False,
        certfile: str | Path | None = None,
        keyfile: str | Path | None = None,
        no_audio: bool = False,
    ) -> None:
        """`mode` record, record-missing or passthrough makes it a proxy in front of
        `upstream`; new recordings go to `record_dir` (default: the first of
        `recordings`), scenario `record_scenario` unless the request's session has an
        active one (or, with `scenario_from_session`, names one, which it also replays
        from: ``--scenario-from-session``). `secrets` (and ``$CHAOSLLM_SECRETS``) are
        redacted from recordings.
        A `control_token`, when given, is required on every HTTP control call
        (``--control-token``); `allow_hosts` are names the control plane answers besides
        loopback ones (``--allow-host``; bound to loopback, the provider endpoints answer
        the same names only); `cors` the origins whose pages may read answers
        (``--cors``, ``"*"`` for any). The methods here call the state directly:
        neither applies to them. `server` is ``"builtin"`` (asyncio protocols and
        httptools, on uvloop where installed), ``"h11"`` (its pure-Python fallback) or
        ``"uvicorn"``; `max_connections` bounds the connections a builtin server holds
        (``--max-connections``: when full, the oldest idle one is closed for a new one).
        `timing` is ``"fast"``, ``"recorded"``, a scale of the recorded gaps, or a pace
        (``"ttft=600ms,tps=50,jitter=0.25"`` or a `Pace`, as ``--timing``).
        `memo_bytes` bounds the engine's memo of worked-out answers (``--memo-bytes``).
        `rate_limit` sets live rate limits (``"rpm=60,tpm=40000"`` or ``{"rpm": 60}``, as
        ``--rate-limit``; `set_rate_limit` changes them); `clock` is the engine's time (a
        `chaosllm.core.clock.ManualClock` lets a test move it instead of sleeping).
        `no_audio` records sessions with a digest of each audio delta (``--no-audio``).
        `tls` serves TLS on every protocol with a self-signed certificate made now
        (`certfile` names it: trust it, or use `live`), or the given `certfile`/`keyfile`."""
        try:
            limit = parse_rate_limit(rate_limit) if rate_limit is not None else None
        except ConfigError as exc:
            raise ServerError(str(exc)) from None
        given: list[Path] | None
        if recordings is None:
            given = None
        elif isinstance(recordings, (str, Path)):
            given = [Path(recordings)]
        else:
            given = [Path(d) for d in recordings]
        mode = Mode.parse(mode) if isinstance(mode, str) else mode
        scale, pace = parse_timing_option(timing)
        try:
            dirs, target = proxy_dirs(
                mode,
                upstream=upstream,
                recordings=given,
                record_dir=Path(record_dir) if record_dir else None,
                servers=mcp_upstreams,
            )
        except ValueError as exc:
            raise ServerError(str(exc)) from None
        self.config = ServerConfig(
            recordings=dirs,
            mode=mode,
            mcp_upstreams=dict(mcp_upstreams or {}),
            on_miss=OnMiss.parse(on_miss) if isinstance(on_miss, str) else on_miss,
            seed=seed,
            timing=scale,
            pace=pace,
            match_order=Strategy.parse_order(match) if isinstance(match, str) else tuple(match),
            nearest_threshold=nearest_threshold,
            max_body_bytes=max_body_bytes,
            max_connections=max_connections,
            upstream=upstream,
            record_dir=target,
            record_scenario=record_scenario,
            scenario_from_session=scenario_from_session,
            secrets=[*secrets, *secrets_from_env()],
            strict=strict,
            gateway=gateway,
            journal_size=journal_size,
            fault_history_size=fault_history_size,
            max_sessions=max_sessions,
            max_faults=max_faults,
            memo_bytes=memo_bytes,
            control_token=control_token,
            allow_hosts=[allow_hosts] if isinstance(allow_hosts, str) else list(allow_hosts),
            cors=[cors] if isinstance(cors, str) else list(cors),
            rate_limit=limit,
            **tls_files(tls, certfile, keyfile),
            no_audio=no_audio,
        )
        try:
            parse_allow_hosts(self.config.allow_hosts)
            parse_cors(self.config.cors)
        except ConfigError as exc:
            raise ServerError(str(exc)) from None
        self.kind = ServerKind(server)
        self.host = host
        self._requested_port = port
        try:
            self.state = ChaosState.from_config(self.config, clock=clock)
        except ValueError as exc:
            raise ServerError(str(exc)) from None
        if profile is not None:
            self.arm_profile(profile)
        self.app = create_app(state=self.state)
        self.port: int | None = None
        self._thread: threading.Thread | None = None
        self._stop: anyio.Event | None = None
        self._token: anyio.lowlevel.EventLoopToken | None = None
        self._uvicorn: Any = None
        self._error: BaseException | None = None

    # -- lifecycle --------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> ChaosServer:
        if self._thread is not None:
            raise ServerError("this ChaosServer is already started")
        started = threading.Event()
        if self.kind is ServerKind.UVICORN:
            sock = _bind(self.host, self._requested_port)
            self.port = sock.getsockname()[1]
            self._uvicorn = _uvicorn_server(self.app, self.config)

            def run_uvicorn() -> None:
                try:
                    self._uvicorn.run(sockets=[sock])
                except BaseException as exc:  # reported by start()/stop()
                    self._error = exc
                finally:
                    sock.close()
                    started.set()

            self._thread = threading.Thread(
                target=run_uvicorn, name="chaosllm-uvicorn", daemon=True
            )
            self._thread.start()
            self._wait_uvicorn(timeout)
            return self

        def run_builtin() -> None:
            async def main() -> None:
                self._stop = anyio.Event()
                self._token = anyio.lowlevel.current_token()

                def ready(bound: tuple[str, int]) -> None:
                    self.port = bound[1]
                    started.set()

                await _serve_builtin(
                    self.app,
                    self.host,
                    self._requested_port,
                    self.config,
                    ready,
                    self._stop,
                    self.kind,
                )

            try:
                anyio.run(main, backend_options=backend_options())
            except BaseException as exc:  # reported by start()/stop()
                self._error = exc
            finally:
                started.set()

        self._thread = threading.Thread(target=run_builtin, name="chaosllm-server", daemon=True)
        self._thread.start()
        if not started.wait(timeout):
            raise ServerError(f"the server did not start within {timeout} s")
        if self._error is not None or self.port is None:
            self._thread.join(timeout)
            self._thread = None
            if self._error is None:
                raise ServerError("the server failed to start")
            raise _start_failure(self._error, self.host, self._requested_port) from None
        return self

    def _wait_uvicorn(self, timeout: float) -> None:
        # The socket is already listening, so requests queue until uvicorn accepts them;
        # waiting for `started` only makes failures surface here rather than later.
        done = threading.Event()
        deadline = timeout
        while not done.wait(0.01):
            deadline -= 0.01
            if self._uvicorn.started or self._error is not None or deadline <= 0:
                break
        if self._error is not None:
            raise _start_failure(self._error, self.host, self._requested_port) from None
        if not self._uvicorn.started:
            raise ServerError(f"uvicorn did not start within {timeout} s")

    def stop(self, timeout: float = 10.0) -> None:
        thread = self._thread
        if thread is None:
            return
        if self.kind is ServerKind.UVICORN:
            self._uvicorn.should_exit = True
        elif self._stop is not None and self._token is not None:
            with contextlib.suppress(RuntimeError):
                anyio.from_thread.run_sync(self._stop.set, token=self._token)
        thread.join(timeout)
        self._thread = None
        if thread.is_alive():
            raise ServerError(f"the server did not stop within {timeout} s")

    def __enter__(self) -> ChaosServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- addresses --------------------------------------------------------------

    @property
    def url(self) -> str:
        if self.port is None:
            raise ServerError("the server is not started")
        return _url(self.host, self.port, self.config.certfile is not None)

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (``.../v1``): ``openai.OpenAI(base_url=server.base_url)``."""
        return self.url + "/v1"

    @property
    def certfile(self) -> Path | None:
        """The certificate served with TLS (None: plain HTTP)."""
        return self.config.certfile

    def realtime(self, **options: Any) -> Any:
        """An ``openai.OpenAI`` client for this server (``client.realtime.connect()``),
        trusting its certificate when it serves TLS."""
        import openai

        if self.certfile is not None:
            import httpx

            from chaosllm.wire.tls import client_context

            options.setdefault("http_client", httpx.Client(verify=client_context(self.certfile)))
        options.setdefault("api_key", "sk-chaosllm")
        return openai.OpenAI(base_url=self.base_url, **options)

    def live(self, **options: Any) -> Any:
        """A ``google.genai.Client`` for this server (``client.aio.live.connect()``), which
        trusts its certificate (google-genai dials ``wss://``: start with ``tls=True``)."""
        from google import genai
        from google.genai import types

        if self.certfile is None:
            raise ServerError("google-genai's live client dials wss://: start with tls=True")
        from chaosllm.wire.tls import client_context

        context = client_context(self.certfile)
        given = options.pop("http_options", None)
        http = types.HttpOptions(
            base_url=self.url,
            headers=getattr(given, "headers", None),
            async_client_args={"ssl": context},
            client_args={"verify": context},
        )
        options.setdefault("api_key", "chaosllm")
        return genai.Client(http_options=http, **options)

    # -- control ----------------------------------------------------------------

    def reset(self) -> None:
        """Disarm every fault, clear the journal and fault history, rewind sequences (and
        forget the WebSocket sessions' log)."""
        hub = getattr(self.state, "_live_hub", None)
        if hub is not None:
            hub.clear()
        self.state.reset()

    def reload(self) -> None:
        self.state.reload()

    def use_scenario(self, scenario: str | None, session: str | None = None) -> None:
        self.state.matcher.set_scenario(scenario, session)

    def requests(self, session: str | None = None, *, settle: float = 2.0) -> list[dict[str, Any]]:
        """The journal: one dict per provider request (see `GET /__requests`). Waits up to
        `settle` seconds for requests still being answered, so that their outcome and
        frame counts are final."""
        return [e.to_json() for e in self.state.journal.entries(session, settle=settle)]

    def arm(
        self,
        spec: str | Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        /,
        **params: Any,
    ) -> list[str]:
        """Arm faults; their ids. ``arm("http_503", remaining=2)``, ``arm({"type": ...})``
        or ``arm([{...}, {...}])``. Raises `InvalidFaultSpec` and arms nothing if any
        spec is bad."""
        if isinstance(spec, str):
            data: Any = {"type": spec, **params}
        elif spec is None:
            data = dict(params)
        else:
            if params:
                raise TypeError("give either a spec or keyword parameters, not both")
            data = list(spec) if not isinstance(spec, Mapping) else dict(spec)
        if data == []:
            return []
        return [f.id for f in self.state.board.arm(parse_fault_specs(data))]

    def arm_profile(self, name_or_path: str) -> list[str]:
        """Arm a profile's faults (their ids) and set its live rate limits, if it has any."""
        loaded = load_profile(name_or_path)
        if loaded.rate_limit is not None:
            self.state.set_rate_limit(loaded.rate_limit)
        return [f.id for f in self.state.board.arm(loaded.specs)]

    def set_rate_limit(self, rate_limit: str | Mapping[str, Any] | RateLimit | None) -> None:
        """Live rate limits from now on (``"rpm=60,tpm=40000"``, ``{"rpm": 60}``, a
        `RateLimit`; every bucket full), or none (None), as ``POST``/``DELETE
        /__ratelimit``; `ConfigError` for a bad one (nothing changes)."""
        self.state.set_rate_limit(parse_rate_limit(rate_limit) if rate_limit is not None else None)

    def rate_limits(self, session: str | None = None) -> dict[str, Any]:
        """The live rate limit and the buckets kept (`session`'s only, when given), as
        ``GET /__ratelimit`` answers."""
        limiter = self.state.limiter
        if limiter is None:
            return {"rate_limit": None, "buckets": []}
        return limiter.to_json(session)

    def disarm(self, fault_id: str | None = None) -> int:
        """Disarm one fault by id, or all of them; how many were disarmed."""
        return self.state.board.disarm(fault_id)

    def faults(self) -> dict[str, Any]:
        """Armed faults and the history of fired ones (see `GET /__fault`)."""
        return {
            "armed": self.state.board.armed(),
            "fired": [f.to_json() for f in self.state.board.history()],
        }

    def findings(self, session: str | None = None, *, settle: float = 2.0) -> list[dict[str, Any]]:
        """What the oracles found about the requests (see `GET /__findings`)."""
        return [
            {"seq": e.seq, "session": e.session, "recording": e.record.recording, **finding}
            for e in self.state.journal.entries(session, settle=settle)
            for finding in e.record.findings
        ]

    def verdict(
        self, session: str | None = None, *, settle: float = 2.0, **tolerances: Any
    ) -> list[Finding]:
        """The findings about the client's behaviour (see `GET /__verdict`): of one
        session, or of every session. Keyword arguments set `Tolerances`
        (``no_backoff_floor=0.5``; `ConfigError` for an unknown or bad one). Waits up to
        `settle` seconds for requests still being answered, so that what the wire sent
        is final."""
        chosen = Tolerances().with_(**tolerances)
        return self.state.findings(session, chosen, settle=settle)

    def unused(self) -> list[str]:
        """The names of the recordings not served since the last reset (`GET /__unused`)."""
        return [e.name for e in self.state.matcher.unused()]

    def set_workspace(self, path: str | Path | None) -> None:
        """The live workspace ``<WORKSPACE>`` in recordings stands for (`POST /__workspace`);
        disarms every fault."""
        self.state.matcher.set_workspace(str(path) if path is not None else None)
        self.state.board.disarm()
