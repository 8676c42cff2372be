"""Start and stop benchmark servers as subprocesses, robustly.

Every server is its own process, started in its own session (so a Ctrl-C in
the terminal reaches only the benchmark driver, which then stops them in
order), bound to 127.0.0.1 on a port it picks itself (port 0), and considered
ready when it prints its "listening on URL" line *and* answers a health probe.
Everything is bounded: start-up, the health probe and the stop have timeouts;
a server that does not stop on SIGINT gets SIGTERM, then SIGKILL. `stop_all`
runs at exit and on SIGTERM, so no server outlives the driver.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

__all__ = [
    "BENCH_DIR",
    "REPO_DIR",
    "ServerError",
    "ServerProcess",
    "affinity",
    "chaosllm_argv",
    "pin",
    "running",
    "start_server",
    "stop_all",
]

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent

LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:\d+)")

_LAUNCHER = BENCH_DIR / "launch_chaosllm.py"


_PINS: dict[str, frozenset[int]] = {}


def pin(server: frozenset[int] | None, load: frozenset[int] | None) -> None:
    """Run servers on the CPUs `server` and load generators (and this process) on `load`
    (None: no pinning). On a 2-core machine this keeps wrk off the server's core."""
    _PINS.clear()
    if server is not None and load is not None:
        _PINS["server"] = server
        _PINS["load"] = load
        os.sched_setaffinity(0, load)


def affinity(role: str) -> Callable[[], None] | None:
    """A `preexec_fn` pinning a child to the CPUs of `role` ("server" or "load")."""
    cpus = _PINS.get(role)
    if cpus is None:
        return None

    def apply() -> None:
        os.sched_setaffinity(0, cpus)

    return apply


class ServerError(RuntimeError):
    """A benchmark server failed to start or to answer."""


def chaosllm_argv(args: Sequence[str], *, uvloop: bool = True, gc_stats: bool = False) -> list[str]:
    """The command line of ``chaosllm ARGS`` (the console script when installed).

    With ``uvloop=False`` the server runs with ``uvloop`` made unimportable, so
    that ``--server uvicorn`` falls back to the plain asyncio loop; with
    ``gc_stats`` it reports its garbage collections on exit (`launch_chaosllm`).
    """
    options = [*(() if uvloop else ("--no-uvloop",)), *(("--gc-stats",) if gc_stats else ())]
    script = Path(sys.executable).with_name("chaosllm")
    if not options and script.exists():
        return [str(script), *args]
    return [sys.executable, str(_LAUNCHER), *options, "--", *args]


@dataclass
class ServerProcess:
    """A running server subprocess and the URL it announced."""

    name: str
    proc: subprocess.Popen[str]
    url: str
    ready_s: float
    """Seconds from spawn to the "listening on" line."""
    output: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=50))
    pump: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self) -> str:
        return "\n".join(self.output)

    def stop(self, timeout: float = 5.0) -> None:
        """SIGINT, then SIGTERM, then SIGKILL, each bounded by `timeout`; then read the
        rest of its output (into `output`)."""
        _stop_process(self.proc, timeout)
        _LIVE.discard(self.proc)
        if self.pump is not None:
            self.pump.join(2.0)
        if self.proc.stdout is not None:
            with contextlib.suppress(OSError):
                self.proc.stdout.close()


_LIVE: set[subprocess.Popen[str]] = set()


def _stop_process(proc: subprocess.Popen[str], timeout: float) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(1.0)


def stop_all(timeout: float = 5.0) -> None:
    """Stop every server this process started and has not stopped yet."""
    for proc in list(_LIVE):
        _stop_process(proc, timeout)
        _LIVE.discard(proc)


def _on_sigterm(signum: int, frame: object) -> None:
    stop_all(2.0)
    raise SystemExit(128 + signum)


atexit.register(stop_all)
if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGTERM, _on_sigterm)


def _pump(
    proc: subprocess.Popen[str], lines: queue.Queue[str | None], keep: collections.deque[str]
) -> None:
    """Drain the child's output for its whole life (a full pipe would block it)."""
    assert proc.stdout is not None
    with contextlib.suppress(ValueError, OSError):
        for line in proc.stdout:
            keep.append(line.rstrip("\n"))
            lines.put(line)
    lines.put(None)


def start_server(
    name: str,
    argv: Sequence[str],
    *,
    timeout: float = 60.0,
    health_path: str | None = "/health",
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    ready: re.Pattern[str] = LISTENING,
) -> ServerProcess:
    """Spawn `argv`, wait (at most `timeout` s) for its "listening on URL" line and
    for ``GET health_path`` to answer 200; the running server."""
    full_env = dict(os.environ)
    full_env.update({"PYTHONUNBUFFERED": "1", "NO_COLOR": "1"})
    if env:
        full_env.update(env)
    keep: collections.deque[str] = collections.deque(maxlen=50)
    lines: queue.Queue[str | None] = queue.Queue()
    start = time.perf_counter()
    proc = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        bufsize=1,
        env=full_env,
        cwd=cwd,
        start_new_session=True,
        preexec_fn=affinity("server"),
    )
    _LIVE.add(proc)
    pump = threading.Thread(
        target=_pump, args=(proc, lines, keep), daemon=True, name=f"pump-{name}"
    )
    pump.start()
    deadline = start + timeout
    url: str | None = None
    ready_s = 0.0
    try:
        while url is None:
            left = deadline - time.perf_counter()
            if left <= 0:
                raise ServerError(f"{name}: no 'listening on' line within {timeout:.0f} s")
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise ServerError(f"{name}: exited with {proc.wait(5)} before listening")
            found = ready.search(line)
            if found:
                url = found.group(1)
                ready_s = time.perf_counter() - start
        server = ServerProcess(
            name=name, proc=proc, url=url, ready_s=ready_s, output=keep, pump=pump
        )
        if health_path is not None:
            _wait_healthy(server, health_path, deadline)
        return server
    except BaseException as exc:
        _stop_process(proc, 3.0)
        _LIVE.discard(proc)
        if isinstance(exc, ServerError):
            tail = "\n".join(keep)
            raise ServerError(f"{exc}\n--- last output ---\n{tail}") from None
        raise


def _wait_healthy(server: ServerProcess, path: str, deadline: float) -> None:
    last: str = "no answer"
    with httpx.Client(base_url=server.url, timeout=2.0, trust_env=False) as client:
        while time.perf_counter() < deadline:
            if not server.alive():
                raise ServerError(f"{server.name}: exited with {server.proc.returncode}")
            try:
                response = client.get(path)
                if response.status_code == 200:
                    return
                last = f"status {response.status_code}"
            except httpx.HTTPError as exc:
                last = repr(exc)
            time.sleep(0.05)
    raise ServerError(f"{server.name}: GET {path} not healthy in time ({last})")


@contextlib.contextmanager
def running(
    name: str,
    argv: Sequence[str],
    *,
    timeout: float = 60.0,
    health_path: str | None = "/health",
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Iterator[ServerProcess]:
    """`start_server` as a context manager: the server is stopped on the way out."""
    server = start_server(name, argv, timeout=timeout, health_path=health_path, env=env, cwd=cwd)
    try:
        yield server
    finally:
        server.stop()
