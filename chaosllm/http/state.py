"""A running server: the engine (`chaosllm.core`) and the I/O it cannot do itself (the
upstream connection, the recording writer), shared by the app, the control plane and
`ChaosServer`."""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

from chaosllm.config import Mode, ServerConfig
from chaosllm.core import verdict as verdicts
from chaosllm.core.call import Decision, ProviderCall
from chaosllm.core.clock import Clock
from chaosllm.core.engine import Engine
from chaosllm.core.verdict import Finding, Tolerances
from chaosllm.errors import ConfigError
from chaosllm.http.access import AccessLog
from chaosllm.model import Exchange
from chaosllm.store.recordings import RecordingStore
from chaosllm.store.redact import Redactor
from chaosllm.store.writer import RecordingWriter

if TYPE_CHECKING:
    from chaosllm.record.proxy import Upstream

__all__ = ["ChaosState"]

log = logging.getLogger("chaosllm")


class ChaosState(Engine):
    """The engine plus the upstream (modes other than replay) and the writer of new
    recordings (record, record-missing)."""

    upstream: Upstream | None = None
    servers: dict[str, Upstream] | None = None
    """Named servers' own upstreams (``--mcp-upstream NAME=URL``), by name."""

    def upstream_for(self, call: ProviderCall) -> tuple[Upstream | None, str | None]:
        """The upstream of `call` and the path to send it (None: the call's path): a named
        server's own (its URL whole), else `upstream`."""
        params = call.provider.path_params(call.path) if call.provider.path_templates else None
        server = params.get("server") if params else None
        if server is not None and self.servers and server in self.servers:
            return self.servers[server], ""
        return self.upstream, None

    """The real provider, in modes other than replay."""
    writer: RecordingWriter | None = None
    """Writes new recordings, in modes record and record-missing."""
    access: AccessLog = AccessLog()
    """Where the access lines go (`chaosllm.http.access`): the ``chaosllm.access``
    logger unless ``chaosllm serve`` gives a buffer."""

    @classmethod
    def from_config(cls, config: ServerConfig, *, clock: Clock | None = None) -> ChaosState:
        """The state of a server (on `clock`, default the machine's); ValueError for a bad
        upstream URL."""
        redactor = Redactor(config.secrets)
        upstream = writer = None
        servers: dict[str, Upstream] | None = None
        if config.mode is not Mode.REPLAY:
            if not config.upstream and not config.mcp_upstreams:
                raise ConfigError(f"--mode {config.mode.value} needs an upstream URL")
            from chaosllm.record.proxy import Upstream  # a replaying server never needs it

            upstream = Upstream(config.upstream) if config.upstream else None
            servers = {name: Upstream(url) for name, url in config.mcp_upstreams.items()}
        if config.mode in (Mode.RECORD, Mode.RECORD_MISSING):
            if config.record_dir is None:
                raise ConfigError(f"--mode {config.mode.value} needs a directory to record to")
            writer = RecordingWriter(config.record_dir, redactor=redactor)
            writer.scenario_dir(config.record_scenario)  # UnsafePath (a ValueError) if bad
            _prepare_record_dir(config)
        store = RecordingStore.load(config.recordings)
        for error in store.errors:
            log.warning("skipped recording %s", error)
        state = cls(config, store, redactor=redactor, clock=clock)
        state.upstream = upstream
        state.writer = writer
        state.servers = servers
        return state

    def handle(self, call: ProviderCall, *, turn: int | None = None) -> Decision:
        """The engine's decision (`Engine.handle`), and the access log line for it when
        INFO is on: the one edge every server and the direct path go through."""
        access = self.access
        if not access.enabled:
            return super().handle(call, turn=turn)
        started = time.perf_counter()
        decision = super().handle(call, turn=turn)
        access.write(decision.entry.record, (time.perf_counter() - started) * 1000.0)
        return decision

    def findings(
        self, session: str | None, tolerances: Tolerances, *, settle: float = 0.0
    ) -> list[Finding]:
        """The findings about the client's behaviour (`GET /__verdict`,
        `ChaosServer.verdict`): its requests' (`chaosllm.core.verdict`) and its WebSocket
        sessions' (`chaosllm.core.live.verdict`), of one session or of all."""
        entries = self.journal.entries(session, settle=settle)
        found = verdicts.findings(entries, self.board.history(session), tolerances)
        hub = getattr(self, "_live_hub", None)
        if hub is not None:
            from chaosllm.core.live.verdict import session_findings

            logs = [log for log in hub.logs if session is None or log.session == session]
            found += session_findings(logs)
        return found

    def record(self, exchange: Exchange, session: str | None) -> Exchange:
        """Write a new recording (to the session's active scenario, else the configured
        one) and serve it from now on; the exchange as stored. Blocking: call it from a
        worker thread. OSError when the disk refuses."""
        assert self.writer is not None
        stored = self.writer.write(exchange, self.recording_scenario(session))
        self.learn(stored)
        log.info("recorded %s (%s)", stored.name, stored.source)
        return stored


def _prepare_record_dir(config: ServerConfig) -> None:
    assert config.record_dir is not None
    try:
        config.record_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.error(
            "cannot create the record directory %s: %s; answers will be proxied "
            "but not recorded until it can be written",
            config.record_dir,
            exc,
        )
        return
    if not os.access(config.record_dir, os.W_OK):
        log.error(
            "the record directory %s is not writable; answers will be proxied but "
            "not recorded until it is",
            config.record_dir,
        )
