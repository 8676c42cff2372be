"""Deterministic embeddings: vectors seeded from a hash of the model and the input.

The same input always gets the same unit vector; different inputs get
different ones; no vector is all-zero (a store that rejects zero vectors
never sees one). A model not in `DEFAULT_DIMENSIONS` gets 768 dimensions
(`FALLBACK_DIMENSIONS`). ``dimensions`` is honoured and ``encoding_format: base64``
(what the `openai` SDK asks for by default) packs little-endian float32s.
"""

from __future__ import annotations

import base64
import hashlib
import math
import random
import struct
from typing import Any

from chaosllm.errors import InvalidRequest
from chaosllm.model import JSON

__all__ = [
    "DEFAULT_DIMENSIONS",
    "PATHS",
    "embed",
    "embeddings_response",
    "validate_embeddings_request",
]

PATHS = ("/v1/embeddings", "/embeddings", "/v1/v1/embeddings")
"""The request paths embeddings are served on (``POST``; errors in OpenAI's envelope). The
doubled one is where DocsGPT posts (``{base}/v1/embeddings`` with a base ending in
``/v1``), as its mock LLM serves it."""

DEFAULT_DIMENSIONS = {
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
    "text-embedding-ada-002": 1536,
}
FALLBACK_DIMENSIONS = 768
"""The dimensions of a model chaosllm does not know (a sentence-transformers model such
as DocsGPT's ``all-mpnet-base-v2``, as DocsGPT's mock LLM answers it)."""
MAX_DIMENSIONS = 8192


def embed(model: str, text: str, dimensions: int) -> list[float]:
    seed = hashlib.sha256(f"{model}\x00{text}".encode()).digest()
    rng = random.Random(seed)
    vector = [rng.gauss(0.0, 1.0) for _ in range(dimensions)]
    if abs(vector[0]) < 1e-3:
        vector[0] = 1e-3 if vector[0] >= 0 else -1e-3
    norm = math.sqrt(sum(v * v for v in vector))
    return [v / norm for v in vector]


def _inputs(raw: JSON) -> list[str]:
    """The inputs as texts: strings as they are, token arrays as their canonical text."""
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, list) and raw:
        if all(isinstance(x, str) for x in raw):
            return list(raw)
        if all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
            return [" ".join(map(str, raw))]
        if all(isinstance(x, list) and all(isinstance(t, int) for t in x) for x in raw):
            return [" ".join(map(str, x)) for x in raw]
    raise InvalidRequest(
        "Invalid 'input': expected a string, an array of strings, an array of tokens "
        "or an array of token arrays (non-empty).",
        param="input",
        code="invalid_type",
    )


def validate_embeddings_request(body: JSON) -> tuple[str, list[str], int, str]:
    if not isinstance(body, dict):
        raise InvalidRequest(
            "The request body must be a JSON object.", param="body", code="invalid_type"
        )
    model = body.get("model")
    if not isinstance(model, str):
        raise InvalidRequest(
            "Missing required parameter: 'model'."
            if model is None
            else "Invalid type for 'model': expected a string.",
            param="model",
            code="missing_required_parameter" if model is None else "invalid_type",
        )
    if "input" not in body:
        raise InvalidRequest(
            "Missing required parameter: 'input'.", param="input", code="missing_required_parameter"
        )
    texts = _inputs(body["input"])
    dimensions = body.get("dimensions")
    if dimensions is None:
        dimensions = DEFAULT_DIMENSIONS.get(model, FALLBACK_DIMENSIONS)
    if (
        not isinstance(dimensions, int)
        or isinstance(dimensions, bool)
        or not 1 <= dimensions <= MAX_DIMENSIONS
    ):
        raise InvalidRequest(
            f"Invalid 'dimensions': expected an integer between 1 and "
            f"{MAX_DIMENSIONS}, got {dimensions!r}.",
            param="dimensions",
            code="invalid_value",
        )
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise InvalidRequest(
            f"Invalid 'encoding_format': {encoding!r}. Supported values are: 'float' and 'base64'.",
            param="encoding_format",
            code="invalid_value",
        )
    return model, texts, dimensions, encoding


def embeddings_response(body: JSON) -> dict[str, Any]:
    model, texts, dimensions, encoding = validate_embeddings_request(body)
    data = []
    tokens = 0
    for index, text in enumerate(texts):
        vector = embed(model, text, dimensions)
        tokens += max(1, len(text.split()))
        encoded: Any = vector
        if encoding == "base64":
            encoded = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
        data.append({"object": "embedding", "index": index, "embedding": encoded})
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
