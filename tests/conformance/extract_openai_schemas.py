"""Write ``openai-schemas.json`` from OpenAI's OpenAPI document (see README.md):
``python -m tests.conformance.extract_openai_schemas path/to/openapi.json``."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOTS = (
    "CreateChatCompletionResponse",
    "CreateChatCompletionStreamResponse",
    "Response",
    "ResponseStreamEvent",
    "ErrorResponse",
)
PREFIX = "#/components/schemas/"


def _refs(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "$ref" and isinstance(item, str):
                yield item
            else:
                yield from _refs(item)
    elif isinstance(value, list):
        for item in value:
            yield from _refs(item)


def _rewritten(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: v.replace(PREFIX, "#/$defs/") if k == "$ref" else _rewritten(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_rewritten(v) for v in value]
    return value


def extract(document: dict[str, Any]) -> dict[str, Any]:
    schemas = document["components"]["schemas"]
    needed: set[str] = set()
    pending = list(ROOTS)
    while pending:
        name = pending.pop()
        if name not in needed:
            needed.add(name)
            pending += [ref.removeprefix(PREFIX) for ref in _refs(schemas[name])]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$defs": {name: _rewritten(schemas[name]) for name in sorted(needed)},
    }


if __name__ == "__main__":
    source = json.loads(Path(sys.argv[1]).read_text("utf-8"))
    target = Path(__file__).with_name("openai-schemas.json")
    target.write_text(json.dumps(extract(source), indent=1, sort_keys=True) + "\n", "utf-8")
