"""The request-validator oracle: what is wrong with the conversation a client sends. Pure.

seeds/completion-test-api.md checks every request a harness sends, because
outcome assertions miss the bugs where the agent does the right thing and the
harness sends the model something broken. Each protocol has its own validator
(a provider's `conversation_findings` calls it): `validate_conversation` for
Chat Completions, `validate_anthropic_conversation` for Anthropic Messages,
`validate_responses_conversation` for the Responses API. They find:

======================  ===========================================================  ============
check                   finding                                                      protocols
======================  ===========================================================  ============
orphan_tool_call        a tool call no tool result answers: Chat, a call without a   all
                        tool message right after its assistant message; Anthropic,
                        a ``tool_use`` block without a ``tool_result`` in the next
                        message; Responses, a ``function_call`` (any ``*_call``) item
                        without an output item of the same ``call_id``
                        (the commonest cause of provider 400s)
orphan_tool_result      a tool result answering no tool call: Chat, a tool message   all
                        not answering the assistant message right before it;
                        Anthropic, a ``tool_result`` whose ``tool_use_id`` is not in
                        the previous message; Responses, an output item whose
                        ``call_id`` no call item has (unless the request continues a
                        stored response or conversation); or one answered twice
null_tool_content       a tool message (Responses: an output item) whose content is  Chat,
                        null                                                         Responses
role_order              Chat: the conversation does not start with a user message    Chat,
                        (after system/developer messages), or two assistant          Anthropic
                        messages follow each other with nothing between; Anthropic:
                        the first message is not a user message
doubled_user_message    the same user message twice in a row (a message persisted    all
                        twice)
missing_system_prompt   no system prompt (Anthropic ``system``, Responses            all
                        ``instructions`` or a system/developer message), where the
                        recording answering the request had one
top_level_cache_control ``cache_control`` on the request itself (a provider          Chat
                        extension that belongs on content blocks)
======================  ===========================================================  ============

Each `Finding` carries a message phrased as the real provider phrases the 400
it would answer with (where it has one) and the ``param`` it would name, so that
``--strict`` can refuse the request exactly like the provider.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from chaosllm.model import JSON

__all__ = [
    "ANTHROPIC_CHECKS",
    "CHAT_CHECKS",
    "CHECKS",
    "RESPONSES_CHECKS",
    "ConversationChecks",
    "Finding",
    "anthropic_has_system_prompt",
    "has_system_prompt",
    "responses_has_system_prompt",
    "validate_anthropic_conversation",
    "validate_conversation",
    "validate_responses_conversation",
]

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
    """The message (index in ``messages``, or ``input``) it is about, if one."""
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


class Validator(Protocol):
    def __call__(self, body: JSON, *, expects_system: bool = False) -> list[Finding]: ...


@dataclass(frozen=True, slots=True)
class ConversationChecks:
    """One protocol's request validator (a provider's `conversation`)."""

    findings: Validator
    has_system_prompt: Callable[[JSON], bool]


# -- what every protocol's validator finds alike ------------------------------------


def _text(content: JSON) -> str | None:
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict)).strip()
    return None


def _doubled_user(where: str, index: int, param: str) -> Finding:
    return Finding(
        "doubled_user_message",
        f"{where} repeats the user message right before it: the same user message was sent twice.",
        index=index,
        param=param,
    )


def _missing_system(param: str) -> Finding:
    return Finding(
        "missing_system_prompt",
        "The request has no system prompt, but the recording answering it was made "
        "with one: the harness lost its system prompt.",
        param=param,
    )


def _dicts(items: JSON) -> Iterable[tuple[int, dict[str, Any]]]:
    """The objects of a list with their indexes (nothing for anything else)."""
    if isinstance(items, list):
        for i, item in enumerate(items):
            if isinstance(item, dict):
                yield i, item


# -- Chat Completions ---------------------------------------------------------------


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
    for i, message in _dicts(messages):
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
                findings.append(_doubled_user(f"messages[{i}]", i, f"messages.[{i}].content"))
        if role == "assistant":
            ids = _call_ids(message)
            if ids:
                pending = dict.fromkeys(ids, i)
                in_block = True
        previous = message
    if pending:
        findings.append(_orphan_calls(pending))
    if expects_system and not has_system_prompt(body):
        findings.append(_missing_system("messages"))
    return findings


def has_system_prompt(body: JSON) -> bool:
    """Whether a chat request's conversation has a system (or developer) message."""
    messages = body.get("messages") if isinstance(body, dict) else None
    return any(m.get("role") in SYSTEM_ROLES for _, m in _dicts(messages))


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


# -- Anthropic Messages -------------------------------------------------------------


def _blocks(message: dict[str, Any], kind: str) -> Iterable[tuple[int, dict[str, Any]]]:
    """The content blocks of one type in a message (a string content has none)."""
    for j, block in _dicts(message.get("content")):
        if block.get("type") == kind:
            yield j, block


def validate_anthropic_conversation(body: JSON, *, expects_system: bool = False) -> list[Finding]:
    """The defects of an Anthropic Messages request's conversation: each ``tool_use`` block of
    an assistant message needs a ``tool_result`` block in the very next (user) message, and
    each ``tool_result`` answers a ``tool_use`` of the message right before it."""
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return []
    findings: list[Finding] = []
    messages = list(_dicts(body["messages"]))
    if messages and messages[0][1].get("role") != "user":
        findings.append(
            Finding(
                "role_order",
                'messages: first message must use the "user" role',
                index=messages[0][0],
                param="messages",
            )
        )
    offered: dict[str, None] = {}  # the tool_use ids of the message right before
    previous: dict[str, Any] | None = None
    at = 0  # the index of the message right before
    for i, message in messages:
        role = message.get("role")
        pending = dict(offered)
        for j, block in _blocks(message, "tool_result") if role == "user" else ():
            use_id = block.get("tool_use_id")
            if use_id in pending:
                del pending[use_id]
                continue
            findings.append(
                Finding(
                    "orphan_tool_result",
                    f"messages.{i}.content.{j}: unexpected `tool_use_id` found in "
                    f"`tool_result` blocks: {use_id}. Each `tool_result` block must have a "
                    f"corresponding `tool_use` block in the previous message.",
                    index=i,
                    param=f"messages.{i}.content.{j}",
                )
            )
        if pending:
            findings.append(_unanswered_tool_use(at, pending))
        if previous is not None and role == "user" and previous.get("role") == "user":
            text = _text(message.get("content"))
            if text and text == _text(previous.get("content")):
                findings.append(_doubled_user(f"messages.{i}", i, f"messages.{i}.content"))
        offered = {}
        if role == "assistant":
            uses = _blocks(message, "tool_use")
            offered = {b["id"]: None for _, b in uses if isinstance(b.get("id"), str)}
        previous, at = message, i
    if offered:
        findings.append(_unanswered_tool_use(at, offered))
    if expects_system and not anthropic_has_system_prompt(body):
        findings.append(_missing_system("system"))
    return findings


def _unanswered_tool_use(index: int, ids: Iterable[str]) -> Finding:
    return Finding(
        "orphan_tool_call",
        f"messages.{index}: `tool_use` ids were found without `tool_result` blocks immediately "
        f"after: {', '.join(ids)}. Each `tool_use` block must have a corresponding "
        f"`tool_result` block in the next message.",
        index=index,
        param=f"messages.{index}",
    )


def anthropic_has_system_prompt(body: JSON) -> bool:
    """Whether an Anthropic request has a (non-empty) ``system``."""
    system = body.get("system") if isinstance(body, dict) else None
    return bool(_text(system))


# -- the Responses API --------------------------------------------------------------


def _is_message(item: dict[str, Any]) -> bool:
    return bool(item.get("type", "message") == "message")


def validate_responses_conversation(body: JSON, *, expects_system: bool = False) -> list[Finding]:
    """The defects of a Responses request's ``input``: each call item (``function_call``,
    ``custom_tool_call``, any ``*_call`` with a ``call_id``) needs an output item
    (``<type>_output``) with its ``call_id``, and each output item a call. A request that
    continues a stored response (``previous_response_id``) or ``conversation`` may answer
    calls made there, so its outputs are not checked for a call."""
    if not isinstance(body, dict) or not isinstance(body.get("input"), list):
        return []
    findings: list[Finding] = []
    items = list(_dicts(body["input"]))
    calls: dict[tuple[str, str], int] = {}  # (output type, call_id) -> index of the call
    for i, item in items:
        kind, call_id = item.get("type"), item.get("call_id")
        if isinstance(kind, str) and kind.endswith("_call") and isinstance(call_id, str):
            calls.setdefault((kind + "_output", call_id), i)
    answered: set[tuple[str, str]] = set()
    stored = body.get("previous_response_id") is not None or body.get("conversation") is not None
    previous: dict[str, Any] | None = None
    for i, item in items:
        kind, call_id = item.get("type"), item.get("call_id")
        if isinstance(kind, str) and kind.endswith("_call_output"):
            key = (kind, str(call_id))
            if item.get("output", "") is None:
                findings.append(
                    Finding(
                        "null_tool_content",
                        f"Invalid type for 'input[{i}].output': expected one of a string or "
                        f"array of input content, but got null instead.",
                        index=i,
                        param=f"input[{i}].output",
                    )
                )
            if key in answered or (key not in calls and not stored):
                findings.append(
                    Finding(
                        "orphan_tool_result",
                        f"No tool call found for {kind[:-12].replace('_', ' ')} call output "
                        f"with call_id {call_id}."
                        + (" (it is answered twice)" if key in answered else ""),
                        index=i,
                        param="input",
                    )
                )
            answered.add(key)
        elif (
            _is_message(item)
            and item.get("role") == "user"
            and previous is not None
            and _is_message(previous)
            and previous.get("role") == "user"
        ):
            text = _text(item.get("content"))
            if text and text == _text(previous.get("content")):
                findings.append(_doubled_user(f"input[{i}]", i, f"input[{i}].content"))
        previous = item
    for (output, call_id), i in calls.items():
        if (output, call_id) not in answered:
            findings.append(
                Finding(
                    "orphan_tool_call",
                    f"No tool output found for {output[:-12].replace('_', ' ')} call {call_id}.",
                    index=i,
                    param="input",
                )
            )
    if expects_system and not responses_has_system_prompt(body):
        findings.append(_missing_system("instructions"))
    return findings


def responses_has_system_prompt(body: JSON) -> bool:
    """Whether a Responses request has ``instructions`` or a system/developer message."""
    if not isinstance(body, dict):
        return False
    if isinstance(body.get("instructions"), str) and body["instructions"].strip():
        return True
    items = _dicts(body.get("input"))
    return any(_is_message(item) and item.get("role") in SYSTEM_ROLES for _, item in items)


CHAT_CHECKS = ConversationChecks(validate_conversation, has_system_prompt)
ANTHROPIC_CHECKS = ConversationChecks(validate_anthropic_conversation, anthropic_has_system_prompt)
RESPONSES_CHECKS = ConversationChecks(validate_responses_conversation, responses_has_system_prompt)
