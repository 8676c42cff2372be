"""The `chaosllm` command. The only place that prints for people and exits.

Exit status: 0 when the command did what it was asked; 1 when it failed at run time (the
server could not start, a server could not be reached or refused the call, a recording is
corrupt, a probe cell got worse); 2 when the command line is wrong (an unknown flag, fault
type or profile, a value out of range, a path that is not a recordings directory). Errors
are one line on stderr, ``chaosllm: error: <cause>: <what to do>``, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import ipaddress
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from chaosllm import __version__
from chaosllm.config import (
    DEFAULT_RECORD_SCENARIO,
    Mode,
    OnMiss,
    Pace,
    ServerConfig,
    parse_rate_limit,
    parse_timing_option,
    proxy_dirs,
    secrets_from_env,
)
from chaosllm.errors import BadBaseline, ChaosLLMError, ConfigError, InvalidFaultSpec, ServerError
from chaosllm.faults import FAULT_TYPES, describe_catalogue
from chaosllm.faults.spec import COMMON_FIELDS, SCHEDULE_FIELDS
from chaosllm.http.access import AccessLog, LineBuffer
from chaosllm.http.control import parse_allow_hosts
from chaosllm.http.cors import parse_cors
from chaosllm.http.state import ChaosState
from chaosllm.providers.gateways import GATEWAY_NAMES
from chaosllm.server import ServerKind, run_server, tls_files
from chaosllm.store.formats import IMPORTABLE
from chaosllm.store.matching import DEFAULT_ORDER, Strategy
from chaosllm.store.profiles import list_profiles, load_profile
from chaosllm.store.recordings import RecordingStore, shipped_dir
from chaosllm.suggest import did_you_mean

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    """argparse with "did you mean" for a mistyped flag or subcommand (exit status 2)."""

    def error(self, message: str) -> Any:
        if message.startswith("unrecognized arguments:"):
            known = _option_strings(self._root())
            hints = [
                f"{word}{hint}"
                for word in message.split(":", 1)[1].split()
                if word.startswith("-") and (hint := did_you_mean(word.split("=")[0], known))
            ]
            if hints:
                message += "; " + ", ".join(hints)
        found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if found:
            choices = re.findall(r"'([^']*)'", found[2]) or found[2].split(", ")
            message = f"{message}{did_you_mean(found[1], choices)}"
        # One line, the cause first (argparse would print the whole usage first).
        self.exit(2, f"chaosllm: error: {message} (see `{self.prog} --help`)\n")

    def _root(self) -> argparse.ArgumentParser:
        return _ROOT if _ROOT is not None else self


_ROOT: argparse.ArgumentParser | None = None


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every long flag of `parser` and of its subcommands, recursively."""
    found: list[str] = []
    for action in parser._actions:
        found += [o for o in action.option_strings if o.startswith("--")]
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _option_strings(sub)
    return found


def _fault_type(value: str) -> str:
    if value in FAULT_TYPES:
        return value
    raise argparse.ArgumentTypeError(
        f"unknown fault type {value!r}{did_you_mean(value, FAULT_TYPES)}"
    )


def _verbosity(parser: argparse.ArgumentParser) -> None:
    """-v/--verbose and -q/--quiet, on the command and on `serve` (as users type them)."""
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS,
        help="log more (the DEBUG level)",
    )
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS,
        help="log only warnings and errors (no access log, no fault lines)",
    )


def _choice(parse: type[Mode] | type[OnMiss] | type[ServerKind]) -> Callable[[str], Any]:
    def convert(value: str) -> Any:
        try:
            return parse(value)
        except ValueError:
            valid = ", ".join(m.value for m in parse)
            raise argparse.ArgumentTypeError(
                f"invalid choice {value!r} (choose from {valid})"
            ) from None

    return convert


def _timing(value: str) -> tuple[float, Pace | None]:
    try:
        return parse_timing_option(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _order(value: str) -> tuple[Strategy, ...]:
    try:
        return Strategy.parse_order(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {value!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is outside 0-65535")
    return port


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _number_or_text(text: str) -> int | str:
    """A flag two types take with different kinds (``--status``): a whole number, else the
    text (the type's own validation says which it wanted)."""
    try:
        return int(text)
    except ValueError:
        return text


def _fault_params() -> dict[str, tuple[Any, str]]:
    """Every parameter of every fault type (one `fault arm` flag each): its kind, and its
    doc with the types that take it."""
    kinds: dict[str, Any] = {}
    docs: dict[str, str] = {}
    takers: dict[str, list[str]] = {}
    for entry in FAULT_TYPES.values():
        for name, param in entry.params.items():
            if kinds.setdefault(name, param.kind) is not param.kind:
                kinds[name] = _number_or_text  # http_error's status 503, background_failed's
            docs.setdefault(name, param.doc)
            takers.setdefault(name, []).append(entry.name)
    return {name: (kinds[name], f"{docs[name]} ({', '.join(takers[name])})") for name in kinds}


def _server_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """--url and --token; with `suppress` they keep the value given before the action
    unless given again after it."""
    parser.add_argument(
        "--url",
        default=argparse.SUPPRESS
        if suppress
        else os.environ.get("CHAOSLLM_URL", "http://127.0.0.1:8000"),
        help="the server (default $CHAOSLLM_URL or http://127.0.0.1:8000)",
    )
    parser.add_argument(
        "--token",
        default=argparse.SUPPRESS if suppress else os.environ.get("CHAOSLLM_CONTROL_TOKEN"),
        help="the control token, if the server has one (default $CHAOSLLM_CONTROL_TOKEN)",
    )


EPILOG = (
    "exit status: 0 ok, 1 a failure at run time, 2 a wrong command line. "
    "Docs: docs/ in the repository (mkdocs serve)."
)


def _parser() -> argparse.ArgumentParser:
    global _ROOT
    parser = _Parser(
        prog="chaosllm",
        description="A fault-injection chaos server for LLM HTTP clients.",
        epilog=EPILOG,
    )
    _ROOT = parser
    parser.add_argument("--version", action="version", version=f"chaosllm {__version__}")
    _verbosity(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="serve recordings over the providers' HTTP APIs",
        description="Replay recorded exchanges over the providers' own HTTP APIs (OpenAI "
        "Chat Completions and Responses, Anthropic Messages, Gemini, Azure OpenAI, Ollama, "
        "Bedrock Converse, embeddings), or record them from a real provider, and break "
        "them with armed faults.",
        epilog=EPILOG,
    )
    _verbosity(serve)
    serve.add_argument(
        "--recordings",
        action="append",
        type=Path,
        metavar="DIR",
        help="a recordings directory (repeatable; default: the shipped ones)",
    )
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)"
    )
    serve.add_argument("--port", type=_port, default=8000, help="port (0 picks a free one)")
    serve.add_argument(
        "--tls",
        action="store_true",
        help="serve TLS on every protocol with a self-signed certificate made at "
        "start (its path is printed: trust it, e.g. SSL_CERT_FILE=...)",
    )
    serve.add_argument("--certfile", type=Path, help="serve TLS with this certificate (PEM)")
    serve.add_argument("--keyfile", type=Path, help="the --certfile's private key (PEM)")
    serve.add_argument(
        "--no-audio",
        action="store_true",
        help="recorded WebSocket sessions keep a digest of each audio delta, not the audio",
    )
    serve.add_argument(
        "--mode",
        type=_choice(Mode),
        default=Mode.REPLAY,
        help="replay (default): answer from recordings; record: proxy every "
        "request to --upstream and record the answer; record-missing: "
        "replay what is recorded, proxy and record the rest; "
        "passthrough: proxy, record nothing (faults still apply)",
    )
    serve.add_argument(
        "--upstream",
        metavar="URL",
        help="the real provider, e.g. https://api.openai.com (needed by the "
        "modes other than replay, unless --mcp-upstream names the only upstreams)",
    )
    serve.add_argument(
        "--mcp-upstream",
        action="append",
        default=[],
        type=_named_url,
        metavar="NAME=URL",
        help="the real endpoint of MCP server NAME (/mcp/NAME) in the proxy modes "
        "(repeatable); a server without one is proxied to --upstream",
    )
    serve.add_argument(
        "--record-dir",
        type=Path,
        metavar="DIR",
        help="where new recordings go (default: the first --recordings DIR; "
        "never the shipped recordings unless named here)",
    )
    serve.add_argument(
        "--scenario",
        dest="record_scenario",
        metavar="NAME",
        default=DEFAULT_RECORD_SCENARIO,
        help="the scenario new recordings are written to, "
        "DIR/NAME/NNNN.json (default 'recorded'; a session's active "
        "scenario takes precedence)",
    )
    serve.add_argument(
        "--scenario-from-session",
        action="store_true",
        help="a session (X-Chaosllm-Session) names its scenario: what it records goes "
        "there (the id made a directory name), and it replays from there when that "
        "scenario is loaded -- a scenario per test or flow, without POST /__scenario",
    )
    serve.add_argument(
        "--secret",
        dest="secrets",
        action="append",
        default=[],
        metavar="VALUE",
        help="a value to redact from recordings (repeatable; also "
        "$CHAOSLLM_SECRETS, comma-separated); API keys shaped like "
        "sk-... are always redacted",
    )
    serve.add_argument(
        "--on-miss",
        type=_choice(OnMiss),
        default=OnMiss.ERROR,
        help="error (default): an error naming the nearest recordings; "
        "fallback: a deterministic canned answer",
    )
    serve.add_argument("--seed", type=int, default=0, help="seed of every random choice")
    serve.add_argument(
        "--timing",
        type=_timing,
        default=(0.0, None),
        metavar="fast|recorded|SCALE|ttft=MS,tps=N,jitter=J",
        help="replay streams as fast as possible (default), with their "
        "recorded gaps, with the gaps scaled by SCALE, or at a pace: the first frame "
        "after ttft (600ms, 0.6s), then tps tokens a second, each gap jittered by up to "
        "J (0-1) from the seeded RNG",
    )
    serve.add_argument(
        "--match",
        type=_order,
        default=DEFAULT_ORDER,
        metavar="ORDER",
        help="matchers in order (default exact,sequence,nearest)",
    )
    serve.add_argument(
        "--nearest-threshold",
        type=float,
        default=0.9,
        metavar="SIM",
        help="least similarity (0-1) at which nearest matching serves a recording (default 0.9)",
    )
    serve.add_argument(
        "--server",
        type=_choice(ServerKind),
        default=ServerKind.BUILTIN,
        help="builtin (default: httptools on uvloop, exact socket-level faults), h11 (its "
        "pure-Python fallback) or uvicorn",
    )
    serve.add_argument(
        "--max-body-bytes",
        type=int,
        default=16 * 1024 * 1024,
        help="largest request body accepted (default 16 MiB)",
    )
    serve.add_argument(
        "--max-connections",
        type=int,
        default=10_000,
        metavar="N",
        help="client connections held at once (default 10000; builtin servers): when full, "
        "the oldest idle keep-alive connection is closed for a new one, and the control "
        "plane still answers",
    )
    serve.add_argument(
        "--journal-size",
        type=int,
        default=10_000,
        metavar="N",
        help="provider requests the journal keeps, newest first (default 10000)",
    )
    serve.add_argument(
        "--fault-history-size",
        type=int,
        default=1000,
        metavar="N",
        help="fired faults GET /__fault keeps, newest first; it counts the dropped ones "
        "(default 1000)",
    )
    serve.add_argument(
        "--max-faults",
        type=int,
        default=10_000,
        metavar="N",
        help="faults that may be armed at once; past it arming is refused with a 429 "
        "(default 10000)",
    )
    serve.add_argument(
        "--max-sessions",
        type=int,
        default=10_000,
        metavar="N",
        help="sessions whose state (sequence cursors, scenario, fault draws) is kept; the "
        "least recently used is forgotten first and starts fresh if seen again "
        "(default 10000)",
    )
    serve.add_argument(
        "--memo-bytes",
        type=int,
        default=32 << 20,
        metavar="N",
        help="bytes the engine's memo of worked-out answers may hold; 0 keeps none "
        "(default 33554432, 32 MiB)",
    )
    serve.add_argument(
        "--profile",
        metavar="NAME|FILE",
        help="arm a fault profile at start (shipped: " + ", ".join(list_profiles()) + ")",
    )
    serve.add_argument(
        "--rate-limit",
        metavar="rpm=N,tpm=M",
        help="live rate limits: token buckets per API key and session, the provider's "
        "rate-limit headers counting down on every answer, its 429 with the exact wait when "
        "empty (either or both of rpm, tpm)",
    )
    serve.add_argument(
        "--control-token",
        metavar="TOKEN",
        default=os.environ.get("CHAOSLLM_CONTROL_TOKEN"),
        help="require this token on control calls (needed to control a server "
        "bound to a non-loopback address; env CHAOSLLM_CONTROL_TOKEN)",
    )
    serve.add_argument(
        "--allow-host",
        metavar="HOST",
        action="append",
        default=[],
        help="a Host name (NAME or NAME:PORT) the control plane (and, bound to loopback, "
        "every endpoint) answers besides loopback names and the bound address "
        "(repeatable; against DNS rebinding, others are refused)",
    )
    serve.add_argument(
        "--cors",
        metavar="ORIGIN",
        action="append",
        default=[],
        help="let web pages of ORIGIN (http://host:port, or '*' for any) read provider "
        "answers: CORS headers and preflights (repeatable; none by default)",
    )
    serve.add_argument(
        "--gateway",
        choices=GATEWAY_NAMES,
        help="answer and fail as this OpenAI-compatible gateway does (docs: gateways)",
    )
    serve.add_argument(
        "--strict",
        action="store_true",
        help="refuse a request the request validator (or a trace check) finds "
        "a defect in, with a 400 like the provider's (default: the "
        "finding is only journaled, GET /__findings)",
    )

    fault = sub.add_parser("fault", help="arm, list and clear faults on a running server")
    _server_options(fault, suppress=False)
    fault_sub = fault.add_subparsers(dest="fault_command", required=True, metavar="ACTION")
    arm = fault_sub.add_parser("arm", help="arm one fault", description=describe_catalogue())
    arm.formatter_class = argparse.RawDescriptionHelpFormatter
    arm.add_argument("type", type=_fault_type, metavar="TYPE")
    arm.add_argument(
        "--json", action="store_true", help="print the server's JSON answer, not one line"
    )
    arm.add_argument("--remaining", type=int)
    arm.add_argument("--probability", type=float)
    arm.add_argument("--reask", action="store_true", default=None, help=COMMON_FIELDS["reask"])
    for name, (kind, doc) in _fault_params().items():
        arm.add_argument("--" + name.replace("_", "-"), type=kind, help=doc)
    arm.add_argument("--session", help="fire only on this X-Chaosllm-Session")
    arm.add_argument("--model", help="fire only on requests for this model")
    arm.add_argument("--path", help="fire only on this endpoint path")
    arm.add_argument("--contains", help="fire only when the last user message holds this text")
    arm.add_argument("--tool", help="fire only when the request offers or the answer calls it")
    arm.add_argument("--turn", type=int, help="fire only on the session's n-th request (from 1)")
    arm.add_argument("--server", help="fire only on requests to this MCP server (/mcp/NAME)")
    for name, kind in SCHEDULE_FIELDS.items():
        arm.add_argument("--" + name.replace("_", "-"), type=kind, help=COMMON_FIELDS[name])
    profile = fault_sub.add_parser("profile", help="arm a fault profile")
    profile.add_argument("name", metavar="NAME|FILE")
    listing = fault_sub.add_parser("list", help="armed faults and fired history")
    clear = fault_sub.add_parser("clear", help="disarm all faults (or one by id)")
    clear.add_argument("id", nargs="?", help="a fault id: flt_3, #3 or 3")
    for action in (profile, listing, clear):
        action.add_argument("--json", action="store_true", help="print the server's JSON answer")
    for action in (arm, profile, listing, clear):
        # as users type them: `chaosllm fault arm http_503 --url U` as well as before ACTION
        _server_options(action, suppress=True)

    probe = sub.add_parser(
        "probe",
        help="run a client program once per fault: a resilience matrix",
        description="Run CMD once without faults, then once per fault (on its first JSON "
        "request and on its first streaming request; with --variants session, on "
        "its WebSocket session turns, the server serving TLS that CMD trusts "
        "through SSL_CERT_FILE), each against a fresh "
        "server with OPENAI_BASE_URL set, and classify each run: recovered, "
        "failed cleanly, hung, wrong answer, not fired.",
    )
    probe.add_argument("--types", metavar="T1,T2", help="fault types (default: all)")
    probe.add_argument("--profile", metavar="NAME|FILE", help="the faults of a profile")
    probe.add_argument(
        "--variants",
        default="json,stream",
        metavar="json,stream",
        help="json, stream (the default), session (live clients: the session faults)",
    )
    probe.add_argument(
        "--timeout",
        type=float,
        default=20.0,
        help="seconds before a run counts as hung (default 20)",
    )
    probe.add_argument("--jobs", type=int, default=1, help="runs in parallel (default 1)")
    probe.add_argument("--recordings", action="append", type=Path, metavar="DIR")
    probe.add_argument("--seed", type=int, default=0)
    probe.add_argument("--json", type=Path, metavar="FILE", help="write the report as JSON")
    probe.add_argument("--html", type=Path, metavar="FILE", help="write an HTML report")
    probe.add_argument(
        "--junit", type=Path, metavar="FILE", help="write JUnit XML (one test case per cell)"
    )
    probe.add_argument(
        "--baseline",
        type=Path,
        metavar="FILE",
        help="an earlier --json report: print what changed, exit 1 if any cell got worse",
    )
    probe.add_argument(
        "--strict", action="store_true", help="exit 1 if any run hung or gave a wrong answer"
    )
    probe.add_argument("program", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS]")

    ls = sub.add_parser("ls", help="list recordings")
    ls.add_argument(
        "dirs",
        nargs="*",
        type=Path,
        metavar="DIR",
        help="recordings directories (default: the shipped ones)",
    )
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.add_argument(
        "--provider",
        metavar="NAME",
        help="only this provider's recordings (openai.chat, anthropic.messages, ...)",
    )

    doctor = sub.add_parser(
        "doctor",
        help="check recordings directories",
        description="Parse every recording and fixture (any format chaosllm reads) and "
        "report unreadable files and files of unknown format, stale or "
        "conflicting digests, duplicates, orphan tool calls, recordings that "
        "would never match, structured answers that break their schema, and "
        "unredacted secrets. Exit status 1 on errors.",
    )
    doctor.add_argument(
        "dirs",
        nargs="*",
        type=Path,
        metavar="DIR",
        help="recordings directories (default: the shipped ones)",
    )
    doctor.add_argument("--json", action="store_true", help="print JSON")
    doctor.add_argument("--strict", action="store_true", help="warnings fail too")

    stdio = sub.add_parser(
        "mcp-stdio",
        help="bridge an MCP server over stdio: record it, or replay and break it",
        description="Speak MCP's stdio transport to the agent. With -- CMD...: launch the "
        "server command, proxy every message and record each request and its answer. With "
        "--replay (no command): answer from --recordings, with the faults of --faults.",
    )
    stdio.add_argument("--name", required=True, help="the server's name (/mcp/NAME)")
    stdio.add_argument("--recordings", action="append", type=Path, metavar="DIR", default=[])
    stdio.add_argument("--replay", action="store_true", help="answer from the recordings")
    stdio.add_argument("--record-dir", type=Path, metavar="DIR", help="where recordings go")
    stdio.add_argument("--record-scenario", default="mcp-stdio", metavar="NAME")
    stdio.add_argument("--faults", type=Path, metavar="FILE", help="fault specs (JSON)")
    stdio.add_argument("--seed", type=int, default=0)
    stdio.add_argument("--session", help="the chaosllm session its requests belong to")
    stdio.add_argument("--journal", type=Path, metavar="FILE", help="write the journal here")
    stdio.add_argument(
        "server_command", nargs=argparse.REMAINDER, metavar="CMD", help="-- CMD ARGS..."
    )

    importer = sub.add_parser(
        "import",
        help="convert other fixture formats to chaosllm recordings",
        description="Convert hash-keyed fixture directories, trace fixtures or VCR.py "
        "cassettes (a file or a directory) into native recordings under DEST. "
        "Each format can also be served as it is with --recordings.",
    )
    importer.add_argument(
        "format", choices=IMPORTABLE, metavar="FORMAT", help="one of: " + ", ".join(IMPORTABLE)
    )
    importer.add_argument("src", type=Path, metavar="SRC")
    importer.add_argument("dest", type=Path, metavar="DEST")
    importer.add_argument(
        "--force", action="store_true", help="overwrite recordings that exist in DEST"
    )
    return parser


def _mcp_stdio(args: argparse.Namespace) -> int:
    from chaosllm import mcp_stdio

    command = list(args.server_command)
    if command[:1] == ["--"]:
        command = command[1:]
    if args.replay == bool(command):
        print("chaosllm: mcp-stdio takes --replay or -- CMD..., one of them", file=sys.stderr)
        return 2
    if args.replay:
        faults = json.loads(args.faults.read_text()) if args.faults else None
        engine = mcp_stdio.replay_engine(args.recordings, seed=args.seed, faults=faults)
        mcp_stdio.Bridge(engine, args.name, sys.stdout, session=args.session).run(sys.stdin)
        if args.journal is not None:
            _write_journal(engine, args.journal)
        return 0
    record_dir = args.record_dir or (args.recordings[0] if args.recordings else None)
    if record_dir is None:
        print("chaosllm: mcp-stdio needs --record-dir DIR (or --recordings DIR)", file=sys.stderr)
        return 2
    from chaosllm.store.redact import Redactor
    from chaosllm.store.writer import RecordingWriter

    secrets = secrets_from_env()
    writer = RecordingWriter(record_dir, redactor=Redactor(secrets))
    breaker = None
    if args.faults is not None or args.journal is not None:
        armed = json.loads(args.faults.read_text()) if args.faults else []
        breaker = mcp_stdio.record_engine(args.seed, armed, secrets=secrets)
    recorder = mcp_stdio.Recorder(
        command,
        args.name,
        writer,
        args.record_scenario,
        sys.stdout,
        engine=breaker,
        session=args.session,
    )
    code = recorder.run(sys.stdin)
    if breaker is not None and args.journal is not None:
        _write_journal(breaker, args.journal)
    return code


def _write_journal(engine: Any, path: Path) -> None:
    lines = [json.dumps(e.to_json()) for e in engine.journal.entries(None)]
    path.write_text("".join(f"{line}\n" for line in lines))


def _doctor(args: argparse.Namespace) -> int:
    from chaosllm.doctor import diagnose  # what `serve` never needs is imported when used

    report = diagnose(args.dirs or [shipped_dir("recordings")])
    print(json.dumps(report.to_json(), indent=2) if args.json else report.render())
    return 0 if report.ok(strict=args.strict) else 1


def _import(args: argparse.Namespace) -> int:
    from chaosllm.store.formats.importer import import_recordings

    result = import_recordings(args.format, args.src, args.dest, overwrite=args.force)
    for error in result.errors:
        print(f"chaosllm: error: {error}", file=sys.stderr)
    for path in result.existing:
        print(f"chaosllm: {path} exists: left alone (--force overwrites)", file=sys.stderr)
    print(
        f"imported {len(result.written)} recordings ({args.format}) from {args.src} "
        f"into {args.dest}"
    )
    return 1 if result.errors or result.existing else 0


def _named_url(text: str) -> tuple[str, str]:
    """``NAME=URL`` (``--mcp-upstream``)."""
    name, _, url = text.partition("=")
    if not name or not url.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"expected NAME=http(s)://HOST[:PORT]/PATH, got {text!r}")
    return name, url


def _arm_spec(args: argparse.Namespace) -> dict[str, object]:
    """The fault spec `chaosllm fault arm` sends: every flag given (the server refuses a
    parameter the type does not take, with the list of those it does)."""
    spec: dict[str, object] = {"type": args.type}
    for name in ("remaining", "probability", "reask", *SCHEDULE_FIELDS, *_fault_params()):
        if getattr(args, name) is not None:
            spec[name] = getattr(args, name)
    match = {
        k: getattr(args, k)
        for k in ("session", "model", "path", "contains", "tool", "turn", "server")
        if getattr(args, k) is not None
    }
    if match:
        spec["match"] = match
    return spec


def _fault(args: argparse.Namespace) -> int:
    import httpx  # only this command needs an HTTP client: not imported at start-up

    headers = {"authorization": f"Bearer {args.token}"} if args.token else {}
    base = args.url.rstrip("/")
    try:
        with httpx.Client(base_url=base, headers=headers, timeout=10.0) as client:
            if args.fault_command == "arm":
                response = client.post("/__fault", json=_arm_spec(args))
            elif args.fault_command == "profile":
                path = Path(args.name)
                if path.suffix == ".json" and path.is_file():
                    response = client.post(
                        "/__profile",
                        content=path.read_bytes(),
                        headers={"content-type": "application/json"},
                    )
                else:
                    response = client.post("/__profile", json={"profile": args.name})
            elif args.fault_command == "list":
                response = client.get("/__fault")
            else:
                fault_id = _fault_id(args.id) if args.id else None
                response = client.delete(f"/__fault/{fault_id}" if fault_id else "/__fault")
    except httpx.HTTPError as exc:
        print(f"chaosllm: cannot reach the server at {base}: {exc}", file=sys.stderr)
        return 1
    try:
        payload = response.json()
    except ValueError:
        payload = {"raw": response.text}
    if response.is_error:
        message = payload.get("error", {}).get("message") if isinstance(payload, dict) else None
        # The first sentence says what is wrong; the rest (the catalogue) is --help's.
        first = str(message or payload).split("\n", 1)[0].split(". ", 1)[0].rstrip(".")
        named = re.match(r"(\w+) has no parameter", first)
        if named and named[1] in FAULT_TYPES:
            takes = ", ".join(FAULT_TYPES[named[1]].params) or "no parameters"
            first += f"; {named[1]} takes {takes}"
        print(f"chaosllm: error: {first} ({response.status_code} from {base})", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(payload, indent=2))
    elif args.fault_command == "list":
        if not payload["armed"] and not payload["fired"]:
            print("no faults armed, none fired since the last reset")
        for fault in payload["armed"]:
            print(
                f"armed {fault['id']:<8} {fault['type']:<20} remaining={fault['remaining']} "
                + json.dumps(
                    {
                        k: v
                        for k, v in fault.items()
                        if k not in ("id", "type", "remaining", "armed_at", "fired")
                    }
                )
            )
        for fired in payload["fired"]:
            print(
                f"fired {fired['id']:<8} {fired['type']:<20} request={fired['request_seq']} "
                f"session={fired['session']}"
            )
    elif args.fault_command == "clear":
        count = payload.get("disarmed", 0)
        print(f"disarmed {count} fault{'s' if count != 1 else ''}")
    else:
        if args.fault_command == "profile":
            print(f"armed profile {payload.get('profile')}: {len(payload['faults'])} faults")
        for fault in payload["faults"]:
            print("armed " + _one_line(fault))
    return 0


_NOT_SHOWN = ("id", "type", "fired", "armed_at", "seen", "remaining")


def _one_line(fault: dict[str, Any]) -> str:
    """``connection_reset#3 (after_chunks=2, remaining=1)``: an armed fault as the server
    holds it, its defaults left out."""
    shown = [
        f"{name}={json.dumps(value) if isinstance(value, (dict, list, str)) else value}"
        for name, value in fault.items()
        if name not in _NOT_SHOWN
        and value is not None
        and not (name == "probability" and value == 1.0)
    ]
    shown.append(f"remaining={fault.get('remaining')}")
    number = str(fault.get("id", "?")).removeprefix("flt_")
    return f"{fault.get('type')}#{number} ({', '.join(shown)})"


def _fault_id(given: str) -> str:
    """``flt_3``, ``#3`` and ``3`` all name fault ``flt_3`` (the one-line form prints
    ``#3``)."""
    bare = given.lstrip("#")
    return f"flt_{bare}" if bare.isdigit() else given


def _probe(args: argparse.Namespace) -> int:
    from chaosllm.testing.probe import (
        BaselineFailed,
        ProbeRun,
        Verdict,
        compare_reports,
        default_faults,
        load_baseline,
        probe,
        render_html,
        render_junit,
        render_matrix,
    )

    command = list(args.program)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print(
            "chaosllm: probe needs a command: chaosllm probe -- python my_client.py",
            file=sys.stderr,
        )
        return 2
    faults = None
    if args.types:
        names = [t.strip() for t in args.types.split(",") if t.strip()]
        unknown = [n for n in names if n not in FAULT_TYPES]
        if unknown:
            print(
                f"chaosllm: unknown fault type {unknown[0]!r}; valid: {', '.join(FAULT_TYPES)}",
                file=sys.stderr,
            )
            return 2
        faults = default_faults(stall_ms=args.timeout * 2000, types=names)
    baseline = None
    if args.baseline is not None:
        try:
            baseline = load_baseline(args.baseline)
        except BadBaseline as exc:
            print(f"chaosllm: {exc}", file=sys.stderr)
            return 2

    def progress(run: ProbeRun) -> None:
        verdict = run.verdict.value if run.verdict else ""
        print(
            f"  {run.label:<20} {run.variant:<6} {verdict:<15} "
            f"({run.attempts} requests, {run.seconds:.1f} s)",
            file=sys.stderr,
            flush=True,
        )

    try:
        report = probe(
            command,
            faults=faults,
            profile=args.profile,
            variants=[v.strip() for v in args.variants.split(",") if v.strip()],
            timeout=args.timeout,
            jobs=args.jobs,
            recordings=args.recordings,
            seed=args.seed,
            progress=progress,
        )
    except (BaselineFailed, ValueError) as exc:
        print(f"chaosllm: {exc}", file=sys.stderr)
        return 1
    print(render_matrix(report))
    if args.json:
        args.json.write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")
    if args.html:
        args.html.write_text(render_html(report), encoding="utf-8")
    if args.junit:
        args.junit.write_text(render_junit(report), encoding="utf-8")
    regressed = False
    if baseline is not None:
        comparison = compare_reports(baseline, report)
        print()
        print(comparison.render())
        regressed = comparison.regressed
    bad = {Verdict.HUNG, Verdict.WRONG_ANSWER}
    return 1 if regressed or (args.strict and any(r.verdict in bad for r in report.runs)) else 0


def _serve(args: argparse.Namespace) -> int:
    if args.journal_size < 1:
        print("chaosllm: --journal-size must be at least 1", file=sys.stderr)
        return 2
    if args.max_connections < 1:
        print("chaosllm: --max-connections must be at least 1", file=sys.stderr)
        return 2
    if args.fault_history_size < 0:
        print("chaosllm: --fault-history-size must be at least 0", file=sys.stderr)
        return 2
    if args.max_sessions < 1:
        print("chaosllm: --max-sessions must be at least 1", file=sys.stderr)
        return 2
    if args.max_faults < 1:
        print("chaosllm: --max-faults must be at least 1", file=sys.stderr)
        return 2
    if args.memo_bytes < 0:
        print("chaosllm: --memo-bytes must be at least 0", file=sys.stderr)
        return 2
    if not 0.0 <= args.nearest_threshold <= 1.0:
        print("chaosllm: --nearest-threshold must be within 0 and 1", file=sys.stderr)
        return 2
    try:
        rate_limit = parse_rate_limit(args.rate_limit) if args.rate_limit is not None else None
    except ConfigError as exc:
        print(f"chaosllm: --rate-limit: {exc}", file=sys.stderr)
        return 2
    try:
        parse_allow_hosts(args.allow_host)
        parse_cors(args.cors)
    except ConfigError as exc:
        print(f"chaosllm: {exc}", file=sys.stderr)
        return 2
    try:
        dirs, record_dir = proxy_dirs(
            args.mode,
            upstream=args.upstream,
            recordings=args.recordings,
            record_dir=args.record_dir,
            servers=dict(args.mcp_upstream),
        )
    except ValueError as exc:
        print(f"chaosllm: {exc}", file=sys.stderr)
        return 2
    try:
        tls = tls_files(args.tls, args.certfile, args.keyfile)
    except (ServerError, ConfigError) as exc:
        print(f"chaosllm: {exc}", file=sys.stderr)
        return 2
    config = ServerConfig(
        **tls,
        no_audio=args.no_audio,
        recordings=dirs,
        mode=args.mode,
        on_miss=args.on_miss,
        seed=args.seed,
        timing=args.timing[0],
        pace=args.timing[1],
        match_order=args.match,
        nearest_threshold=args.nearest_threshold,
        upstream=args.upstream,
        mcp_upstreams=dict(args.mcp_upstream),
        record_dir=record_dir,
        record_scenario=args.record_scenario,
        scenario_from_session=args.scenario_from_session,
        secrets=[*args.secrets, *secrets_from_env()],
        max_body_bytes=args.max_body_bytes,
        max_connections=args.max_connections,
        control_token=args.control_token,
        allow_hosts=args.allow_host,
        cors=args.cors,
        journal_size=args.journal_size,
        fault_history_size=args.fault_history_size,
        max_sessions=args.max_sessions,
        max_faults=args.max_faults,
        memo_bytes=args.memo_bytes,
        strict=args.strict,
        gateway=args.gateway,
        rate_limit=rate_limit,
    )
    for d in config.recordings:
        if record_dir is not None and Path(d) == record_dir and not Path(d).exists():
            continue  # the recorder makes it
        problem = _not_a_recordings_dir(Path(d))
        if problem:
            print(f"chaosllm: error: {problem}", file=sys.stderr)
            return 2
    profile = None
    if args.profile:
        try:
            profile = load_profile(args.profile)
        except InvalidFaultSpec as exc:
            print(f"chaosllm: error: --profile: {exc}", file=sys.stderr)
            return 2

    if not _is_loopback(args.host) and not args.control_token:
        print(
            f"chaosllm: warning: bound to {args.host} without --control-token: the control "
            f"plane answers loopback clients only",
            file=sys.stderr,
        )
    # The recordings live as long as the process and loading them makes no cycles: no
    # collection walks them before they are frozen out of the collector's sight (the
    # first one after loading 10k would cost start-up a tenth of its time).
    gc.disable()
    try:
        state = ChaosState.from_config(config)
    except ValueError as exc:
        print(f"chaosllm: {exc}", file=sys.stderr)
        return 2
    finally:
        gc.freeze()
        gc.enable()
    if config.mode is not Mode.REPLAY:
        target = f", recording to {record_dir}" if record_dir is not None else ""
        upstream = state.upstream.display if state.upstream else config.upstream
        print(f"chaosllm: {config.mode.value}: proxying to {upstream}{target}", file=sys.stderr)
    _report_loaded(state, config.recordings)
    if _level(args) <= logging.INFO:
        state.access = AccessLog(args.access_lines)
    if profile is not None:
        state.board.arm(profile.specs)
        print(
            f"chaosllm: armed profile {profile.name}: {len(profile.specs)} faults", file=sys.stderr
        )
        if profile.rate_limit is not None and rate_limit is None:  # --rate-limit wins
            state.set_rate_limit(profile.rate_limit)

    def listening(url: str) -> None:
        print(f"chaosllm listening on {url}", flush=True)
        if config.certfile is not None:
            print(f"chaosllm: TLS certificate {config.certfile}", file=sys.stderr, flush=True)

    run_server(
        config,
        host=args.host,
        port=args.port,
        kind=args.server,
        state=state,
        on_listening=listening,
    )
    return 0


def _not_a_recordings_dir(path: Path) -> str | None:
    """Why `path` cannot be a ``--recordings`` directory (None: it can), cause first."""
    if path.is_dir():
        return None
    if path.exists():
        return (
            f"--recordings {path} is a file, not a directory: give the directory that holds "
            f"the recordings (its <scenario>/NNNN.json files)"
        )
    return f"--recordings {path} does not exist: give a directory of recordings"


def _report_loaded(state: ChaosState, dirs: Sequence[Path]) -> None:
    """One line for what was loaded, and a warning naming each directory that holds no
    recording (every request to it would be a miss)."""
    counts = {str(d): 0 for d in dirs}
    for exchange in state.store.exchanges:
        for d in counts:
            if (exchange.source or "").startswith(d.rstrip(os.sep) + os.sep):
                counts[d] += 1
                break
    log = logging.getLogger("chaosllm")
    log.info("loaded %d recordings from %s", len(state.store.exchanges), ", ".join(counts))
    for d, count in counts.items():
        if count == 0:
            log.warning(
                "warning: %s holds no recordings: every request will be a miss (404) "
                "until you record some (--mode record-missing --upstream URL)",
                d,
            )


def _ls(args: argparse.Namespace) -> int:
    from chaosllm.providers import PROVIDERS

    dirs = args.dirs or [shipped_dir("recordings")]
    for d in dirs:
        problem = _not_a_recordings_dir(Path(d))
        if problem:
            print(f"chaosllm: error: {problem.replace('--recordings ', '')}", file=sys.stderr)
            return 2
    from chaosllm.providers.sessions import SESSION_PROTOCOLS
    from chaosllm.store.sessions import SessionStore

    known = [*PROVIDERS, *SESSION_PROTOCOLS]
    if args.provider is not None and args.provider not in known:
        print(
            f"chaosllm: error: unknown provider {args.provider!r}"
            f"{did_you_mean(args.provider, known)}; providers: {', '.join(known)}",
            file=sys.stderr,
        )
        return 2
    store = RecordingStore.load(dirs)
    summary = [
        {**item, "question": _question(exchange)}
        for item, exchange in zip(store.summary(), store.exchanges, strict=True)
        if args.provider is None or item["provider"] == args.provider
    ]
    sessions_store = SessionStore([Path(d) for d in dirs])
    sessions = [
        {
            "name": r.name,
            "provider": r.provider,
            "model": r.model,
            "path": r.path,
            "turns": len(r.turns),
            "events": len(r.events),
            "source": r.source,
        }
        for r in sessions_store.recordings
        if args.provider is None or r.provider == args.provider
    ]
    errors = [*store.errors, *sessions_store.errors]
    if args.json:
        print(
            json.dumps(
                {
                    "recordings": summary,
                    "sessions": sessions,
                    "errors": [*store.error_summary(), *(str(e) for e in sessions_store.errors)],
                },
                indent=2,
            )
        )
    else:
        for item in summary:
            kind = "stream" if item["stream"] else "json"
            question = item["question"]
            asked = repr(question if len(question) <= 60 else question[:57] + "...")
            described = f"  ({item['description']})" if item["description"] else ""
            print(
                f"{item['name']:<26} {item['provider']:<24} {item['model']!s:<26} {kind:<6} "
                f"{item['status']}  {asked if question else '-'}{described}"
            )
        for session in sessions:
            turns = f"{session['turns']} turn" + ("" if session["turns"] == 1 else "s")
            print(
                f"{session['name']:<26} {session['provider']:<24} {session['model']!s:<26} "
                f"{'session':<6} {turns}, {session['events']} events"
            )
        which = f" of provider {args.provider}" if args.provider else ""
        also = f" and {len(sessions)} session recordings" if sessions else ""
        print(f"{len(summary)} recordings{also}{which} in {', '.join(map(str, dirs))}")
        for error in errors:
            print(f"error: {error}", file=sys.stderr)
    return 1 if errors else 0


def _question(exchange: Any) -> str:
    """The last user message of a recorded request: what to ask to get its answer."""
    from chaosllm.providers import PROVIDERS

    provider = PROVIDERS.get(exchange.provider)
    text = provider.faults.last_user_text(exchange.request.body) if provider is not None else None
    return " ".join(text.split()) if text else ""


def _level(args: argparse.Namespace) -> int:
    if getattr(args, "quiet", False):
        return logging.WARNING
    return logging.DEBUG if getattr(args, "verbose", 0) else logging.INFO


class _LogHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The command's log lines on standard error, after the access lines buffered before
    them (`chaosllm.http.access`): the lines keep their order."""

    def __init__(self, lines: LineBuffer) -> None:
        super().__init__(sys.stderr)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.flush()
        super().emit(record)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    lines = LineBuffer(sys.stderr, prefix="chaosllm: ")
    args.access_lines = lines
    handler = _LogHandler(lines)
    handler.setFormatter(logging.Formatter("chaosllm: %(message)s"))
    logger = logging.getLogger("chaosllm")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(_level(args))
    try:
        return _run(args)
    except BrokenPipeError:
        # `chaosllm ls | head -1`: the reader has all it wanted. Point stdout at nothing,
        # so that flushing it at exit raises nothing either.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("chaosllm: interrupted", file=sys.stderr)
        return 130
    finally:
        # main() may run in-process (tests, other tools): leave the logger as it was, so no
        # handler outlives the stderr it was bound to.
        lines.close()
        logger.removeHandler(handler)
        logger.setLevel(level)


def _run(args: argparse.Namespace) -> int:
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "fault":
            return _fault(args)
        if args.command == "probe":
            return _probe(args)
        if args.command == "doctor":
            return _doctor(args)
        if args.command == "import":
            return _import(args)
        if args.command == "mcp-stdio":
            return _mcp_stdio(args)
        return _ls(args)
    except ChaosLLMError as exc:
        print(f"chaosllm: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
