"""Drive the engine in memory, as h11's `ConnectionPair` drives a connection: request
bytes in, a decision out, no sockets, no event loop, a clock the test sets."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaosllm.config import Mode, ServerConfig
from chaosllm.core.clock import ManualClock
from chaosllm.core.engine import Decision, Engine, ProviderCall, Proxy, Reply
from chaosllm.faults import parse_fault_specs
from chaosllm.faults.board import ArmedFault
from chaosllm.paths import shipped_dir
from chaosllm.providers import PROVIDERS, provider_for_path
from chaosllm.store.recordings import RecordingStore

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
RESPONSES = "/v1/responses"


@dataclass
class Answer:
    """A `Reply` read the way a client would read its bytes."""

    reply: Reply

    @property
    def status(self) -> int:
        return self.reply.plan.status

    @property
    def headers(self) -> dict[str, str]:
        return dict(self.reply.plan.headers)

    @property
    def body(self) -> bytes:
        return self.reply.plan.body()

    def json(self) -> Any:
        return json.loads(self.body)

    def frames(self) -> list[str]:
        """The SSE frames of a streamed answer, each with its `data: ` prefix."""
        return [p.data.decode() for p in self.reply.plan.pieces if p.frame]

    @property
    def record(self) -> dict[str, Any]:
        return self.reply.entry.record.to_json()

    @property
    def error(self) -> dict[str, Any]:
        error: dict[str, Any] = self.json()["error"]
        return error


@dataclass
class EnginePair:
    """An engine over some recordings, and a client that calls it."""

    config: ServerConfig = field(default_factory=ServerConfig)
    clock: ManualClock = field(default_factory=ManualClock)
    engine: Engine = field(init=False)

    def __post_init__(self) -> None:
        store = RecordingStore.load(self.config.recordings)
        self.engine = Engine(self.config, store, clock=self.clock)

    @classmethod
    def proxying(cls, mode: Mode, tmp_path: Path, **config: Any) -> EnginePair:
        """An engine in a proxy `mode` with no recordings, an upstream nobody answers on
        and a record directory under `tmp_path` (its decisions are `Proxy`s)."""
        return cls(
            ServerConfig(
                recordings=[tmp_path / "none"],
                mode=mode,
                upstream="http://127.0.0.1:9",
                record_dir=tmp_path / "rec",
                **config,
            )
        )

    @classmethod
    def of(cls, *recordings: Path, **config: Any) -> EnginePair:
        dirs = list(recordings) or [shipped_dir("recordings")]
        return cls(ServerConfig(recordings=dirs, **config))

    def decide(
        self,
        body: Any,
        *,
        path: str = CHAT,
        session: str | None = None,
        raw: bytes | None = None,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> Decision:
        provider = provider_for_path(path) or PROVIDERS["openai.chat"]
        data = raw if raw is not None else json.dumps(body).encode()
        return self.engine.handle(
            ProviderCall(provider=provider, path=path, body=data, session=session, headers=headers)
        )

    def send(self, body: Any, **kwargs: Any) -> Answer:
        decision = self.decide(body, **kwargs)
        assert isinstance(decision, Reply), decision
        return Answer(decision)

    def proxy(self, body: Any, **kwargs: Any) -> Proxy:
        decision = self.decide(body, **kwargs)
        assert isinstance(decision, Proxy), decision
        return decision

    def arm(self, spec: Any) -> list[ArmedFault]:
        return self.engine.board.arm(parse_fault_specs(spec))

    def journal(self, session: str | None = None) -> list[dict[str, Any]]:
        return [e.to_json() for e in self.engine.journal.entries(session)]
