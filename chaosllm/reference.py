"""The reference pages of the docs, rendered from the code that they describe.

The docs site (``mkdocs.yml``, its hook ``docs/hooks.py``) writes each of these as a page
at build time, so that a fault type, a flag or a control route cannot be added without
its reference: the fault catalogue from `chaosllm.faults.CATALOGUE`, the command line
from the argparse parser of `chaosllm.cli`, the control plane from its Starlette routes.
Markdown out, nothing else: the functions are pure and the tests read their output.
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Iterator

from chaosllm.faults import CATALOGUE
from chaosllm.faults.catalogue import Param
from chaosllm.faults.spec import COMMON_FIELDS, MATCH_FIELDS, SCHEDULE_FIELDS

__all__ = ["CONTROL_CALLS", "cli_page", "control_plane_page", "fault_catalogue_page"]


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _param(name: str, param: Param) -> str:
    """``after_chunks`` (2): what it does, its bounds."""
    shown = f"`{name}`" + (f" ({param.default:g})" if isinstance(param.default, float) else "")
    if isinstance(param.default, int) and not isinstance(param.default, bool):
        shown = f"`{name}` ({param.default})"
    elif isinstance(param.default, str):
        shown = f"`{name}` ({param.default!r})"
    bounds = []
    if param.minimum is not None:
        bounds.append(f"≥ {param.minimum:g}")
    if param.maximum is not None:
        bounds.append(f"≤ {param.maximum:g}")
    kind = param.kind.__name__ + (", " + ", ".join(bounds) if bounds else "")
    return f"{shown}: {_cell(param.doc)} ({kind})"


def fault_catalogue_page() -> str:
    """The fault types, in catalogue order: a table of every type and its parameters
    (defaults in brackets), then the fields every fault takes."""
    lines = [
        "# Fault catalogue",
        "",
        "Generated from `chaosllm.faults.CATALOGUE` when the docs are built: every fault "
        "type, in the catalogue's order, with its parameters and their defaults. What each "
        "type does to a JSON answer and to a stream is in [Breaking things](../faults.md).",
        "",
        "| type | what it does | parameters (default) | retryable |",
        "|---|---|---|---|",
    ]
    for entry in CATALOGUE:
        params = "<br>".join(_param(n, p) for n, p in entry.params.items()) or "-"
        retry = {True: "yes", False: "no", None: "-"}[entry.retryable]
        lines.append(f"| `{entry.name}` | {_cell(entry.summary)} | {params} | {retry} |")
    lines += [
        "",
        "## Fields every fault takes",
        "",
        "| field | what it does |",
        "|---|---|",
    ]
    lines += [f"| `{name}` | {_cell(doc)} |" for name, doc in COMMON_FIELDS.items()]
    lines += [
        "",
        "`match` holds any of: " + ", ".join(f"`{m}`" for m in MATCH_FIELDS) + ". "
        "The schedule fields are "
        + ", ".join(f"`{name}` ({kind.__name__})" for name, kind in SCHEDULE_FIELDS.items())
        + ".",
        "",
    ]
    return "\n".join(lines)


# -- the command line ---------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.values()


def _flag(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    names = ", ".join(f"`{o}`" for o in action.option_strings)
    takes = action.nargs != 0 and not isinstance(
        action, (argparse._StoreTrueAction, argparse._CountAction, argparse._VersionAction)
    )
    if takes:
        metavar = action.metavar or action.dest.upper()
        names += f" `{metavar if isinstance(metavar, str) else ' '.join(metavar)}`"
    return names


def _default(action: argparse.Action) -> str:
    default = action.default
    if default in (None, False, [], argparse.SUPPRESS) or action.nargs == 0:
        return ""
    if isinstance(default, tuple):
        return ""
    value = getattr(default, "value", default)
    return f"`{value}`"


def _options(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| argument | default | what it does |", "|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        rows.append(f"| {_flag(action)} | {_default(action)} | {_cell(action.help or '')} |")
    return rows


def cli_page(parser: argparse.ArgumentParser) -> str:
    """Every command of `parser` (the `chaosllm` parser), its arguments and flags, with
    defaults; the exit statuses."""
    lines = [
        "# Command line",
        "",
        "Generated from the argparse parser of `chaosllm.cli` when the docs are built: every "
        "command, argument and flag that `chaosllm` takes.",
        "",
        "## Exit status",
        "",
        "| status | meaning |",
        "|---|---|",
        "| 0 | the command did what it was asked |",
        "| 1 | a failure at run time: the server could not start (a port in use), a server "
        "could not be reached or refused the call, a recording is corrupt, a probe cell got "
        "worse than its baseline |",
        "| 2 | a wrong command line: an unknown flag, command, fault type, provider or "
        "profile (each with a *did you mean*), a value out of range, a path that is not a "
        "recordings directory |",
        "| 130 | interrupted twice (a second Ctrl-C stops at once) |",
        "",
        "Errors are one line on stderr, the cause first: `chaosllm: error: ...`.",
        "",
        f"## `{parser.prog}`",
        "",
        _cell(parser.description or ""),
        "",
        *_options(parser),
        "",
    ]
    for sub in _subcommands(parser):
        lines += _command(sub, level=2)
    return "\n".join(lines)


def _command(parser: argparse.ArgumentParser, *, level: int) -> list[str]:
    lines = [f"{'#' * level} `{parser.prog}`", ""]
    if parser.description and "\n" not in parser.description.strip():
        lines += [_cell(parser.description), ""]
    lines += [*_options(parser), ""]
    for sub in _subcommands(parser):
        lines += _command(sub, level=level + 1)
    return lines


# -- the control plane --------------------------------------------------------------------

CONTROL_CALLS: dict[tuple[str, str], str] = {
    ("POST", "/__fault"): "arm one fault (a JSON object) or several in order (an array); "
    "201 with their ids",
    ("GET", "/__fault"): "armed faults and the history of fired ones (the newest "
    "`--fault-history-size`; `fired_total`, `fired_dropped`, `sessions`, "
    "`sessions_dropped`), and each type's parameters",
    ("DELETE", "/__fault"): "disarm every fault",
    ("POST", "/__fault/{type}"): "arm one fault of that type; query parameters set its "
    "parameters (`?remaining=2&after_chunks=1&session=s1`)",
    ("DELETE", "/__fault/{id}"): "disarm one fault (404 `unknown_fault` when it is not armed)",
    ("POST", "/__profile"): 'arm a profile: `{"profile": NAME}` (a shipped one) or a '
    "profile object",
    ("GET", "/__ratelimit"): "the live rate limit and the buckets kept (`?session=` filters)",
    ("POST", "/__ratelimit"): '`{"rpm": N, "tpm": M}`: live rate limits from now on, every '
    "bucket full",
    ("DELETE", "/__ratelimit"): "no live rate limits",
    ("GET", "/__requests"): "the journal: each provider request with its seq, session, "
    "model, stream, digest, recording and how it matched (or miss), fault, status, "
    "ending, frames and bytes sent, outcome; `?session=` filters, `?settle=S` waits for "
    "outcomes",
    ("DELETE", "/__requests"): "clear the journal",
    ("GET", "/__recordings"): "what is loaded, and which files failed to load and why",
    ("POST", "/__reload"): "reload the recordings from disk",
    ("POST", "/__scenario"): '`{"scenario": NAME, "session": ...}`: the active scenario '
    "for sequence matching",
    ("POST", "/__reset"): "disarm all, clear the journal and history, rewind sequences, "
    "fill the rate-limit buckets",
    ("GET", "/__findings"): "what the request validator and the trace checks found",
    ("GET", "/__verdict"): "findings about the client's retry behaviour; `?session=` "
    "filters, other query parameters set tolerances",
    ("GET", "/__unused"): "recordings never served since the last reset",
    ("POST", "/__workspace"): '`{"path": "/live/workspace"}`: what `<WORKSPACE>` tokens in '
    "recordings stand for",
}
"""What each control call does, by method and path. `control_plane_page` lists the routes
of `chaosllm.http.control.control_routes` and takes each one's text from here; a route
without an entry (or an entry without a route) fails the docs' tests."""


def control_routes_table() -> list[tuple[str, str, str]]:
    """(method, path, handler) for every control route the app serves, in its order."""
    from chaosllm.http.control import control_routes  # the http layer: only when rendered

    rows: list[tuple[str, str, str]] = []
    for route in control_routes():
        path = getattr(route, "path", "")
        endpoint = getattr(route, "endpoint", None)
        name = getattr(endpoint, "__name__", "?")
        for method in sorted(getattr(route, "methods", None) or (), key=_method_order):
            if method != "HEAD":
                rows.append((method, path, name))
    return rows


def _method_order(method: str) -> int:
    return ["GET", "POST", "DELETE", "PUT", "PATCH", "HEAD"].index(method)


def control_plane_page() -> str:
    """Every control route (method, path, what it does), from the app's routes."""
    lines = [
        "# Control plane HTTP API",
        "",
        "Generated from the routes of `chaosllm.http.control` when the docs are built. "
        "All under `/__`, JSON in and out; who may call it is in "
        "[Security](../background/security.md).",
        "",
        "| call | what it does | handler |",
        "|---|---|---|",
    ]
    for method, path, name in control_routes_table():
        text = CONTROL_CALLS.get((method, path), "")
        lines.append(f"| `{method} {path}` | {_cell(text)} | `{name}` |")
    lines += [
        "",
        "`GET /health` answers liveness (not under `/__`, open to every client).",
        "",
        "Handlers, with their own documentation where they have it:",
        "",
    ]
    seen: set[str] = set()
    from chaosllm.http import control

    for _, _, name in control_routes_table():
        if name in seen:
            continue
        seen.add(name)
        doc = inspect.getdoc(getattr(control, name, None)) or ""
        if doc:
            lines.append(f"- `{name}`: {_cell(doc.split(chr(10) * 2)[0])}")
    lines.append("")
    return "\n".join(lines)
