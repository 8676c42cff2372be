"""Provider protocols: one module each, all pure."""

from __future__ import annotations

from chaosllm.providers.anthropic_messages import AnthropicMessages
from chaosllm.providers.base import Provider, canonical_json, sha256_digest
from chaosllm.providers.openai_chat import OpenAIChat
from chaosllm.providers.openai_responses import OpenAIResponses

__all__ = [
    "PROVIDERS",
    "AnthropicMessages",
    "OpenAIChat",
    "OpenAIResponses",
    "Provider",
    "canonical_json",
    "provider_for_path",
    "sha256_digest",
]

PROVIDERS: dict[str, Provider] = {
    "anthropic.messages": AnthropicMessages(),
    "openai.chat": OpenAIChat(),
    "openai.responses": OpenAIResponses(),
}

_BY_PATH: dict[str, Provider] = {
    path: provider for provider in PROVIDERS.values() for path in getattr(provider, "paths", ())
}


def provider_for_path(path: str) -> Provider | None:
    return _BY_PATH.get(path)
