"""Structured outputs: a recorded answer re-validated against the request's schema. Pure.

A request with ``response_format: {"type": "json_schema", "json_schema":
{"schema": ...}}`` gets an answer the provider guarantees to match that schema.
A recording made before the schema changed does not: served as it is, it would
hand the client the wrong shape. So on replay the answer's content is parsed and
validated (`jsonschema`) against the schema of the request being answered, and a
mismatch is an error that names the recording and the violation and says to
re-record it (seeds/adr-model-fixtures.md). A refusal (no content) and tool calls
are not checked.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from chaosllm.model import JSON
from chaosllm.providers.base import canonical_json

__all__ = ["answer_schema_problem", "request_schema"]


def request_schema(body: JSON) -> tuple[str, dict[str, Any]] | None:
    """(name, schema) of a request's ``json_schema`` response format, if it has one."""
    if not isinstance(body, dict):
        return None
    response_format = body.get("response_format")
    if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
        return None
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        return None
    name = spec.get("name")
    return (name if isinstance(name, str) else "(unnamed)"), spec["schema"]


@functools.lru_cache(maxsize=256)
def _validator(schema_text: str) -> Any:
    import jsonschema  # type: ignore[import-untyped, unused-ignore]  # on use: slow to import

    schema = json.loads(schema_text)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _where(path: Any) -> str:
    parts = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
    return "$" + parts


def answer_schema_problem(request: JSON, answer: JSON) -> str | None:
    """Why the answer does not match the request's JSON schema (None when it does, or when
    the request asks for no schema)."""
    found = request_schema(request)
    if found is None or not isinstance(answer, dict):
        return None
    name, schema = found
    import jsonschema  # type: ignore[import-untyped, unused-ignore]  # on use: slow to import

    try:
        validator = _validator(canonical_json(schema))
    except jsonschema.SchemaError as exc:
        return (
            f"the request's response_format schema {name!r} is not a valid JSON Schema: "
            f"{exc.message}"
        )
    for choice in answer.get("choices") or ():
        message = choice.get("message") if isinstance(choice, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, str):
            continue  # a refusal, or tool calls
        try:
            value = json.loads(content)
        except json.JSONDecodeError as exc:
            return (
                f"its content is not JSON ({exc.msg}), but the request asks for "
                f"response_format json_schema {name!r}"
            )
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
        if error is not None:
            return (
                f"its content does not match the request's response_format json_schema "
                f"{name!r}: {error.message} at {_where(error.absolute_path)}"
            )
    return None
