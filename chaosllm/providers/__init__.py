"""Provider protocols: one module each, all pure."""

from __future__ import annotations

from chaosllm.providers.base import Provider, canonical_json, sha256_digest
from chaosllm.providers.openai_chat import OpenAIChat

__all__ = ["PROVIDERS", "OpenAIChat", "Provider", "canonical_json", "provider_for_path",
           "sha256_digest"]

PROVIDERS: dict[str, Provider] = {"openai.chat": OpenAIChat()}

_BY_PATH: dict[str, Provider] = {
    path: provider for provider in PROVIDERS.values()
    for path in getattr(provider, "paths", ())
}


def provider_for_path(path: str) -> Provider | None:
    return _BY_PATH.get(path)
