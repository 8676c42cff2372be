"""The control plane: everything under ``/__`` (faults, journal, recordings, scenario,
findings, unused recordings, workspace).

Loopback-only by default: a control call from any other address is refused
unless the server has a control token (``--control-token``) and the call
carries it (``Authorization: Bearer TOKEN`` or ``X-Chaosllm-Token``). When a
token is set, every control call must carry it.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from chaosllm.errors import InvalidFaultSpec, InvalidRequest, UnknownScenario
from chaosllm.faults import FAULT_TYPES, describe_catalogue, parse_fault_specs, spec_from_query
from chaosllm.http.web import SESSION_HEADER, chaos_state, json_body, openai_error
from chaosllm.store.profiles import Profile, list_profiles, load_profile, parse_profile

__all__ = ["ControlGuard", "control_routes"]

CONTROL_PREFIX = "/__"


def _is_loopback(host: str | None) -> bool:
    if host is None:
        return False
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return host in ("localhost", "testclient")


class ControlGuard:
    """ASGI middleware refusing control calls that are neither local nor authorised."""

    def __init__(self, app: ASGIApp, token: str | None = None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(CONTROL_PREFIX):
            refusal = self._refusal(scope)
            if refusal is not None:
                await openai_error(403, refusal, code="control_forbidden")(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> str | None:
        if self.token is None:
            client = scope.get("client")
            if _is_loopback(client[0] if client else None):
                return None
            return (
                "The control plane answers loopback clients only. Start chaosllm with "
                "--control-token TOKEN to control it from elsewhere."
            )
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        given = (
            headers.get("x-chaosllm-token")
            or headers.get("authorization", "").removeprefix("Bearer ").strip()
        )
        if given and hmac.compare_digest(given.encode(), self.token.encode()):
            return None
        return (
            "This control call needs the control token: send 'Authorization: Bearer "
            "TOKEN' or 'X-Chaosllm-Token: TOKEN'."
        )


def _bad_spec(exc: InvalidFaultSpec) -> JSONResponse:
    return openai_error(400, str(exc), code="invalid_fault_spec")


async def arm_faults(request: Request) -> Response:
    state = chaos_state(request)
    try:
        specs = parse_fault_specs(await json_body(request))
    except InvalidRequest as exc:
        return openai_error(400, exc.message + " " + describe_catalogue(), code=exc.code)
    except InvalidFaultSpec as exc:
        return _bad_spec(exc)
    armed = state.board.arm(specs)
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
    armed = state.board.arm(specs)
    return JSONResponse(
        {"ids": [f.id for f in armed], "faults": [f.to_json() for f in armed]}, status_code=201
    )


async def list_faults(request: Request) -> Response:
    state = chaos_state(request)
    session = request.query_params.get("session")
    return JSONResponse(
        {
            "armed": state.board.armed(),
            "fired": [f.to_json() for f in state.board.history(session)],
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
            f"unknown profile {name!r}; shipped profiles: {', '.join(shipped) or '(none)'}; "
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
        elif isinstance(body, dict) and "faults" in body:
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
    armed = state.board.arm(profile.specs)
    return JSONResponse(
        {
            "profile": profile.name,
            "ids": [f.id for f in armed],
            "faults": [f.to_json() for f in armed],
        },
        status_code=201,
    )


async def journal(request: Request) -> Response:
    """``?session=`` filters (and, with DELETE, clears only that session);
    ``?settle=SECONDS`` first waits that long at most for answers still being written."""
    state = chaos_state(request)
    session = request.query_params.get("session")
    if request.method == "DELETE":
        return JSONResponse({"cleared": state.journal.clear(session)})
    try:
        settle = min(float(request.query_params.get("settle", "0")), 30.0)
    except ValueError:
        return openai_error(400, "settle must be a number of seconds", param="settle")
    if settle > 0:
        entries = await anyio.to_thread.run_sync(
            functools.partial(state.journal.entries, session, settle=settle)
        )
    else:
        entries = state.journal.entries(session)
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
        Route("/__requests", journal, methods=["GET", "DELETE"]),
        Route("/__recordings", list_recordings, methods=["GET"]),
        Route("/__reload", reload, methods=["POST"]),
        Route("/__scenario", scenario, methods=["POST"]),
        Route("/__reset", reset, methods=["POST"]),
        Route("/__findings", findings, methods=["GET"]),
        Route("/__unused", unused, methods=["GET"]),
        Route("/__workspace", workspace, methods=["POST"]),
    ]
