"""Verdicts about live sessions: what a WebSocket client did wrong across its sessions.

Pure: the hub's log of sessions (`SessionLog`, one per connection, in order, the newest
`MAX_LOGGED` kept) in, `Finding` out. Sessions are grouped by protocol and by the
``X-Chaosllm-Session`` header (None together), in the order they opened:

``reconnected_without_resumption``
    a session opened after an earlier one was offered a resumption handle, without
    resuming from any handle.
``no_reconnect_after_going_away``
    a session told it is going away (``goAway``; Realtime's ``session_expired``) after
    which no session opened.
``resent_after_done``
    a turn asked again (the same content) right after the same turn was answered in
    full (Realtime's ``response.done``; Live's ``turnComplete``), in the same session or
    the first turn of the next one.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

from chaosllm.core.verdict import Finding

__all__ = ["MAX_LOGGED", "SESSION_FINDINGS", "SessionLog", "session_findings"]

MAX_LOGGED = 1000
SESSION_FINDINGS = (
    "reconnected_without_resumption",
    "no_reconnect_after_going_away",
    "resent_after_done",
)


@dataclass
class SessionLog:
    n: int
    """The session's number since the server started (a finding's ``seqs``)."""
    protocol: str
    session: str | None
    offered: list[str] = field(default_factory=list)
    resumed: str | None = None
    went_away: bool = False
    turns: list[tuple[str, bool]] = field(default_factory=list)
    """Each turn's digest and whether its answer was delivered whole."""


def session_findings(logs: Iterable[SessionLog]) -> list[Finding]:
    groups: dict[tuple[str, str | None], list[SessionLog]] = {}
    for log in logs:
        groups.setdefault((log.protocol, log.session), []).append(log)
    found: list[Finding] = []
    for (_, session), run in groups.items():
        run.sort(key=lambda log: log.n)
        for before, after in itertools.pairwise(run):
            if before.offered and after.resumed is None:
                found.append(
                    Finding(
                        "reconnected_without_resumption",
                        (before.n, after.n),
                        f"session {after.n} opened without resuming from the handle session "
                        f"{before.n} was offered",
                        session,
                    )
                )
            if before.turns and after.turns and before.turns[-1] == (after.turns[0][0], True):
                found.append(
                    Finding(
                        "resent_after_done",
                        (before.n, after.n),
                        f"session {after.n} asked again the turn session {before.n} had been "
                        f"answered in full",
                        session,
                    )
                )
        for log in run:
            for (digest, done), (again, _) in itertools.pairwise(log.turns):
                if done and digest == again:
                    found.append(
                        Finding(
                            "resent_after_done",
                            (log.n,),
                            f"session {log.n} asked a turn again after its complete answer",
                            session,
                        )
                    )
                    break
        last = run[-1]
        if last.went_away:
            found.append(
                Finding(
                    "no_reconnect_after_going_away",
                    (last.n,),
                    f"session {last.n} was told it is going away and no session followed",
                    session,
                )
            )
    found.sort(key=lambda f: f.seqs)
    return found
