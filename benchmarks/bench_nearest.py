"""Benchmark `chaosllm.store.nearest.NearestIndex` on a synthetic corpus of chat requests.

Why synthetic: recordings are private and a benchmark must be reproducible.
The corpus imitates what makes the real thing hard (deterministic, seeded):

- a Zipf-distributed vocabulary (40k words), so common words are really
  common and the rare ones are rare;
- a few dozen system prompts, themselves picked Zipf-wise, so that most
  documents share long runs of identical text;
- "agent loop" families: ~40 % of the documents are successive prefixes of one
  long conversation (each step adds a turn), i.e. many near-identical
  documents that the index must tell apart;
- 50-300 words a document.

Queries (default 1,000): exact copies of stored documents, one-word
substitutions, three random edits, a stored document with a new turn
appended, a stored document whose last turn is replaced by a new one, and
novel documents. For the near-duplicate kinds, a query counts as
*found* when the top hit is at least as similar as the document it was derived
from (another document may legitimately be closer).

Usage: ``python benchmarks/bench_nearest.py [--n 100000] [--queries 1000]``.
"""

from __future__ import annotations

import argparse
import itertools
import random
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chaosllm.store.nearest import NearestIndex, similarity

__all__ = ["Corpus", "main", "make_corpus", "make_queries"]

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class Corpus:
    docs: list[str]
    vocab: list[str]
    cum_weights: list[float]
    prompts: list[list[str]]
    prompt_cum_weights: list[float]


def _zipf_cum(n: int, s: float) -> list[float]:
    return list(itertools.accumulate(1.0 / (r + 1) ** s for r in range(n)))


def _words(rng: random.Random, corpus_vocab: Sequence[str], cum: list[float], n: int) -> list[str]:
    return rng.choices(corpus_vocab, cum_weights=cum, k=n)


def _turn(rng: random.Random, vocab: Sequence[str], cum: list[float]) -> list[str]:
    role = rng.choice(("user:", "assistant:", "assistant:", "tool:"))
    body = _words(rng, vocab, cum, rng.randint(5, 60))
    if rng.random() < 0.1:
        body.insert(rng.randrange(len(body) + 1), rng.choice(("<id>", "<path>", "<ts>")))
    return [role, *body]


def _conversation(
    rng: random.Random, vocab: Sequence[str], cum: list[float], target: int
) -> list[list[str]]:
    turns: list[list[str]] = []
    total = 0
    while total < target:
        turn = _turn(rng, vocab, cum)
        turns.append(turn)
        total += len(turn)
    return turns


def make_corpus(n: int, seed: int = 1) -> Corpus:
    rng = random.Random(seed)
    vocab_set: set[str] = set()
    while len(vocab_set) < 40_000:
        vocab_set.add("".join(rng.choices(_LETTERS, k=rng.randint(2, 10))))
    vocab = sorted(vocab_set)
    rng.shuffle(vocab)
    cum = _zipf_cum(len(vocab), 1.05)
    prompts = [["system:", *_words(rng, vocab, cum, rng.randint(30, 100))] for _ in range(40)]
    prompt_cum = _zipf_cum(len(prompts), 1.2)
    docs: list[str] = []
    while len(docs) < n:
        prompt = rng.choices(prompts, cum_weights=prompt_cum)[0]
        budget = rng.randint(50, 300) - len(prompt)
        if rng.random() < 0.4:
            # An agent-loop family: successive prefixes of one conversation.
            turns = _conversation(rng, vocab, cum, max(budget, 60))
            for end in range(1, len(turns) + 1):
                docs.append(" ".join(itertools.chain(prompt, *turns[:end])))
        else:
            turns = _conversation(rng, vocab, cum, max(budget, 10))
            docs.append(" ".join(itertools.chain(prompt, *turns)))
    del docs[n:]
    return Corpus(docs, vocab, cum, prompts, prompt_cum)


@dataclass(frozen=True)
class Query:
    kind: str
    text: str
    source: int | None  # key of the stored document it was derived from


def make_queries(corpus: Corpus, count: int, seed: int = 2) -> list[Query]:
    rng = random.Random(seed)
    vocab, cum = corpus.vocab, corpus.cum_weights
    queries: list[Query] = []
    kinds = ("exact", "sub1", "edit3", "append", "newturn", "novel")
    weights = (15, 30, 15, 10, 10, 20)
    for kind in rng.choices(kinds, weights=weights, k=count):
        if kind == "novel":
            prompt = rng.choices(corpus.prompts, cum_weights=corpus.prompt_cum_weights)[0]
            turns = _conversation(rng, vocab, cum, rng.randint(20, 250))
            queries.append(Query(kind, " ".join(itertools.chain(prompt, *turns)), None))
            continue
        key = rng.randrange(len(corpus.docs))
        words = corpus.docs[key].split()
        if kind == "sub1":
            words[rng.randrange(len(words))] = _words(rng, vocab, cum, 1)[0]
        elif kind == "edit3":
            for _ in range(3):
                op = rng.randrange(3)
                i = rng.randrange(len(words))
                if op == 0:
                    words[i] = _words(rng, vocab, cum, 1)[0]
                elif op == 1 and len(words) > 1:
                    del words[i]
                else:
                    words.insert(i, _words(rng, vocab, cum, 1)[0])
        elif kind == "append":
            words += _turn(rng, vocab, cum)
        elif kind == "newturn":
            # The last turn replaced by a new one (a test whose prompt changed).
            last = max(i for i, w in enumerate(words) if w.endswith(":"))
            words = words[:last] if last else words
            words += _turn(rng, vocab, cum)
        queries.append(Query(kind, " ".join(words), key))
    return queries


def _build(docs: Sequence[str], **options: int) -> tuple[NearestIndex, float]:
    index = NearestIndex(**options)
    start = time.perf_counter()
    for key, text in enumerate(docs):
        index.add(key, text)
    return index, time.perf_counter() - start


def _pct(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def _maxrss_mb() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=100_000, help="documents (default 100000)")
    parser.add_argument("--queries", type=int, default=1000, help="queries (default 1000)")
    parser.add_argument("--seed", type=int, default=1)
    for option in ("max-probes", "max-postings", "candidates", "shortlist"):
        parser.add_argument(f"--{option}", type=int, help="NearestIndex option (default: its own)")
    args = parser.parse_args(argv)
    options = {
        name: value
        for name in ("max_probes", "max_postings", "candidates", "shortlist")
        if (value := getattr(args, name)) is not None
    }

    t0 = time.perf_counter()
    corpus = make_corpus(args.n, args.seed)
    queries = make_queries(corpus, args.queries, args.seed + 1)
    words = [len(d.split()) for d in corpus.docs]
    print(
        f"corpus: {len(corpus.docs)} docs, words/doc mean {statistics.mean(words):.0f} "
        f"(min {min(words)}, max {max(words)}), generated in {time.perf_counter() - t0:.1f} s"
    )

    n10k = min(10_000, args.n)
    _, build_10k = _build(corpus.docs[:n10k], **options)
    rss_before = _maxrss_mb()
    index, build_all = _build(corpus.docs, **options)
    rss_after = _maxrss_mb()

    times: dict[str, list[float]] = {}
    found: dict[str, list[bool]] = {}
    for q in queries:
        start = time.perf_counter()
        hits = index.query(q.text, k=3)
        elapsed = (time.perf_counter() - start) * 1000
        times.setdefault(q.kind, []).append(elapsed)
        if q.source is not None:
            best = hits[0][1] if hits else 0.0
            target = 1.0 if q.kind == "exact" else similarity(q.text, corpus.docs[q.source])
            found.setdefault(q.kind, []).append(best >= target - 1e-12)

    # Restricted queries: only the even keys (a large `keys`), then 30 and 200 keys.
    restricted: dict[str, list[float]] = {}
    for label, allowed in (
        ("keys=half", range(0, args.n, 2)),
        ("keys=30", set(range(0, args.n, max(1, args.n // 30)))),
        ("keys=200", set(range(0, args.n, max(1, args.n // 200)))),
    ):
        for q in queries[:200]:
            start = time.perf_counter()
            hits = index.query(q.text, k=3, keys=allowed)
            restricted.setdefault(label, []).append((time.perf_counter() - start) * 1000)
            assert all(key in allowed for key, _ in hits)

    all_times = [t for ts in times.values() for t in ts]
    print(f"build {n10k:>7} docs: {build_10k:7.3f} s  ({build_10k / n10k * 1e6:.1f} us/doc)")
    print(
        f"build {args.n:>7} docs: {build_all:7.3f} s  ({build_all / args.n * 1e6:.1f} us/doc), "
        f"max RSS {rss_before:.0f} -> {rss_after:.0f} MB"
    )
    print()
    print(f"{'queries':<10} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'found':>7}")
    rows = [*times.items(), ("all", all_times), *restricted.items()]
    for kind, ts in rows:
        ok = found.get(kind)
        rate = f"{sum(ok) / len(ok):7.1%}" if ok else f"{'':>7}"
        print(
            f"{kind:<10} {len(ts):>5} {_pct(ts, 50):8.3f} {_pct(ts, 99):8.3f} {max(ts):8.3f} {rate}"
        )
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
