"""Gemini ``generateContent``: canonical requests, plans, error envelopes, stream assembly.

Theory of operation
-------------------
Gemini names the model and the method in the path, not the body:
``POST /v1beta/models/{model}:generateContent`` and ``:streamGenerateContent``, the
same under ``/v1/models/...`` (what ``google-genai`` calls by default), and Vertex AI's
``/v1/projects/{p}/locations/{l}/publishers/google/models/{m}:...`` (``/v1beta1``, what
``google-genai`` calls with ``vertexai=True``; also without the project, Vertex's
express mode). `bind` folds the path into the request chaosllm keys and records: the
model (``"model"``), whether it streams (``"stream": true``) and how (``"alt": "sse"``
for ``?alt=sse``, else a streamed JSON array). The API key (``key=`` in the query, or
``x-goog-api-key``) is never folded in.

The digest covers what decides the answer (model, contents, systemInstruction,
tools, toolConfig, the structured-output fields of generationConfig, cachedContent)
and nothing of transport or sampling (temperature, maxOutputTokens, the framing), so a
streamed and a non-streamed request hit the same recording.

An answer is a ``GenerateContentResponse``: ``candidates`` (each a ``content`` of
``parts`` -- text, thought text, ``functionCall`` with ``args`` as a JSON object --
with ``finishReason``, ``safetyRatings``...), ``usageMetadata``, ``modelVersion``,
``responseId``. A stream is a sequence of such responses, each one part of the answer:
with ``alt=sse`` one ``data: <json>`` event each (frames end with ``\\r\\n\\r\\n``, as
Google sends them); without, the elements of one JSON array (``[``, ``,\\r\\n`` between
elements, ``]`` at the end). The last response carries ``finishReason``, the candidate's
other fields and the full ``usageMetadata``; the earlier ones the prompt's token count.
Recorded (SSE) frames replay verbatim, or as array elements for a request without
``alt=sse``.

Errors are Google's envelope ``{"error": {"code", "message", "status"}}`` (``status``
the RPC code: ``INVALID_ARGUMENT``, ``RESOURCE_EXHAUSTED``, ``UNAVAILABLE``...), with
``details`` (``google.rpc.BadRequest``, ``google.rpc.ErrorInfo``) on the errors
chaosllm answers itself; mid-stream, the same envelope as one more event.

Faults: the frame that finishes an answer is the one with a ``finishReason`` (or a
blocked prompt's ``promptFeedback``, an error, the array's ``]``). A function call's
``args`` is a JSON object (a ``Struct``) on the wire: Gemini cannot send invalid JSON
arguments; when the model writes a call it cannot parse, it answers
``finishReason: MALFORMED_FUNCTION_CALL`` with the broken call's text in
``finishMessage`` and no ``functionCall`` part. That is ``malformed_tool_args`` here,
JSON and stream alike (the call's arguments cut into invalid JSON text, in the message).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final
from urllib.parse import parse_qs

from chaosllm.errors import InvalidRequest
from chaosllm.model import JSON, RecordedChunk, RecordedResponse, ResponsePlan
from chaosllm.providers import facts, sse
from chaosllm.providers.base import Parts, Provider
from chaosllm.providers.codec import Codec
from chaosllm.providers.conversation import (
    ConversationChecks,
    Finding,
    _doubled_user,
    _missing_system,
)
from chaosllm.providers.embeddings import embed
from chaosllm.providers.equivalence import proto_json_name, proto_json_names, without_defaults
from chaosllm.providers.errors import Errors
from chaosllm.providers.failures import Failure
from chaosllm.providers.faulthooks import ArgumentCuts, FaultHooks
from chaosllm.providers.text import (
    cut_json,
    estimated_tokens,
    filtered_blocks,
    text_pieces,
    type_name,
)

__all__ = [
    "AUX_METHODS",
    "GEMINI_CHECKS",
    "Gemini",
    "batch_embed_answer",
    "count_tokens_answer",
    "embed_answer",
    "gemini_has_system_prompt",
    "model_prefixes",
    "predict_answer",
    "validate_gemini_conversation",
]

GENERATE: Final = "generateContent"
STREAM: Final = "streamGenerateContent"
AUX_METHODS: Final = ("countTokens", "embedContent", "batchEmbedContents", "predict")
"""The other methods of a model path (`chaosllm.http.gemini` answers them)."""

_PREFIXES: Final = (
    "/v1beta/models",
    "/v1/models",
    "/v1beta1/projects/{project}/locations/{location}/publishers/google/models",
    "/v1/projects/{project}/locations/{location}/publishers/google/models",
    "/v1beta1/publishers/google/models",
    "/v1/publishers/google/models",
)


def model_prefixes() -> tuple[str, ...]:
    """The path prefixes a model path starts with (``{model}:<method>`` follows)."""
    return _PREFIXES


ROLES = frozenset({"user", "model", "function"})
_PART_DATA = (
    "text",
    "inlineData",
    "fileData",
    "functionCall",
    "functionResponse",
    "executableCode",
    "codeExecutionResult",
    "inline_data",
    "file_data",
    "function_call",
    "function_response",
)
_BOUND = ("model", "stream", "alt")
"""What `bind` folds into a request: never part of what a client sends."""
_STRUCTURED = frozenset({"responseMimeType", "responseSchema", "responseJsonSchema"})
"""The fields of generationConfig that decide the answer's shape (part of the digest), by
their proto3 JSON name (either spelling is read)."""

_OPAQUE_FIELDS: Final = frozenset(
    {
        "args",
        "response",
        "parametersJsonSchema",
        "responseJsonSchema",
        "default",
        "example",
        "partialArgs",
    }
)
"""Fields whose value is a ``google.protobuf.Struct``/``Value`` (the caller's JSON): their
member names are data, never proto field names."""
_MAP_FIELDS: Final = frozenset({"properties"})
"""Map fields: their keys are the caller's names (a schema's properties)."""

_CALLING_DEFAULTS: Final[Mapping[str, JSON]] = MappingProxyType({"mode": "AUTO"})
"""``FunctionCallingConfig.mode``: "If unspecified, the default value will be set to AUTO"."""
_SYSTEM_DEFAULTS: Final[Mapping[str, JSON]] = MappingProxyType({"role": "user"})
"""``systemInstruction.role``: one Content, whose role "can be left blank or unset"."""

_SSE: tuple[str, Mapping[str, Any]] = ("sse", MappingProxyType({"sse": True}))
_ARRAY: tuple[str, Mapping[str, Any]] = ("json-array", MappingProxyType({"sse": False}))
_ARRAY_HEADERS: Final = (("content-type", "application/json; charset=UTF-8"),)

_FRAME_END: Final = "\r\n\r\n"
_ARRAY_END: Final = "]"

_STATUSES: Mapping[int, str] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
"""The google.rpc code each HTTP status is answered with: the code whose HTTP mapping
(google/rpc/code.proto) is that status."""
_PIECE_WORDS = 4
"""Words per streamed text chunk (Gemini streams a few words to a sentence at a time)."""
CONTEXT_WINDOW: Final = 1_048_576
"""The input token limit the "input token count exceeds" message states (Gemini 2.5's)."""
_HARM_CATEGORIES: Final = (
    "HARM_CATEGORY_SEXUALLY_EXPLICIT",
    "HARM_CATEGORY_HATE_SPEECH",
    "HARM_CATEGORY_HARASSMENT",
    "HARM_CATEGORY_DANGEROUS_CONTENT",
)
_BLOCKED_CATEGORY: Final = "HARM_CATEGORY_DANGEROUS_CONTENT"
"""The category a filtered answer is blocked by."""
_HOSTED_TOOLS: Final = frozenset(
    {"googleSearch", "googleSearchRetrieval", "codeExecution", "urlContext", "google_search"}
)
"""Tools of a request that Google runs (``match.tool`` names them by their key)."""


def rpc_status(status: int) -> str:
    """The google.rpc code name Google's APIs answer an HTTP status with (a status no code
    maps to: ``FAILED_PRECONDITION`` for a 4xx, ``INTERNAL`` for a 5xx)."""
    if status in _STATUSES:
        return _STATUSES[status]
    return "INTERNAL" if status >= 500 else "FAILED_PRECONDITION"


def _fail(message: str, field: str | None = None) -> InvalidRequest:
    return InvalidRequest(message, param=field, code="INVALID_ARGUMENT")


def _tokens(characters: int) -> int:
    """About four characters a token (Google's own rule of thumb for Gemini models)."""
    return math.ceil(characters / 4)


def _texts(value: Any) -> Iterator[str]:
    """Every ``text`` string of a contents-like value (contents, a content, parts)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "text" and isinstance(item, str):
                yield item
            elif isinstance(item, (dict, list)):
                yield from _texts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)


def _payloads(frames: Sequence[str]) -> Iterator[Any]:
    """The JSON payload of each frame: an SSE event's data, or a streamed array's element
    (the ``[``, ``,`` and ``]`` around it removed); frames that are neither are skipped."""
    for frame in frames:
        text = frame.strip()
        if text.startswith("data:"):
            for data in sse.iter_data([frame]):
                try:
                    yield json.loads(data)
                except json.JSONDecodeError:
                    continue
            continue
        text = text.lstrip("[,").rstrip("]").strip()
        if text:
            try:
                yield json.loads(text)
            except json.JSONDecodeError:
                continue


def _finishes(payload: Any) -> bool:
    if not isinstance(payload, dict):
        return False
    if "error" in payload:
        return True
    feedback = payload.get("promptFeedback")
    if isinstance(feedback, dict) and feedback.get("blockReason"):
        return True
    candidates = payload.get("candidates")
    return isinstance(candidates, list) and any(
        isinstance(c, dict) and c.get("finishReason") for c in candidates
    )


def _google_json(payload: JSON) -> str:
    """JSON as Google's servers write it: a space after each colon, none after commas."""
    return json.dumps(payload, separators=(",", ": "), ensure_ascii=False)


def _sse_frame(payload: JSON) -> str:
    return "data: " + _google_json(payload) + _FRAME_END


def _array_frames(payloads: Sequence[str]) -> list[str]:
    """Compact JSON texts as the frames of a streamed JSON array (and its ``]``)."""
    frames = [("[" if i == 0 else ",\r\n") + text for i, text in enumerate(payloads)]
    return [*frames, _ARRAY_END] if frames else ["[", _ARRAY_END]


# -- the conversation (the request-validator oracle) ---------------------------------------


def _contents(body: JSON) -> list[tuple[int, dict[str, Any]]]:
    contents = body.get("contents") if isinstance(body, dict) else None
    if not isinstance(contents, list):
        return []
    return [(i, c) for i, c in enumerate(contents) if isinstance(c, dict)]


def _parts_of(content: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    parts = content.get("parts")
    return [
        p[key]
        for p in (parts if isinstance(parts, list) else [])
        if isinstance(p, dict) and isinstance(p.get(key), dict)
    ]


def _call_key(call: Mapping[str, Any]) -> str:
    return str(call.get("id") or call.get("name"))


def validate_gemini_conversation(body: JSON, *, expects_system: bool = False) -> list[Finding]:
    """The defects of a Gemini request's ``contents``: each ``functionCall`` of a model turn
    needs a ``functionResponse`` (same id, else same name) in the very next turn, and each
    ``functionResponse`` answers a call of the turn right before it; the first turn is the
    user's; the same user text twice in a row is a turn persisted twice."""
    findings: list[Finding] = []
    contents = _contents(body)
    if contents and contents[0][1].get("role", "user") != "user":
        findings.append(
            Finding(
                "role_order",
                "Please ensure that multiturn requests alternate between user and model: the "
                "first content must be the user's.",
                index=contents[0][0],
                param="contents[0].role",
            )
        )
    calls = [_calls_of(content) for _, content in contents]
    for k, (i, content) in enumerate(contents):
        offered = calls[k - 1] if k else {}
        answered = [_call_key(r) for r in _parts_of(content, "functionResponse")]
        findings.extend(_orphan_result(i, key) for key in answered if key not in offered)
        unanswered = {key: None for key in offered if key not in answered}
        if unanswered:
            findings.append(_unanswered(contents[k - 1][0], unanswered))
        if k and _same_user_text(contents[k - 1][1], content):
            findings.append(_doubled_user(f"contents[{i}]", i, f"contents[{i}].parts"))
    if calls and calls[-1]:
        findings.append(_unanswered(contents[-1][0], calls[-1]))
    if expects_system and not gemini_has_system_prompt(body):
        findings.append(_missing_system("systemInstruction"))
    return findings


def _calls_of(content: Mapping[str, Any]) -> dict[str, None]:
    """The calls a model turn makes (by id, else name); none for any other turn."""
    if content.get("role") != "model":
        return {}
    return {_call_key(c): None for c in _parts_of(content, "functionCall")}


def _same_user_text(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    if not before.get("role", "user") == after.get("role", "user") == "user":
        return False
    text = "\n".join(_texts(after.get("parts"))).strip()
    return bool(text) and text == "\n".join(_texts(before.get("parts"))).strip()


def _orphan_result(index: int, key: str) -> Finding:
    message = (
        f"Please ensure that function response turn comes immediately after a function call "
        f"turn: contents[{index}] answers {key!r}, which the turn before it does not call."
    )
    return Finding("orphan_tool_result", message, index=index, param=f"contents[{index}].parts")


def _unanswered(index: int, keys: Mapping[str, None]) -> Finding:
    message = (
        f"Please ensure that function call turn comes immediately before a function response "
        f"turn: the function calls of contents[{index}] ({', '.join(keys)}) have no "
        f"functionResponse in the next turn."
    )
    return Finding("orphan_tool_call", message, index=index, param=f"contents[{index}]")


def gemini_has_system_prompt(body: JSON) -> bool:
    """Whether a Gemini request has a (non-empty) ``systemInstruction``."""
    system = body.get("systemInstruction") if isinstance(body, dict) else None
    if isinstance(system, str):
        return bool(system.strip())
    return bool("".join(_texts(system)).strip())


GEMINI_CHECKS = ConversationChecks(validate_gemini_conversation, gemini_has_system_prompt)


def _member(body: JSON, name: str) -> JSON:
    """A request's top-level field by its lowerCamelCase `name`, or by its original proto
    name (``system_instruction``): proto3 JSON parsers accept both."""
    if not isinstance(body, dict):
        return None
    if name in body:
        return body[name]
    return next((v for k, v in body.items() if proto_json_name(k) == name), None)


def _tool_config(config: JSON) -> JSON:
    """A toolConfig with its functionCallingConfig `without_defaults`, and a config left
    empty by it as none (the default tool configuration)."""
    if not (isinstance(config, dict) and isinstance(config.get("functionCallingConfig"), dict)):
        return config
    calling = without_defaults(config["functionCallingConfig"], _CALLING_DEFAULTS)
    folded = {k: v for k, v in config.items() if k != "functionCallingConfig"}
    if calling:
        folded["functionCallingConfig"] = calling
    return folded or None


_SCHEMA_CHILDREN: Final = frozenset({"items", "anyOf"})
"""A ``Schema``'s members that hold schemas (a schema, or a list of them); its
``properties`` map names to schemas too."""


def _schema_types(schema: JSON) -> JSON:
    """An OpenAPI ``Schema`` (a function's ``parameters``, ``responseSchema``) with every
    ``type`` in upper case: ``Type`` is an enum the API reads in either case (google-genai
    declares it a ``CaseInSensitiveEnum`` and sends ``OBJECT``; the Vercel AI SDK sends
    ``object``), so the two spellings ask for the same schema."""
    if isinstance(schema, list):
        return [_schema_types(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    typed: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str):
            typed[key] = value.upper()
        elif key == "properties" and isinstance(value, dict):
            typed[key] = {name: _schema_types(v) for name, v in value.items()}
        elif key in _SCHEMA_CHILDREN:
            typed[key] = _schema_types(value)
        else:
            typed[key] = value
    return typed


_DECLARED_SCHEMAS: Final = frozenset({"parameters", "response"})
"""A ``FunctionDeclaration``'s OpenAPI schemas."""


def _declaration_types(declaration: JSON) -> JSON:
    """A function declaration with its `_DECLARED_SCHEMAS`' types `_schema_types`."""
    if not isinstance(declaration, dict):
        return declaration
    return {k: _schema_types(v) if k in _DECLARED_SCHEMAS else v for k, v in declaration.items()}


def _declared_types(tools: JSON) -> JSON:
    """Each function declaration of `tools` `_declaration_types`; any other tool as it is."""
    if not isinstance(tools, list):
        return tools
    return [
        {**tool, "functionDeclarations": [_declaration_types(f) for f in declared]}
        if isinstance(tool, dict) and isinstance(declared := tool.get("functionDeclarations"), list)
        else tool
        for tool in tools
    ]


def _config_types(config: JSON) -> JSON:
    """A generationConfig with its ``responseSchema``'s types `_schema_types`."""
    if not (isinstance(config, dict) and "responseSchema" in config):
        return config
    return {**config, "responseSchema": _schema_types(config["responseSchema"])}


class GeminiCodec(Codec):
    """`Gemini`'s codec: its requests' canonical form, its answers' framing."""

    conversation = GEMINI_CHECKS
    turn_key = "contents"

    def validate(self, body: JSON) -> None:
        if not isinstance(body, dict):
            raise _fail("Invalid JSON payload received. Root element must be a message.")
        contents = body.get("contents")
        if contents is None or contents == []:
            raise _fail("* GenerateContentRequest.contents: contents is not specified", "contents")
        if not isinstance(contents, list):
            raise _fail(
                f"Invalid value at 'contents' ({type_name(contents)}): expected a list of Content.",
                "contents",
            )
        for i, content in enumerate(contents):
            where = f"contents[{i}]"
            if not isinstance(content, dict):
                raise _fail(f"Invalid value at '{where}' ({type_name(content)}).", where)
            role = content.get("role")
            if role is not None and role not in ROLES:
                raise _fail(
                    f"Please use a valid role: user, model. (got {role!r} at {where}.role)",
                    f"{where}.role",
                )
            parts = content.get("parts")
            if not isinstance(parts, list) or not parts:
                raise _fail(
                    f"* GenerateContentRequest.{where}.parts: contents.parts must not be empty.",
                    f"{where}.parts",
                )
            for j, part in enumerate(parts):
                if not isinstance(part, dict) or not any(k in part for k in _PART_DATA):
                    raise _fail(
                        f"* GenerateContentRequest.{where}.parts[{j}].data: required oneof "
                        f"field 'data' must have one initialized field",
                        f"{where}.parts[{j}]",
                    )
        for key, types, kind in (
            ("systemInstruction", (dict, str), "Content"),
            ("tools", (list,), "a list of Tool"),
            ("toolConfig", (dict,), "ToolConfig"),
            ("generationConfig", (dict,), "GenerationConfig"),
            ("safetySettings", (list,), "a list of SafetySetting"),
        ):
            if key in body and body[key] is not None and not isinstance(body[key], types):
                raise _fail(
                    f"Invalid value at '{key}' ({type_name(body[key])}): expected {kind}.", key
                )

    def written(self, body: JSON) -> JSON:
        config = _member(body, "generationConfig")
        structured = (
            {k: v for k, v in config.items() if proto_json_name(k) in _STRUCTURED}
            if isinstance(config, dict)
            else {}
        )
        return {
            "model": body.get("model"),
            "contents": [
                {k: v for k, v in c.items() if k in ("role", "parts")} if isinstance(c, dict) else c
                for c in body.get("contents") or []
            ],
            "systemInstruction": _member(body, "systemInstruction"),
            "tools": body.get("tools"),
            "toolConfig": _member(body, "toolConfig"),
            "generationConfig": structured or None,
            "cachedContent": _member(body, "cachedContent"),
        }

    def equivalent(self, written: Any, *, defaults: bool = True, types: bool = True) -> Any:
        """Every field named in proto3 JSON's lowerCamelCase (the API reads
        ``parameters_json_schema`` as ``parametersJsonSchema``), the caller's data
        (arguments, schemas, property names) as it is; ``systemInstruction`` without
        ``role: "user"``; ``functionCallingConfig.mode: "AUTO"`` (the default) as no
        mode, and a toolConfig left empty as none; an OpenAPI schema's ``type`` in
        either case (`_schema_types`)."""
        named: dict[str, Any] = proto_json_names(written, _OPAQUE_FIELDS, _MAP_FIELDS)
        if not defaults:
            return named
        folded = {
            **named,
            "systemInstruction": without_defaults(named["systemInstruction"], _SYSTEM_DEFAULTS),
            "toolConfig": _tool_config(named["toolConfig"]),
        }
        if not types:
            return folded
        return {
            **folded,
            "tools": _declared_types(named["tools"]),
            "generationConfig": _config_types(named["generationConfig"]),
        }

    def earlier_forms(self, written: Any) -> Sequence[Any]:
        """Before the calling mode ``AUTO`` and the system instruction's ``user`` role
        were defaults, and a schema's type was read in either case."""
        return (
            self.equivalent(written, defaults=False),
            self.equivalent(written, types=False),
        )

    def stream_variant(self, body: JSON) -> tuple[str, Mapping[str, Any]]:
        """``alt=sse``: SSE events; without: a streamed JSON array."""
        return _SSE if isinstance(body, dict) and body.get("alt") == "sse" else _ARRAY

    # -- stream framing ---------------------------------------------------------

    def stream_headers(self, options: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
        return sse.SSE_HEADERS if options.get("sse", True) else _ARRAY_HEADERS

    # -- responses --------------------------------------------------------------

    def is_answer(self, body: JSON) -> bool:
        return (
            isinstance(body, dict)
            and "error" not in body
            and ("candidates" in body or "promptFeedback" in body)
        )

    def _recorded_frames(
        self, response: RecordedResponse, options: Mapping[str, Any], request: JSON
    ) -> Sequence[RecordedChunk]:
        """The recorded events, or (no ``alt=sse``) their payloads as array elements."""
        chunks = response.chunks
        assert chunks is not None
        if options.get("sse", True):
            return chunks
        texts = [_google_json(p) for p in _payloads([c.data for c in chunks])]
        frames = _array_frames(texts)
        delays = [c.delay_ms for c in chunks] + [0.0] * (len(frames) - len(chunks))
        return tuple(RecordedChunk(f, d) for f, d in zip(frames, delays, strict=False))

    def stream_frames(self, answer: Mapping[str, Any], *, sse: bool = True) -> list[str]:
        """The frames of `answer` streamed as the API streams it: a response per text piece
        (a few words), per function call and per other part, the last one with the
        finish reason, the candidate's other fields and the full usage."""
        payloads = _stream_payloads(answer)
        if sse:
            return [_sse_frame(p) for p in payloads]
        return _array_frames([_google_json(p) for p in payloads])

    def models_body(self, model_ids: Sequence[str]) -> JSON:
        """Gemini's ``models.list`` shape (what ``google-genai``'s ``models.list`` reads)."""
        return {
            "models": [
                {
                    "name": f"models/{model}",
                    "version": "001",
                    "displayName": model,
                    "description": "A model of chaosllm's recordings.",
                    "inputTokenLimit": 1048576,
                    "outputTokenLimit": 65536,
                    "supportedGenerationMethods": ["generateContent", "countTokens"],
                }
                for model in model_ids
            ]
        }

    # -- assembly ---------------------------------------------------------------

    def assemble(self, frames: Sequence[str]) -> JSON:
        answer: dict[str, Any] = {}
        candidates: dict[int, dict[str, Any]] = {}
        for payload in _payloads(frames):
            if not isinstance(payload, dict):
                continue
            if "error" in payload:
                return payload
            for key, value in payload.items():
                if key != "candidates":
                    answer[key] = value
            for candidate in payload.get("candidates") or []:
                if isinstance(candidate, dict):
                    _merge_candidate(candidates, candidate)
        if candidates or "promptFeedback" not in answer:
            answer = {"candidates": [candidates[i] for i in sorted(candidates)], **answer}
        return answer

    def stream_complete(self, frames: Sequence[str]) -> bool:
        return any(_finishes(p) for p in _payloads(frames))

    # -- fallback ---------------------------------------------------------------

    def fallback(self, body: JSON, digest: str) -> JSON:
        return {
            "candidates": [
                {
                    "content": {
                        "parts": [
                            {
                                "text": f"[chaosllm fallback] No recording matches this "
                                f"request (digest {digest})."
                            }
                        ],
                        "role": "model",
                    },
                    "finishReason": "STOP",
                    "index": 0,
                }
            ],
            "usageMetadata": {
                "promptTokenCount": 0,
                "candidatesTokenCount": 0,
                "totalTokenCount": 0,
            },
            "modelVersion": body.get("model", "") if isinstance(body, dict) else "",
            "responseId": "chaosllm" + digest[:16],
        }


class GeminiErrors(Errors):
    """`Gemini`'s errors: its envelope, its failure classes, its rate-limit headers."""

    codec: GeminiCodec

    def _envelope(
        self, status: int, message: str, kind: str | None, code: str | None, param: str | None
    ) -> dict[str, Any]:
        """``{"error": {"code", "message", "status"}}``; an error chaosllm answers itself
        also names what it is in ``details`` (the field, as ``google.rpc.BadRequest``; its
        code, as ``google.rpc.ErrorInfo``), as Google's own errors do."""
        error: dict[str, Any] = {"code": status, "message": message, "status": rpc_status(status)}
        details: list[dict[str, Any]] = []
        if kind is not None and param is not None:
            details.append(
                {
                    "@type": "type.googleapis.com/google.rpc.BadRequest",
                    "fieldViolations": [{"field": param, "description": message}],
                }
            )
        if kind is not None and code is not None and code != error["status"]:
            details.append(
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": code.upper(),
                    "domain": "chaosllm",
                    "metadata": {"code": code},
                }
            )
        if details:
            error["details"] = details
        return {"error": error}

    def throttled_answer(self, message: str, *, retry_after: float) -> JSON:
        """Google's 429 with the wait as ``google.rpc.RetryInfo`` (``retryDelay``, a
        ``google.protobuf.Duration`` in whole seconds, rounded up as ``Retry-After`` is)."""
        body = self.error_answer(message, status=429)
        delay = {
            "@type": "type.googleapis.com/google.rpc.RetryInfo",
            "retryDelay": f"{math.ceil(retry_after - 1e-9)}s",
        }
        body["error"]["details"] = [*body["error"].get("details", []), delay]
        return body

    # -- the named failure classes ----------------------------------------------

    def failure_status(self, failure: Failure) -> int:
        """A key Google refuses is a 400 ``INVALID_ARGUMENT``, not a 401."""
        return 400 if failure is Failure.KEY_REFUSED else super().failure_status(failure)

    def failure_message(self, failure: Failure, request: JSON) -> str:
        if failure is Failure.CONTEXT_TOO_LONG:
            tokens = CONTEXT_WINDOW + estimated_tokens(request)
            return (
                f"The input token count ({tokens}) exceeds the maximum number of tokens "
                f"allowed ({CONTEXT_WINDOW})."
            )
        if failure is Failure.QUOTA_EXHAUSTED:
            return (
                "You exceeded your current quota, please check your plan and billing details. "
                "For more information on this error, head to: "
                "https://ai.google.dev/gemini-api/docs/rate-limits."
            )
        if failure is Failure.KEY_REFUSED:
            return "API key not valid. Please pass a valid API key."
        if failure is Failure.NO_SUCH_MODEL:
            return (
                f"models/{self.codec.model_of(request)} is not found for API version v1beta, or is "
                f"not supported for generateContent. Call ListModels to see the list of "
                f"available models and their supported methods."
            )
        return "The model is overloaded. Please try again later."

    def _failure_body(self, failure: Failure, message: str, *, status: int) -> JSON:
        """Google's envelope, with the ``details`` Google sends: ``ErrorInfo``
        ``API_KEY_INVALID`` for a refused key, ``QuotaFailure`` and ``Help`` for a spent
        quota."""
        body = self.error_body(status, message)
        details: list[dict[str, Any]] = []
        if failure is Failure.KEY_REFUSED:
            details.append(
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "API_KEY_INVALID",
                    "domain": "googleapis.com",
                    "metadata": {"service": "generativelanguage.googleapis.com"},
                }
            )
        elif failure is Failure.QUOTA_EXHAUSTED:
            details += [
                {
                    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [
                        {
                            "quotaMetric": "generativelanguage.googleapis.com/"
                            "generate_content_paid_tier_input_token_count",
                            "quotaId": "GenerateContentPaidTierInputTokensPerModelPerDay",
                        }
                    ],
                },
                {
                    "@type": "type.googleapis.com/google.rpc.Help",
                    "links": [
                        {
                            "description": "Learn more about Gemini API quotas",
                            "url": "https://ai.google.dev/gemini-api/docs/rate-limits",
                        }
                    ],
                },
            ]
        if details:
            body["error"]["details"] = details
        return body


class GeminiFaults(FaultHooks):
    """`Gemini`'s fault hooks: how its streams end and its answers break."""

    codec: GeminiCodec
    errors: GeminiErrors

    arguments_key = "args"

    # -- what faults need -------------------------------------------------------

    def frame_finishes(self, frame: str) -> bool:
        if frame.strip() == _ARRAY_END:
            return True
        return any(_finishes(p) for p in _payloads([frame]))

    def stream_error_frame(self, message: str, *, status: int) -> bytes:
        return _sse_frame(self.errors.error_answer(message, status=status)).encode("utf-8")

    def framed_error(self, frame: bytes, plan: ResponsePlan, kept: int) -> bytes:
        """In a streamed JSON array (no ``alt=sse``) the error is the array's next element
        (its first: ``[``), and closes the array."""
        if not plan.pieces or not plan.pieces[0].data.lstrip().startswith(b"["):
            return frame
        found = list(_payloads([frame.decode("utf-8", "replace")]))
        if len(found) != 1:
            return frame
        element = ("[" if kept == 0 else ",\r\n") + _google_json(found[0]) + _ARRAY_END
        return element.encode("utf-8")

    def break_argument_deltas(self, frame: bytes, cut: ArgumentCuts) -> bytes | None:
        """A ``functionCall`` comes whole in one response: each is dropped as it passes, and
        the candidate's finishing response says ``MALFORMED_FUNCTION_CALL`` with the first
        call's text cut (kept in ``cut.memo`` till then), as `break_tool_arguments` says;
        a changed response is written again in its own framing (an SSE event or an array
        element)."""
        text = frame.decode("utf-8", "replace") if frame else ""
        start, end = text.find("{"), text.rfind("}")
        try:
            payload = json.loads(text[start : end + 1]) if 0 <= start < end else None
        except ValueError:
            return frame
        if not isinstance(payload, dict):
            return frame
        changed = False
        for candidate in payload.get("candidates") or ():
            if not isinstance(candidate, dict):
                continue
            key = ("candidate", candidate.get("index", 0))
            content = candidate.get("content")
            parts = content.get("parts") if isinstance(content, dict) else None
            calls = [
                p
                for p in parts or ()
                if isinstance(p, dict) and isinstance(p.get("functionCall"), dict)
            ]
            if calls and isinstance(content, dict) and isinstance(parts, list):
                if key not in cut.memo:
                    alone = {"candidates": [{"content": {"parts": calls[:1]}}]}
                    broken = self.break_tool_arguments(alone)
                    assert isinstance(broken, dict)
                    cut.memo[key] = broken["candidates"][0]["finishMessage"]
                kept = [p for p in parts if not any(p is c for c in calls)]
                if kept:
                    content["parts"] = kept
                else:
                    candidate["content"] = {}
                changed = True
            if candidate.get("finishReason") and key in cut.memo:
                candidate["finishReason"] = "MALFORMED_FUNCTION_CALL"
                candidate["finishMessage"] = cut.memo[key]
                changed = True
        if not changed:
            return frame
        return (text[:start] + _google_json(payload) + text[end + 1 :]).encode("utf-8")

    def empty_answer(self, body: JSON) -> JSON:
        """What Gemini answers when the model writes nothing: each candidate a content
        with a role and no parts, ``finishReason: STOP``, no candidate tokens."""
        empty = copy.deepcopy(body)
        for candidate in empty.get("candidates") or []:
            if isinstance(candidate, dict):
                candidate["content"] = {"role": "model"}
                candidate["finishReason"] = "STOP"
                candidate.pop("finishMessage", None)
        usage = empty.get("usageMetadata")
        if isinstance(usage, dict):
            usage.pop("candidatesTokenCount", None)
            usage.pop("thoughtsTokenCount", None)
            usage.pop("candidatesTokensDetails", None)
            usage["totalTokenCount"] = usage.get("promptTokenCount", 0)
        return empty

    def tool_calls(self, answer: Any) -> Iterator[dict[str, Any]]:
        for candidate in answer.get("candidates") or []:
            content = candidate.get("content") if isinstance(candidate, dict) else None
            for part in (content or {}).get("parts") or []:
                if isinstance(part, dict) and isinstance(part.get("functionCall"), dict):
                    yield part["functionCall"]

    # -- what fault matching reads (``match.contains``, ``match.tool``) ---------------

    def last_user_text(self, body: JSON) -> str | None:
        """The text parts (thoughts aside) of the last user content that has any."""
        for _, content in reversed(_contents(body)):
            if content.get("role", "user") != "user":
                continue
            parts = content.get("parts")
            texts = [
                part["text"]
                for part in (parts if isinstance(parts, list) else ())
                if isinstance(part, dict)
                and isinstance(part.get("text"), str)
                and not part.get("thought")
            ]
            if texts:
                return "\n".join(texts)
        return None

    def tool_names(self, body: JSON) -> frozenset[str]:
        """The names of the ``functionDeclarations`` of each tool, and the key of each tool
        Google runs (``googleSearch``, ``codeExecution``...)."""
        tools = body.get("tools") if isinstance(body, dict) else None
        names: set[str] = set()
        for tool in tools if isinstance(tools, list) else ():
            if not isinstance(tool, dict):
                continue
            for key in ("functionDeclarations", "function_declarations"):
                names |= facts.tool_names(tool.get(key))
            names |= {key for key in tool if key in _HOSTED_TOOLS}
        return frozenset(names)

    def filtered_answer(self, answer: JSON) -> JSON | None:
        """``finishReason: "SAFETY"`` with the safety ratings saying which category blocked
        it; each candidate's text cut (`filtered_text`), no function calls."""
        if not self.codec.is_answer(answer):
            return None
        assert isinstance(answer, dict)
        filtered = copy.deepcopy(answer)
        for candidate in filtered.get("candidates") or []:
            if not isinstance(candidate, dict):
                continue
            content = candidate.get("content")
            if isinstance(content, dict):
                content["parts"] = filtered_blocks(
                    content.get("parts"), lambda p: "functionCall" in p, drop_empty=True
                )
            candidate.pop("finishMessage", None)
            candidate["finishReason"] = "SAFETY"
            candidate["safetyRatings"] = [
                {"category": category, "probability": "HIGH", "blocked": True}
                if category == _BLOCKED_CATEGORY
                else {"category": category, "probability": "NEGLIGIBLE"}
                for category in _HARM_CATEGORIES
            ]
        return filtered

    def break_tool_arguments(self, body: JSON) -> JSON | None:
        """``finishReason: MALFORMED_FUNCTION_CALL``, the call's arguments cut into invalid
        JSON in ``finishMessage``, and no ``functionCall`` part (see the module doc)."""
        if not isinstance(body, dict):
            return None
        broken = copy.deepcopy(body)
        found = False
        for candidate in broken.get("candidates") or []:
            content = candidate.get("content") if isinstance(candidate, dict) else None
            parts = (content or {}).get("parts") or []
            calls = [
                p["functionCall"] for p in parts if isinstance(p, dict) and "functionCall" in p
            ]
            if not calls or not isinstance(content, dict):
                continue
            found = True
            call = calls[0]
            args = call.get("args")
            text = cut_json(json.dumps(args, ensure_ascii=False) if args else "")
            kept = [p for p in parts if not (isinstance(p, dict) and "functionCall" in p)]
            if kept:
                content["parts"] = kept
            else:
                candidate["content"] = {}
            candidate["finishReason"] = "MALFORMED_FUNCTION_CALL"
            candidate["finishMessage"] = f"Malformed function call: {call.get('name')}{text}"
        return broken if found else None


class Gemini(Provider):
    """The `gemini.generate_content` provider (Gemini API and Vertex AI model paths)."""

    parts = Parts(GeminiCodec, GeminiErrors, GeminiFaults)

    name = "gemini.generate_content"
    path_templates = tuple(f"{p}/{{model}}:{m}" for p in _PREFIXES for m in (GENERATE, STREAM))
    client_header = "x-goog-api-client"

    # -- routes -----------------------------------------------------------------

    def path_params(self, path: str) -> dict[str, str] | None:
        """The template's parameters, and the method the path calls (``method``)."""
        params = super().path_params(path)
        if params is not None:
            params["method"] = path.rsplit(":", 1)[1]
        return params

    def bind(self, body: JSON, params: Mapping[str, str], query: str) -> JSON:
        if not isinstance(body, dict):
            raise _fail(
                f"Invalid JSON payload received. Expected an object, but got {type_name(body)}.",
            )
        alt = parse_qs(query).get("alt", [""])[-1]
        if alt not in ("", "sse", "json"):
            raise _fail(f"Invalid value at 'alt' ({alt!r}): chaosllm serves json and sse.", "alt")
        bound = {k: v for k, v in body.items() if k not in _BOUND}
        bound["model"] = params.get("model", "").removeprefix("models/")
        if params.get("method") == STREAM:
            bound["stream"] = True
            if alt == "sse":
                bound["alt"] = "sse"
        return bound


def _stream_payloads(answer: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The responses a stream of `answer` is made of (see `Gemini.stream_frames`)."""
    top = {k: v for k, v in answer.items() if k not in ("candidates", "usageMetadata")}
    usage = answer.get("usageMetadata")
    early_usage = None
    if isinstance(usage, dict) and "promptTokenCount" in usage:
        early_usage = {
            "promptTokenCount": usage["promptTokenCount"],
            "totalTokenCount": usage["promptTokenCount"],
        }
    payloads: list[dict[str, Any]] = []

    def response(candidate: dict[str, Any], final: bool) -> dict[str, Any]:
        payload: dict[str, Any] = {"candidates": [candidate]}
        if final and usage is not None:
            payload["usageMetadata"] = usage
        elif early_usage is not None:
            payload["usageMetadata"] = early_usage
        payload.update(top)
        return payload

    candidates = answer.get("candidates") or []
    if not candidates:
        final = {k: v for k, v in answer.items()}
        return [final]
    for candidate in candidates:
        index = candidate.get("index", 0)
        content = candidate.get("content") or {}
        role = content.get("role", "model")
        pieces: list[dict[str, Any]] = []
        for part in content.get("parts") or []:
            if isinstance(part, dict) and isinstance(part.get("text"), str) and part["text"]:
                words = text_pieces(part["text"])
                groups = [
                    "".join(words[i : i + _PIECE_WORDS]) for i in range(0, len(words), _PIECE_WORDS)
                ]
                pieces.append({**part, "text": groups[0]})
                rest = {"thought": True} if part.get("thought") else {}
                pieces.extend({"text": g, **rest} for g in groups[1:])
            else:
                pieces.append(part)
        others = {k: v for k, v in candidate.items() if k not in ("content", "index")}
        for i, part in enumerate(pieces):
            last = i == len(pieces) - 1
            piece: dict[str, Any] = {"content": {"parts": [part], "role": role}}
            if last:
                piece.update(others)
            piece["index"] = index
            payloads.append(response(piece, last))
        if not pieces:
            empty = {**candidate, "content": {k: v for k, v in content.items() if k != "parts"}}
            if "parts" in content:
                empty["content"]["parts"] = []
            payloads.append(response(empty, True))
    return payloads


def _merge_candidate(candidates: dict[int, dict[str, Any]], candidate: Mapping[str, Any]) -> None:
    index = candidate.get("index", 0)
    state = candidates.setdefault(index, {})
    content = candidate.get("content")
    for key, value in candidate.items():
        if key != "content":
            state[key] = value
    if not isinstance(content, dict):
        return
    merged = state.setdefault("content", {})
    for key, value in content.items():
        if key != "parts":
            merged[key] = value
    if "parts" in content:
        parts = merged.setdefault("parts", [])
        for part in content["parts"] or []:
            _merge_part(parts, part)
    # Keys in the order of an answer: content first, index after the candidate's fields.
    ordered = {"content": state.pop("content")}
    ordered.update(state)
    state.clear()
    state.update(ordered)


def _merge_part(parts: list[Any], part: Any) -> None:
    """Append a streamed part: text continuing the text part before it (of the same kind,
    thought or not) joins it; an empty text part adds nothing."""
    if isinstance(part, dict) and isinstance(part.get("text"), str):
        if part["text"] == "" and set(part) <= {"text", "thought"}:
            return
        last = parts[-1] if parts else None
        if (
            isinstance(last, dict)
            and isinstance(last.get("text"), str)
            and bool(last.get("thought")) == bool(part.get("thought"))
        ):
            last["text"] += part["text"]
            last.update({k: v for k, v in part.items() if k not in ("text", "thought")})
            return
    parts.append(copy.deepcopy(part))


# -- the other methods of a model path (pure answers; `chaosllm.http.gemini` serves them) -------


def count_tokens_answer(body: JSON, *, vertex: bool = False) -> dict[str, Any]:
    """``:countTokens``: about four characters a token of every text of the request."""
    if not isinstance(body, dict):
        raise _fail("Invalid JSON payload received. Root element must be a message.")
    request = body.get("generateContentRequest", body)
    characters = sum(len(t) for t in _texts(request if isinstance(request, dict) else {}))
    total = _tokens(characters)
    answer: dict[str, Any] = {
        "totalTokens": total,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": total}],
    }
    if vertex:
        answer["totalBillableCharacters"] = characters
    return answer


def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, dict) or not isinstance(content.get("parts"), list):
        raise _fail(f"* {where}: content is not specified", where)
    return "".join(_texts(content["parts"]))


def _dimensions(request: Mapping[str, Any], default: int) -> int:
    size = request.get("outputDimensionality", default)
    if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= 8192:
        raise _fail(
            f"* outputDimensionality: must be between 1 and 8192 (got {size!r})",
            "outputDimensionality",
        )
    return size


DEFAULT_DIMENSIONS: Final = 768


def embed_answer(body: JSON, model: str) -> dict[str, Any]:
    """``:embedContent``: a deterministic unit vector of the content's text."""
    if not isinstance(body, dict):
        raise _fail("Invalid JSON payload received. Root element must be a message.")
    text = _content_text(body.get("content"), "EmbedContentRequest.content")
    return {"embedding": {"values": embed(model, text, _dimensions(body, DEFAULT_DIMENSIONS))}}


def batch_embed_answer(body: JSON, model: str) -> dict[str, Any]:
    """``:batchEmbedContents``: one `embed_answer` vector per request."""
    requests = body.get("requests") if isinstance(body, dict) else None
    if not isinstance(requests, list) or not requests:
        raise _fail("* BatchEmbedContentsRequest.requests: requests is not specified", "requests")
    embeddings = []
    for i, request in enumerate(requests):
        if not isinstance(request, dict):
            raise _fail(f"Invalid value at 'requests[{i}]'.", f"requests[{i}]")
        where = f"BatchEmbedContentsRequest.requests[{i}].content"
        text = _content_text(request.get("content"), where)
        embeddings.append({"values": embed(model, text, _dimensions(request, DEFAULT_DIMENSIONS))})
    return {"embeddings": embeddings}


def predict_answer(body: JSON, model: str) -> dict[str, Any]:
    """Vertex AI's ``:predict`` for text-embedding models (``instances`` of ``content``)."""
    instances = body.get("instances") if isinstance(body, dict) else None
    if not isinstance(instances, list) or not instances:
        raise _fail("instances is not specified", "instances")
    parameters = body.get("parameters") if isinstance(body, dict) else None
    size = _dimensions(
        {
            "outputDimensionality": (parameters or {}).get(
                "outputDimensionality", DEFAULT_DIMENSIONS
            )
        },
        DEFAULT_DIMENSIONS,
    )
    predictions = []
    for i, instance in enumerate(instances):
        text = instance.get("content") if isinstance(instance, dict) else None
        if not isinstance(text, str):
            raise _fail(f"instances[{i}].content is not specified", f"instances[{i}].content")
        predictions.append(
            {
                "embeddings": {
                    "values": embed(model, text, size),
                    "statistics": {"truncated": False, "token_count": _tokens(len(text))},
                }
            }
        )
    return {"predictions": predictions}
