"""Every answer chaosllm gives, against the providers' own published descriptions, in
memory (`tests.conformance.answers`: every shipped recording as JSON and streamed, every
fault of the catalogue, a miss):

- OpenAI Chat Completions and Responses (and Azure's): OpenAI's OpenAPI document, the
  schemas vendored in ``openai-schemas.json`` (see README.md): answers, stream chunks and
  events, error bodies, error events;
- Anthropic Messages, Gemini (extra members forbidden, as google-genai's types are) and
  Ollama: their SDKs' own pydantic types;
- Bedrock Converse: botocore's service model of bedrock-runtime (members, required
  members, a union's one member; the errors each operation declares and their HTTP
  codes)."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import anthropic.types
import botocore.session
import jsonschema  # type: ignore[import-untyped, unused-ignore]
import ollama
import pytest
from botocore.model import OperationModel, Shape
from google.genai import types as genai
from pydantic import TypeAdapter

from tests.conformance.answers import Payload, payloads

pytestmark = pytest.mark.timeout(120)

SCHEMAS = json.loads((Path(__file__).parent / "openai-schemas.json").read_text("utf-8"))


def _optional_may_be_null(schema: Any) -> Any:
    """The document marks few optional members nullable, yet the API sends ``null`` for
    an optional member it has no value for (``usage`` on every chunk but the last,
    ``user``...), and OpenAI's own SDKs, generated from it, accept ``null`` for every
    optional member: so does this test (required members keep their types)."""
    if isinstance(schema, list):
        return [_optional_may_be_null(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _optional_may_be_null(v) for k, v in schema.items()}
    kinds = out.get("type")
    if "enum" in out and isinstance(kinds, list) and "null" in kinds and None not in out["enum"]:
        out["enum"] = [*out["enum"], None]  # a nullable enum: its null is one of its values
    if out.pop("nullable", False) is True:  # OpenAPI 3.0's spelling, still in the document
        return {"anyOf": [out, {"type": "null"}]}
    properties = out.get("properties")
    if isinstance(properties, dict):
        required = set(out.get("required", ()))
        out["properties"] = {
            name: sub if name in required else {"anyOf": [sub, {"type": "null"}]}
            for name, sub in properties.items()
        }
    return out


DEFS = _optional_may_be_null(SCHEMAS["$defs"])


@cache
def openai_schema(name: str) -> jsonschema.Draft202012Validator:
    schema = {"$defs": DEFS, "$ref": f"#/$defs/{name}"}
    return jsonschema.Draft202012Validator(schema)


def _openai(name: str) -> Callable[[Any], None]:
    def check(data: Any) -> None:
        errors = sorted(openai_schema(name).iter_errors(data), key=lambda e: e.path)
        if errors:
            best = jsonschema.exceptions.best_match(errors)
            raise AssertionError(f"{name}: {best.message} at {list(best.absolute_path)}")

    return check


# Azure OpenAI's error (inference spec 2024-10-21, `errorBase` / `error`): code and message,
# optionally param, type and inner_error.
AZURE_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "type": {"type": ["string", "null"]},
                "inner_error": {"type": "object"},
            },
        }
    },
}


def _azure_chunk(data: Any) -> None:
    """Azure's content filter speaks in chunks of its own, ``object`` empty: the first says
    the prompt's filter results (``prompt_filter_results``), the asynchronous filter's
    say each choice's (``content_filter_offsets``), as Azure's inference spec documents;
    the ``filter_frames`` fault sends them on OpenAI's protocol too (the Azure
    deployments behind OpenAI-compatible gateways). Every other chunk is OpenAI's."""
    filtered = isinstance(data, dict) and (
        "prompt_filter_results" in data
        or any(
            isinstance(c, dict) and "content_filter_offsets" in c for c in data.get("choices") or ()
        )
    )
    if filtered and data.get("object") == "":
        data = {**data, "object": "chat.completion.chunk"}
    _openai("CreateChatCompletionStreamResponse")(data)


def _azure_error(data: Any) -> None:
    if isinstance(data.get("error"), dict) and "type" in data["error"]:
        _openai("ErrorResponse")(data)
    else:
        jsonschema.validate(data, AZURE_ERROR)


def _pydantic(kind: Any) -> Callable[[Any], None]:
    adapter: TypeAdapter[Any] = TypeAdapter(kind)

    def check(data: Any) -> None:
        adapter.validate_python(data)

    return check


def _anthropic_event(data: Any) -> None:
    """A stream event of the SDK's union, or the ``ping`` the streaming docs describe
    (which the SDK reads apart from the union)."""
    if data == {"type": "ping"}:
        return
    _pydantic(anthropic.types.RawMessageStreamEvent)(data)


def _gemini(data: Any) -> None:
    genai.GenerateContentResponse.model_validate(data)


# google.rpc.Status as Google's JSON errors carry it (`{"error": Status}` with the HTTP
# code): code, message, status, details (each an Any: `@type` first).
GEMINI_ERROR = {
    "type": "object",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "status"],
            "additionalProperties": False,
            "properties": {
                "code": {"type": "integer"},
                "message": {"type": "string"},
                "status": {"type": "string", "pattern": "^[A-Z_]+$"},
                "details": {
                    "type": "array",
                    "items": {"type": "object", "required": ["@type"]},
                },
            },
        }
    },
}


def _gemini_error(data: Any) -> None:
    jsonschema.validate(data, GEMINI_ERROR)


OLLAMA_ERROR = {
    "type": "object",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {"error": {"type": "string"}},
}


def _ollama_error(data: Any) -> None:
    jsonschema.validate(data, OLLAMA_ERROR)


# -- Bedrock: botocore's service model ---------------------------------------------------

_BEDROCK = botocore.session.get_session().get_service_model("bedrock-runtime")


def conforms(shape: Shape, value: Any, where: str = "$") -> None:
    """`value` is what botocore's `shape` describes: every member known, every required
    one present, a union with exactly one member, the scalar types."""
    kind = shape.type_name
    if shape.metadata.get("document"):
        return  # a document: any JSON value
    if kind == "structure":
        assert isinstance(value, dict), f"{where}: {value!r} is not a structure"
        members = shape.members
        unknown = set(value) - set(members)
        assert not unknown, f"{where}: members {sorted(unknown)} not in {shape.name}"
        missing = set(shape.required_members) - set(value)
        assert not missing, f"{where}: required members {sorted(missing)} of {shape.name}"
        if shape.metadata.get("union"):
            assert len(value) == 1, f"{where}: union {shape.name} with {sorted(value)}"
        for key, item in value.items():
            conforms(members[key], item, f"{where}.{key}")
    elif kind == "list":
        assert isinstance(value, list), f"{where}: not a list"
        for i, item in enumerate(value):
            conforms(shape.member, item, f"{where}[{i}]")
    elif kind == "map":
        assert isinstance(value, dict), f"{where}: not a map"
        for key, item in value.items():
            conforms(shape.value, item, f"{where}.{key}")
    elif kind == "string":
        assert isinstance(value, str), f"{where}: {value!r} is not a string"
        enum = shape.enum
        assert not enum or value in enum, f"{where}: {value!r} not in {enum}"
    elif kind in ("integer", "long"):
        assert isinstance(value, int) and not isinstance(value, bool), f"{where}: {value!r}"
    elif kind in ("double", "float"):
        assert isinstance(value, (int, float)) and not isinstance(value, bool), where
    elif kind == "boolean":
        assert isinstance(value, bool), f"{where}: {value!r} is not a boolean"
    elif kind == "timestamp":
        assert isinstance(value, (str, int, float)), where
    elif kind == "blob":
        assert isinstance(value, str), where
    # document: any JSON value


def _operation(name: str) -> OperationModel:
    return _BEDROCK.operation_model(name)


def _bedrock_answer(data: Any) -> None:
    conforms(_operation("Converse").output_shape, data)


def _bedrock_event(payload: Payload) -> None:
    events = _operation("ConverseStream").output_shape.members["stream"]
    name = str(payload.event)
    assert name in events.members, f"event {name!r} not in ConverseStreamOutput"
    conforms(events.members[name], payload.data)


# AWS's common errors (every service answers them; no service model declares them):
# https://docs.aws.amazon.com/bedrock/latest/APIReference/CommonErrors.html
COMMON_ERRORS = {
    "UnrecognizedClientException": 403,
    "InvalidSignatureException": 403,
    "MissingAuthenticationTokenException": 403,
    "ExpiredTokenException": 403,
}


def _bedrock_error(payload: Payload) -> None:
    """The exception ``x-amzn-ErrorType`` names is one Converse declares (or one of AWS's
    common errors) with the status it is declared with, whenever some error is declared
    with that status (``http_error`` with another status has none to name); its body is
    that error's shape. An error inside a 200 (``error_in_200``) is the error's body."""
    headers = {k.lower(): v for k, v in payload.headers}
    declared = {e.name: e for e in _operation("Converse").error_shapes}
    if payload.status == 200:
        conforms(declared["InternalServerException"], payload.data)
        return
    name = headers["x-amzn-errortype"].split(":", 1)[0]
    statuses = {n: e.metadata["error"]["httpStatusCode"] for n, e in declared.items()}
    statuses.update(COMMON_ERRORS)
    assert name in statuses, f"{name} is not an error Converse declares"
    if payload.status in statuses.values():
        assert statuses[name] == payload.status, (
            f"{name} is a {statuses[name]}, answered as {payload.status}"
        )
    assert set(payload.data) <= {"message"} and isinstance(payload.data.get("message"), str)


# -- the table ---------------------------------------------------------------------------

Check = Callable[[Any], None]

CHECKS: dict[str, dict[str, Check]] = {
    "openai.chat": {
        "answer": _openai("CreateChatCompletionResponse"),
        "chunk": _azure_chunk,
        "error": _openai("ErrorResponse"),
        "error_event": _openai("ErrorResponse"),
    },
    "azure.chat": {
        "answer": _openai("CreateChatCompletionResponse"),
        "chunk": _azure_chunk,
        "error": _azure_error,
        "error_event": _azure_error,
    },
    "openai.responses": {
        "answer": _openai("Response"),
        "chunk": _openai("ResponseStreamEvent"),
        "error": _openai("ErrorResponse"),
        "error_event": _openai("ResponseStreamEvent"),
    },
    "azure.responses": {
        "answer": _openai("Response"),
        "chunk": _openai("ResponseStreamEvent"),
        "error": _azure_error,
        "error_event": _openai("ResponseStreamEvent"),
    },
    "anthropic.messages": {
        "answer": _pydantic(anthropic.types.Message),
        "chunk": _anthropic_event,
        "error": _pydantic(anthropic.types.ErrorResponse),
        "error_event": _pydantic(anthropic.types.ErrorResponse),
    },
    "gemini.generate_content": {
        "answer": _gemini,
        "chunk": _gemini,
        "error": _gemini_error,
        "error_event": _gemini_error,
    },
    "ollama.chat": {
        "answer": _pydantic(ollama.ChatResponse),
        "chunk": _pydantic(ollama.ChatResponse),
        "error": _ollama_error,
        "error_event": _ollama_error,
    },
    "ollama.generate": {
        "answer": _pydantic(ollama.GenerateResponse),
        "chunk": _pydantic(ollama.GenerateResponse),
        "error": _ollama_error,
        "error_event": _ollama_error,
    },
}


def failures(provider: str) -> list[str]:
    found = []
    for payload in payloads(provider):
        try:
            if provider == "bedrock.converse":
                if payload.kind == "answer":
                    _bedrock_answer(payload.data)
                elif payload.kind == "error":
                    _bedrock_error(payload)
                else:
                    _bedrock_event(payload)
            else:
                CHECKS[provider][payload.kind](payload.data)
        except (AssertionError, ValueError, jsonschema.ValidationError) as exc:
            found.append(f"{payload.source} ({payload.kind} {payload.event}): {exc}"[:600])
    return found


PROVIDERS = [*CHECKS, "bedrock.converse"]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_every_answer_conforms_to_the_providers_description(provider: str) -> None:
    found = failures(provider)
    assert not found, f"{len(found)} payloads do not conform:\n" + "\n".join(found[:20])


@pytest.mark.parametrize("provider", PROVIDERS)
def test_answers_events_and_errors_are_all_checked(provider: str) -> None:
    """The gathering is not vacuous: each protocol yields answers, stream payloads and
    error bodies (and, but for Bedrock's, error events)."""
    kinds = {p.kind for p in payloads(provider)}
    assert {"answer", "chunk", "error"} <= kinds
