"""``chaosllm doctor``: what is wrong with a recordings directory, before a test finds out.

`diagnose` reads every file the server would load (native recordings and the
other formats of `chaosllm.store.formats`) and reports, per file:

=====================  ========  ===========================================================
check                  severity  what it means
=====================  ========  ===========================================================
unreadable             error     the file cannot be parsed (bad JSON/YAML, a malformed
                                 recording, fixture, trace or cassette)
unknown_format         error     a ``.json``/``.yaml`` file in none of the formats
stale_digest           error     the digest written in the file conflicts with the one its
                                 request hashes to (for a hash-keyed fixture:
                                 ``request_digest`` is not the file name)
duplicate              warning   the same request recorded more than once with the same
                                 answer: all but the first are dead weight
ambiguous              warning   the same request recorded in several scenarios with
                                 different answers: which one is served depends on the
                                 active scenario and on order
orphan_tool_call       error     a recorded conversation has a tool call no tool message
                                 answers (or a tool message answering none, or null tool
                                 content), or a trace step's expected_tool_results answer
                                 no earlier call; a warning when a trace turn ends on a
                                 tool_calls step (fine when the agent stops there)
never_matches          error     a recording no request can reach: its request is one the
                                 server refuses before matching (invalid for the provider,
                                 an unknown endpoint), or it holds a key-shaped secret that
                                 incoming requests are redacted of before keying
schema_mismatch        error     a structured answer that does not match its own request's
                                 ``json_schema`` (replay refuses it: re-record it)
malformed_tool_args    warning   an answer's tool-call arguments are not valid JSON
unredacted_secret      error     a string shaped like an API key, or a credential header
                                 with a value, is stored in the file (not: a filter's
                                 placeholder such as vcrpy's ``AUTHORIZATION-XXX``, the
                                 ``openai-organization``/``openai-project`` ids, Cloudflare's
                                 bot-management cookies)
model_name_clash       warning   two traces answer as one ``model_name``: a request for it
                                 cannot choose one without ``POST /__scenario``
=====================  ========  ===========================================================

Exit status of the command: 1 when there is an error (or, with ``--strict``, a
warning), else 0.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaosllm.core.structured import answer_schema_problem
from chaosllm.errors import InvalidRequest, RecordingError, UnknownFormat
from chaosllm.faults.catalogue import MALFORMED_TOOL_ARGS
from chaosllm.model import JSON, Exchange, Keying
from chaosllm.providers import PROVIDERS
from chaosllm.store.formats import FORMATS, NATIVE, parse_data, read_data, recording_files
from chaosllm.store.redact import KEY_PATTERNS, REDACTED, SECRET_HEADERS, Redactor

__all__ = ["CHECKS", "Problem", "Report", "diagnose"]

CHECKS = (
    "unreadable",
    "unknown_format",
    "stale_digest",
    "duplicate",
    "ambiguous",
    "orphan_tool_call",
    "never_matches",
    "schema_mismatch",
    MALFORMED_TOOL_ARGS.name,  # the recording already has the damage that fault injects
    "unredacted_secret",
    "model_name_clash",
)

_KEY = re.compile("|".join(KEY_PATTERNS))
_PAIRING = ("orphan_tool_call", "orphan_tool_result", "null_tool_content")


@dataclass(frozen=True, slots=True)
class Problem:
    severity: str
    """``error`` or ``warning``."""
    check: str
    path: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {
            "severity": self.severity,
            "check": self.check,
            "path": self.path,
            "message": self.message,
        }


@dataclass
class Report:
    dirs: list[str]
    files: int = 0
    recordings: int = 0
    sessions: int = 0
    """Session recordings (WebSocket) among the files."""
    problems: list[Problem] = field(default_factory=list)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "warning"]

    def ok(self, *, strict: bool = False) -> bool:
        return not self.errors and not (strict and self.warnings)

    def to_json(self) -> dict[str, Any]:
        return {
            "dirs": self.dirs,
            "files": self.files,
            "recordings": self.recordings,
            "sessions": self.sessions,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "problems": [p.to_json() for p in self.problems],
        }

    def render(self) -> str:
        lines = [f"{p.severity:<7} {p.path}: [{p.check}] {p.message}" for p in self.problems]
        sessions = f", {self.sessions} session recordings" if self.sessions else ""
        lines.append(
            f"doctor: {self.files} files, {self.recordings} recordings{sessions} in "
            f"{', '.join(self.dirs)}: {len(self.errors)} errors, "
            f"{len(self.warnings)} warnings"
        )
        return "\n".join(lines)


def _mask(secret: str) -> str:
    return f"{secret[:6]}...{secret[-4:]}" if len(secret) > 12 else secret[:3] + "..."


def _secret_problems(path: str, text: str, data: JSON) -> list[Problem]:
    problems = []
    for match in _KEY.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        problems.append(
            Problem(
                "error",
                "unredacted_secret",
                path,
                f"line {line}: a string shaped like an API key "
                f"({_mask(match.group(0))}) is stored: redact it "
                f"({REDACTED}) and rotate the key",
            )
        )
    for where, value in _credential_headers(data, "$"):
        problems.append(
            Problem(
                "error",
                "unredacted_secret",
                path,
                f"{where}: the credential header holds a value "
                f"({_mask(value)}): remove it or filter it when recording "
                f"(vcrpy: filter_headers=['authorization'])",
            )
        )
    return problems


_IDENTIFIER_HEADERS = frozenset({"openai-organization", "openai-project"})
"""Headers that name an account (``org-...``, ``proj_...``): identifiers, not credentials
(the API sends them back in every response)."""

_PLACEHOLDER = re.compile(
    r"\A\s*(?:(?:Bearer|Basic|Token)\s+)?"
    r"(?:[A-Z0-9_-]*(?:XXX|REDACTED|FILTERED|DUMMY|PLACEHOLDER)[A-Z0-9_-]*|<[^<>]*>|\*+)\s*\Z"
)
"""What a recording filter writes instead of a credential (vcrpy's ``filter_headers``
replacements such as ``AUTHORIZATION-XXX``, ``<API_KEY>``, ``***``)."""

_CLOUDFLARE_COOKIES = frozenset(
    {"__cf_bm", "_cfuvid", "__cflb", "__cfruid", "__cfseq", "cf_clearance", "__cfwaitingroom"}
)
"""Cookies Cloudflare sets on any API response (bot management, load balancing)."""


def _cloudflare_cookie(value: str) -> bool:
    """Whether a (set-)cookie header only holds Cloudflare's own cookies."""
    if value.lstrip().lower().startswith(("set-cookie:", "cookie:")):
        value = value.split(":", 1)[1]
    names = [
        part.split("=", 1)[0].strip()
        for part in re.split(r"[;,]\s*(?=[^;,=\s]+=)", value)
        if "=" in part
    ]
    attributes = {"path", "expires", "domain", "max-age", "samesite", "secure", "httponly"}
    cookies = [n for n in names if n.lower() not in attributes]
    return bool(cookies) and all(n in _CLOUDFLARE_COOKIES for n in cookies)


def _not_a_secret(header: str, value: str) -> bool:
    if header in _IDENTIFIER_HEADERS or _PLACEHOLDER.search(value):
        return True
    return header in ("cookie", "set-cookie") and _cloudflare_cookie(value)


def _credential_headers(data: JSON, where: str) -> Iterable[tuple[str, str]]:
    if isinstance(data, dict):
        for key, value in data.items():
            at = f"{where}.{key}"
            if isinstance(key, str) and key.lower() in SECRET_HEADERS:
                for item in value if isinstance(value, list) else [value]:
                    if (
                        isinstance(item, str)
                        and item.strip()
                        and REDACTED not in item
                        and not _KEY.search(item)  # key shapes are reported already
                        and not _not_a_secret(key.lower(), item)
                    ):
                        yield at, item
            else:
                yield from _credential_headers(value, at)
    elif isinstance(data, list):
        for i, item in enumerate(data):
            yield from _credential_headers(item, f"{where}[{i}]")


def _one_of_a_run(exchange: Exchange) -> bool:
    """Whether the exchange is one of the several a file holds (a trace's step, a
    cassette's call: `FixtureFormat.holds_run`), so that its problems name it."""
    entry = FORMATS.get(str(exchange.meta.get("format", NATIVE)))
    return exchange.keyed_by == Keying.SEQUENCE or (entry is not None and entry.holds_run)


def _exchange_problems(exchange: Exchange) -> list[Problem]:
    path = exchange.source or exchange.name
    where = f"{exchange.name}: " if _one_of_a_run(exchange) else ""
    problems: list[Problem] = []
    provider = PROVIDERS[exchange.provider]
    if (
        exchange.stored_digest is not None
        and exchange.stored_digest != exchange.digest
        and exchange.keyed_by != Keying.SEQUENCE  # a step's digest names it, keys nothing
        # Written before its protocol folded an equivalent form: its request's digest as
        # written or folded then, and keyed now by the folded one (no rewrite needed).
        and not (
            exchange.keyed_by == Keying.REQUEST
            and exchange.stored_digest in provider.codec.earlier_digests(exchange.request.body)
        )
    ):
        if exchange.keyed_by == Keying.HASH_KEYED:
            message = (
                f"the file's request_digest {exchange.stored_digest[:16]}... conflicts "
                f"with its name ({exchange.digest[:16]}...), which is what it is keyed "
                f"by: rename the file or fix request_digest"
            )
        else:
            message = (
                f"the file's digest {exchange.stored_digest[:16]}... conflicts with its "
                f"request ({exchange.digest[:16]}...): the request was edited after "
                f"recording; re-record it, or fix the digest if the edit is meant"
            )
        problems.append(Problem("error", "stale_digest", path, where + message))
    body = exchange.request.body
    if exchange.keyed_by == Keying.REQUEST:
        paths = (*provider.paths, *provider.path_templates)
        served = exchange.request.path in provider.paths or (
            provider.path_params(exchange.request.path) is not None
        )
        if paths and not served:
            problems.append(
                Problem(
                    "error",
                    "never_matches",
                    path,
                    f"{where}request.path {exchange.request.path!r} is not an endpoint of "
                    f"{provider.name} ({', '.join(paths)})",
                )
            )
        try:
            provider.validate(body)
        except InvalidRequest as exc:
            problems.append(
                Problem(
                    "error",
                    "never_matches",
                    path,
                    f"{where}its request is one the server refuses before matching (400): "
                    f"{exc.message}",
                )
            )
        if Redactor().body(body) != body:
            problems.append(
                Problem(
                    "error",
                    "never_matches",
                    path,
                    f"{where}its request holds a key-shaped secret; incoming requests are "
                    f"redacted before keying, so none can match it",
                )
            )
        for finding in provider.conversation_findings(body):
            if finding.check in _PAIRING:
                problems.append(
                    Problem(
                        "error",
                        "orphan_tool_call",
                        path,
                        f"{where}recorded request: {finding.message}",
                    )
                )
        if exchange.response.status < 400:
            mismatch = answer_schema_problem(body, exchange.response.body)
            if mismatch is not None:
                problems.append(
                    Problem(
                        "error",
                        "schema_mismatch",
                        path,
                        f"{where}the recorded answer {mismatch}: replay refuses it; re-record it",
                    )
                )
    for call in _tool_calls(exchange.response.body):
        arguments = (call.get("function") or {}).get("arguments")
        if isinstance(arguments, str):
            try:
                json.loads(arguments or "{}")
            except json.JSONDecodeError as exc:
                problems.append(
                    Problem(
                        "warning",
                        MALFORMED_TOOL_ARGS.name,
                        path,
                        f"{where}tool call {call.get('id')!r} has arguments that are not JSON "
                        f"({exc.msg}): fine if recorded on purpose",
                    )
                )
    return problems


def _tool_calls(answer: JSON) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    if isinstance(answer, dict):
        for choice in answer.get("choices") or ():
            message = choice.get("message") if isinstance(choice, dict) else None
            if isinstance(message, dict) and isinstance(message.get("tool_calls"), list):
                calls.extend(c for c in message["tool_calls"] if isinstance(c, dict))
    return calls


def _trace_problems(steps: Sequence[Exchange]) -> list[Problem]:
    """The tool results a trace step expects must answer calls an earlier step made, and
    a step that follows tool calls in its turn should expect their results when it lists
    any. A turn may end on a tool_calls step (an approval denied, an auth gate: the
    agent stops there), as real traces do: a warning only."""
    problems: list[Problem] = []
    made: set[str] = set()
    for i, step in enumerate(steps):
        path = step.source or step.name
        expected = step.meta.get("expected_tool_results")
        if isinstance(expected, list):
            for item in expected:
                call_id = item.get("tool_call_id") if isinstance(item, dict) else None
                if call_id not in made:
                    problems.append(
                        Problem(
                            "error",
                            "orphan_tool_call",
                            path,
                            f"{step.name}: expected_tool_results names tool call {call_id!r}, "
                            f"which no earlier step made",
                        )
                    )
        ids = [c.get("id") for c in _tool_calls(step.response.body)]
        if not ids:
            continue
        made.update(i for i in ids if isinstance(i, str))
        following = steps[i + 1] if i + 1 < len(steps) else None
        turn = step.meta.get("trace", {}).get("turn")
        if following is None or following.meta.get("trace", {}).get("turn") != turn:
            problems.append(
                Problem(
                    "warning",
                    "orphan_tool_call",
                    path,
                    f"{step.name}: the turn ends on a tool_calls step ({', '.join(map(str, ids))}):"
                    f" no later step consumes their results -- fine when the agent stops there "
                    f"(an approval denied, an auth gate)",
                )
            )
            continue
        answered = following.meta.get("expected_tool_results")
        if isinstance(answered, list):
            got = {a.get("tool_call_id") for a in answered if isinstance(a, dict)}
            missing = [i for i in ids if i not in got]
            if missing:
                problems.append(
                    Problem(
                        "warning",
                        "orphan_tool_call",
                        path,
                        f"{following.name}: expected_tool_results has no result for tool call(s) "
                        f"{', '.join(map(str, missing))} of the step before",
                    )
                )
    return problems


def _model_clashes(runs: dict[str, list[Exchange]]) -> list[Problem]:
    """Traces answering as one model_name: a request naming it cannot choose one."""
    by_model: dict[str, list[str]] = {}
    for scenario, steps in runs.items():
        model = steps[0].meta.get("trace", {}).get("model_name")
        if isinstance(model, str):
            by_model.setdefault(model, []).append(scenario)
    problems: list[Problem] = []
    for model, scenarios in by_model.items():
        if len(scenarios) < 2:
            continue
        files = [runs[s][0].source or s for s in scenarios]
        for scenario, source in zip(scenarios[1:], files[1:], strict=True):
            problems.append(
                Problem(
                    "warning",
                    "model_name_clash",
                    source,
                    f"trace {scenario} has the model_name {model!r} of {scenarios[0]} "
                    f"({files[0]}): a request for that model cannot choose between them "
                    f"(it gets a 404 saying so) unless it selects one with POST /__scenario; "
                    f"give each trace its own model_name",
                )
            )
    return problems


def _key_problems(exchanges: Sequence[Exchange]) -> list[Problem]:
    groups: dict[tuple[str, str, str], list[Exchange]] = {}
    for exchange in exchanges:
        if exchange.keyed_by != Keying.SEQUENCE:
            key = (exchange.provider, exchange.keyed_by, exchange.digest)
            groups.setdefault(key, []).append(exchange)
    problems: list[Problem] = []
    for (_, _, digest), members in groups.items():
        if len(members) < 2:
            continue
        first = members[0]
        for other in members[1:]:
            if other.response.body == first.response.body:
                problems.append(
                    Problem(
                        "warning",
                        "duplicate",
                        other.source or other.name,
                        f"{other.name} records the same request (digest {digest[:16]}...) with "
                        f"the same answer as {first.name} ({first.source}): delete one",
                    )
                )
            elif other.scenario != first.scenario:
                problems.append(
                    Problem(
                        "warning",
                        "ambiguous",
                        other.source or other.name,
                        f"{other.name} records the same request (digest {digest[:16]}...) as "
                        f"{first.name} ({first.source}) with a different answer, in another "
                        f"scenario: which one is served depends on the active scenario",
                    )
                )
    return problems


def diagnose(dirs: Sequence[Path]) -> Report:
    """Every problem of the recordings directories `dirs` (see the module docstring)."""
    report = Report(dirs=[str(d) for d in dirs])
    exchanges: list[Exchange] = []
    for root in map(Path, dirs):
        if not root.is_dir():
            report.problems.append(Problem("error", "unreadable", str(root), "not a directory"))
            continue
        for path in recording_files(root):
            report.files += 1
            source = str(path)
            try:
                text = path.read_text("utf-8")
                data = read_data(path)
            except (OSError, UnicodeDecodeError) as exc:
                report.problems.append(
                    Problem("error", "unreadable", source, f"cannot read: {exc}")
                )
                continue
            except RecordingError as exc:
                report.problems.append(Problem("error", "unreadable", source, exc.problem))
                continue
            report.problems.extend(_secret_problems(source, text, data))
            try:
                found = parse_data(path, data, root=root)
            except UnknownFormat as exc:
                report.problems.append(Problem("error", "unknown_format", source, exc.problem))
                continue
            except RecordingError as exc:
                report.problems.append(Problem("error", "unreadable", source, exc.problem))
                continue
            for exchange in found:
                report.problems.extend(_exchange_problems(exchange))
            exchanges.extend(found)
    report.recordings = len(exchanges)
    # A trace's steps, whether one file holds them or `chaosllm import` wrote one per file.
    runs: dict[str, list[Exchange]] = {}
    for exchange in exchanges:
        if exchange.keyed_by == Keying.SEQUENCE:
            runs.setdefault(exchange.scenario, []).append(exchange)
    for steps in runs.values():
        report.problems.extend(_trace_problems(steps))
    report.problems.extend(_model_clashes(runs))
    report.problems.extend(_key_problems(exchanges))
    report.problems.extend(_session_problems(report, [Path(d) for d in dirs if Path(d).is_dir()]))
    return report


def _session_problems(report: Report, dirs: Sequence[Path]) -> list[Problem]:
    """The session recordings' (WebSocket): one that cannot be read as a session is an
    error (the replay skips it); one with no turn (no client event that ends one)
    answers nothing, a warning."""
    from chaosllm.store.sessions import SessionStore

    store = SessionStore(dirs)
    report.sessions = len(store.recordings)
    problems = [Problem("error", "bad_session", e.path, e.problem) for e in store.errors]
    for recording in store.recordings:
        if not recording.turns:
            problems.append(
                Problem(
                    "warning",
                    "session_without_turns",
                    recording.source,
                    f"no client event of this {recording.provider} session ends a turn "
                    "(response.create, a turnComplete client content, a tool response): "
                    "it answers nothing",
                )
            )
    return problems
