"""Stored responses: background mode, polling, cancelling and resuming a stream (OpenAI
Responses), on the engine's clock. No I/O.

Theory of operation. A ``POST /v1/responses`` with ``background: true`` (or ``store:
true``) is matched and rendered as any request; the ``answered`` hook (`keep`) then
stores the whole answer it made -- every event with its sequence number and the moment
it is due, from the rendered plan's gaps (the recorded pace, ``--timing``), before any
fault cut it -- in `StoredResponses`, the engine's bounded store, and a background
create without a stream is answered at once with the response ``queued``. Operations on
a stored response (the ``openai.responses.stored`` provider: poll, resume, cancel) are
answered by the ``before_match`` hook (`operation`) from the store as an exchange made
on the spot, so that they take the remaining stages (faults fire on them, the journal
records them): its status as the engine's clock stands -- ``queued`` until its first
event is due, ``in_progress`` (with the output so far) until its last, then the
recorded status -- or its events after ``starting_after`` with their own sequence
numbers, those due already at once and the rest at their pace. An id the store does not
hold (and no recording answers) gets the API's 404 (`unknown`).

Faults on stored responses (``background_failed``, ``response_expired``,
``cancel_ignored``) have lasting effects, which the catalogue states as data
(`FaultType.stored_effect`) and `settle` applies to the store after they fire: a failed
response stays failed, an expired one is gone, an ignored cancel leaves the response
running.

Memo. Every answer that reads the store depends on the clock: it is never kept
(``request.keep = False``), and the store's own changes need no `StateVersion` bump --
no answer the memo may keep reads it.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from chaosllm.core.call import Answer, Chosen, Decision, Request
from chaosllm.core.clock import Clock, SystemClock
from chaosllm.core.hooks import Hooks
from chaosllm.core.oracle import Refusal
from chaosllm.model import (
    JSON,
    Exchange,
    Piece,
    RecordedChunk,
    RecordedRequest,
    RecordedResponse,
    ResponsePlan,
)
from chaosllm.providers import PROVIDERS
from chaosllm.providers.base import ErrorKind, Provider
from chaosllm.providers.openai_stored import (
    ANSWERS,
    CANCEL,
    RESUME,
    OpenAIStoredResponses,
    cursor_past_end,
    not_found,
    not_streamable,
)
from chaosllm.providers.sse import iter_events

if TYPE_CHECKING:
    from chaosllm.core.engine import Engine

__all__ = ["HOOKS", "MAX_STORED", "MAX_STORED_BYTES", "Event", "Stored", "StoredResponses"]

MAX_STORED: Final = 1024
"""The most responses kept at once (the oldest go first)."""
MAX_STORED_BYTES: Final = 64 << 20
"""The most bytes of events and bodies kept at once (64 MiB)."""
FAILED: Final = "failed"
EXPIRED: Final = "expired"
KEEP_RUNNING: Final = "keep_running"
"""The `FaultType.stored_effect` values."""

_WAITING = frozenset({"queued", "in_progress"})

_OPERATIONS = PROVIDERS["openai.responses.stored"]
assert isinstance(_OPERATIONS, OpenAIStoredResponses)
STORING: Mapping[str, OpenAIStoredResponses] = {ANSWERS: _OPERATIONS}
"""The providers whose answers are stored, and the provider of the operations on them."""


class Event(NamedTuple):
    seq: int
    frame: str
    """The frame as sent (``event: ...`` and ``data: ...``)."""
    due: float
    """Seconds after the create when it is sent (the rendered gaps, summed)."""


@dataclass(frozen=True, slots=True)
class Stored:
    """One stored response."""

    id: str
    created: float
    """The engine's monotonic clock at the create."""
    final: Mapping[str, Any]
    """The response as it ends (its recorded status)."""
    events: tuple[Event, ...]
    streamable: bool
    """Created with ``background`` and ``stream``: its events can be streamed again."""
    background: bool
    size: int
    cancelled: float | None = None
    """When it was cancelled (seconds after the create), if it was."""
    failed: Mapping[str, Any] | None = None
    """The response as a fault failed it, if one did."""

    @property
    def last_seq(self) -> int:
        return self.events[-1].seq if self.events else -1

    def elapsed(self, now: float) -> float:
        return max(0.0, now - self.created)

    def status_at(self, elapsed: float) -> str:
        if self.failed is not None:
            return str(self.failed.get("status"))
        if self.cancelled is not None:
            return "cancelled"
        if not self.background:
            return str(self.final.get("status") or "completed")
        first = self.events[0].due if self.events else 0.0
        last = self.events[-1].due if self.events else 0.0
        if elapsed <= 0.0 or elapsed < first:
            return "queued"
        if elapsed < last:
            return "in_progress"
        return str(self.final.get("status") or "completed")

    def due(self, elapsed: float) -> tuple[Event, ...]:
        """The events sent by `elapsed` (by the cancel, when it was cancelled)."""
        if self.cancelled is not None:
            elapsed = min(elapsed, self.cancelled)
        return tuple(e for e in self.events if e.due <= elapsed)


class StoredResponses:
    """The engine's stored responses by id, bounded by count and bytes (the oldest
    created go first). Thread-safe."""

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        max_entries: int = MAX_STORED,
        max_bytes: int = MAX_STORED_BYTES,
    ) -> None:
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def bytes(self) -> int:
        return self._bytes

    def get(self, response_id: str) -> Stored | None:
        return self._items.get(response_id)

    def put(self, stored: Stored) -> None:
        if stored.size > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(stored.id, None)
            if old is not None:
                self._bytes -= old.size
            self._items[stored.id] = stored
            self._bytes += stored.size
            while len(self._items) > self.max_entries or self._bytes > self.max_bytes:
                _, dropped = self._items.popitem(last=False)
                self._bytes -= dropped.size

    def update(self, stored: Stored) -> None:
        """`stored` changed (cancelled, failed), if it is still held."""
        with self._lock:
            if stored.id in self._items:
                self._items[stored.id] = stored

    def drop(self, response_id: str) -> None:
        with self._lock:
            old = self._items.pop(response_id, None)
            if old is not None:
                self._bytes -= old.size

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0


# -- the create ---------------------------------------------------------------------------


def _events(plan: ResponsePlan) -> tuple[Event, ...]:
    events: list[Event] = []
    due = 0.0
    for index, piece in enumerate(p for p in plan.pieces if p.frame):
        due += piece.delay_ms / 1000.0
        frame = piece.data.decode("utf-8", "replace")
        seq = index
        for _, data in iter_events([frame]):
            try:
                event = json.loads(data)
            except ValueError:
                continue
            if isinstance(event, dict) and isinstance(event.get("sequence_number"), int):
                seq = event["sequence_number"]
        events.append(Event(seq, frame, due))
    return tuple(events)


def _queued(final: Mapping[str, Any]) -> dict[str, Any]:
    queued = dict(final)
    queued.update(
        status="queued", output=[], usage=None, error=None, incomplete_details=None, background=True
    )
    if "completed_at" in queued:
        queued["completed_at"] = None
    return queued


def keep(engine: Engine, request: Request, answer: Answer) -> None:
    """The ``answered`` hook: a create that asks for it stored (a background create
    without a stream answered ``queued``); an operation's lasting effects (`settle`)."""
    if request.call.provider.faults.stored_operation(request.body) is not None:
        settle(engine, request, answer)
        return
    provider, body = request.call.provider, request.body
    if provider.name not in STORING or not isinstance(body, dict):
        return
    background = body.get("background") is True
    if not (background or body.get("store") is True) or answer.plan.status != 200:
        return
    request.keep = False  # each create stores a response of its own
    whole = answer.unfaulted if answer.unfaulted is not None else answer.plan
    if request.stream:
        events = _events(whole)
        final = provider.codec.assemble([e.frame for e in events])
    else:
        final = json.loads(whole.body())
        asked = {**body, "stream": True}
        events = _events(provider.render(answer.exchange, asked, timing=engine.config.timing))
    if not isinstance(final, dict) or not isinstance(final.get("id"), str):
        return
    if final.get("status") in _WAITING:
        return  # recorded from a real background create: its recorded polls answer it
    size = sum(len(e.frame) for e in events) + len(whole.body())
    stored = Stored(
        id=final["id"],
        created=engine.clock.monotonic(),
        final=final,
        events=events,
        streamable=background and request.stream,
        background=background,
        size=size,
    )
    engine.stored.put(stored)
    fields: dict[str, Any] = {"id": stored.id, "operation": "create"}
    if request.stream and events:
        fields.update(first=events[0].seq, last=stored.last_seq)
    request.fields["background"] = fields
    if background and not request.stream:
        data = json.dumps(_queued(final), ensure_ascii=False).encode("utf-8")
        answer.plan = answer.plan.with_(pieces=(Piece(data, frame=False),), content_length=None)


# -- operations on a stored response -----------------------------------------------------


def _exchange(
    request: Request, status: int, body: JSON, chunks: tuple[RecordedChunk, ...] | None = None
) -> Chosen:
    call = request.call
    exchange = Exchange(
        provider=call.provider.name,
        request=RecordedRequest(method=call.method, path=call.path, body=request.body),
        response=RecordedResponse(
            status=status, body=body, stream=chunks is not None, chunks=chunks
        ),
        digest=request.digest,
        name="(stored)",
        scenario="(stored)",
    )
    return Chosen(exchange, None, ())


def _error(request: Request, status: int, message: str, param: str | None = None) -> Chosen:
    provider = request.call.provider
    body = provider.error_body(status, message, kind=ErrorKind.INVALID_REQUEST, param=param)
    return _exchange(request, status, body)


def snapshot(provider: Provider, stored: Stored, elapsed: float) -> dict[str, Any]:
    """The response as a poll at `elapsed` sees it."""
    status = stored.status_at(elapsed)
    if stored.failed is not None:
        return dict(stored.failed)
    if status == "queued":
        return _queued(stored.final)
    if status == "in_progress" or status == "cancelled":
        frames = [e.frame for e in stored.due(elapsed)]
        sofar = provider.codec.assemble(frames) if frames else _queued(stored.final)
        if not isinstance(sofar, dict) or sofar.get("object") != "response":
            sofar = _queued(stored.final)
        return {**sofar, "status": status, "usage": None}
    return dict(stored.final)


def _resumed(
    stored: Stored, after: int | None, elapsed: float, timing: float
) -> tuple[RecordedChunk, ...]:
    """The events after `after`, as recorded chunks whose gaps (scaled by `timing` when
    rendered) send those due already at once and the rest when they are due."""
    chunks: list[RecordedChunk] = []
    waited = 0.0
    end = stored.cancelled if stored.cancelled is not None else None
    for event in stored.events:
        if after is not None and event.seq <= after:
            continue
        if end is not None and event.due > end:
            break
        wait = max(0.0, event.due - elapsed)
        gap, waited = max(0.0, wait - waited), max(wait, waited)
        chunks.append(RecordedChunk(event.frame, gap * 1000.0 / timing if timing > 0 else 0.0))
    return tuple(chunks)


def operation(engine: Engine, request: Request) -> Chosen | None:
    """The ``before_match`` hook: a poll, resume or cancel of a stored response answered
    from the store (None: not such an operation, or an id the store does not hold)."""
    provider, body = request.call.provider, request.body
    kind = provider.faults.stored_operation(body)
    if kind is None:
        return None
    response_id = str(body["response_id"])
    stored = engine.stored.get(response_id)
    if stored is None:
        return None
    request.keep = False  # the answer depends on the clock
    elapsed = stored.elapsed(engine.clock.monotonic())
    fields: dict[str, Any] = {"id": response_id, "operation": kind}
    request.fields["background"] = fields
    if kind == RESUME:
        after = body.get("starting_after")
        fields["after"] = after
        if not stored.streamable:
            return _error(request, 400, not_streamable(response_id), "stream")
        if after is not None and after > stored.last_seq:
            return _error(request, 400, cursor_past_end(after, stored.last_seq), "starting_after")
        chunks = _resumed(stored, after, elapsed, engine.config.timing)
        if stored.failed is not None:
            frame = provider.faults.stored_failure_frame(stored.failed, body)
            chunks = (RecordedChunk(frame.decode()),)
        if chunks:
            fields.update(first=_seq(chunks[0]), last=_seq(chunks[-1]))
        return _exchange(request, 200, snapshot(provider, stored, elapsed), chunks)
    if kind == CANCEL:
        if not stored.background:
            message = "Only responses created with background=true can be cancelled."
            return _error(request, 400, message)
        now = stored.status_at(elapsed)
        fields["status"] = now
        if now in ("queued", "in_progress"):
            cancelled = replace(stored, cancelled=elapsed)
            return _exchange(request, 200, snapshot(provider, cancelled, elapsed))
    fields["status"] = stored.status_at(elapsed)
    return _exchange(request, 200, snapshot(provider, stored, elapsed))


def _seq(chunk: RecordedChunk) -> int | None:
    for _, data in iter_events([chunk.data]):
        try:
            event = json.loads(data)
        except ValueError:
            return None
        seq = event.get("sequence_number") if isinstance(event, dict) else None
        return seq if isinstance(seq, int) else None
    return None


def settle(engine: Engine, request: Request, answer: Answer) -> None:
    """An operation's lasting effects on the store: a cancel cancels (unless a fault says
    it is ignored), a fault that fails or expires the response does so for good."""
    body = request.body
    stored = engine.stored.get(str(body.get("response_id")))
    if stored is None:
        return
    effect = answer.fired.spec.entry.stored_effect if answer.fired is not None else None
    elapsed = stored.elapsed(engine.clock.monotonic())
    if effect == EXPIRED:
        engine.stored.drop(stored.id)
    elif effect == FAILED:
        status = (answer.fired.spec.param("status") if answer.fired is not None else None) or FAILED
        failed = request.call.provider.faults.stored_failure(
            snapshot(request.call.provider, stored, elapsed), status
        )
        engine.stored.update(replace(stored, failed=failed))
    elif (
        body.get("operation") == CANCEL
        and effect != KEEP_RUNNING
        and stored.background
        and stored.status_at(elapsed) in ("queued", "in_progress")
        and answer.plan.status == 200
    ):
        engine.stored.update(replace(stored, cancelled=elapsed))


def unknown(engine: Engine, request: Request) -> Decision | None:
    """The ``on_miss`` hook: the API's 404 for an operation on an id neither the store
    nor a recording holds."""
    from chaosllm.core.stages import finish

    body = request.body
    if request.call.provider.faults.stored_operation(body) is None:
        return None
    response_id = str(body.get("response_id"))
    refusal = Refusal(
        status=404,
        message=not_found(response_id),
        kind=ErrorKind.INVALID_REQUEST,
        error="unknown response id",
    )
    return finish.refuse(engine, request, refusal)


HOOKS = Hooks(before_match=(operation,), on_miss=(unknown,), answered=(keep,))
"""The stored responses' hooks (`chaosllm.core.hooks.default_hooks` adds them)."""
