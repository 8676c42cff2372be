"""What the benchmarks send and what the servers answer.

- The JSON payload is the request body of the shipped
  ``recordings/simple-chat/0001.json`` (answered from that recording).
- The SSE payload asks for a benchmark recording (``bench-stream/0001.json``,
  written to a temp dir) whose answer has exactly 17 words, so the OpenAI
  provider *renders* it (no recorded ``chunks``) as 20 frames: the role delta,
  17 content deltas, the finish chunk and ``data: [DONE]``.
- `synthetic_recordings` writes N distinct, realistic recordings (seeded) for
  the start-up and matcher benchmarks.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from servers import REPO_DIR

__all__ = [
    "SSE_FRAMES",
    "STREAM_ANSWER",
    "STREAM_QUESTION",
    "Payloads",
    "count_frames",
    "make_bench_recordings",
    "raw_request",
    "synthetic_recordings",
]

SSE_FRAMES = 20
STREAM_QUESTION = "Stream a short sentence for the chaosllm benchmark, please."
STREAM_ANSWER = (
    "Here is a short sentence, streamed word by word, so that the benchmark "
    "measures exactly twenty frames."
)
SIMPLE_CHAT = REPO_DIR / "recordings" / "simple-chat" / "0001.json"
_WORD = re.compile(r"\s*\S+|\s+")  # how the OpenAI provider splits text into deltas


@dataclass(frozen=True)
class Payloads:
    recordings: Path
    """The benchmark recording set (simple-chat + bench-stream)."""
    json_request: Path
    sse_request: Path
    json_question: str
    json_answer: str

    def request_file(self, kind: str) -> Path:
        return self.json_request if kind == "json" else self.sse_request


def _recording(body: dict[str, Any], answer: str, description: str) -> dict[str, Any]:
    return {
        "chaosllm": 1,
        "provider": "openai.chat",
        "request": {"method": "POST", "path": "/v1/chat/completions", "body": body},
        "response": {
            "status": 200,
            "stream": False,
            "body": {
                "id": "chatcmpl-bench",
                "object": "chat.completion",
                "created": 1788338474,
                "model": "gpt-4o-mini-2024-07-18",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "logprobs": None,
                        "message": {"role": "assistant", "content": answer, "refusal": None},
                    }
                ],
                "usage": {"prompt_tokens": 20, "completion_tokens": 20, "total_tokens": 40},
            },
        },
        "meta": {"description": description},
    }


def make_bench_recordings(root: Path) -> Payloads:
    """Write the benchmark recording set and the two request bodies under `root`."""
    assert len(_WORD.findall(STREAM_ANSWER)) == SSE_FRAMES - 3
    shipped = json.loads(SIMPLE_CHAT.read_text(encoding="utf-8"))
    recordings = root / "recordings"
    (recordings / "simple-chat").mkdir(parents=True)
    (recordings / "simple-chat" / "0001.json").write_text(
        json.dumps(shipped, indent=2, sort_keys=True), encoding="utf-8"
    )
    stream_body = {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": STREAM_QUESTION},
        ],
    }
    (recordings / "bench-stream").mkdir()
    (recordings / "bench-stream" / "0001.json").write_text(
        json.dumps(
            _recording(stream_body, STREAM_ANSWER, "20-frame SSE benchmark answer (rendered)"),
            indent=2,
            sort_keys=True,
        ),
        encoding="utf-8",
    )
    json_request = root / "json-request.json"
    json_request.write_text(json.dumps(shipped["request"]["body"]), encoding="utf-8")
    sse_request = root / "sse-request.json"
    sse_request.write_text(json.dumps({**stream_body, "stream": True}), encoding="utf-8")
    messages = shipped["request"]["body"]["messages"]
    return Payloads(
        recordings=recordings,
        json_request=json_request,
        sse_request=sse_request,
        json_question=messages[-1]["content"],
        json_answer=shipped["response"]["body"]["choices"][0]["message"]["content"],
    )


def count_frames(body: bytes) -> int:
    """SSE events with a ``data:`` field in a response body."""
    events = body.replace(b"\r\n", b"\n").split(b"\n\n")
    return sum(
        1 for event in events if any(line.startswith(b"data:") for line in event.split(b"\n"))
    )


def raw_request(host: str, port: int, path: str, body: bytes) -> bytes:
    """The request `wrk` sends with ``post.lua``: POST, Host, Content-Type, Content-Length."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body


def fetch(url: str, request_file: Path, headers: dict[str, str] | None = None) -> httpx.Response:
    """One request as the load generator sends it (for checks and for the baseline bytes)."""
    with httpx.Client(timeout=10.0, trust_env=False) as client:
        return client.post(
            url,
            content=request_file.read_bytes(),
            headers={"content-type": "application/json", **(headers or {})},
        )


# -- synthetic recordings --------------------------------------------------------------

_SYLLABLES = (
    "ka",
    "lo",
    "mi",
    "ne",
    "ru",
    "sa",
    "ti",
    "vo",
    "ze",
    "da",
    "pe",
    "qui",
    "bra",
    "sto",
    "fen",
    "gar",
    "hul",
    "jin",
    "mor",
    "tas",
)


def _vocabulary(rng: random.Random, size: int) -> list[str]:
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choices(_SYLLABLES, k=rng.randint(1, 4))))
    return sorted(words)


def synthetic_recordings(root: Path, n: int, *, seed: int = 7) -> Path:
    """Write `n` distinct recordings (100 scenarios) under ``root/synthetic``; its path.

    Each is a chat request (one of 20 system prompts, 1-3 turns of 8-40 words)
    with a 20-80 word answer, written as the recorder writes (indented, sorted).
    """
    rng = random.Random(seed)
    vocab = _vocabulary(rng, 5000)
    prompts = [" ".join(rng.choices(vocab, k=rng.randint(10, 40))) for _ in range(20)]
    base = root / "synthetic"
    for i in range(n):
        messages: list[dict[str, str]] = [{"role": "system", "content": rng.choice(prompts)}]
        for turn in range(rng.randint(1, 3)):
            if turn:
                messages.append(
                    {
                        "role": "assistant",
                        "content": " ".join(rng.choices(vocab, k=rng.randint(8, 40))),
                    }
                )
            messages.append(
                {
                    "role": "user",
                    "content": f"request {i}: "
                    + " ".join(rng.choices(vocab, k=rng.randint(8, 40))),
                }
            )
        body = {
            "model": rng.choice(("gpt-4o-mini", "gpt-4o", "gpt-4.1")),
            "messages": messages,
            "temperature": 0.2,
        }
        answer = " ".join(rng.choices(vocab, k=rng.randint(20, 80)))
        scenario = base / f"scenario-{i % 100:03d}"
        scenario.mkdir(parents=True, exist_ok=True)
        (scenario / f"{i // 100 + 1:04d}.json").write_text(
            json.dumps(_recording(body, answer, f"synthetic {i}"), indent=2, sort_keys=True),
            encoding="utf-8",
        )
    return base
