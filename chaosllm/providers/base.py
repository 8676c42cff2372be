"""The shared provider base: what every protocol offers the rest of chaosllm. Pure.

Theory of operation
-------------------
A provider validates and canonicalises requests, renders exchanges into
response plans, renders its own error envelope, checks the conversation a
client sends, and assembles a recorded stream back into a non-stream body.
Faults and the wire layer only see plans, so a new protocol never touches
them.

A provider is a few small parts, each a class with defaults, and a concrete
provider composes them (`Parts`) and writes only what its protocol needs:

- its codec (`chaosllm.providers.codec.Codec`): the request's canonical form
  (validation, the digest, what nearest matching compares, the conversation
  checks), the answer's and the stream's framing (rendering plans, frames on the
  wire, assembling recorded frames), fresh ids, the model list and the fallback;
- its errors (`chaosllm.providers.errors.Errors`): the error envelope, the named
  failure classes, the error and rate-limit headers;
- its fault hooks (`chaosllm.providers.faulthooks.FaultHooks`): how its stream
  ends, its error frame, how its tool-call arguments break, what the pace and
  fault matching read. Only `chaosllm.faults` calls them, there
  (``provider.faults``).

`Provider` itself holds the protocol's name and routes (`paths`,
`path_templates`, `path_params`, `bind`, `upstream_path`), its parts
(``codec``, ``errors``, ``faults``), and one-line delegations for what
`chaosllm.core` asks of a provider. The shared helpers are `text`
(serialisation, text pieces), `failures` (`ErrorKind`, `Failure`), `ids`
(fresh ids) and `sse` (the SSE framing); this module re-exports the names
other layers import from it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Concatenate, Generic, NamedTuple, ParamSpec, TypeVar, overload

from chaosllm.model import JSON
from chaosllm.providers.codec import Codec, FrameSplitting
from chaosllm.providers.errors import Errors
from chaosllm.providers.failures import FAILURE_STATUSES, ErrorKind, Failure, FailureReply
from chaosllm.providers.faulthooks import ArgumentCuts, FaultHooks
from chaosllm.providers.ids import swap_strings
from chaosllm.providers.text import (
    JSON_HEADERS,
    canonical_json,
    cut_json,
    estimated_tokens,
    filtered_blocks,
    filtered_text,
    sha256_digest,
    text_pieces,
    type_name,
)

__all__ = [
    "FAILURE_STATUSES",
    "JSON_HEADERS",
    "ArgumentCuts",
    "Codec",
    "ErrorKind",
    "Errors",
    "Failure",
    "FailureReply",
    "FaultHooks",
    "FrameSplitting",
    "Parts",
    "Provider",
    "canonical_json",
    "cut_json",
    "estimated_tokens",
    "filtered_blocks",
    "filtered_text",
    "sha256_digest",
    "swap_strings",
    "text_pieces",
    "type_name",
]


_TEMPLATE_PARAM = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(:path)?\}")


def _compile_template(template: str) -> re.Pattern[str]:
    """A path template (``{name}``: one segment; ``{name:path}``: anything) as a regex."""
    parts: list[str] = []
    at = 0
    for found in _TEMPLATE_PARAM.finditer(template):
        parts.append(re.escape(template[at : found.start()]))
        span = ".+" if found.group(2) else "[^/]+"
        parts.append(f"(?P<{found.group(1)}>{span})")
        at = found.end()
    parts.append(re.escape(template[at:]))
    return re.compile("".join(parts))


_P = ParamSpec("_P")
_R = TypeVar("_R")


class _Delegated(Generic[_P, _R]):
    """A method of one of a provider's parts, called on the provider itself: with
    ``validate = _Delegated("codec", Codec.validate)``, ``provider.validate(body)`` is
    ``provider.codec.validate(body)``, typed as that method is (what `chaosllm.core`
    calls on a provider keeps its name there, the part does the work)."""

    def __init__(self, part: str, method: Callable[Concatenate[Any, _P], _R]) -> None:
        self._part = part
        self._name = method.__name__
        self.__doc__ = method.__doc__

    @overload
    def __get__(self, provider: None, owner: type[Provider]) -> _Delegated[_P, _R]: ...

    @overload
    def __get__(self, provider: Provider, owner: type[Provider]) -> Callable[_P, _R]: ...

    def __get__(
        self, provider: Provider | None, owner: type[Provider]
    ) -> _Delegated[_P, _R] | Callable[_P, _R]:
        if provider is None:
            return self
        method: Callable[_P, _R] = getattr(getattr(provider, self._part), self._name)
        return method


class Parts(NamedTuple):
    """The part classes a provider composes: one instance of each per provider."""

    codec: type[Codec]
    errors: type[Errors]
    faults: type[FaultHooks]


class Provider:
    """One protocol: its name, its routes and its parts. Subclasses set `name`, `paths`
    (or `path_templates`) and `parts`; `chaosllm.providers.PROVIDERS` holds one instance
    of each."""

    name: ClassVar[str]
    """Recording `provider` field, e.g. ``openai.chat``."""
    paths: ClassVar[tuple[str, ...]] = ()
    """The request paths it serves (``POST``); routes and the wire's envelope use them."""
    path_templates: ClassVar[tuple[str, ...]] = ()
    """Request paths with parameters it serves (``POST``), e.g.
    ``/v1beta/models/{model}:generateContent``: ``{name}`` is one path segment,
    ``{name:path}`` any run of characters, slashes too (Starlette's syntax, so the ASGI
    app routes them as they are). What the path and the query carry is folded into the
    request by `bind`."""
    methods: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    """The methods of the paths (or templates) served otherwise than by ``POST`` (a
    stored response is fetched with ``GET``)."""
    bodiless: ClassVar[bool] = False
    """Whether its requests may carry no body (the path and the query say it all): an
    empty body is then ``{}``."""
    client_header: ClassVar[str | None] = None
    """A request header only this protocol's SDK sends (how a shared endpoint such as
    ``GET /v1/models`` tells the protocol asking)."""
    model_protocol: ClassVar[bool] = True
    """Whether it serves models (False: an MCP server, `MODEL_PROVIDERS` leaves it out)."""
    call_headers: ClassVar[frozenset[str]] = frozenset()
    """Request headers (lower case) the protocol reads: the adapters pass them in the
    call, and `bind_headers` folds them in (MCP's ``Accept``, ``Mcp-Session-Id``)."""
    parts: ClassVar[Parts]
    """Its codec, errors and fault hooks (the classes; `__init__` makes one of each)."""

    codec: Codec
    errors: Errors
    faults: FaultHooks

    def __init__(self) -> None:
        self.codec = self.parts.codec()
        self.errors = self.parts.errors(self.codec)
        self.faults = self.parts.faults(self.codec, self.errors)
        self._templates = tuple(_compile_template(t) for t in self.path_templates)

    # -- routes -----------------------------------------------------------------------

    def path_params(self, path: str) -> dict[str, str] | None:
        """The parameters of `path` if one of `path_templates` matches it, else None."""
        for pattern in self._templates:
            found = pattern.fullmatch(path)
            if found is not None:
                return found.groupdict()
        return None

    def methods_of(self, path: str) -> tuple[str, ...]:
        """The methods a path (or template) of `paths`/`path_templates` is served by."""
        return self.methods.get(path, ("POST",))

    def bind(self, body: JSON, params: Mapping[str, str], query: str) -> JSON:
        """The request as chaosllm keys, matches and records it: the client's body with what
        the path (`params`) and the query string say about the answer folded in (the
        model a Gemini path names, the deployment of an Azure one, whether a stream is
        asked for), for a provider with `path_templates`. Secrets in the query (``key=``)
        are never folded in. Raises `InvalidRequest` for a path or query the real API
        refuses. The body itself by default."""
        return body

    def bind_headers(
        self,
        body: JSON,
        params: Mapping[str, str],
        query: str,
        headers: Sequence[tuple[str, str]],
    ) -> JSON:
        """`bind` for a protocol whose `call_headers` say something about the answer too
        (`headers`: those of the request); `bind` by default."""
        return self.bind(body, params, query)

    def upstream_path(self, path: str) -> str:
        """The path the recording proxy sends upstream for a (decoded) request path: the
        path as the SDK encoded it where that matters (a signed request's path is part of
        its signature: Bedrock's model ids are percent-encoded); itself by default."""
        return path

    # -- what chaosllm.core asks, delegated to the parts ------------------------------

    validate = _Delegated("codec", Codec.validate)
    canonical = _Delegated("codec", Codec.canonical)
    digest = _Delegated("codec", Codec.digest)
    wants_stream = _Delegated("codec", Codec.wants_stream)
    model_of = _Delegated("codec", Codec.model_of)
    render = _Delegated("codec", Codec.render)
    render_key = _Delegated("codec", Codec.render_key)
    served_answer = _Delegated("codec", Codec.served_answer)
    estimated = _Delegated("codec", Codec.estimated)
    journal_fields = _Delegated("codec", Codec.journal_fields)
    fresh_ids = _Delegated("codec", Codec.fresh_ids)
    id_template = _Delegated("codec", Codec.id_template)
    recorded_ids = _Delegated("codec", Codec.recorded_ids)
    assemble = _Delegated("codec", Codec.assemble)
    fallback = _Delegated("codec", Codec.fallback)
    conversation_findings = _Delegated("codec", Codec.conversation_findings)
    has_system_prompt = _Delegated("codec", Codec.has_system_prompt)
    error_body = _Delegated("errors", Errors.error_body)
    error_headers = _Delegated("errors", Errors.error_headers)
    rate_limit_headers = _Delegated("errors", Errors.rate_limit_headers)
    render_error = _Delegated("errors", Errors.render_error)
