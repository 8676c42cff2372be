"""The request-validator oracle: what is wrong with the conversation a client sends. Pure.

seeds/completion-test-api.md checks every chat request a harness sends, because
outcome assertions miss the bugs where the agent does the right thing and the
harness sends the model something broken. `validate_conversation` finds:

======================  ==================================================================
check                   finding
======================  ==================================================================
orphan_tool_call        an assistant message's tool call has no tool message answering it
                        right after it (the commonest cause of provider 400s)
orphan_tool_result      a tool message answering no tool call of the assistant message
                        right before it (or answering one twice)
null_tool_content       a tool message whose content is null
role_order              the conversation does not start with a user message (after
                        system/developer messages), or two assistant messages follow
                        each other with nothing between
doubled_user_message    the same user message twice in a row (a message persisted twice)
missing_system_prompt   no system/developer message, where the recording answering the
                        request had one
top_level_cache_control ``cache_control`` on the request itself (a provider extension that
                        belongs on content blocks)
======================  ==================================================================

Each `Finding` carries a message phrased as the real provider phrases the 400
it would answer with (where it has one) and the ``param`` it would name, so that
``--strict`` can refuse the request exactly like the provider.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chaosllm.model import JSON

__all__ = ["CHECKS", "Finding", "has_system_prompt", "validate_conversation"]

CHECKS = (
    "orphan_tool_call",
    "orphan_tool_result",
    "null_tool_content",
    "role_order",
    "doubled_user_message",
    "missing_system_prompt",
    "top_level_cache_control",
)

SYSTEM_ROLES = frozenset({"system", "developer"})


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    """What was checked (`CHECKS`, or a trace/structured-output check)."""
    message: str
    oracle: str = "request-validator"
    severity: str = "error"
    """``error`` or ``warning`` (soft checks, such as trace request hints)."""
    index: int | None = None
    """The message (index in ``messages``) it is about, if one."""
    param: str | None = None
    """The parameter the provider's 400 would name."""

    def to_json(self) -> dict[str, Any]:
        return {
            "oracle": self.oracle,
            "check": self.check,
            "severity": self.severity,
            "message": self.message,
            "index": self.index,
            "param": self.param,
        }


def _text(content: JSON) -> str | None:
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict)).strip()
    return None


def _call_ids(message: dict[str, Any]) -> list[str]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [c["id"] for c in calls if isinstance(c, dict) and isinstance(c.get("id"), str)]


def validate_conversation(body: JSON, *, expects_system: bool = False) -> list[Finding]:
    """The defects of a chat request's conversation (an empty list for a well-formed one).
    `expects_system`: the recording answering it had a system prompt."""
    if not isinstance(body, dict):
        return []
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    findings: list[Finding] = []
    if "cache_control" in body:
        findings.append(
            Finding(
                "top_level_cache_control",
                "Unrecognized request argument supplied: cache_control (cache_control belongs on "
                "content blocks, not on the request).",
                param="cache_control",
            )
        )

    pending: dict[str, int] = {}  # tool-call ids awaiting their result -> assistant index
    in_block = False  # right after an assistant message with tool calls (and its results)
    started = False  # a non-system message was seen
    previous: dict[str, Any] | None = None
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "tool":
            if message.get("content") is None:
                findings.append(
                    Finding(
                        "null_tool_content",
                        "Invalid value for 'content': expected a string, got null.",
                        index=i,
                        param=f"messages.[{i}].content",
                    )
                )
            call_id = message.get("tool_call_id")
            if not in_block or call_id not in pending:
                findings.append(
                    Finding(
                        "orphan_tool_result",
                        "Invalid parameter: messages with role 'tool' must be a response to a "
                        "preceeding message with 'tool_calls'."
                        + (
                            f" (tool_call_id {call_id!r} answers no pending tool call)"
                            if in_block
                            else ""
                        ),
                        index=i,
                        param=f"messages.[{i}].role",
                    )
                )
            else:
                del pending[call_id]
            previous = message
            continue
        orphaned = bool(pending)
        if orphaned:
            findings.append(_orphan_calls(pending))
        pending = {}
        in_block = False
        if role in SYSTEM_ROLES:
            previous = message
            continue
        if not started and role != "user":
            findings.append(
                Finding(
                    "role_order",
                    f"Invalid role order: the conversation must start with a 'user' message "
                    f"(after system/developer messages), but messages[{i}] has role {role!r}.",
                    index=i,
                    param=f"messages.[{i}].role",
                )
            )
        started = True
        if (
            previous is not None
            and role == "assistant"
            and not orphaned
            and previous.get("role") == "assistant"
        ):
            findings.append(
                Finding(
                    "role_order",
                    f"Invalid role order: messages[{i}] is an 'assistant' message right after "
                    f"another 'assistant' message, with no user or tool message between.",
                    index=i,
                    param=f"messages.[{i}].role",
                )
            )
        if previous is not None and role == "user" and previous.get("role") == "user":
            text = _text(message.get("content"))
            if text is not None and text == _text(previous.get("content")):
                findings.append(
                    Finding(
                        "doubled_user_message",
                        f"messages[{i}] repeats the user message right before it: the same user "
                        f"message was sent twice.",
                        index=i,
                        param=f"messages.[{i}].content",
                    )
                )
        if role == "assistant":
            ids = _call_ids(message)
            if ids:
                pending = dict.fromkeys(ids, i)
                in_block = True
        previous = message
    if pending:
        findings.append(_orphan_calls(pending))
    if expects_system and not has_system_prompt(body):
        findings.append(
            Finding(
                "missing_system_prompt",
                "The request has no system prompt, but the recording answering it was made "
                "with one: the harness lost its system prompt.",
                param="messages",
            )
        )
    return findings


def has_system_prompt(body: JSON) -> bool:
    """Whether a request's conversation has a system (or developer) message."""
    messages = body.get("messages") if isinstance(body, dict) else None
    return isinstance(messages, list) and any(
        isinstance(m, dict) and m.get("role") in SYSTEM_ROLES for m in messages
    )


def _orphan_calls(pending: dict[str, int]) -> Finding:
    index = min(pending.values())
    return Finding(
        "orphan_tool_call",
        "An assistant message with 'tool_calls' must be followed by tool messages responding "
        "to each 'tool_call_id'. The following tool_call_ids did not have response "
        "messages: " + ", ".join(pending),
        index=index,
        param=f"messages.[{index}].role",
    )
