"""The recording / passthrough proxy: forward a provider request to the real upstream.

Theory of operation
-------------------
`ProxyCall` is the ASGI response of a proxied request. It sends the client's
request body bytes unchanged to the upstream (`Upstream`: keep-alive
connections per event loop through chaosllm's h11 client, or httpx when an
HTTP proxy must be used; see `chaosllm.record.client` for why), with the
client's headers minus hop-by-hop ones, ``Host`` and ``Content-Length``
(recomputed) and ``Accept-Encoding`` (set to ``identity``, so that the bytes
the recorder sees are the bytes the model wrote); credentials are forwarded
upstream and never stored. (The wire server reads a request body whole before
the app runs, so the request is streamed upstream from memory.)

Without an armed fault the answer streams through untouched: upstream's
status, headers (minus hop-by-hop ones) and raw body bytes go to the client
as they arrive. Meanwhile an SSE body is split into events at blank lines
(``\\n\\n``, ``\\r\\n\\r\\n``), each kept with its exact text and the gap before
it. At a clean end the exchange is assembled by the provider, redacted and
handed to the recorder (in a worker thread: the file is written and fsynced)
*before* the response is completed, so a client that repeats the request gets
the recording (``record-missing``). A recording that cannot be written is
logged as an error; the answer still reaches the client.

When a fault on the board may fire on the request, the answer is read whole
instead and turned into a `ResponsePlan` (the upstream's status, headers and
exact frames or body); the fault hook applies the fault to it as it does to a
replayed plan, and the wire executes the plan. What is recorded is always the
upstream's real answer, never the faulted one.

The environment's failures reach the client as they happened and nothing is
written: an upstream that cannot be reached gives a 502 (504 when it times
out) in the provider's error envelope naming the upstream; an upstream that
closes or resets the connection before answering gives an empty reply or a
reset; an upstream that drops the connection mid-answer gives the client the
same bytes and then a dropped connection (the response is aborted, so the
body is incomplete on the wire), and no recording: an incomplete exchange is
never written, so it can never be served as if it were an answer. A stream
that ends cleanly but without its terminator (``[DONE]``) is passed on as it
is and not recorded either. A client that goes away mid-answer cancels the
upstream request (its connection is closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import ssl
import time
import urllib.request
import weakref
import zlib
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import anyio.to_thread

from chaosllm.core.journal import JournalEntry, ending_of
from chaosllm.core.report import Outcome, PlanReport
from chaosllm.errors import ChaosLLMError, NotRecordable, PlanAborted, UpstreamTooLarge
from chaosllm.faults.live import LiveChoice, LiveEnd, LiveFault
from chaosllm.model import (
    JSON,
    Ending,
    Exchange,
    Framing,
    Piece,
    RecordedChunk,
    RecordedRequest,
    RecordedResponse,
    ResponsePlan,
)
from chaosllm.providers.base import ErrorKind, FrameSplitting, Provider
from chaosllm.providers.sse import FrameSplitter
from chaosllm.record.bounds import MAX_BODY, decode
from chaosllm.record.client import (
    ClosedBeforeAnswer,
    ConnectFailed,
    DroppedMidAnswer,
    H11Pool,
    ResetBeforeAnswer,
    Timeouts,
    UpstreamError,
    UpstreamTimeout,
    default_ssl_context,
)
from chaosllm.store.redact import Redactor, kept_response_headers
from chaosllm.wire.asgi import Receive, Scope, Send, send_plan

if TYPE_CHECKING:
    import httpx

__all__ = [
    "DEFAULT_TIMEOUTS",
    "HOP_BY_HOP",
    "Answer",
    "FrameSplitter",
    "NotRecordable",
    "ProxyCall",
    "Upstream",
    "recorded_exchange",
]

log = logging.getLogger("chaosllm")

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
_NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length", "accept-encoding", "expect"}
_FRAMING = frozenset({"content-length"})

DEFAULT_TIMEOUTS = Timeouts(connect=10.0, read=600.0, write=60.0)
"""Reads may wait long: a model can think for minutes before its first token."""

FaultHook = Callable[[ResponsePlan, JSON], ResponsePlan]
"""Applies the fault that fires (if any) to the plan of an upstream answer."""
Recorder = Callable[[Exchange], Exchange]
"""Writes an exchange and adds it to the live store; the exchange as stored."""


class Amend(Protocol):
    def __call__(self, **changes: Any) -> None: ...


# -- the upstream --------------------------------------------------------------------


class Answer(Protocol):
    """An upstream answer whose head has arrived (either transport)."""

    status: int
    headers: list[tuple[bytes, bytes]]

    finished: bool
    """The whole body has been read (set before `aiter_raw` yields its last bytes)."""

    def header(self, name: str) -> str | None: ...

    def available(self) -> tuple[bytes, bool]:
        """The body bytes already received, without waiting, and whether that is all of
        it (then `aiter_raw` yields nothing more)."""

    def aiter_raw(self) -> AsyncIterator[bytes]:
        """The body as it arrives; `DroppedMidAnswer` if it stops before its end."""

    async def aclose(self) -> None: ...


class Upstream:
    """The real provider: its base URL and the connections that talk to it.

    `transport` ``auto`` uses chaosllm's own h11 client (`chaosllm.record.client`), or
    httpx when the environment routes the upstream through an HTTP proxy
    (``HTTPS_PROXY``, ``HTTP_PROXY``, ``ALL_PROXY`` and ``NO_PROXY``)."""

    def __init__(
        self, url: str, *, timeouts: Timeouts = DEFAULT_TIMEOUTS, transport: str = "auto"
    ) -> None:
        import httpx  # only the record modes need it: imported on use

        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, TypeError) as exc:
            raise ValueError(f"invalid upstream URL {url!r}: {exc}") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(
                f"invalid upstream URL {url!r}: expected http(s)://HOST[:PORT]"
                f"[/PATH], e.g. https://api.openai.com"
            )
        if transport not in ("auto", "h11", "httpx"):
            raise ValueError(f"invalid transport {transport!r}: auto, h11 or httpx")
        self.url = url
        self._parsed = parsed
        self._prefix = parsed.path.rstrip("/")
        self._netloc = parsed.netloc
        self.display = f"{parsed.scheme}://{parsed.netloc.decode('ascii')}{self._prefix}"
        """The URL without credentials or query: what messages and recordings name."""
        self.timeouts = timeouts
        if transport == "auto":
            transport = "httpx" if _proxied(parsed.scheme, parsed.host) else "h11"
        self.transport = transport
        self._ssl: ssl.SSLContext | None = None
        self._pools: weakref.WeakKeyDictionary[Any, H11Pool] = weakref.WeakKeyDictionary()
        self._clients: weakref.WeakKeyDictionary[Any, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )

    def target(self, path: str, query: bytes = b"") -> bytes:
        """The upstream request target of a request path (an upstream given as
        ``.../v1`` is not doubled: ``/v1/chat/completions`` goes to
        ``.../v1/chat/completions``; an MCP server's whole URL given as a bare
        ``http://host:port`` is its root, ``/``)."""
        if self._prefix.endswith("/v1") and (path == "/v1" or path.startswith("/v1/")):
            path = path[3:]
        raw = (self._prefix + path).encode("utf-8") or b"/"  # a bare host's root
        return raw + b"?" + query if query else raw

    async def send(
        self,
        method: str,
        path: str,
        query: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
    ) -> Answer:
        """Send a request; its answer once the head has arrived. Raises the
        `chaosllm.record.client.UpstreamError` subclass that says how it failed."""
        target = self.target(path, query)
        forwarded = forwarded_headers(headers)
        if self.transport == "httpx":
            return await self._send_httpx(method, target, forwarded, body)
        loop = _running_loop()
        pool = self._pools.get(loop)
        if pool is None or pool.closed:
            if self._parsed.scheme == "https" and self._ssl is None:
                self._ssl = default_ssl_context()
            pool = self._pools[loop] = H11Pool(
                self._parsed.scheme,
                self._parsed.host,
                self._parsed.port or (443 if self._parsed.scheme == "https" else 80),
                timeouts=self.timeouts,
                ssl_context=self._ssl,
            )
        return await pool.send(method, target, [(b"host", self._netloc), *forwarded], body)

    async def _send_httpx(
        self, method: str, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> Answer:
        import httpx  # only the record modes need it: imported on use

        loop = _running_loop()
        client = self._clients.get(loop)
        if client is None or client.is_closed:
            t = self.timeouts
            client = self._clients[loop] = httpx.AsyncClient(
                timeout=httpx.Timeout(
                    connect=t.connect, read=t.read, write=t.write, pool=t.connect
                ),
                follow_redirects=False,
                trust_env=True,
            )
        request = client.build_request(
            method, self._parsed.copy_with(raw_path=target), headers=headers, content=body
        )
        try:
            response = await client.send(request, stream=True)
        except (httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise UpstreamTimeout(_reason(exc)) from None
        except (httpx.ConnectError, httpx.UnsupportedProtocol, httpx.ProxyError) as exc:
            raise ConnectFailed(_reason(exc)) from None
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout(_reason(exc)) from None
        except httpx.ReadError as exc:
            raise ResetBeforeAnswer(_reason(exc)) from None
        except httpx.TransportError as exc:
            raise ClosedBeforeAnswer(_reason(exc)) from None
        return _HttpxAnswer(response)

    async def aclose(self) -> None:
        """Close the connections of the running event loop (server shutdown)."""
        loop = _running_loop()
        pool = self._pools.pop(loop, None)
        if pool is not None:
            await pool.aclose()
        client = self._clients.pop(loop, None)
        if client is not None:
            await client.aclose()


class _HttpxAnswer:
    """An httpx response as an `Answer`."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status = response.status_code
        self.headers = list(response.headers.raw)
        self.finished = False

    def available(self) -> tuple[bytes, bool]:
        return b"", False

    def header(self, name: str) -> str | None:
        value: str | None = self._response.headers.get(name)
        return value

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        import httpx  # only the record modes need it: imported on use

        try:
            async for chunk in self._response.aiter_raw():
                yield chunk
        except httpx.TransportError as exc:
            raise DroppedMidAnswer(_reason(exc)) from None

    async def aclose(self) -> None:
        await self._response.aclose()


def _proxied(scheme: str, host: str) -> bool:
    """Whether the environment sends requests for this upstream through a proxy."""
    proxies = urllib.request.getproxies()
    if not (proxies.get(scheme) or proxies.get("all")):
        return False
    return not urllib.request.proxy_bypass(host)


def _running_loop() -> Any:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # pragma: no cover - not under asyncio (trio): one slot
        return _running_loop


def forwarded_headers(headers: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The client's request headers as sent upstream."""
    out = [
        (name, value)
        for name, value in headers
        if (lowered := name.decode("latin-1").lower()) not in _NOT_FORWARDED
        and not lowered.startswith("x-chaosllm-")
    ]
    out.append((b"accept-encoding", b"identity"))
    return out


def _identity(response: Answer) -> bool:
    """Whether the answer's body has no content coding."""
    encoding = (response.header("content-encoding") or "identity").strip().lower()
    return encoding in ("", "identity")


def _is_stream(provider: Provider, response: Answer) -> bool:
    """Whether the upstream answered with the protocol's stream of frames."""
    return provider.codec.is_stream(response.header("content-type") or "")


def _text(provider: Provider, data: bytes) -> str:
    """A frame's text, as well as it can be read (for the checks that inspect a frame)."""
    try:
        return provider.codec.frame_text(data)
    except ValueError:
        return data.decode("utf-8", "replace")


# -- what is recorded ----------------------------------------------------------------


def recorded_exchange(
    provider: Provider,
    *,
    method: str,
    path: str,
    body: JSON,
    status: int,
    headers: Sequence[tuple[str, str]],
    frames: Sequence[tuple[bytes, float]] | None,
    content: bytes | None,
    upstream: str,
    redactor: Redactor,
) -> Exchange:
    """The exchange to record from an upstream answer that completed (`frames` for an SSE
    body, else `content`); `NotRecordable` says why one is not recorded. `body` is the
    request body, already redacted."""
    chunks: tuple[RecordedChunk, ...] | None = None
    if frames is not None:
        try:
            texts = [provider.codec.frame_text(data) for data, _ in frames]
        except ValueError as exc:
            raise NotRecordable(f"the stream's frames cannot be read: {exc}") from None
        if not provider.codec.stream_complete(texts):
            raise NotRecordable(
                "the stream ended without its terminator ([DONE] or an error "
                "event): an incomplete answer is never recorded"
            )
        chunks = tuple(
            RecordedChunk(redactor.text(text), round(delay, 3))
            for text, (_, delay) in zip(texts, frames, strict=True)
        )
        try:
            answer = redactor.body(provider.assemble(texts))
            if provider.assemble([c.data for c in chunks]) != answer:
                # A secret spans frames (a model streams a key a few characters at a
                # time): no frame shows it whole, so only the redacted answer is kept,
                # and replay renders frames from it.
                chunks = None
        except (ValueError, TypeError, AttributeError) as exc:
            raise NotRecordable(f"the stream cannot be assembled: {exc}") from None
        stream = True
    else:
        stream = False
        try:
            answer = redactor.body(json.loads(content or b""))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise NotRecordable(
                f"the upstream's {status} answer is not JSON (not an answer of the model's)"
            ) from None
    return Exchange(
        provider=provider.name,
        request=RecordedRequest(method=method, path=path, body=body),
        response=RecordedResponse(
            status=status,
            body=answer,
            stream=stream,
            chunks=chunks,
            headers=kept_response_headers(headers),
        ),
        digest=provider.digest(body),
        name="(unsaved)",
        scenario="(unsaved)",
        meta={
            "recorded_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "upstream": upstream,
        },
    )


# -- the proxied response ------------------------------------------------------------


class _End(enum.Enum):
    COMPLETE = "complete"
    ABORT = "abort"


@dataclass
class _Call:
    gone: bool = False
    end: _End | None = None
    plan: ResponsePlan | None = None
    error: Exception | None = None
    ending: str | None = None
    """How a live fault ended the answer (the journal's ``ending``), once it did."""
    finishing: bool = False
    """The last message is being sent: a disconnect from now on is the normal end."""
    handed_off: bool = False
    """The upstream answer was handed to a drain (`_drain`): it closes it, and the
    request is settled (`PlanReport.outcome`) once both it and the response are done."""
    pending: int = 1
    """What must end before the request is settled: the response (and the drain)."""

    def settle(self, report: PlanReport) -> None:
        self.pending -= 1
        if self.pending <= 0 and report.outcome is None:
            report.outcome = Outcome.COMPLETE


@dataclass
class ProxyCall:
    """The ASGI response of a request answered by the upstream (see the module doc)."""

    upstream: Upstream
    provider: Provider
    method: str
    path: str
    query: bytes
    headers: Sequence[tuple[bytes, bytes]]
    """The client's request headers (raw)."""
    content: bytes
    """The client's request body, forwarded unchanged."""
    body: JSON
    """The request body as recorded (redacted); None when it is not a JSON object."""
    entry: JournalEntry
    amend: Amend
    """Writes what the answer says (status, error) into `entry` (`Engine.amend`)."""
    redactor: Redactor
    fault_hook: FaultHook | None = None
    """Set when an armed fault may fire on this request."""
    live_hook: Callable[[], LiveChoice] | None = None
    """Set with `fault_hook`: at the head of a live stream, which fault applies to its
    frames as they arrive (`chaosllm.core.engine.Engine.fault_live`)."""
    recorder: Recorder | None = None
    """Set when the answer is to be recorded."""
    timing: float = 0.0
    """How recorded gaps scale in a faulted plan (as in replay)."""
    extra_headers: tuple[tuple[str, str], ...] = ()
    """chaosllm's headers on the answer (each replaces the upstream's of its name)."""
    target: str | None = None
    """The path sent upstream, when not the provider's for `path` (a named server's URL)."""
    answer_head: Callable[[Sequence[tuple[bytes, bytes]]], None] | None = None
    """Sees the upstream's answer head once it arrives (record-missing learns the MCP
    upstream's session id from it)."""
    _raw_extra: list[tuple[bytes, bytes]] = field(default_factory=list, init=False)

    @property
    def status_code(self) -> int:
        status = self.entry.status
        return status if status is not None else 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._raw_extra = [
            (k.encode("latin-1"), v.encode("latin-1")) for k, v in self.extra_headers
        ]
        call = _Call()
        async with anyio.create_task_group() as tg:
            tg.start_soon(_watch_disconnect, receive, call, tg.cancel_scope)
            try:
                await self._exchange(send, call)
            except OSError:
                # ASGI >= 2.4 servers raise OSError from send() once the client is gone.
                call.gone = True
            except Exception as exc:  # re-raised below, outside the task group
                call.error = exc
            finally:
                tg.cancel_scope.cancel()
        if call.error is not None:
            raise call.error
        report = self.entry.report
        if call.gone:
            self.amend(
                error=(
                    self.entry.error or "the client went away: the upstream request was cancelled"
                )
            )
            # Nothing more can reach the client; end the ASGI response for the server's sake.
            with contextlib.suppress(OSError, RuntimeError):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            report.outcome = Outcome.CLIENT_GONE
            return
        if call.plan is not None:
            self.amend(ending=ending_of(call.plan))
            await send_plan(scope, receive, send, call.plan, report)
            return
        if call.ending is None:
            self.amend(ending="closed" if call.end is _End.ABORT else "complete")
        call.settle(report)
        if call.end is _End.ABORT:
            raise PlanAborted(
                "chaosllm: the upstream dropped the connection mid-answer; "
                "dropping the client's the same way"
            )

    # -- phases -------------------------------------------------------------------

    async def _exchange(self, send: Send, call: _Call) -> None:
        try:
            response = await self.upstream.send(
                self.method,
                self.provider.upstream_path(self.path) if self.target is None else self.target,
                self.query,
                self.headers,
                self.content,
            )
        except UpstreamError as exc:
            call.plan = self._failure_plan(exc)
            return
        if self.answer_head is not None:
            self.answer_head(response.headers)
        try:
            self.amend(status=response.status)
            if self.fault_hook is None:
                await self._pass_on(response, send, call)
                return
            fault: LiveFault | None = None
            buffered: FaultHook | None = self.fault_hook
            if self.live_hook is not None and self._live_stream(response):
                choice = self.live_hook()
                fault, buffered = choice.fault, choice.buffered
            if fault is not None:
                call.end = await self._live(response, send, call, fault)
            elif buffered is not None:
                call.plan = await self._buffered(response, buffered)
            else:  # no armed fault fires on it
                await self._pass_on(response, send, call)
        finally:
            if not call.handed_off:
                with anyio.CancelScope(shield=True):
                    await response.aclose()

    def _failure_plan(self, exc: UpstreamError) -> ResponsePlan:
        """What the client gets when the upstream gives no answer at all."""
        where = self.upstream.display
        reason = _reason(exc)
        entry = self.entry
        if isinstance(exc, UpstreamTooLarge):
            status, code = 502, "upstream_too_large"
            message = (
                f"The upstream {where} answered with more than chaosllm reads: "
                f"{exc}. Nothing was recorded."
            )
        elif isinstance(exc, ConnectFailed):
            status, code = 502, "upstream_unreachable"
            message = (
                f"chaosllm could not reach the upstream {where}: {reason}. Nothing was "
                f"recorded. Check --upstream and that the provider is reachable."
            )
        elif isinstance(exc, UpstreamTimeout):
            status, code = 504, "upstream_timeout"
            message = (
                f"The upstream {where} did not answer in time: {reason}. Nothing was recorded."
            )
        else:
            # It accepted the request, then closed or reset the connection without an
            # answer: the client sees the same (an empty reply, or a reset).
            reset = isinstance(exc, ResetBeforeAnswer)
            self.amend(
                status=None,
                error=(
                    f"the upstream {where} {'reset' if reset else 'closed'} the "
                    f"connection without answering ({reason}); nothing recorded"
                ),
            )
            log.warning("%s", entry.error)
            return ResponsePlan(
                status=200,
                headers=(),
                pieces=(),
                send_head=False,
                ending=Ending.RESET if reset else Ending.CLOSE,
            )
        log.warning("%s", message)
        self.amend(status=status, error=message)
        plan = self.provider.render_error(status, message, kind=ErrorKind.SERVER_ERROR, code=code)
        return plan.with_(headers=plan.headers + self.extra_headers)

    def _client_head(
        self, response: Answer, *, drop: frozenset[str] = frozenset()
    ) -> list[tuple[bytes, bytes]]:
        ours = {name.lower() for name, _ in self.extra_headers}
        return [
            (name, value)
            for name, value in response.headers
            if (lowered := name.decode("latin-1").lower()) not in HOP_BY_HOP
            and lowered not in drop
            and lowered not in ours
        ] + self._raw_extra

    def _dropped(self, exc: DroppedMidAnswer, then: str) -> None:
        """Note in the journal (and log) that the upstream dropped the connection
        mid-answer; `then`: what became of the answer."""
        self.amend(
            error=(
                f"the upstream {self.upstream.display} dropped the connection "
                f"mid-answer ({_reason(exc)}); {then}"
            )
        )
        log.warning("%s", self.entry.error)

    async def _pass_on(self, response: Answer, send: Send, call: _Call) -> None:
        """Pass the answer on as it comes (`_stream`), or, when a content-encoded one is
        to be recorded, read it whole and decode it first (`_encoded`)."""
        if self.recorder is not None and not _identity(response):
            call.plan = await self._encoded(response)
        else:
            call.end = await self._stream(response, send, call)

    async def _encoded(self, response: Answer) -> ResponsePlan:
        """A content-encoded answer to record: read whole (at most `MAX_BODY` bytes),
        decoded in a worker thread within `chaosllm.record.bounds`; past a bound a 502
        naming it, nothing recorded; else passed on as it came."""
        headers = tuple(
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in self._client_head(response, drop=_FRAMING)
        )
        encoding = response.header("content-encoding") or "identity"
        try:
            content, dropped = await self._whole(response)
        except UpstreamTooLarge as exc:
            return self._failure_plan(exc)
        if dropped is not None:
            self._dropped(dropped, "nothing recorded")
            return ResponsePlan(
                response.status, headers, (Piece(content, frame=False),), ending=Ending.CLOSE
            )
        try:
            data = await anyio.to_thread.run_sync(decode, content, encoding)
        except UpstreamTooLarge as exc:
            return self._failure_plan(exc)
        except (NotRecordable, zlib.error) as exc:
            self._not_recorded(str(exc))
        else:
            frames = (
                self.provider.codec.split_frames(data)
                if _is_stream(self.provider, response)
                else None
            )
            await self._record(response, frames, data)
        return ResponsePlan(response.status, headers, (Piece(content, frame=False),))

    async def _whole(self, response: Answer) -> tuple[bytes, DroppedMidAnswer | None]:
        """The body read whole (`UpstreamTooLarge` past `MAX_BODY` bytes), and how it
        stopped short if it did."""
        body, complete = response.available()
        if complete:
            return body, None
        parts, size = [body], len(body)
        try:
            async for chunk in response.aiter_raw():
                size += len(chunk)
                if size > MAX_BODY:
                    raise UpstreamTooLarge(f"a body over {MAX_BODY} bytes")
                parts.append(chunk)
        except DroppedMidAnswer as exc:
            return b"".join(parts), exc
        return b"".join(parts), None

    def _not_recorded(self, why: str) -> None:
        self.amend(error=f"not recorded: {why}")
        log.warning("%s %s: %s", self.method, self.path, self.entry.error)

    async def _stream(self, response: Answer, send: Send, call: _Call) -> _End:
        """Pass the answer through as it arrives; record it at a clean end.

        When recording, the end of the answer (an SSE stream's terminator frame, or a
        JSON body's last bytes) is held back until the recording is written: a client
        stops reading at ``[DONE]``, and the same request sent again at once must find
        the recording (record-missing)."""
        report = self.entry.report
        recording = self.recorder is not None
        encoding = response.header("content-encoding") or "identity"
        identity = encoding.strip().lower() in ("", "identity")
        splitter = (
            self.provider.codec.frame_splitter(time.monotonic(), keep=recording)
            if _is_stream(self.provider, response) and identity
            else None
        )
        parts: list[bytes] | None = [] if recording and splitter is None else None
        body, complete = response.available()
        if complete:
            # The whole answer came with its head: one message with a Content-Length
            # (transfer coding is hop-by-hop; the body bytes are the same), one write.
            if splitter is not None:
                report.frames_sent += splitter.feed(body, time.monotonic())
                splitter.finish()
            elif parts is not None:
                parts.append(body)
            if recording:
                await self._record_stream(response, splitter, parts)
            head = self._client_head(response, drop=_FRAMING)
            head.append((b"content-length", b"%d" % len(body)))
            await send({"type": "http.response.start", "status": response.status, "headers": head})
            call.finishing = True
            await send({"type": "http.response.body", "body": body, "more_body": False})
            report.head_sent = True
            report.bytes_sent += len(body)
            return _End.COMPLETE
        await send(
            {
                "type": "http.response.start",
                "status": response.status,
                "headers": self._client_head(response),
            }
        )
        report.head_sent = True
        held = b""
        holding = False
        size = 0
        try:
            async for chunk in response.aiter_raw():
                size += len(chunk)
                if recording and size > MAX_BODY:
                    # Too long to record: passed on, no longer kept.
                    recording = holding = False
                    self._not_recorded(f"the answer is over {MAX_BODY} bytes")
                    parts = None
                    if splitter is not None:
                        splitter.keep = False
                        splitter.frames.clear()
                    if held:
                        await send({"type": "http.response.body", "body": held, "more_body": True})
                        report.bytes_sent += len(held)
                        held = b""
                if splitter is not None:
                    completed = splitter.feed(chunk, time.monotonic())
                    report.frames_sent += completed
                    if recording and not holding and completed:
                        last = _text(self.provider, splitter.frames[-1][0])
                        holding = self.provider.codec.stream_complete([last])
                elif parts is not None:
                    parts.append(chunk)
                    # Not a stream: each piece waits for the next, the last for the recording.
                    chunk, held = held, chunk
                if holding:
                    held += chunk
                    continue
                if response.finished and not recording:
                    # The last bytes: they end the message in the same write.
                    call.finishing = True
                    await send({"type": "http.response.body", "body": chunk, "more_body": False})
                    report.bytes_sent += len(chunk)
                    return _End.COMPLETE
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    report.bytes_sent += len(chunk)
        except DroppedMidAnswer as exc:
            self._dropped(exc, _DROPPED_TOO)
            if held:
                await send({"type": "http.response.body", "body": held, "more_body": True})
                report.bytes_sent += len(held)
            return _End.ABORT
        if splitter is not None:
            splitter.finish()
        if recording:
            await self._record_stream(response, splitter, parts)
        call.finishing = True
        await send({"type": "http.response.body", "body": held, "more_body": False})
        report.bytes_sent += len(held)
        return _End.COMPLETE

    # -- a live stream's fault, frame by frame (`chaosllm.faults.live`) ---------------

    def _live_stream(self, response: Answer) -> bool:
        """Whether a fault can apply to the answer frame by frame as it arrives: a 200
        stream of frames, not content-encoded, to a request that asked for a stream."""
        encoding = (response.header("content-encoding") or "identity").strip().lower()
        return (
            response.status == 200
            and encoding in ("", "identity")
            and _is_stream(self.provider, response)
            and self.provider.wants_stream(self.body)
        )

    async def _live(self, response: Answer, send: Send, call: _Call, fault: LiveFault) -> _End:
        """Pass the stream to the client through `fault` as its frames arrive; record the
        upstream's own answer (the module doc)."""
        report = self.entry.report
        splitter = self.provider.codec.frame_splitter(time.monotonic())
        head = self._client_head(response, drop=_FRAMING)
        await send({"type": "http.response.start", "status": response.status, "headers": head})
        report.head_sent = True
        body, complete = response.available()
        chunks: AsyncIterator[bytes] = _once(body) if complete else response.aiter_raw()
        fed = size = 0
        recording = self.recorder is not None
        try:
            async for chunk in chunks:
                size += len(chunk)
                if recording and size > MAX_BODY:
                    recording = False
                    self._not_recorded(f"the answer is over {MAX_BODY} bytes")
                done = splitter.feed(chunk, time.monotonic())
                for data, _ in splitter.frames[fed : fed + done]:
                    fed += 1
                    step = fault.feed(data)
                    await self._write(send, step.write)
                    if step.end is not None:
                        # The client's answer ends here; the upstream's goes on, to be
                        # recorded whole (bounded: `_drain`).
                        if recording:
                            drain = self._drain(response, chunks, splitter, call)
                            call.handed_off = _spawn(drain)
                            call.pending += call.handed_off
                        return await self._end_live(send, call, step.end)
                if not recording and fed > 1:
                    # Frames passed on are not kept (the last one: bytes may join it).
                    del splitter.frames[: fed - 1]
                    fed = 1
        except DroppedMidAnswer as exc:
            self._dropped(exc, _DROPPED_TOO)
            return _End.ABORT
        last = len(splitter.frames[-1][0]) if splitter.frames else 0
        splitter.finish()
        end: LiveEnd | None = None
        if len(splitter.frames) > fed:  # the stream's only bytes, with no blank line
            step = fault.feed(splitter.frames[fed][0])
            await self._write(send, step.write)
            end = step.end
        elif splitter.frames and len(splitter.frames[-1][0]) > last:
            # Bytes after the last blank line: they join the last frame, passed on as such.
            await self._write(send, (Piece(splitter.frames[-1][0][last:], frame=False),))
        if recording:
            await self._record_stream(response, splitter, None)
        return await self._end_live(send, call, end if end is not None else fault.finish())

    async def _write(self, send: Send, pieces: Sequence[Piece]) -> None:
        report = self.entry.report
        for piece in pieces:
            if piece.data:
                await send({"type": "http.response.body", "body": piece.data, "more_body": True})
                report.bytes_sent += len(piece.data)
            if piece.frame:
                report.frames_sent += 1

    async def _end_live(self, send: Send, call: _Call, end: LiveEnd) -> _End:
        """End the client's answer as the live fault says."""
        report = self.entry.report
        await self._write(send, end.pieces)
        shape = ResponsePlan(200, (), end.pieces, framing=Framing.CHUNKED, ending=end.ending)
        call.ending = ending_of(shape)
        self.amend(ending=call.ending, frames=report.frames_sent)
        if end.ending is Ending.COMPLETE:
            call.finishing = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return _End.COMPLETE
        if end.ending is Ending.STALL and end.stall_ms > 0:
            await anyio.sleep(end.stall_ms / 1000)  # ends early when the client leaves
        call.settle(report)
        aborted = PlanAborted(f"chaosllm: a live stream's fault ends it ({end.ending.value})")
        aborted.reset = end.ending is Ending.RESET
        raise aborted

    async def _drain(
        self, response: Answer, chunks: AsyncIterator[bytes], splitter: FrameSplitting, call: _Call
    ) -> None:
        """After a fault ended the client's stream: read the rest of the upstream's, and
        record it when it ends cleanly within `DRAIN_SECONDS` and `DRAIN_BYTES`."""
        why = None
        try:
            with anyio.move_on_after(DRAIN_SECONDS) as scope:
                size = 0
                async for chunk in chunks:
                    size += len(chunk)
                    if size > DRAIN_BYTES:
                        why = f"the rest of the upstream's answer is over {DRAIN_BYTES} bytes"
                        break
                    splitter.feed(chunk, time.monotonic())
            if scope.cancelled_caught:
                why = f"the upstream's answer did not end within {DRAIN_SECONDS:g} s"
            if why is None:
                splitter.finish()
                await self._record_stream(response, splitter, None)
        except DroppedMidAnswer as exc:
            why = f"the upstream dropped the connection mid-answer ({_reason(exc)})"
        finally:
            with anyio.CancelScope(shield=True):
                await response.aclose()
        if why is not None:
            self.amend(error=f"not recorded: {why}, after a fault ended the client's stream")
            log.warning("%s %s: %s", self.method, self.path, self.entry.error)
        call.settle(self.entry.report)

    async def _record_stream(
        self,
        response: Answer,
        splitter: FrameSplitting | None,
        parts: list[bytes] | None,
    ) -> None:
        """Record an identity answer: its frames, or its body from `parts`."""
        if splitter is not None:
            if splitter.overflow is not None:
                self._not_recorded(f"the stream holds {splitter.overflow}")
                return
            await self._record(response, splitter.frames, None)
            return
        data = b"".join(parts or ())
        await self._record(
            response,
            self.provider.codec.split_frames(data) if _is_stream(self.provider, response) else None,
            data,
        )

    async def _buffered(self, response: Answer, fault_hook: FaultHook) -> ResponsePlan:
        """Read the whole answer into a plan; apply the fault that fires to it."""
        encoding = response.header("content-encoding") or "identity"
        identity = encoding.strip().lower() in ("", "identity")
        splitter = (
            self.provider.codec.frame_splitter(time.monotonic())
            if _is_stream(self.provider, response) and identity
            else None
        )
        parts: list[bytes] = []
        headers = tuple(
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in self._client_head(response, drop=_FRAMING)
        )
        status = response.status
        size = 0
        try:
            async for chunk in response.aiter_raw():
                size += len(chunk)
                if size > MAX_BODY:
                    return self._failure_plan(UpstreamTooLarge(f"a body over {MAX_BODY} bytes"))
                if splitter is not None:
                    splitter.feed(chunk, time.monotonic())
                else:
                    parts.append(chunk)
        except DroppedMidAnswer as exc:
            self._dropped(exc, "nothing recorded, no fault applied")
            if splitter is not None:
                return ResponsePlan(
                    status=status,
                    headers=headers,
                    pieces=tuple(Piece(d) for d, _ in splitter.frames),
                    framing=Framing.CHUNKED,
                    ending=Ending.CLOSE,
                )
            declared = response.header("content-length")
            return ResponsePlan(
                status=status,
                headers=headers,
                pieces=(Piece(b"".join(parts), frame=False),),
                content_length=int(declared) if declared and declared.isdigit() else None,
                ending=Ending.CLOSE,
            )
        answer: JSON = None
        if splitter is not None:
            splitter.finish()
            frames: list[tuple[bytes, float]] | None = splitter.frames
            content = None
            plan = ResponsePlan(
                status=status,
                headers=headers,
                pieces=tuple(Piece(d, delay * self.timing) for d, delay in splitter.frames),
                framing=Framing.CHUNKED,
            )
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                answer = self.provider.assemble(
                    [_text(self.provider, d) for d, _ in splitter.frames]
                )
        else:
            frames = None
            content = b"".join(parts)
            plan = ResponsePlan(
                status=status, headers=headers, pieces=(Piece(content, frame=False),)
            )
            if identity:
                with contextlib.suppress(ValueError):
                    answer = json.loads(content)
            else:
                content = None  # encoded: passed on as it is, not recorded
        faulted = fault_hook(plan, answer)
        if self.recorder is not None:
            if content is None and frames is None:
                self.amend(
                    error=(
                        f"not recorded: the upstream answered with Content-Encoding {encoding!r}"
                    )
                )
            else:
                await self._record(response, frames, content)
        return faulted

    async def _record(
        self, response: Answer, frames: list[tuple[bytes, float]] | None, content: bytes | None
    ) -> None:
        assert self.recorder is not None
        entry = self.entry
        try:
            exchange = recorded_exchange(
                self.provider,
                method=self.method,
                path=self.path,
                body=self.body,
                status=response.status,
                headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers],
                frames=frames,
                content=content,
                upstream=self.upstream.display,
                redactor=self.redactor,
            )
        except NotRecordable as exc:
            self.amend(error=f"not recorded: {exc}")
            log.warning("%s %s: %s", self.method, self.path, entry.error)
            return
        try:
            # Shielded: a client that leaves now does not make a written file unknown.
            with anyio.CancelScope(shield=True):
                stored = await anyio.to_thread.run_sync(self.recorder, exchange)
        except (OSError, ChaosLLMError) as exc:
            self.amend(error=f"the recording could not be written: {exc}")
            log.error(
                "%s %s: %s (the answer was still proxied to the client)",
                self.method,
                self.path,
                entry.error,
            )
            return
        self.amend(recording=stored.name)


DRAIN_SECONDS = 300.0
"""How long the proxy keeps reading an upstream stream to record it after a fault ended
the client's (`ProxyCall._drain`)."""
DRAIN_BYTES = 64 << 20
"""How many more bytes of it it reads at most."""
MAX_DRAINS = 64
"""How many such streams it reads at once; beyond that one is closed, not recorded."""

_DRAINS: set[asyncio.Task[None]] = set()


def _spawn(drain: Coroutine[Any, Any, None]) -> bool:
    """Run `drain` beside the request (it outlives the client's answer); False when it
    cannot (`MAX_DRAINS` running, or not under asyncio): then it is not run."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # pragma: no cover - not under asyncio (trio)
        loop = None
    if loop is None or len(_DRAINS) >= MAX_DRAINS:
        drain.close()
        return False
    task = loop.create_task(drain)
    _DRAINS.add(task)
    task.add_done_callback(_DRAINS.discard)
    return True


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


_DROPPED_TOO = "the client's connection was dropped the same way; nothing recorded"
"""What became of an answer passed on as it came when the upstream dropped it (`_dropped`)."""


def _reason(exc: Exception) -> str:
    text = str(exc)
    cause = exc.__cause__ or exc.__context__
    if not text and cause is not None:
        text = str(cause) or type(cause).__name__
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def _watch_disconnect(receive: Receive, call: _Call, scope: anyio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if not call.finishing:
                call.gone = True
                scope.cancel()
            return
