"""The control plane: everything under ``/__`` (faults, journal, recordings, scenario,
findings, verdicts, unused recordings, workspace, live rate limits).

Who may call it (`ControlGuard`, an ASGI middleware, so it holds under every server:
``--server builtin`` and ``--server uvicorn`` alike):

- **The client.** Loopback clients only by default: a control call from any other
  address is refused unless the server has a control token (``--control-token``) and
  the call carries it (``Authorization: Bearer TOKEN``, the scheme in any case, or
  ``X-Chaosllm-Token``). When a token is set, every control call must carry it.
- **The Host.** A loopback client is not enough: any web page the developer visits runs
  on a loopback client too. With DNS rebinding a page at ``evil.example`` makes its own
  name resolve to 127.0.0.1 and then reads the control plane as if same-origin; the one
  thing it cannot change is the ``Host`` header, which names the page's site. So the
  ``Host`` must be a loopback name or address (``localhost``, any 127.0.0.0/8,
  ``[::1]``, any port), the address the connection arrived on, or a name allowed with
  ``--allow-host`` (``ChaosServer(allow_hosts=[...])``). A request without ``Host``
  (HTTP/1.0) is let through: browsers always send one.
- **The Origin.** A browser names the page behind every cross-origin request that can
  change anything (``Origin`` on every request whose method is not GET or HEAD, and on
  every CORS request), ``null`` for opaque pages. A control call whose ``Origin`` is
  present and not the server's own (``http://`` and the ``Host`` it was sent to) is
  refused, as is one whose ``Sec-Fetch-Site`` says a page of another origin sent it
  (a plain ``<img>``/no-cors GET carries no ``Origin``, but modern browsers mark it).
  CLIs, SDKs and test clients send neither header.
- **The content type.** A state-changing call (POST, PUT, PATCH, DELETE) that has a
  body must send ``Content-Type: application/json`` (parameters such as
  ``; charset=utf-8`` allowed). A page can send a body cross-origin without a CORS
  preflight only as ``text/plain``, a form or ``multipart/form-data``; JSON needs a
  preflight, which the control plane never grants (it answers no CORS headers), so even
  a browser or extension that strips ``Origin`` cannot deliver a body. A bodyless
  state-changing call (``POST /__reset``, ``POST /__fault/{type}?k=v``,
  ``DELETE /__fault``) carries no content type to check; a page could still send one
  (a ``no-cors`` fetch or an empty form), but the browser always adds ``Origin`` to a
  POST or DELETE, so such a call is refused exactly when its ``Origin`` is foreign, and
  ``curl -X POST``, the CLI and scripts keep working without a content type. A body
  that parses as JSON counts as JSON whatever its content type when the request carries
  no ``Origin`` and no browser ``Sec-Fetch-*`` header (``curl -d``, which says it sends
  a form, and Node's ``fetch`` with a string body, which says ``text/plain`` and sends
  only ``Sec-Fetch-Mode``): a browser sends ``Origin`` on every cross-origin POST and
  ``Sec-Fetch-Site`` on every request, so a page's forged form is still refused.

Every refusal is a 403 in the OpenAI envelope (``code: control_forbidden``) saying what
to do. Provider endpoints (``/v1/...``) and ``/health`` are not control calls: the SDKs
and their CORS choices are unaffected.

``GET /__requests?settle=SECONDS`` waits on the event loop (polling the reports, no
worker thread), and at most `SETTLE_LIMIT` such waits run at once per app; beyond that
the call is answered 429 with ``Retry-After``.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import json
import re
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chaosllm.config import parse_rate_limit
from chaosllm.core import verdict as verdicts
from chaosllm.core.journal import JournalEntry
from chaosllm.errors import (
    ConfigError,
    InvalidFaultSpec,
    InvalidRequest,
    TooManyFaults,
    UnknownScenario,
)
from chaosllm.faults import (
    FAULT_TYPES,
    ArmedFault,
    FaultSpec,
    describe_catalogue,
    parse_fault_specs,
    spec_from_query,
)
from chaosllm.faults.spec import COMMON_FIELDS, MATCH_FIELDS
from chaosllm.http.web import (
    SESSION_HEADER,
    chaos_state,
    error_response,
    json_body,
    openai_error,
)
from chaosllm.store.profiles import Profile, list_profiles, load_profile, parse_profile
from chaosllm.suggest import did_you_mean

__all__ = [
    "SETTLE_LIMIT",
    "ControlGuard",
    "HostRule",
    "control_routes",
    "loopback_bound",
    "parse_allow_hosts",
    "settle",
]

CONTROL_PREFIX = "/__"
LOOPBACK_NAMES = frozenset({"localhost"})
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
JSON_TYPE = "application/json"
SAME_ORIGIN_FETCH = frozenset({"same-origin", "none"})
"""``Sec-Fetch-Site`` values a control call may carry: the server's own origin, or the
user's own doing (typing the URL)."""
_DEFAULT_PORTS = {"http": 80, "https": 443}
_HOST_NAME = re.compile(r"[a-z0-9_](?:[a-z0-9_.-]*[a-z0-9_])?\.?")

SETTLE_LIMIT = 64
"""Most ``GET /__requests?settle=`` waits running at once (per app); more are 429."""
SETTLE_POLL = 0.02
"""Longest pause between two looks at a pending report while settling (seconds)."""


def _is_loopback(host: str | None) -> bool:
    if host is None:
        return False
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return host in ("localhost", "testclient")


def _split_host(value: str) -> tuple[str, int | None] | None:
    """A ``Host`` value (``name``, ``name:port``, ``[v6]``, ``[v6]:port``) as a lowercase
    host without brackets and its port; None when it is not one."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        host, rest = value[1:end], value[end + 1 :]
        if rest and not rest.startswith(":"):
            return None
        port_text = rest[1:] if rest else None
    else:
        if value.count(":") > 1:  # a bare IPv6 address is not a valid Host
            return None
        host, _, port_text = value.partition(":")
        port_text = port_text if ":" in value else None
    if not host:
        return None
    if port_text is None:
        return host, None
    if not port_text.isdigit() or len(port_text) > 5:
        return None
    return host, int(port_text)


def parse_allow_hosts(names: Iterable[str]) -> dict[str, int | None]:
    """``--allow-host`` values (``NAME``, ``NAME:PORT``, an address) as host -> port (None:
    any port); `ConfigError` for one that is not a host."""
    allowed: dict[str, int | None] = {}
    for name in names:
        split = _split_host(name)
        if split is None or (_address(split[0]) is None and not _HOST_NAME.fullmatch(split[0])):
            raise ConfigError(
                f"--allow-host {name!r} is not a host name or address (with an optional "
                f"port): give e.g. devbox.lan, devbox.lan:8000 or 192.168.1.20"
            )
        allowed[split[0]] = split[1]
    return allowed


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


@functools.lru_cache(maxsize=64)
def loopback_bound(host: str | None) -> bool:
    """Whether a server bound to `host` is reachable from this machine only (then its
    provider endpoints are behind the Host rule too)."""
    if host is None:
        return False
    address = _address(host.strip("[]"))
    return host == "localhost" if address is None else address.is_loopback


class HostRule:
    """The one Host rule: a loopback name or address, a name of ``--allow-host``, or the
    address the server is bound to. The control plane is always behind it; provider
    endpoints are when the server is bound to loopback (`loopback_bound`), so a web page
    that rebinds its own name to 127.0.0.1 can neither drive chaosllm nor read its
    recordings."""

    __slots__ = ("_plain", "allow_hosts")

    def __init__(self, allow_hosts: Iterable[str] = ()) -> None:
        self.allow_hosts = parse_allow_hosts(allow_hosts)
        self._plain: dict[bytes, bool] = {}

    def allowed(self, value: str | None, server: Sequence[Any] | None = None) -> bool:
        """Whether a ``Host`` value (None: absent, as in HTTP/1.0) passes, for a server
        bound to `server` (``(address, port)``)."""
        if value is None:
            return True
        split = _split_host(value)
        if split is None:
            return False
        host, port = split
        if host in LOOPBACK_NAMES:
            return True
        if host in self.allow_hosts:
            wanted = self.allow_hosts[host]
            return wanted is None or wanted == port
        address = _address(host)
        if address is None:
            return False
        if address.is_loopback:
            return True
        bound = _address(str(server[0])) if server else None
        return bound is not None and bound == address

    def plainly(self, value: bytes) -> bool:
        """`allowed` for a raw value without the server's address (the hot path; a
        value refused here goes to the app, which knows that address), remembered for
        the few values a server sees."""
        known = self._plain.get(value)
        if known is None:
            known = self.allowed(value.decode("latin-1"))
            if len(self._plain) < 256:
                self._plain[value] = known
        return known

    def refusal(self, value: str, *, control: bool) -> str:
        """What a refused Host is told."""
        what = "The control plane" if control else "chaosllm (bound to loopback)"
        return (
            f"{what} refuses Host {value!r}: it answers only loopback names and addresses "
            f"(localhost, 127.0.0.1, [::1]) and the server's own address, so a web page "
            f"that rebinds its own name to this machine cannot reach it. To use chaosllm "
            f"under another name, start it with --allow-host NAME "
            f"(ChaosServer(allow_hosts=[NAME]))."
        )


def _host_of(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"host":
            return str(value.decode("latin-1"))
    return None


def _headers(scope: Scope) -> dict[str, str]:
    # A repeated header keeps its first value: any of them failing a check is enough,
    # and the first is what Starlette's `Request.headers` reads too.
    found: dict[str, str] = {}
    for name, value in scope["headers"]:
        found.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return found


def _given_token(headers: dict[str, str]) -> str:
    explicit = headers.get("x-chaosllm-token", "").strip()
    if explicit:
        return explicit
    scheme, _, credentials = headers.get("authorization", "").strip().partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else ""


def _has_body(headers: dict[str, str]) -> bool:
    if "transfer-encoding" in headers:
        return True
    length = headers.get("content-length", "").strip()
    return bool(length) and length != "0"


class ControlGuard:
    """ASGI middleware refusing control calls that are neither local nor authorised, or
    that a web page may have sent (module docstring)."""

    def __init__(
        self, app: ASGIApp, token: str | None = None, allow_hosts: Iterable[str] = ()
    ) -> None:
        self.app = app
        self.token = token
        self.hosts = HostRule(allow_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not scope["path"].startswith(CONTROL_PREFIX):
            server = scope.get("server")
            if server and loopback_bound(str(server[0])):
                host = _host_of(scope)
                if not self.hosts.allowed(host, server):
                    assert host is not None
                    message = self.hosts.refusal(host, control=False)
                    await error_response(scope["path"], 403, message, code="host_forbidden")(
                        scope, receive, send
                    )
                    return
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        refusal = (
            self._client_refusal(scope, headers)
            or self._host_refusal(scope, headers)
            or self._origin_refusal(scope, headers)
        )
        if refusal is None:
            refusal = self._content_type_refusal(scope, headers)
            if refusal is not None and _scripted(headers):
                # curl -d, fetch() with a string body, a script: no browser sent it
                # (a browser always adds Origin or Sec-Fetch-* to a cross-origin
                # POST), so a body that parses as JSON is JSON.
                body = await _read_body(receive)
                if _parses_as_json(body):
                    await self.app(scope, _replay(body, receive), send)
                    return
                refusal += " (The body is not valid JSON either.)"
        if refusal is not None:
            await openai_error(403, refusal, code="control_forbidden")(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _client_refusal(self, scope: Scope, headers: dict[str, str]) -> str | None:
        if self.token is None:
            client = scope.get("client")
            if _is_loopback(client[0] if client else None):
                return None
            return (
                "The control plane answers loopback clients only. Start chaosllm with "
                "--control-token TOKEN to control it from elsewhere."
            )
        given = _given_token(headers)
        if given and hmac.compare_digest(given.encode(), self.token.encode()):
            return None
        return (
            "This control call needs the control token: send 'Authorization: Bearer "
            "TOKEN' or 'X-Chaosllm-Token: TOKEN'."
        )

    def _host_refusal(self, scope: Scope, headers: dict[str, str]) -> str | None:
        value = headers.get("host")
        if value is None:  # HTTP/1.0: no browser sends a request without Host
            return None
        if self.hosts.allowed(value, scope.get("server")):
            return None
        return self.hosts.refusal(value, control=True)

    def _origin_refusal(self, scope: Scope, headers: dict[str, str]) -> str | None:
        origin = headers.get("origin")
        if origin is not None and not _same_origin(scope, origin, headers.get("host")):
            return (
                f"The control plane refuses calls from web pages of another origin "
                f"(Origin: {origin!r}): call it from a script, a test, the chaosllm CLI or "
                f"curl, which send no Origin header. Provider endpoints are not affected."
            )
        fetch_site = headers.get("sec-fetch-site", "").strip().lower()
        if fetch_site and fetch_site not in SAME_ORIGIN_FETCH:
            return (
                f"The control plane refuses calls a web page of another origin makes "
                f"(Sec-Fetch-Site: {fetch_site}): call it from a script, a test, the chaosllm "
                f"CLI or curl. Provider endpoints are not affected."
            )
        return None

    def _content_type_refusal(self, scope: Scope, headers: dict[str, str]) -> str | None:
        if scope["method"] not in STATE_CHANGING or not _has_body(headers):
            return None
        given = headers.get("content-type", "")
        if given.split(";", 1)[0].strip().lower() == JSON_TYPE:
            return None
        shown = f"Content-Type {given!r}" if given else "no Content-Type"
        return (
            f"A control call that changes state and has a body must send it as "
            f"'Content-Type: {JSON_TYPE}' (this one has {shown}); a web page cannot send "
            f"that to another origin, which is why it is required."
        )


def _scripted(headers: dict[str, str]) -> bool:
    """Whether a request carries none of the headers a browser adds to what a page sends:
    no ``Origin`` and no ``Sec-Fetch-Site`` (nor ``Sec-Fetch-Dest``/``-User``). Node's
    `fetch` (undici) sends ``Sec-Fetch-Mode: cors`` alone, which no browser does: every
    browser that sends Sec-Fetch headers sends ``Sec-Fetch-Site``, and every browser adds
    ``Origin`` to a cross-origin POST."""
    return "origin" not in headers and not any(name in _BROWSER_FETCH_HEADERS for name in headers)


_BROWSER_FETCH_HEADERS = frozenset({"sec-fetch-site", "sec-fetch-dest", "sec-fetch-user"})


async def _read_body(receive: Receive) -> bytes:
    """The whole request body (the app's `BodyLimit`, outside this middleware, bounds it)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _parses_as_json(body: bytes) -> bool:
    try:
        json.loads(body)
    except ValueError:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return False
    return True


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives `body` once, then what the server gives (a disconnect)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def _same_origin(scope: Scope, origin: str, host: str | None) -> bool:
    """Whether `origin` is the server's own: the scheme it is served on and the `host`
    the request was sent to (default ports made explicit on both sides)."""
    if host is None:
        return False
    scheme, sep, rest = origin.strip().lower().partition("://")
    if not sep or "/" in rest:
        return False
    own_scheme = str(scope.get("scheme", "http")).lower()
    if scheme != own_scheme:
        return False
    theirs, ours = _split_host(rest), _split_host(host)
    if theirs is None or ours is None:
        return False
    default = _DEFAULT_PORTS.get(scheme)
    return theirs[0] == ours[0] and (theirs[1] or default) == (ours[1] or default)


_UNKNOWN_TYPE = re.compile(r"unknown fault type ('[^']*')")
_UNKNOWN_PARAM = re.compile(r"(\w+) has no parameter ('[^']*')")
_UNKNOWN_MATCH = re.compile(r"match has no field ('[^']*')")


def with_suggestion(message: str) -> str:
    """A fault spec's error with a "did you mean" right after the unknown type,
    parameter or match field it names, when one is close to a known name."""
    found = _UNKNOWN_TYPE.search(message)
    if found:
        return _insert(message, found, 1, FAULT_TYPES)
    found = _UNKNOWN_PARAM.search(message)
    if found and found[1] in FAULT_TYPES:
        name = found[2][1:-1]
        takers = [t.name for t in FAULT_TYPES.values() if name in t.params]
        if takers:  # a real parameter, of other types: say which
            where = f" (a parameter of {', '.join(takers)})"
            return message[: found.end(2)] + where + message[found.end(2) :]
        return _insert(message, found, 2, [*FAULT_TYPES[found[1]].params, *COMMON_FIELDS])
    found = _UNKNOWN_MATCH.search(message)
    if found:
        return _insert(message, found, 1, MATCH_FIELDS)
    return message


def _insert(message: str, found: re.Match[str], group: int, choices: Iterable[str]) -> str:
    hint = did_you_mean(found[group][1:-1], choices)
    return message[: found.end(group)] + hint + message[found.end(group) :]


def _bad_spec(exc: InvalidFaultSpec) -> JSONResponse:
    return openai_error(400, with_suggestion(str(exc)), code="invalid_fault_spec")


async def arm_faults(request: Request) -> Response:
    state = chaos_state(request)
    try:
        specs = parse_fault_specs(await json_body(request))
    except InvalidRequest as exc:
        return openai_error(400, exc.message + " " + describe_catalogue(), code=exc.code)
    except InvalidFaultSpec as exc:
        return _bad_spec(exc)
    return _arm(state, specs)


def _arm(state: Any, specs: Sequence[FaultSpec]) -> JSONResponse:
    try:
        return _armed(state.board.arm(specs))
    except TooManyFaults as exc:
        return _too_many(exc)


def _too_many(exc: TooManyFaults) -> JSONResponse:
    return openai_error(429, str(exc), code="too_many_faults")


def _armed(armed: list[ArmedFault]) -> JSONResponse:
    return JSONResponse(
        {"ids": [f.id for f in armed], "faults": [f.to_json() for f in armed]}, status_code=201
    )


async def arm_fault_type(request: Request) -> Response:
    """``POST /__fault/{type}?k=v``: each value typed by the kind of the parameter it sets."""
    state = chaos_state(request)
    spec = spec_from_query(request.path_params["type"], request.query_params.items())
    try:
        specs = parse_fault_specs(spec)
    except InvalidFaultSpec as exc:
        return _bad_spec(exc)
    return _arm(state, specs)


async def list_faults(request: Request) -> Response:
    state = chaos_state(request)
    session = request.query_params.get("session")
    return JSONResponse(
        {
            "armed": state.board.armed(),
            "fired": [f.to_json() for f in state.board.history(session)],
            **state.board.counts(),
            **state.matcher.session_counts(),
            "types": {name: sorted(t.params) for name, t in FAULT_TYPES.items()},
        }
    )


async def disarm_faults(request: Request) -> Response:
    return JSONResponse({"disarmed": chaos_state(request).board.disarm()})


async def disarm_fault(request: Request) -> Response:
    fault_id = request.path_params["id"]
    if not chaos_state(request).board.disarm(fault_id):
        return openai_error(
            404,
            f"No armed fault has id {fault_id!r} (it may have fired "
            f"already); GET /__fault lists the armed ones.",
            code="unknown_fault",
        )
    return JSONResponse({"disarmed": 1})


def _shipped_profile(name: str) -> Profile:
    """A shipped profile by name. Over HTTP the server reads no file the caller names (a
    path would let any control client read the server's JSON files); a profile of one's
    own is sent inline, as `chaosllm fault profile FILE` does."""
    shipped = list_profiles()
    if name not in shipped:
        raise InvalidFaultSpec(
            f"unknown profile {name!r}{did_you_mean(name, shipped)}; shipped profiles: "
            f"{', '.join(shipped) or '(none)'}; "
            'or send a profile of your own inline: {"description": ..., '
            '"faults": [fault spec, ...]}'
        )
    return load_profile(name)


async def arm_profile(request: Request) -> Response:
    state = chaos_state(request)
    try:
        body = await json_body(request)
        if isinstance(body, dict) and isinstance(body.get("profile"), str):
            profile = _shipped_profile(body["profile"])
        elif isinstance(body, dict) and ("faults" in body or "rate_limit" in body):
            profile = parse_profile(body, "(request)")
        else:
            raise InvalidFaultSpec(
                'send {"profile": NAME} (a shipped profile: '
                + ", ".join(list_profiles())
                + ") or a profile object "
                '{"description": ..., "faults": [fault spec, ...]}'
            )
    except InvalidRequest as exc:
        return openai_error(400, exc.message, code=exc.code)
    except InvalidFaultSpec as exc:
        return _bad_spec(exc)
    try:
        armed = state.board.arm(profile.specs)
    except TooManyFaults as exc:
        return _too_many(exc)
    if profile.rate_limit is not None:
        state.set_rate_limit(profile.rate_limit)
    return JSONResponse(
        {
            "profile": profile.name,
            "ids": [f.id for f in armed],
            "faults": [f.to_json() for f in armed],
            "rate_limit": profile.rate_limit.to_json() if profile.rate_limit else None,
        },
        status_code=201,
    )


async def rate_limit(request: Request) -> Response:
    """``POST /__ratelimit {"rpm": N, "tpm": M}``: live rate limits from now on (every
    bucket full; a bad body is a 400 and changes nothing); ``GET``: the limit and the
    buckets kept (``?session=`` filters), each caller by its key's salted hash;
    ``DELETE``: no live limits."""
    state = chaos_state(request)
    if request.method == "GET":
        limiter = state.limiter
        if limiter is None:
            return JSONResponse({"rate_limit": None, "buckets": []})
        return JSONResponse(limiter.to_json(request.query_params.get("session")))
    if request.method == "DELETE":
        was_on = state.limiter is not None
        state.set_rate_limit(None)
        return JSONResponse({"rate_limit": None, "disabled": was_on})
    try:
        body = await json_body(request)
        if not isinstance(body, dict):
            raise ConfigError('send a JSON object {"rpm": N, "tpm": M} (either or both)')
        limit = parse_rate_limit(body)
    except InvalidRequest as exc:
        return openai_error(400, exc.message, code=exc.code)
    except ConfigError as exc:
        return openai_error(400, str(exc), code="invalid_rate_limit")
    state.set_rate_limit(limit)
    return JSONResponse({"rate_limit": limit.to_json()})


class _SettleSlots:
    """How many settles run at once on one app (a lock: an app may be served by more
    than one event loop)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self.active >= self.limit:
                return False
            self.active += 1
            return True

    def give_back(self) -> None:
        with self._lock:
            self.active -= 1


_slots_lock = threading.Lock()


def _settle_slots(request: Request) -> _SettleSlots:
    state = request.app.state
    with _slots_lock:
        slots: _SettleSlots | None = getattr(state, "control_settle_slots", None)
        if slots is None:
            slots = state.control_settle_slots = _SettleSlots(SETTLE_LIMIT)
    return slots


async def settle(entries: Sequence[JournalEntry], seconds: float) -> bool:
    """Wait up to `seconds` for every entry's answer to be settled, on the event loop: a
    look at the reports, then a pause (growing from 1 ms to `SETTLE_POLL`), never a
    worker thread. Whether all settled."""
    deadline = anyio.current_time() + seconds
    pause = 0.001
    for entry in entries:
        while entry.report.outcome is None:
            left = deadline - anyio.current_time()
            if left <= 0:
                return False
            await anyio.sleep(min(pause, left))
            pause = min(pause * 2, SETTLE_POLL)
    return True


async def journal(request: Request) -> Response:
    """``?session=`` filters (and, with DELETE, clears only that session);
    ``?settle=SECONDS`` first waits that long at most (30 s) for answers still being
    written (at most `SETTLE_LIMIT` at once: more are answered 429)."""
    state = chaos_state(request)
    session = request.query_params.get("session")
    if request.method == "DELETE":
        return JSONResponse({"cleared": state.journal.clear(session)})
    try:
        seconds = min(float(request.query_params.get("settle", "0")), 30.0)
    except ValueError:
        return openai_error(400, "settle must be a number of seconds", param="settle")
    entries = state.journal.entries(session)
    if seconds > 0 and any(e.report.outcome is None for e in entries):
        slots = _settle_slots(request)
        if not slots.take():
            busy = openai_error(
                429,
                f"{slots.limit} GET /__requests?settle= calls are already waiting; retry in "
                f"a second, or ask without settle.",
                type_="rate_limit_error",
                code="too_many_settles",
            )
            busy.headers["retry-after"] = "1"
            return busy
        try:
            await settle(entries, seconds)
        finally:
            slots.give_back()
    unused = [e.name for e in state.matcher.unused()]
    summary = {
        "requests": len(entries),
        "misses": sum(1 for e in entries if e.record.miss),
        "faults": sum(1 for e in entries if e.fault is not None),
        "findings": sum(len(e.record.findings) for e in entries),
        "unused": unused,
        "text": f"{len(entries)} requests; {len(unused)} of {len(state.store.exchanges)} "
        f"recordings never served since the last reset"
        + (": " + ", ".join(unused[:20]) + (" ..." if len(unused) > 20 else "") if unused else ""),
    }
    return JSONResponse({"requests": [e.to_json() for e in entries], "summary": summary})


async def findings(request: Request) -> Response:
    """Every oracle finding in the journal (``?session=`` filters), with its request."""
    state = chaos_state(request)
    found = [
        {"seq": e.seq, "session": e.session, "recording": e.record.recording, **finding}
        for e in state.journal.entries(request.query_params.get("session"))
        for finding in e.record.findings
    ]
    return JSONResponse({"findings": found})


async def verdict(request: Request) -> Response:
    """``GET /__verdict?session=``: the findings about the client's behaviour
    (`chaosllm.core.verdict`), and the tolerances they were found with; any other query
    parameter sets a tolerance (``?no_backoff_floor=0.5``)."""
    state = chaos_state(request)
    session = request.query_params.get("session")
    items = [(k, v) for k, v in request.query_params.multi_items() if k != "session"]
    tolerances = verdicts.Tolerances()
    for item in items:  # one at a time, so that the refusal names the bad one
        try:
            tolerances = tolerances.with_text([item])
        except ConfigError as exc:
            return openai_error(400, str(exc), code="invalid_tolerance", param=item[0])
    found = state.findings(session, tolerances)
    return JSONResponse(
        {"findings": [f.to_json() for f in found], "tolerances": tolerances.to_json()}
    )


async def unused(request: Request) -> Response:
    """The recordings no request was served since the last reset."""
    state = chaos_state(request)
    names = [
        {"name": e.name, "scenario": e.scenario, "source": e.source} for e in state.matcher.unused()
    ]
    return JSONResponse({"unused": names, "total": len(state.store.exchanges)})


async def workspace(request: Request) -> Response:
    """``{"path": PATH}``: the live workspace that ``<WORKSPACE>`` in recordings stands
    for (null clears it). Disarms every fault, so chaos never leaks across scenarios."""
    state = chaos_state(request)
    try:
        body = await json_body(request)
    except InvalidRequest as exc:
        return openai_error(400, exc.message, code=exc.code)
    if (
        not isinstance(body, dict)
        or "path" not in body
        or not (body["path"] is None or (isinstance(body["path"], str) and body["path"]))
    ):
        return openai_error(
            400,
            'Expected a JSON object {"path": PATH} (the live workspace '
            "directory, or null to clear it).",
            code="invalid_value",
            param="path",
        )
    state.matcher.set_workspace(body["path"])
    disarmed = state.board.disarm()
    return JSONResponse({"workspace": body["path"], "disarmed": disarmed})


async def list_recordings(request: Request) -> Response:
    store = chaos_state(request).store
    return JSONResponse(
        {
            "dirs": [str(d) for d in store.dirs],
            "recordings": store.summary(),
            "errors": store.error_summary(),
            "scenarios": store.scenario_info,
        }
    )


async def reload(request: Request) -> Response:
    state = chaos_state(request)
    state.reload()
    return JSONResponse(
        {
            "recordings": len(state.store.exchanges),
            "errors": state.store.error_summary(),
        }
    )


async def scenario(request: Request) -> Response:
    state = chaos_state(request)
    try:
        body = await json_body(request)
    except InvalidRequest as exc:
        return openai_error(400, exc.message, code=exc.code)
    if (
        not isinstance(body, dict)
        or "scenario" not in body
        or not (body["scenario"] is None or isinstance(body["scenario"], str))
    ):
        return openai_error(
            400,
            'Expected a JSON object {"scenario": NAME} (NAME a string, '
            'or null to clear), optionally with "session".',
            code="invalid_value",
            param="scenario",
        )
    session = body.get("session", request.headers.get(SESSION_HEADER))
    if session is not None and not isinstance(session, str):
        return openai_error(400, '"session" must be a string', param="session")
    try:
        state.matcher.set_scenario(body["scenario"], session)
    except UnknownScenario as exc:
        return openai_error(404, str(exc), code="unknown_scenario", param="scenario")
    return JSONResponse({"scenario": body["scenario"], "session": session})


async def reset(request: Request) -> Response:
    chaos_state(request).reset()
    return JSONResponse({"reset": True})


def control_routes() -> list[BaseRoute]:
    return [
        Route("/__fault", arm_faults, methods=["POST"]),
        Route("/__fault", list_faults, methods=["GET"]),
        Route("/__fault", disarm_faults, methods=["DELETE"]),
        Route("/__fault/{type}", arm_fault_type, methods=["POST"]),
        Route("/__fault/{id}", disarm_fault, methods=["DELETE"]),
        Route("/__profile", arm_profile, methods=["POST"]),
        Route("/__ratelimit", rate_limit, methods=["GET", "POST", "DELETE"]),
        Route("/__requests", journal, methods=["GET", "DELETE"]),
        Route("/__recordings", list_recordings, methods=["GET"]),
        Route("/__reload", reload, methods=["POST"]),
        Route("/__scenario", scenario, methods=["POST"]),
        Route("/__reset", reset, methods=["POST"]),
        Route("/__findings", findings, methods=["GET"]),
        Route("/__verdict", verdict, methods=["GET"]),
        Route("/__unused", unused, methods=["GET"]),
        Route("/__workspace", workspace, methods=["POST"]),
    ]
