"""Everything a running server knows, shared by the app, the control plane and
`ChaosServer`."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from chaosllm.config import ServerConfig
from chaosllm.faults import FaultBoard
from chaosllm.journal import Journal
from chaosllm.matching import Matcher
from chaosllm.store import RecordingStore

__all__ = ["ChaosState"]

log = logging.getLogger("chaosllm")


@dataclass
class ChaosState:
    config: ServerConfig
    store: RecordingStore
    matcher: Matcher
    journal: Journal
    board: FaultBoard

    @classmethod
    def from_config(cls, config: ServerConfig) -> ChaosState:
        store = RecordingStore.load(config.recordings)
        for error in store.errors:
            log.warning("skipped recording %s", error)
        matcher = Matcher(store, order=config.match_order,
                          nearest_threshold=config.nearest_threshold)
        return cls(config=config, store=store, matcher=matcher, journal=Journal(),
                   board=FaultBoard(seed=config.seed))

    def reload(self) -> None:
        self.store.reload()
        for error in self.store.errors:
            log.warning("skipped recording %s", error)
        self.matcher.reloaded()

    def reset(self) -> None:
        """Disarm every fault, clear the journal and fault history, rewind sequences."""
        self.board.reset()
        self.journal.clear()
        self.matcher.reset()
