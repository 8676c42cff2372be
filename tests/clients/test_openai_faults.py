"""What the official `openai` SDK (sync, ``max_retries=2``) does against every fault.

Each test is a specification of the SDK's observed behaviour: how many attempts
the server saw (the journal), which exception class reached the caller and from
where (``create()`` or iterating the stream), or what it returned instead -- an
empty answer, a silently truncated stream, unparseable tool arguments. A change
in the SDK or in chaosllm makes one of them fail. The table these tests
establish is in the report of issue 3 (fault x SDK behaviour).

Without a Retry-After the SDK backs off 0.5 s (x0.75-1 jitter), then 1 s, before
its two retries; faults that need several retries use a small `retry_after`
where the fault has one, so that the suite stays fast.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from chaosllm import ChaosServer
from tests.helpers import CLOCK_SLACK, openai_client, recording, request_body

pytestmark = pytest.mark.timeout(30)

NAME = "knowledge/0004"
"""A short answer recorded from a stream: 16 answer frames, finish, usage, [DONE]."""
TOOLS_JSON = "tool-call/0001"
TOOLS_STREAM = "streaming-tools/0001"
STREAM_CHUNKS = 18
"""Chunks the SDK yields for NAME unfaulted (19 frames minus [DONE])."""
FIRST_RETRY_MIN_S = 0.5 * 0.75
"""The SDK's shortest first backoff without Retry-After (0.5 s minus 25 % jitter)."""


def answer_text(name: str = NAME) -> str:
    content: str = recording(name)["response"]["body"]["choices"][0]["message"]["content"]
    return content


@dataclass
class Outcome:
    """What the caller of ``client.chat.completions.create`` got."""

    attempts: list[str | None]
    """The fault the server applied on each attempt it saw (None: served normally)."""
    error: Exception | None
    raised_in: str | None
    """``create`` or ``iterate`` (the stream), when an exception reached the caller."""
    completion: ChatCompletion | None = None
    chunks: list[ChatCompletionChunk] = field(default_factory=list)
    """The chunks the caller received (before an exception, if any)."""
    elapsed: float = 0.0
    times: list[float] = field(default_factory=list)
    """When the server saw each attempt (journal time)."""

    @property
    def text(self) -> str:
        return "".join(c.choices[0].delta.content or "" for c in self.chunks if c.choices)

    @property
    def finish(self) -> list[str]:
        return [
            c.choices[0].finish_reason
            for c in self.chunks
            if c.choices and c.choices[0].finish_reason
        ]

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.times, self.times[1:], strict=False)]

    def tool_arguments(self) -> dict[int, str]:
        calls: dict[int, str] = {}
        for chunk in self.chunks:
            for choice in chunk.choices:
                for call in choice.delta.tool_calls or []:
                    piece = call.function.arguments if call.function else None
                    calls[call.index] = calls.get(call.index, "") + (piece or "")
        return calls


def run(
    server: ChaosServer,
    *,
    stream: bool,
    name: str = NAME,
    timeout: float = 5.0,
    max_retries: int = 2,
    session: str | None = None,
) -> Outcome:
    """One SDK call of recording `name` against the armed faults."""
    body = request_body(name, stream=stream)
    started = time.monotonic()
    error: Exception | None = None
    raised_in: str | None = None
    completion: ChatCompletion | None = None
    chunks: list[ChatCompletionChunk] = []
    headers = {"X-Chaosllm-Session": session} if session else None
    with openai_client(
        server, max_retries=max_retries, timeout=timeout, default_headers=headers
    ) as client:
        raised_in = "create"
        try:
            if stream:
                with client.chat.completions.create(**body) as events:
                    raised_in = "iterate"
                    for chunk in events:
                        chunks.append(chunk)
            else:
                completion = client.chat.completions.create(**body)
        except Exception as exc:  # what reaches the caller is the point of the test
            error = exc
        else:
            raised_in = None
    elapsed = time.monotonic() - started
    entries = server.requests(session)
    return Outcome(
        attempts=[e["fault"]["type"] if e["fault"] else None for e in entries],
        error=error,
        raised_in=raised_in,
        completion=completion,
        chunks=chunks,
        elapsed=elapsed,
        times=[e["time"] for e in entries],
    )


def assert_full_answer(out: Outcome, *, stream: bool) -> None:
    assert out.error is None, repr(out.error)
    if stream:
        assert out.text == answer_text() and out.finish == ["stop"]
        assert len(out.chunks) == STREAM_CHUNKS and out.chunks[-1].usage is not None
    else:
        assert out.completion == ChatCompletion.model_validate(recording(NAME)["response"]["body"])


def assert_raised(out: Outcome, cls: type[Exception], where: str) -> Exception:
    assert type(out.error) is cls, repr(out.error)
    assert out.raised_in == where
    assert out.error is not None
    return out.error


# -- faults that deliver the answer, only slower -------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_latency_answer_arrives_late(server: ChaosServer, stream: bool) -> None:
    server.arm("latency", delay_ms=300)
    out = run(server, stream=stream)
    assert out.attempts == ["latency"]
    assert_full_answer(out, stream=stream)
    assert out.elapsed >= 0.3 - CLOCK_SLACK


@pytest.mark.parametrize("stream", [False, True])
def test_latency_beyond_the_timeout_is_retried(server: ChaosServer, stream: bool) -> None:
    server.arm("latency", delay_ms=1500)
    out = run(server, stream=stream, timeout=0.5)
    assert out.attempts == ["latency", None]
    assert_full_answer(out, stream=stream)


@pytest.mark.parametrize("stream", [False, True])
def test_slow_stream_answer_arrives_whole(server: ChaosServer, stream: bool) -> None:
    server.arm("slow_stream", delay_ms=15, piece_bytes=200)
    out = run(server, stream=stream)
    assert out.attempts == ["slow_stream"]
    assert_full_answer(out, stream=stream)


# -- faults the SDK accepts silently -------------------------------------------------------


def test_empty_response_json_is_accepted_as_an_empty_answer(server: ChaosServer) -> None:
    server.arm("empty_response")
    out = run(server, stream=False)
    assert out.attempts == ["empty_response"] and out.error is None
    assert out.completion is not None
    message = out.completion.choices[0].message
    assert message.content is None and message.tool_calls is None
    assert out.completion.choices[0].finish_reason == "stop"


def test_empty_response_stream_is_accepted_as_an_empty_answer(server: ChaosServer) -> None:
    server.arm("empty_response")
    out = run(server, stream=True)
    assert out.attempts == ["empty_response"] and out.error is None
    assert len(out.chunks) == 3  # role delta, finish chunk, usage chunk
    assert out.text == "" and out.finish == ["stop"]


def test_truncated_stream_is_accepted_silently(server: ChaosServer) -> None:
    server.arm("truncated_stream", after_chunks=5)
    out = run(server, stream=True)
    assert out.attempts == ["truncated_stream"] and out.error is None
    assert len(out.chunks) == 5 and out.finish == []
    assert all(c.usage is None for c in out.chunks)
    assert out.text and answer_text().startswith(out.text) and out.text != answer_text()


def test_truncated_stream_json_raises_a_bare_json_decode_error(server: ChaosServer) -> None:
    # A 200 whose (complete, Content-Length framed) body is cut JSON: the SDK lets the
    # decoder's error through -- not an openai.APIError -- and does not retry.
    server.arm("truncated_stream")
    out = run(server, stream=False)
    assert out.attempts == ["truncated_stream"]
    assert_raised(out, json.JSONDecodeError, "create")
    assert not isinstance(out.error, openai.OpenAIError)


def test_error_in_200_json_returns_a_completion_without_choices(server: ChaosServer) -> None:
    server.arm("error_in_200", message="upstream failed")
    out = run(server, stream=False)
    assert out.attempts == ["error_in_200"] and out.error is None
    completion = out.completion
    assert completion is not None
    assert completion.choices is None
    assert completion.model_extra == {
        "error": {"message": "upstream failed", "type": "server_error", "param": None, "code": None}
    }


@pytest.mark.parametrize("stream", [False, True])
def test_malformed_tool_args_are_passed_through(server: ChaosServer, stream: bool) -> None:
    name = TOOLS_STREAM if stream else TOOLS_JSON
    server.arm("malformed_tool_args")
    out = run(server, stream=stream, name=name)
    assert out.attempts == ["malformed_tool_args"] and out.error is None
    if stream:
        arguments = list(out.tool_arguments().values())
        assert out.finish == ["tool_calls"]
    else:
        assert out.completion is not None
        calls = out.completion.choices[0].message.tool_calls or []
        arguments = [c.function.arguments for c in calls]  # type: ignore[union-attr]
        assert out.completion.choices[0].finish_reason == "tool_calls"
    originals = recording(name)["response"]["body"]["choices"][0]["message"]["tool_calls"]
    assert len(arguments) == len(originals) >= 1
    for text, original in zip(arguments, originals, strict=True):
        assert original["function"]["arguments"].startswith(text)
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)


# -- faults raised mid-stream: never retried -------------------------------------------------


def test_error_in_200_stream_raises_api_error_after_k_chunks(server: ChaosServer) -> None:
    server.arm("error_in_200", after_chunks=2, message="upstream failed")
    out = run(server, stream=True)
    assert out.attempts == ["error_in_200"]
    error = assert_raised(out, openai.APIError, "iterate")
    assert isinstance(error, openai.APIError)
    assert error.message == "upstream failed" and error.type == "server_error"
    assert len(out.chunks) == 2


def test_dropped_connection_stream_raises_connection_error(server: ChaosServer) -> None:
    server.arm("dropped_connection", after_chunks=3)
    out = run(server, stream=True)
    assert out.attempts == ["dropped_connection"]
    error = assert_raised(out, openai.APIConnectionError, "iterate")
    assert type(error.__cause__).__name__ == "RemoteProtocolError"
    assert len(out.chunks) == 3


def test_connection_reset_stream_raises_connection_error(server: ChaosServer) -> None:
    server.arm("connection_reset", after_chunks=2)
    out = run(server, stream=True)
    assert out.attempts == ["connection_reset"]
    error = assert_raised(out, openai.APIConnectionError, "iterate")
    assert isinstance(
        error.__cause__.__cause__.__cause__,  # type: ignore[union-attr]
        ConnectionResetError,
    )
    assert len(out.chunks) == 2


def test_stall_stream_raises_timeout(server: ChaosServer) -> None:
    server.arm("stall", after_chunks=2, max_ms=10_000)
    out = run(server, stream=True, timeout=1.0)
    assert out.attempts == ["stall"]
    assert_raised(out, openai.APITimeoutError, "iterate")
    assert len(out.chunks) == 2 and out.elapsed >= 1.0 - CLOCK_SLACK


def test_garbage_stream_raises_a_bare_unicode_decode_error(server: ChaosServer) -> None:
    # The default garbage is binary: the SDK's SSE decoder fails on it and the
    # UnicodeDecodeError reaches the caller unwrapped.
    server.arm("garbage", after_chunks=2)
    out = run(server, stream=True)
    assert out.attempts == ["garbage"]
    assert_raised(out, UnicodeDecodeError, "iterate")
    assert len(out.chunks) == 2


def test_garbage_stream_of_text_raises_connection_error(server: ChaosServer) -> None:
    # Text that is not SSE is skipped as unknown fields; the missing terminating chunk
    # then surfaces as a connection error.
    server.arm("garbage", after_chunks=2, data="<html><body>502 Bad Gateway</body></html>\r\n")
    out = run(server, stream=True)
    assert out.attempts == ["garbage"]
    assert_raised(out, openai.APIConnectionError, "iterate")
    assert len(out.chunks) == 2


# -- faults before a usable response: retried, then recovered or exhausted -----------------------


@dataclass(frozen=True)
class Retried:
    """A fault the SDK retries: what it should end with after `remaining` firings."""

    fault: str
    stream: bool
    remaining: int
    error: type[Exception] | None
    """None: the retry got the whole answer."""
    cause: str | None = None
    """The class name of the exception's ``__cause__`` (the transport's error)."""
    params: tuple[tuple[str, Any], ...] = ()
    timeout: float = 5.0

    @property
    def id(self) -> str:
        kind = "stream" if self.stream else "json"
        return f"{self.fault}{dict(self.params) or ''}-{kind}-x{self.remaining}"

    def expected(self) -> dict[str, Any]:
        attempts = min(self.remaining, 3)
        return {
            "attempts": [self.fault] * attempts + [None] * (self.remaining < 3),
            "error": None if self.error is None else self.error.__name__,
            "raised_in": None if self.error is None else "create",
            "cause": self.cause,
            "full_answer": self.error is None,
        }


def observed(out: Outcome, stream: bool) -> dict[str, Any]:
    try:
        assert_full_answer(out, stream=stream)
        full = True
    except AssertionError:
        full = False
    cause = (
        None
        if out.error is None or out.error.__cause__ is None
        else type(out.error.__cause__).__name__
    )
    return {
        "attempts": out.attempts,
        "error": None if out.error is None else type(out.error).__name__,
        "raised_in": out.raised_in,
        "cause": cause,
        "full_answer": full,
    }


CONNECTION = openai.APIConnectionError
RETRIED = [
    # One-shot (the default): the SDK's first retry gets the answer.
    Retried("http_503", False, 1, None),
    Retried("http_503", True, 1, None),
    Retried("http_429", False, 1, None, params=(("retry_after", 0.1),)),
    Retried("http_429", True, 1, None, params=(("retry_after", 0.1),)),
    Retried("http_error", False, 1, None),
    Retried("http_error", True, 1, None),
    Retried("dropped_connection", False, 1, None),
    Retried("connection_reset", False, 1, None),
    Retried("empty_reply", False, 1, None),
    Retried("empty_reply", True, 1, None),
    Retried("garbage", False, 1, None),
    Retried("stall", False, 1, None, params=(("max_ms", 10_000),), timeout=1.0),
    # Three firings: the two retries run out and the last error reaches the caller.
    Retried("http_503", False, 3, openai.InternalServerError, params=(("retry_after", 0.1),)),
    Retried("http_503", True, 3, openai.InternalServerError, params=(("retry_after", 0.1),)),
    Retried("http_429", False, 3, openai.RateLimitError, params=(("retry_after", 0.1),)),
    Retried("http_429", True, 3, openai.RateLimitError, params=(("retry_after", 0.1),)),
    Retried("dropped_connection", False, 3, CONNECTION, "RemoteProtocolError"),
    Retried("connection_reset", False, 3, CONNECTION, "ReadError"),
    Retried("empty_reply", False, 3, CONNECTION, "RemoteProtocolError"),
    Retried("empty_reply", True, 3, CONNECTION, "RemoteProtocolError"),
    Retried("garbage", False, 3, CONNECTION, "RemoteProtocolError"),
    Retried(
        "stall",
        False,
        3,
        openai.APITimeoutError,
        "ReadTimeout",
        params=(("max_ms", 10_000),),
        timeout=0.5,
    ),
]


def test_faults_before_a_usable_response_are_retried(server: ChaosServer) -> None:
    """All the cases at once, each on its own session, as the SDK's backoff (0.5 s, then
    1 s) makes them slow one by one."""

    def one(index: int, case: Retried) -> dict[str, Any]:
        session = f"retried-{index}"
        server.arm(
            case.fault, remaining=case.remaining, match={"session": session}, **dict(case.params)
        )
        return observed(
            run(server, stream=case.stream, timeout=case.timeout, session=session), case.stream
        )

    with ThreadPoolExecutor(len(RETRIED)) as pool:
        futures = {case.id: pool.submit(one, i, case) for i, case in enumerate(RETRIED)}
        got = {name: future.result(timeout=20) for name, future in futures.items()}
    assert got == {case.id: case.expected() for case in RETRIED}
    assert server.faults()["armed"] == []


@pytest.mark.parametrize(
    ("status", "cls", "attempts"),
    [
        (400, openai.BadRequestError, 1),
        (401, openai.AuthenticationError, 1),
        (403, openai.PermissionDeniedError, 1),
        (404, openai.NotFoundError, 1),
        (408, openai.APIStatusError, 3),
        (409, openai.ConflictError, 3),
        (422, openai.UnprocessableEntityError, 1),
        (500, openai.InternalServerError, 3),
        (502, openai.InternalServerError, 3),
        (504, openai.InternalServerError, 3),
        (529, openai.InternalServerError, 3),
    ],
)
def test_http_error_status_decides_retry_and_exception(
    server: ChaosServer, status: int, cls: type[Exception], attempts: int
) -> None:
    # Raised by create() before any chunk: the same for a streaming request (see
    # test_faults_before_a_usable_response_are_retried).
    server.arm(
        "http_error", status=status, retry_after=0.1, remaining=3, message=f"injected {status}"
    )
    out = run(server, stream=False)
    assert out.attempts == ["http_error"] * attempts
    error = assert_raised(out, cls, "create")
    assert isinstance(error, openai.APIStatusError)
    assert (
        error.status_code == status and error.message == f"Error code: {status} - injected {status}"
    )


# -- Retry-After --------------------------------------------------------------------------------


def test_retry_after_is_honoured(server: ChaosServer) -> None:
    # 0.6 s is longer than the SDK's own first backoff (at most 0.5 s): only honouring
    # the header explains the gap.
    server.arm("http_429", retry_after=0.6)
    out = run(server, stream=False)
    assert out.attempts == ["http_429", None]
    assert_full_answer(out, stream=False)
    assert out.gaps[0] >= 0.6


def test_retry_after_zero_falls_back_to_the_sdk_backoff(server: ChaosServer) -> None:
    server.arm("http_429", retry_after=0)
    out = run(server, stream=False)
    assert out.attempts == ["http_429", None]
    assert out.gaps[0] >= FIRST_RETRY_MIN_S


def test_retry_after_beyond_two_minutes_is_not_retried(server: ChaosServer) -> None:
    server.arm("http_429", retry_after=121, remaining=3)
    out = run(server, stream=False)
    assert out.attempts == ["http_429"]
    assert_raised(out, openai.RateLimitError, "create")
    assert out.elapsed < 5.0  # it did not wait the 121 s


def test_no_retries_the_first_fault_reaches_the_caller(server: ChaosServer) -> None:
    server.arm("empty_reply")
    out = run(server, stream=False, max_retries=0)
    assert out.attempts == ["empty_reply"]
    assert_raised(out, openai.APIConnectionError, "create")


def test_the_sdk_reads_the_request_id_of_every_answer(server: ChaosServer) -> None:
    """openai's ``_request_id`` and ``APIStatusError.request_id`` (the x-request-id header)."""
    with openai_client(server) as client:
        reply = client.chat.completions.create(**request_body(NAME, stream=False))
        assert str(reply._request_id).startswith("req_")
        server.arm("http_503")
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(**request_body(NAME, stream=False))
    assert str(info.value.request_id).startswith("req_")
    assert info.value.request_id != reply._request_id
