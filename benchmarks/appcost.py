"""The apps alone, in-process: microseconds per request with no server and no socket.

Each app (chaosllm's, the bare baseline) is called as an ASGI callable with a
ready-made scope, a ``receive`` that hands over the request body and a
``send`` that drops the messages. What is measured is the app's own CPU cost
per request -- routing, parsing, matching, rendering, the journal -- and,
for chaosllm, the same with 100 armed faults that never match, and the app behind
`chaosllm.http.direct.DirectFront` (what ``chaosllm serve --server uvicorn`` hands
uvicorn: a provider POST in replay mode is answered without Starlette). The best of
several repeats, in CPU time of the process, is kept, so a busy machine disturbs
these figures much less than the HTTP ones.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import workloads

__all__ = ["app_costs"]

Message = MutableMapping[str, Any]
App = Callable[
    [
        MutableMapping[str, Any],
        Callable[[], Awaitable[Message]],
        Callable[[Message], Awaitable[None]],
    ],
    Awaitable[None],
]


def _scope(body: bytes) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"x-chaosllm-session", b"bench"),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }


def _receiver(body: bytes) -> Callable[[], Awaitable[Message]]:
    """``receive`` for one request: the body, then nothing until cancelled (a client
    that stays connected), as a server would."""
    given = False

    async def receive() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    return receive


def _time_once(app: App, body: bytes, requests: int) -> float:
    scope = _scope(body)
    sent = [0]

    async def send(message: Message) -> None:
        sent[0] += len(message.get("body", b""))

    async def run() -> None:
        for _ in range(requests):
            await app(dict(scope), _receiver(body), send)

    gc.collect()
    # CPU time of this process, not wall time (as `hotpath`): on a shared machine the
    # time the process waits for a core is someone else's.
    start = time.process_time()
    asyncio.run(run())
    elapsed = (time.process_time() - start) / requests * 1e6
    if not sent[0]:
        raise RuntimeError("the app sent no body")
    return elapsed


def _answer(app: App, body: bytes) -> bytes:
    """The body `app` answers `body` with."""
    parts: list[bytes] = []

    async def send(message: Message) -> None:
        parts.append(message.get("body", b""))

    async def call() -> None:
        await app(_scope(body), _receiver(body), send)

    asyncio.run(call())
    return b"".join(parts)


def app_costs(
    payloads: workloads.Payloads, *, requests: int = 1000, repeats: int = 9
) -> dict[str, float]:
    """µs per request: ``chaosllm/json``, ``bare/json``, ``chaosllm/sse``, ``bare/sse``,
    ``chaosllm/json+100 faults (session)`` and ``(model)`` (the Starlette app), and
    ``front/json``, ``front/sse`` (`DirectFront` in front of it: what ``--server
    uvicorn`` runs for a provider POST). The bare app answers with chaosllm's bytes."""
    import bare_app

    from chaosllm.config import ServerConfig
    from chaosllm.faults import parse_fault_specs
    from chaosllm.http.app import create_app
    from chaosllm.http.direct import DirectFront
    from chaosllm.http.state import ChaosState

    def chaos_app(faults_by: str | None) -> tuple[App, ChaosState]:
        state = ChaosState.from_config(ServerConfig(recordings=[payloads.recordings]))
        if faults_by is not None:
            state.board.arm(
                parse_fault_specs(
                    [
                        {"type": "http_503", "match": {faults_by: f"other-{faults_by}-{i}"}}
                        for i in range(100)
                    ]
                )
            )
        return create_app(state=state), state

    chaos, state = chaos_app(None)
    # What `chaosllm serve --server uvicorn` hands uvicorn: the app behind DirectFront,
    # which answers a provider POST in replay mode without Starlette.
    front = DirectFront(chaos, state, ServerConfig().max_body_bytes)
    bodies = {p: payloads.request_file(p).read_bytes() for p in ("json", "sse")}
    sse = _answer(chaos, bodies["sse"])
    if workloads.count_frames(sse) != workloads.SSE_FRAMES:
        raise RuntimeError("chaosllm's in-process stream does not have 20 frames")
    bare = bare_app.create_app(
        _answer(chaos, bodies["json"]), [f + b"\n\n" for f in sse.split(b"\n\n") if f]
    )
    variants: dict[str, tuple[App, bytes, ChaosState | None]] = {
        "chaosllm/json": (chaos, bodies["json"], state),
        "bare/json": (bare, bodies["json"], None),
        "chaosllm/sse": (chaos, bodies["sse"], state),
        "bare/sse": (bare, bodies["sse"], None),
        "front/json": (front, bodies["json"], state),
        "front/sse": (front, bodies["sse"], state),
    }
    for by in ("session", "model"):
        app, faulted = chaos_app(by)
        variants[f"chaosllm/json+100 faults ({by})"] = (app, bodies["json"], faulted)
    # Round robin: every variant sees the same machine conditions in each repeat.
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(repeats):
        for label, (app, body, owner) in variants.items():
            if owner is not None:
                owner.journal.clear()
            best[label] = min(best[label], _time_once(app, body, requests))
    for _, _, owner in variants.values():
        if owner is not None and owner.board.history():
            raise RuntimeError("a non-matching fault fired")
    return {label: round(value, 1) for label, value in best.items()}
