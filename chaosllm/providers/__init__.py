"""Provider protocols: one module each on the shared base (`base.Provider`), all pure.

`PROVIDERS` is the registry: one instance of each protocol, by its recording
name. Everything else is derived from it: the routes (each provider's
`paths`), the protocol a request path speaks (`provider_for_path`, used for
the error envelope of any answer on that path: `error_body_for_path` is the
wire server's hook), and the protocol whose SDK is asking on a shared
endpoint (`provider_for_client`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from chaosllm.errors import ChaosLLMError
from chaosllm.providers.anthropic_messages import AnthropicMessages
from chaosllm.providers.azure import AzureChat, AzureResponses
from chaosllm.providers.base import ErrorKind, Provider, canonical_json, sha256_digest
from chaosllm.providers.bedrock import BedrockConverse
from chaosllm.providers.gemini import Gemini
from chaosllm.providers.mcp import Mcp
from chaosllm.providers.ollama import OllamaChat, OllamaGenerate
from chaosllm.providers.openai_chat import OpenAIChat
from chaosllm.providers.openai_responses import OpenAIResponses
from chaosllm.providers.openai_stored import OpenAIStoredResponses

__all__ = [
    "DEFAULT_PROVIDER",
    "MODEL_PROVIDERS",
    "PROVIDERS",
    "AnthropicMessages",
    "AzureChat",
    "AzureResponses",
    "BedrockConverse",
    "Gemini",
    "Mcp",
    "OllamaChat",
    "OllamaGenerate",
    "OpenAIChat",
    "OpenAIResponses",
    "OpenAIStoredResponses",
    "Provider",
    "canonical_json",
    "error_body_for_path",
    "provider_for_client",
    "provider_for_path",
    "sha256_digest",
]

PROVIDERS: dict[str, Provider] = {
    provider.name: provider
    for provider in (
        AnthropicMessages(),
        OpenAIChat(),
        OpenAIResponses(),
        OpenAIStoredResponses(),
        Gemini(),
        OllamaChat(),
        OllamaGenerate(),
        BedrockConverse(),
        AzureChat(),
        AzureResponses(),
        Mcp(),
    )
}

MODEL_PROVIDERS: dict[str, Provider] = {
    name: provider for name, provider in PROVIDERS.items() if provider.model_protocol
}
"""The protocols that serve models (every one but the MCP servers')."""

DEFAULT_PROVIDER: Provider = PROVIDERS["openai.chat"]
"""The protocol of an answer on no provider's path (OpenAI's envelope, the model list)."""


def _by_path(providers: Iterable[Provider]) -> dict[str, Provider]:
    by_path: dict[str, Provider] = {}
    for provider in providers:
        for path in provider.paths:
            other = by_path.setdefault(path, provider)
            if other is not provider:
                raise ChaosLLMError(f"{path} is served by both {other.name} and {provider.name}")
    return by_path


_BY_PATH = _by_path(PROVIDERS.values())


_TEMPLATED = tuple(provider for provider in PROVIDERS.values() if provider.path_templates)


def provider_for_path(path: str) -> Provider | None:
    """The provider serving a request path (None for any other path): its own `paths`, or
    one of its `path_templates`."""
    provider = _BY_PATH.get(path)
    if provider is None and _TEMPLATED:
        for templated in _TEMPLATED:
            if templated.path_params(path) is not None:
                return templated
    return provider


def provider_for_client(header_names: Iterable[str]) -> Provider:
    """The protocol whose SDK sent a request with these (lower-case) header names: the
    provider whose `client_header` is among them, else `DEFAULT_PROVIDER`."""
    names = set(header_names)
    for provider in PROVIDERS.values():
        if provider.client_header is not None and provider.client_header in names:
            return provider
    return DEFAULT_PROVIDER


def error_body_for_path(path: str, status: int, message: str, code: str) -> dict[str, Any] | None:
    """The error body of the protocol served on `path` for an error chaosllm answers on its
    own (5xx: a server error; else a refused request), None on any other path: the
    `chaosllm.wire.server.ErrorBody` hook of `WireServer(error_body=...)`."""
    provider = provider_for_path(path)
    if provider is None:
        return None
    kind = ErrorKind.SERVER_ERROR if status >= 500 else ErrorKind.INVALID_REQUEST
    return provider.error_body(status, message, kind=kind, code=code)
