"""NearestIndex's candidate selection and scoring are the straightforward ones, only faster.

`NearestIndex._probes` sorts where it took `heapq.nsmallest`; `_top` picks the
slots to score from the probe counts with byte strings and masks, looks `keys`
up only where it must, and weighs long lists of tied slots by walking the
documents by length; `_score_slots` screens with the kept number of distinct words and
scores from the words in common plus the bigrams. `Straightforward`
below is all of it as first written, in plain Python (probes by
`heapq.nsmallest`, every count filtered by `keys`, a histogram, a full sort by
length, whole feature sets scored with `_jaccard`); every query on seeded
random corpora must give exactly the same results (keys and float scores)
with both.
"""

from __future__ import annotations

import heapq
import random
from bisect import bisect_left
from collections import Counter
from collections.abc import Container, Iterable
from itertools import compress, islice

import pytest

from chaosllm.store.nearest import NearestIndex, _features, _jaccard
from chaosllm.store.normalize import tokenize_bytes

_WORDS = [f"w{i}" for i in range(600)]


class Straightforward(NearestIndex):
    """The first, plain selection: the oracle the optimised one must equal."""

    __slots__ = ()

    def _probes(self, tokens: list[bytes]) -> list[tuple[int, bytes]]:
        get = self._postings.get
        df = {word: len(plist) for word in set(tokens) if (plist := get(word)) is not None}
        limit = self._max_probes
        if len(df) <= limit:
            chosen = set(df)
        else:
            chosen = set()
            stretches = max(1, limit // 2)
            n = len(tokens)
            for i in range(stretches):
                stretch = tokens[i * n // stretches : (i + 1) * n // stretches]
                words = {w for w in stretch if w in df}
                chosen.update(heapq.nsmallest(2, words, key=df.__getitem__))
            if len(chosen) < limit:
                rest = (w for w in df if w not in chosen)
                chosen.update(heapq.nsmallest(limit - len(chosen), rest, key=df.__getitem__))
        return sorted((df[w], w) for w in chosen)

    def _top(
        self,
        counts: dict[int, int],
        want: int,
        ntokens: int,
        keys: Container[int] | None,
        levels: int,
    ) -> set[int]:
        if keys is not None and counts:
            inside = list(
                compress(counts, map(keys.__contains__, map(self._keys.__getitem__, counts)))
            )
            counts = dict(zip(inside, map(counts.__getitem__, inside), strict=True))
        if len(counts) <= want:
            return set(counts)
        histogram = Counter(counts.values())
        admitted = 0
        threshold = 0
        for count in sorted(histogram, reverse=True):
            admitted += histogram[count]
            threshold = count
            if admitted >= want:
                break
        above = list(compress(counts, map(threshold.__lt__, counts.values())))
        need = want - len(above)
        tied = list(islice(compress(counts, map(threshold.__eq__, counts.values())), 4096))
        if len(tied) > need:
            tied = self._closest_in_length(tied, ntokens, need)
        return {*above, *tied}

    def _closest_in_length(self, slots: list[int], ntokens: int, n: int) -> list[int]:
        lengths = self._ntokens
        slots.sort(key=lengths.__getitem__)
        right = bisect_left(slots, ntokens, key=lengths.__getitem__)
        left = right - 1
        out: list[int] = []
        while len(out) < n:
            if right < len(slots) and (
                left < 0 or lengths[slots[right]] - ntokens <= ntokens - lengths[slots[left]]
            ):
                out.append(slots[right])
                right += 1
            else:
                out.append(slots[left])
                left -= 1
        return out

    def _score_slots(
        self, tokens: list[bytes], slots: Iterable[int], k: int, exact: Iterable[int] = ()
    ) -> list[tuple[int, float]]:
        docs = self._docs
        qwords = set(tokens)
        nq = len(qwords)
        screened: list[tuple[float, int, list[bytes]]] = []
        for slot in slots:
            text = docs[slot]
            if text is None:
                continue
            dtokens = tokenize_bytes(text)
            dwords = set(dtokens)
            inter = len(qwords & dwords)
            union = nq + len(dwords) - inter
            if inter or not union:
                screened.append((-(inter / union if union else 1.0), slot, dtokens))
        if not screened:
            return []
        qfeatures = _features(tokens)
        slot_keys = self._keys
        scored = {slot_keys[slot]: -1.0 for slot in exact}
        for _, slot, dtokens in heapq.nsmallest(max(k, self._shortlist), screened):
            key = slot_keys[slot]
            if key not in scored:
                scored[key] = -_jaccard(qfeatures, _features(dtokens))
        best = heapq.nsmallest(k, ((neg, key) for key, neg in scored.items()))
        return [(key, -neg) for neg, key in best]


def _zipf_words(rng: random.Random, n: int, vocabulary: int = len(_WORDS)) -> list[str]:
    return [_WORDS[min(int(rng.paretovariate(0.7)) - 1, vocabulary - 1)] for _ in range(n)]


def _corpus(rng: random.Random, size: int) -> list[str]:
    """Chat-like documents: shared prompts, prefix families, lengths 5-120 words."""
    prompts = [_zipf_words(rng, rng.randint(5, 30)) for _ in range(6)]
    docs: list[str] = []
    while len(docs) < size:
        prompt = rng.choice(prompts)
        if rng.random() < 0.3:  # successive prefixes of one conversation
            turns = [_zipf_words(rng, rng.randint(3, 20)) for _ in range(rng.randint(2, 5))]
            for end in range(1, len(turns) + 1):
                docs.append(" ".join(prompt + [w for t in turns[:end] for w in t]))
        elif rng.random() < 0.01:
            docs.append(rng.choice(["", "?!", "..."]))  # documents without words
        else:
            docs.append(" ".join(prompt + _zipf_words(rng, rng.randint(1, 90))))
    return docs[:size]


def _queries(rng: random.Random, docs: list[str], count: int) -> list[str]:
    out: list[str] = []
    for _ in range(count):
        words = rng.choice(docs).split() or ["w1"]
        kind = rng.randrange(5)
        if kind == 1:
            words[rng.randrange(len(words))] = rng.choice(_WORDS)
        elif kind == 2:
            words += _zipf_words(rng, rng.randint(3, 30))
        elif kind == 3:
            words = _zipf_words(rng, rng.randint(1, 100))
        elif kind == 4:
            words = rng.sample(_WORDS, rng.randint(1, 8))  # rare words only
        out.append(" ".join(words))
    out += ["", "!!", "w0", "w0 w0 w0"]
    return out


class _Odd:
    """A Container that is not a Collection."""

    def __contains__(self, key: object) -> bool:
        return isinstance(key, int) and key % 2 == 1


def _key_sets(size: int, rng: random.Random) -> list[Container[int] | None]:
    return [
        None,
        range(0, size, 2),
        frozenset(rng.sample(range(size), size // 3)),
        set(rng.sample(range(size), 150)),  # few: most slots are left out
        set(rng.sample(range(size), 100)),  # scored directly when the search finds < k
        _Odd(),
    ]


def _both(
    docs: list[str], options: dict[str, int] | None = None, keys_of: list[int] | None = None
) -> tuple[NearestIndex, Straightforward]:
    fast, plain = NearestIndex(**(options or {})), Straightforward(**(options or {}))
    for slot, text in enumerate(docs):
        key = slot if keys_of is None else keys_of[slot]
        fast.add(key, text)
        plain.add(key, text)
    return fast, plain


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"max_postings": 256, "candidates": 24},
        {"max_postings": 64, "candidates": 7, "shortlist": 3},
        {"max_probes": 4, "candidates": 40},
        {"candidates": 1, "shortlist": 1},
    ],
)
def test_queries_equal_the_straightforward_selection(options: dict[str, int]) -> None:
    rng = random.Random(20261201)
    docs = _corpus(rng, 2500)
    fast, plain = _both(docs, options)
    queries = _queries(rng, docs, 40)
    for keys in _key_sets(len(docs), rng):
        for query in queries:
            for k in (1, 12):
                assert fast.query(query, k=k, keys=keys) == plain.query(query, k=k, keys=keys)


def test_equal_with_replaced_documents_and_keys_that_are_not_slots() -> None:
    # Keys far from the slots (and replacements: dead slots in the postings).
    rng = random.Random(5)
    docs = _corpus(rng, 2000)
    keys_of = rng.sample(range(10**6), len(docs))
    fast, plain = _both(docs, keys_of=keys_of)
    for _ in range(300):  # replace some documents: their old slots stay in the postings
        key = rng.choice(keys_of)
        text = rng.choice(docs)
        fast.add(key, text)
        plain.add(key, text)
    queries = _queries(rng, docs, 80)
    key_sets: list[Container[int] | None] = [
        None,
        frozenset(keys_of[::2]),
        set(rng.sample(keys_of, 200)),
    ]
    for keys in key_sets:
        for query in queries:
            assert fast.query(query, k=3, keys=keys) == plain.query(query, k=3, keys=keys)


def test_long_tied_lists_are_weighed_by_length_as_by_the_sort() -> None:
    # The walk over the documents by length (long lists) against the full sort,
    # with the order of `slots` arbitrary, lengths clustered and sparse, and the
    # walk given up (too many steps) when the slots are few among many documents.
    rng = random.Random(9)
    docs = [
        " ".join(["w"] * rng.choice([1, 2, 3, 40, 41, 90, rng.randint(1, 300)]))
        for _ in range(6000)
    ]
    fast, plain = _both(docs)
    for _ in range(300):
        slots = rng.sample(range(len(docs)), rng.choice([257, 300, 1000, 4096]))
        ntokens = rng.choice([0, 1, 2, 40, 45, 89, 150, 299, 400])
        n = rng.randint(1, 40)
        wanted = plain._closest_in_length(list(slots), ntokens, n)
        assert fast._closest_in_length(list(slots), ntokens, n) == wanted


def test_equal_while_documents_are_added_between_queries() -> None:
    # What the index keeps per slot (token and word counts, the documents by
    # length, whether keys are slots) follows adds and replacements between
    # queries; the same key objects asked with again and again, and new ones.
    rng = random.Random(13)
    docs = _corpus(rng, 1500)
    fast, plain = _both(docs[:1000])
    evens = frozenset(range(0, 3000, 2))
    thirds = range(0, 3000, 3)
    queries = _queries(rng, docs, 16)
    for step, text in enumerate(docs[1000:]):
        key = step % 1200 if step % 3 else 1000 + step  # replacements and new keys
        fast.add(key, text)
        plain.add(key, text)
        if step % 100 == 0:
            others = [frozenset(rng.sample(range(3000), 1500)) for _ in range(3)]
            for query in queries:
                for keys in (evens, thirds, evens, *others, *others):
                    assert fast.query(query, k=3, keys=keys) == plain.query(query, k=3, keys=keys)
