"""Plain helpers shared by the test modules (fixtures live in conftest.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from openai.types.chat import ChatCompletionMessageParam


def chat_messages(messages: Sequence[Mapping[str, Any]]) -> list[ChatCompletionMessageParam]:
    """Chat messages built as JSON (recorded, or from an SDK object's ``model_dump``) as
    the SDK's message params: the JSON value narrowed for the type checker, unchanged."""
    return cast("list[ChatCompletionMessageParam]", list(messages))
