"""A reference resilient client: a small wrapper over the official `openai` SDK that
recovers from every fault in chaosllm's catalogue, within a retry budget.

What it does, and why each rule exists:

- Retries connection errors, timeouts, resets and drops (the SDK raises
  `APIConnectionError`/`APITimeoutError`), and 408/409/429/5xx statuses; never
  other 4xx (a bad request stays bad).
- Honours `Retry-After` (`retry-after-ms` first), as long as the wait fits in the
  time left; otherwise it fails at once rather than sleeping past its deadline.
- Detects what the SDK lets through as success: an error envelope inside a 200
  (`error_in_200`), an answer with neither content nor tool calls
  (`empty_response`), tool-call arguments that are not JSON
  (`malformed_tool_args`), a stream that ends without a finish reason
  (`truncated_stream`, `garbage`) — and asks again.
- Bounds every attempt (`attempt_timeout`) and the whole call (`total_timeout`),
  so a stall costs one attempt, never a hang.
- Gives up with `RetryBudgetExceeded` (listing every failure) after
  `max_attempts`; never returns a partial answer.

    client = ResilientClient(openai.OpenAI(max_retries=0), max_attempts=4)
    message = client.chat({"model": "gpt-4o-mini", "messages": [...]})
    text = client.stream_text({"model": "gpt-4o-mini", "messages": [...]})
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

import openai

__all__ = ["IncompleteAnswer", "ResilientClient", "RetryBudgetExceeded"]

T = TypeVar("T")
RETRYABLE_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})


class IncompleteAnswer(Exception):
    """An answer that arrived but cannot be used (empty, cut short, malformed)."""


class ContentFiltered(Exception):
    """The provider's content filter cut the answer (``finish_reason: "content_filter"``):
    the same question would be filtered again, so it is not retried."""


class RetryBudgetExceeded(Exception):
    """Every attempt failed, or time ran out; `failures` says how each one failed."""

    def __init__(self, failures: list[str]) -> None:
        super().__init__(f"gave up after {len(failures)} attempts: " + "; ".join(failures))
        self.failures = failures


def _retry_after(error: openai.APIStatusError) -> float | None:
    headers = error.response.headers
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is not None:
            try:
                return max(0.0, float(value) / scale)
            except ValueError:
                continue
    return None


def _check_message(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls") or []
    if not message.get("content") and not calls and not message.get("refusal"):
        raise IncompleteAnswer("an empty answer (no content, no tool calls)")
    for call in calls:
        try:
            json.loads(call["function"]["arguments"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise IncompleteAnswer(
                f"tool call {call.get('id')} has arguments that are not JSON: {exc}"
            ) from None
    return message


class ResilientClient:
    def __init__(
        self,
        client: openai.OpenAI | None = None,
        *,
        max_attempts: int = 4,
        attempt_timeout: float = 5.0,
        total_timeout: float = 30.0,
        backoff: float = 0.05,
        max_backoff: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self.client = client or openai.OpenAI()
        self.max_attempts = max_attempts
        self.attempt_timeout = attempt_timeout
        self.total_timeout = total_timeout
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.sleep = sleep
        self.attempts = 0
        """Attempts made by the last call."""

    def chat(self, request: dict[str, Any]) -> dict[str, Any]:
        """The assistant message (``content``, ``tool_calls``, ``refusal``) as a dict."""
        return self._with_retries(lambda timeout: self._chat_once(request, timeout))

    def stream_text(self, request: dict[str, Any]) -> str:
        """The whole streamed text, only once the stream finished properly."""
        return self._with_retries(lambda timeout: self._stream_once(request, timeout))

    # -- one attempt -------------------------------------------------------------

    def _chat_once(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        raw = self.client.with_options(
            max_retries=0, timeout=timeout
        ).chat.completions.with_raw_response.create(**request)
        body = json.loads(raw.http_response.content)
        if not isinstance(body, dict) or "error" in body or not body.get("choices"):
            raise IncompleteAnswer(
                f"a {raw.http_response.status_code} whose body is not an answer: {str(body)[:200]}"
            )
        message = body["choices"][0].get("message") or {}
        if body["choices"][0].get("finish_reason") is None:
            raise IncompleteAnswer("an answer without a finish reason")
        if body["choices"][0].get("finish_reason") == "content_filter":
            raise ContentFiltered("the provider's content filter cut the answer")
        result = {
            k: message[k]
            for k in ("content", "tool_calls", "refusal")
            if message.get(k) is not None
        }
        if "tool_calls" in result:
            result["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": c.get("type", "function"),
                    "function": {
                        "name": c["function"]["name"],
                        "arguments": c["function"]["arguments"],
                    },
                }
                for c in result["tool_calls"]
            ]
        return _check_message(result)

    def _stream_once(self, request: dict[str, Any], timeout: float) -> str:
        text: list[str] = []
        finish = None
        stream = self.client.with_options(max_retries=0, timeout=timeout).chat.completions.create(
            **request, stream=True
        )
        with stream:
            for chunk in stream:
                for choice in chunk.choices:
                    text.append(choice.delta.content or "")
                    finish = choice.finish_reason or finish
        if finish is None:
            raise IncompleteAnswer("the stream ended without a finish reason")
        if finish == "content_filter":
            raise ContentFiltered("the provider's content filter cut the streamed answer")
        if not "".join(text):
            raise IncompleteAnswer("an empty streamed answer")
        return "".join(text)

    # -- the retry loop ------------------------------------------------------------

    def _with_retries(self, attempt: Callable[[float], T]) -> T:
        deadline = time.monotonic() + self.total_timeout
        failures: list[str] = []
        self.attempts = 0
        while self.attempts < self.max_attempts:
            left = deadline - time.monotonic()
            if left <= 0:
                failures.append("out of time")
                break
            self.attempts += 1
            wait = min(self.backoff * 2 ** (self.attempts - 1), self.max_backoff)
            try:
                return attempt(min(self.attempt_timeout, left))
            except openai.APIStatusError as exc:
                failures.append(f"HTTP {exc.status_code}")
                if exc.status_code not in RETRYABLE_STATUSES:
                    raise RetryBudgetExceeded(failures) from exc
                wait = _retry_after(exc) if _retry_after(exc) is not None else wait
            except (openai.APIConnectionError, openai.APIError) as exc:
                failures.append(type(exc).__name__)
            except (IncompleteAnswer, ValueError) as exc:
                failures.append(str(exc) or type(exc).__name__)
            if self.attempts >= self.max_attempts:
                break
            if time.monotonic() + wait >= deadline:
                failures.append(f"a wait of {wait:g} s would pass the deadline")
                break
            self.sleep(wait)
        raise RetryBudgetExceeded(failures)


def main() -> None:
    """Run the example agent flow through the resilient client (reads OPENAI_BASE_URL)."""
    import sys

    from agent_flow import run

    client = ResilientClient(
        openai.OpenAI(max_retries=0), max_attempts=4, attempt_timeout=2.0, total_timeout=20.0
    )
    try:
        run(client.chat, client.stream_text)
    except RetryBudgetExceeded as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
