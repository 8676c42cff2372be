"""Find the recorded requests most similar to an incoming one, fast, at 100k.

Why
---
When a request has no exact recording, chaosllm answers with an error that
names the nearest recordings and how they differ (SPEC §4, "nearest"), or
replays the nearest one when configured to. With up to ~100k recordings loaded
this must cost a few milliseconds per request, so comparing against every
recording is out; an inverted index narrows the search to a few dozen
candidates, which are then scored.

Similarity
----------
A text is split into word tokens (`chaosllm.store.normalize.tokenize_bytes`: case-folded,
punctuation separates). Its *features* are the set of its word unigrams and
word bigrams (adjacent pairs, i.e. 2-shingles). The similarity of two texts is
the Jaccard index of their feature sets::

    similarity(a, b) = len(F(a) & F(b)) / len(F(a) | F(b))     (1.0 if both are empty)

Why this measure:

- It is a property of the two texts alone. No corpus statistics (IDF) enter
  the score, so a score, and any threshold set on it, does not drift as
  recordings are added, and the score printed in a miss report can be
  reproduced with `similarity` on the two texts.
- Bigrams make word order count and keep edits local: changing one word in a
  text of n words removes at most 3 of its ~2n features (the unigram and the
  two bigrams through it) and adds at most 3, so a one-word change scores
  about (2n - 4) / (2n + 2): 0.985 at 200 words, still > 0.9 at 30. Short texts
  that differ in their one meaningful word stay apart: "What is the capital
  of France?" vs "... of Spain?" share 9 of 13 features, 0.69.
- Jaccard is symmetric, in [0, 1], 1.0 for the same token sequence, 0.0 for
  texts without a common word.
- Sets, not multisets: a feature repeated in one text counts once (a request
  that repeats a turn still differs in the bigrams at the seams). This keeps
  scoring in C (`set` intersection).

Index
-----
The index keeps each document's text (a reference, not a copy), its token
count, the slots of the documents of each token count, and postings: for
each word, the slots of the documents containing it. A query:

1. takes exact duplicates (the same text; or, for a query without words, the
   documents without words) from hash tables: found whatever the budgets;
2. picks up to ``max_probes`` known words of the query: the two rarest (by
   document frequency) of each of ``max_probes // 2`` equal stretches of it,
   topped up with the rarest overall. Spreading the probes matters when the
   query shares only part of its text with its nearest document (a stored
   conversation plus a new turn full of rare words);
3. scans the postings of the rarest probes while they fit in ``max_postings``
   (a probe more common than the whole budget only if nothing rarer exists,
   and then its newest ``max_postings`` entries), counting for each document
   how many probes it contains (C-speed `Counter.update`); the ``candidates``
   documents with the highest counts go on (ties: closest in length; see
   "Selecting" below). The
   probes too common for the budget (shared system prompts, "the") are only
   sampled, their newest entries, ``max_postings // 4`` in all; the
   ``candidates // 4`` documents with the most of them go on too: when all
   that a query shares with its nearest documents is common text (the same
   system prompt, a new user turn), these are the documents that share it;
4. screens those documents by the Jaccard index of their word sets (cheap:
   no bigrams), scores the best ``shortlist`` and the exact duplicates with
   the measure above, and returns the best ``k`` (ties: smaller key first).
   Every returned score is exact: it is what `similarity` says.

A near-duplicate of the query contains (almost) all of its probes and so tops
the counts; it is missed only if more than ``candidates`` documents contain
as many probes and are closer in length. Far from the query, results are
approximate: the best-scoring document may share with it only words too
common to scan, and then only documents among the sampled newest ones are
seen. This index finds what is *near*; it does not rank what is far.

``keys`` restricts results to documents whose key is in it: a collection of
at most 64 keys is scored directly (exact); otherwise documents outside
``keys`` are dropped after counting (a C-speed filter), and if that leaves
fewer than ``k`` results, a collection of at most 128 keys is scored directly.

Selecting
---------
Counting visits up to ``max_postings`` documents per query, so picking the
best counted ones is done in a few C passes over them rather than in Python
steps per document. A count is at most the number of probes (each slot is in
a word's postings once), so the counts are a byte string aligned with the
counted slots: its histogram is `bytes.count` per count, and the slots above
or at the admitting count are picked by `bytes.translate` masks fed to
`itertools.compress`. ``keys`` are looked up only for the slots at or above
the count that would admit enough if none were left out, unless fewer than
enough of those are in ``keys`` or ``keys`` are few (more than 8 documents
per key). The ties at the admitting count (at most 4096 of them, in counting
order) are weighed by length: the closest first, the longer first at the
same distance, then the order counted (for the shorter ones, the reverse);
a long list of ties is walked outwards from the query's length through the
documents of each length instead of being sorted. The choice is exactly that
of a plain filter, histogram and sort (``tests/leaves/test_nearest_selection.py``).

Adding a key again replaces its document; the old one's postings stay behind
(skipped) until replaced documents outnumber live ones and 1024, when the
postings are rebuilt. Not thread-safe: use it from one event loop or thread.

Costs (``benchmarks/bench_nearest.py``: 100k synthetic chat documents of ~170
words, a shared 2-core VM): ~50 µs to add a document; a query ~2.1-2.5 ms
(p50), ~3.6-5.2 ms (p99), restricted to half the keys ~2.3-2.6 ms and ~5-6 ms
(the keys of the thousands of documents counted are looked up); the index
adds ~1.2 KB per document to the texts, mostly postings (8 bytes per distinct
word), and 12 bytes for its number of distinct words and its place among the
documents of its length.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Collection, Container, Iterable, Sized
from itertools import compress, islice, pairwise
from typing import TypeAlias

from chaosllm.store.normalize import tokenize_bytes as _tokens

__all__ = ["NearestIndex", "similarity"]

_Feature: TypeAlias = "bytes | tuple[bytes, bytes]"

# `keys` collections this small are scored directly rather than searched; up to
# the larger size, directly when the search finds fewer than k among them.
_DIRECT_SCORE_SMALL = 64
_DIRECT_SCORE_LIMIT = 128
# At most this many slots tied at the admitting count are weighed by length.
_TIED_LIMIT = 4096


# `bytes.translate` tables over counts 0..255: 1 where a count is above, at, at
# or above (from), or below `level`, else 0: masks for `itertools.compress`.
def _above(level: int) -> bytes:
    return bytes(level + 1) + b"\x01" * (255 - level)


def _at(level: int) -> bytes:
    return bytes(level) + b"\x01" + bytes(255 - level)


def _from(level: int) -> bytes:
    return bytes(level) + b"\x01" * (256 - level)


def _below(level: int) -> bytes:
    return b"\x01" * level + bytes(256 - level)


# `keys` are few when there are more than this many documents per key.
_FEW_KEYS = 8
# Longer lists of tied slots are weighed by length with the documents by length.
_WALK_LONGER = 256


def _features(tokens: list[bytes]) -> set[_Feature]:
    """The set of word unigrams and bigrams of a token list."""
    features: set[_Feature] = set(tokens)
    features.update(pairwise(tokens))
    return features


def _jaccard(a: set[_Feature], b: set[_Feature]) -> float:
    if not a and not b:
        return 1.0
    inter = len(a & b) if len(a) <= len(b) else len(b & a)
    return inter / (len(a) + len(b) - inter)


def _second(pair: tuple[int, int]) -> int:
    return pair[1]


def similarity(a: str, b: str) -> float:
    """Jaccard similarity of the word unigram+bigram sets of `a` and `b`.

    The measure `NearestIndex` ranks by (see the module docstring); symmetric,
    in [0, 1], 1.0 for texts with the same tokens, 0.0 for texts with no word
    in common.
    """
    return _jaccard(_features(_tokens(a)), _features(_tokens(b)))


class NearestIndex:
    """An index of texts by integer key, answering "which are most similar".

    `add` a document per key (adding a key again replaces its document);
    `query` returns ``[(key, similarity), ...]``, best first. Texts should be
    normalised already (`chaosllm.store.normalize.normalize_text`); the index only
    tokenises them. It keeps a reference to each text.
    """

    __slots__ = (
        "_by_length",
        "_candidates",
        "_dead",
        "_docs",
        "_exact",
        "_exact_more",
        "_keyed_by_slot",
        "_keys",
        "_max_postings",
        "_max_probes",
        "_ntokens",
        "_nwords",
        "_postings",
        "_shortlist",
        "_slot_of",
        "_wordless",
    )

    def __init__(
        self,
        *,
        max_probes: int = 16,
        max_postings: int = 8192,
        candidates: int = 24,
        shortlist: int = 8,
    ) -> None:
        if min(max_probes, max_postings, candidates, shortlist) < 1:
            raise ValueError("max_probes, max_postings, candidates, shortlist must be positive")
        self._max_probes = max_probes
        self._max_postings = max_postings
        self._candidates = candidates
        self._shortlist = shortlist
        self._clear()

    def _clear(self) -> None:
        self._postings: defaultdict[bytes, list[int]] = defaultdict(list)  # word -> slots
        self._docs: list[str | None] = []  # slot -> text; None: replaced
        self._keys: list[int] = []  # slot -> key
        self._keyed_by_slot = True  # every slot's key is the slot itself
        self._ntokens = array("i")  # slot -> number of tokens
        self._nwords = array("i")  # slot -> number of distinct tokens
        self._by_length: defaultdict[int, list[int]] = defaultdict(list)  # tokens -> slots
        self._slot_of: dict[int, int] = {}  # key -> live slot
        self._exact: dict[str, int] = {}  # text -> a live slot with that text
        self._exact_more: dict[str, list[int]] = {}  # text -> its other live slots
        self._wordless: set[int] = set()  # live slots of documents without a word
        self._dead = 0  # replaced slots still in the postings

    def __len__(self) -> int:
        return len(self._slot_of)

    def __contains__(self, key: object) -> bool:
        return key in self._slot_of

    def add(self, key: int, text: str) -> None:
        """Index `text` under `key`, replacing what `key` had."""
        old = self._slot_of.get(key)
        if old is not None:
            self._forget(old)
        self._insert(key, text)
        if self._dead > 1024 and self._dead > len(self._slot_of):
            self._rebuild()

    def _insert(self, key: int, text: str) -> None:
        tokens = _tokens(text)
        slot = len(self._docs)
        self._docs.append(text)
        self._keys.append(key)
        if key != slot:
            self._keyed_by_slot = False
        self._ntokens.append(len(tokens))
        self._by_length[len(tokens)].append(slot)
        self._slot_of[key] = slot
        if self._exact.setdefault(text, slot) != slot:
            self._exact_more.setdefault(text, []).append(slot)
        if not tokens:
            self._wordless.add(slot)
        words = set(tokens)
        self._nwords.append(len(words))
        postings = self._postings
        for word in words:
            postings[word].append(slot)

    def _forget(self, slot: int) -> None:
        text = self._docs[slot]
        assert text is not None
        more = self._exact_more.get(text)
        if self._exact[text] == slot:
            if more:
                self._exact[text] = more.pop(0)
            else:
                del self._exact[text]
        else:
            assert more is not None
            more.remove(slot)
        if more is not None and not more:
            del self._exact_more[text]
        self._wordless.discard(slot)
        self._docs[slot] = None  # its postings stay; dead slots are skipped
        self._dead += 1

    def _rebuild(self) -> None:
        """Re-index the live documents (in their order), dropping replaced ones."""
        docs = self._docs
        live = [(key, docs[slot]) for key, slot in sorted(self._slot_of.items(), key=_second)]
        self._clear()
        for key, text in live:
            assert text is not None
            self._insert(key, text)

    def query(
        self, text: str, *, k: int = 3, keys: Container[int] | None = None
    ) -> list[tuple[int, float]]:
        """The (at most) `k` documents most similar to `text`, best first.

        Only documents with a word in common with `text` (similarity > 0) are
        returned. If `keys` is given, only documents whose key is in `keys`.
        """
        if k <= 0 or not self._slot_of:
            return []
        tokens = _tokens(text)

        if keys is not None and isinstance(keys, Collection) and len(keys) <= _DIRECT_SCORE_SMALL:
            return self._score_keys(tokens, keys, k)

        exact = set(self._exact_more.get(text, ()))
        first = self._exact.get(text)
        if first is not None:
            exact.add(first)
        if not tokens:  # no words: documents without words are the same (similarity 1)
            exact.update(self._wordless)
        if keys is not None:
            slot_keys = self._keys
            exact = {s for s in exact if slot_keys[s] in keys}
        chosen = exact if len(exact) >= k else self._candidate_slots(tokens, keys) | exact

        results = self._score_slots(tokens, chosen, k, exact)
        if (
            len(results) < k
            and keys is not None
            and isinstance(keys, Collection)
            and len(keys) <= _DIRECT_SCORE_LIMIT
        ):
            return self._score_keys(tokens, keys, k)
        return results

    def _probes(self, tokens: list[bytes]) -> list[tuple[int, bytes]]:
        """The words to look up, as ``(document frequency, word)``, rarest first.

        The rarest known words of each of ``max_probes // 2`` equal stretches
        of the query (two each), topped up with the rarest overall: a document
        that shares only part of the query (the query is a stored
        conversation plus a new turn full of rare words) still shares
        probes with it.
        """
        get = self._postings.get
        df = {word: len(plist) for word in set(tokens) if (plist := get(word)) is not None}
        limit = self._max_probes
        if len(df) <= limit:
            chosen = set(df)
        else:
            chosen = set()
            stretches = max(1, limit // 2)
            n = len(tokens)
            # sorted(...)[:m] is heapq.nsmallest(m, ...) (the same ties: first
            # in iteration order), with the key called from C.
            frequency = df.__getitem__
            for i in range(stretches):
                stretch = tokens[i * n // stretches : (i + 1) * n // stretches]
                words = {w for w in stretch if w in df}
                chosen.update(sorted(words, key=frequency)[:2])
            if len(chosen) < limit:
                rest = [w for w in df if w not in chosen]
                chosen.update(sorted(rest, key=frequency)[: limit - len(chosen)])
        return sorted((df[w], w) for w in chosen)

    def _candidate_slots(self, tokens: list[bytes], keys: Container[int] | None) -> set[int]:
        """Slots worth scoring: those sharing the most probe words with the query.

        Rare probes are scanned in full while they fit in ``max_postings``;
        the documents containing most of them are the ``candidates``. The
        probes too common for that budget are sampled (their newest entries,
        ``max_postings // 4`` in all), and the documents containing most of
        those add ``candidates // 4``: when the query shares with its nearest
        documents only common text (a system prompt, with the user turn
        changed), these are the documents that share it.
        """
        postings = self._postings
        probes = self._probes(tokens)
        rare: Counter[int] = Counter()
        budget = self._max_postings
        scanned = 0
        for df, word in probes:
            if df > budget:
                if scanned:
                    break
                rare.update(postings[word][-budget:])  # nothing rarer: its newest entries
            else:
                rare.update(postings[word])
            scanned += 1
            budget -= df
            if budget <= 0:
                break
        common: Counter[int] = Counter()
        rest = probes[scanned:]
        if rest:
            share = max(1, self._max_postings // 4 // len(rest))
            for _, word in rest:
                common.update(postings[word][-share:])
        chosen = self._top(rare, self._candidates, len(tokens), keys, scanned)
        chosen.update(
            self._top(common, max(1, self._candidates // 4), len(tokens), keys, len(rest))
        )
        return chosen

    def _top(
        self,
        counts: dict[int, int],
        want: int,
        ntokens: int,
        keys: Container[int] | None,
        levels: int,
    ) -> set[int]:
        """The `want` slots with the highest counts (in `keys`); ties: closest length.

        The same selection as `_top_of` on `counts` restricted to `keys`, in
        fewer steps per slot. Every count is in ``1..levels`` (the number of
        probes counted); with at most 255 levels the counts fit in a byte
        string aligned with the slots (`_select`). Unless `keys` are few (then
        every slot is looked up first), `keys` are looked up first only for the
        slots at or above the count that would admit `want` slots if none were
        left out (a few dozen, usually), and only if fewer than `want` of those
        are in `keys`, for the others too.
        """
        if not counts:
            return set()
        if levels > 255 or want > _TIED_LIMIT:
            if keys is not None:
                inside = self._inside(counts, keys)
                counts = dict(zip(inside, map(counts.__getitem__, inside), strict=True))
            return self._top_of(counts, want, ntokens)
        if keys is None:
            return self._select(counts, bytes(counts.values()), want, ntokens, levels)
        count_of = counts.__getitem__
        if isinstance(keys, Sized) and len(keys) * _FEW_KEYS < len(self._slot_of):
            inside = self._inside(counts, keys)
            return self._select(inside, bytes(map(count_of, inside)), want, ntokens, levels)
        values = bytes(counts.values())
        threshold = self._threshold(values, want, levels)[0]
        at_or_above = (
            counts if threshold == 1 else compress(counts, values.translate(_from(threshold)))
        )
        high = self._inside(at_or_above, keys)
        if len(high) >= want or threshold == 1:
            return self._select(high, bytes(map(count_of, high)), want, ntokens, levels)
        low = self._inside(compress(counts, values.translate(_below(threshold))), keys)
        rest = self._select(low, bytes(map(count_of, low)), want - len(high), ntokens, levels)
        return rest.union(high)

    def _inside(self, slots: Iterable[int], keys: Container[int]) -> list[int]:
        """Those of `slots` whose key is in `keys`, in their order."""
        if self._keyed_by_slot:
            return list(filter(keys.__contains__, slots))
        listed = list(slots)
        return list(compress(listed, map(keys.__contains__, map(self._keys.__getitem__, listed))))

    @staticmethod
    def _threshold(values: bytes, want: int, levels: int) -> tuple[int, int]:
        """The highest count such that `want` of `values` are at or above it (else 1),
        and how many are."""
        admitted = 0
        threshold = 1
        for count in range(levels, 0, -1):
            admitted += values.count(count)
            threshold = count
            if admitted >= want:
                break
        return threshold, admitted

    def _select(
        self, slots: Collection[int], values: bytes, want: int, ntokens: int, levels: int
    ) -> set[int]:
        """`_top_of` on `slots` with their counts `values` (in 1..levels, aligned).

        The histogram is `bytes.count` per level, and the slots above or at a
        count are picked by masks (`bytes.translate`) for `itertools.compress`:
        a few C passes over the slots.
        """
        threshold, admitted = self._threshold(values, want, levels)
        if admitted <= want:  # all of those at or above it, and no more
            return set(compress(slots, values.translate(_from(threshold))))
        above = list(compress(slots, values.translate(_above(threshold))))
        need = want - len(above)
        tied = list(islice(compress(slots, values.translate(_at(threshold))), _TIED_LIMIT))
        if len(tied) > need:
            tied = self._closest_in_length(tied, ntokens, need)
        return {*above, *tied}

    def _top_of(self, counts: dict[int, int], want: int, ntokens: int) -> set[int]:
        """`_top` on `counts` already restricted to `keys`, in plain Python."""
        if len(counts) <= want:
            return set(counts)
        # The count threshold that admits `want` slots; ties at it by length.
        histogram = Counter(counts.values())
        admitted = 0
        threshold = 0
        for count in sorted(histogram, reverse=True):
            admitted += histogram[count]
            threshold = count
            if admitted >= want:
                break
        # C-speed filters; at most 4096 tied slots are weighed by length.
        above = list(compress(counts, map(threshold.__lt__, counts.values())))
        need = want - len(above)
        tied = list(islice(compress(counts, map(threshold.__eq__, counts.values())), _TIED_LIMIT))
        if len(tied) > need:
            tied = self._closest_in_length(tied, ntokens, need)
        return {*above, *tied}

    def _closest_in_length(self, slots: list[int], ntokens: int, n: int) -> list[int]:
        """The `n` slots whose documents' token counts are closest to `ntokens`.

        The first `n` in the order of: distance, then longer (or as long)
        before shorter, then for the longer ones their order in `slots` and for
        the shorter ones the reverse; as a merge outwards from `ntokens` over
        `slots` sorted by length (a stable sort) takes them. A long list is
        walked instead in the index's documents by length, outwards from
        `ntokens`, picking those in `slots`, while that finds them in fewer steps
        than twice the length of the list; otherwise it is sorted.
        """
        if len(slots) > _WALK_LONGER:
            found = self._walk_lengths(slots, ntokens, n)
            if found is not None:
                return found
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

    def _walk_lengths(self, slots: list[int], ntokens: int, n: int) -> list[int] | None:
        """`_closest_in_length` by the documents of each length; None: too many steps."""
        position = dict(zip(slots, range(len(slots)), strict=True))
        place = position.__getitem__
        by_length = self._by_length.get
        steps = 2 * len(slots)
        out: list[int] = []
        distance = 0
        while True:
            longer = by_length(ntokens + distance)
            if longer:
                steps -= len(longer)
                found = list(filter(position.__contains__, longer))
                found.sort(key=place)
                out += found[: n - len(out)]
            shorter = by_length(ntokens - distance) if distance else None
            if shorter and len(out) < n:
                steps -= len(shorter)
                found = list(filter(position.__contains__, shorter))
                found.sort(key=place, reverse=True)
                out += found[: n - len(out)]
            if len(out) >= n:
                return out
            steps -= 1
            if steps < 0:
                return None
            distance += 1

    def _score_slots(
        self, tokens: list[bytes], slots: Iterable[int], k: int, exact: Iterable[int] = ()
    ) -> list[tuple[int, float]]:
        """Score `slots` against the query `tokens` and return the best `k`.

        Two stages: the Jaccard index of the word sets (cheap: no bigrams to
        build; the number of distinct words of each document is kept) screens
        the slots down to ``shortlist``; those, and the `exact` duplicates, are
        scored with the real measure (`similarity`, from the words in common
        and the bigrams).
        """
        docs = self._docs
        nwords = self._nwords
        qwords = set(tokens)
        nq = len(qwords)
        screened: list[tuple[float, int, int, list[bytes]]] = []
        for slot in slots:
            text = docs[slot]
            if text is None:
                continue
            dtokens = _tokens(text)
            inter = len(qwords.intersection(dtokens))
            union = nq + nwords[slot] - inter
            if inter or not union:
                screened.append((-(inter / union if union else 1.0), slot, inter, dtokens))
        if not screened:
            return []
        # The measure in parts: words and bigrams never equal each other, so the
        # features in common are the words in common (known) plus the bigrams.
        qbigrams = set(pairwise(tokens))
        nqfeatures = nq + len(qbigrams)
        slot_keys = self._keys
        scored = {slot_keys[slot]: -1.0 for slot in exact}  # the same text: similarity 1
        for _, slot, words_in_common, dtokens in heapq.nsmallest(max(k, self._shortlist), screened):
            key = slot_keys[slot]
            if key not in scored:
                dbigrams = set(pairwise(dtokens))
                inter = words_in_common + len(
                    qbigrams & dbigrams if len(qbigrams) <= len(dbigrams) else dbigrams & qbigrams
                )
                union = nqfeatures + nwords[slot] + len(dbigrams) - inter
                scored[key] = -(inter / union if union else 1.0)
        best = heapq.nsmallest(k, ((neg, key) for key, neg in scored.items()))
        return [(key, -neg) for neg, key in best]

    def _score_keys(
        self, tokens: list[bytes], keys: Collection[int], k: int
    ) -> list[tuple[int, float]]:
        slot_of = self._slot_of
        slots = [slot_of[key] for key in keys if key in slot_of]
        return self._score_slots(tokens, slots, k)
