"""chaosllm.store.nearest: the similarity measure and the index that ranks by it."""

from __future__ import annotations

import random
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaosllm.store.nearest import NearestIndex, similarity

_WORDS = [f"w{i}" for i in range(400)]


def _features(text: str) -> set[object]:
    """Unigrams and bigrams, independently of the module (a brute-force oracle)."""
    words = text.casefold().replace(",", " ").replace(".", " ").replace(":", " ").split()
    return {*words, *pairwise(words)}


def _conversation(rng: random.Random, n: int) -> str:
    # Zipf-ish: low-numbered words are common.
    return " ".join(_WORDS[min(int(rng.paretovariate(0.8)) - 1, 399)] for _ in range(n))


# -- similarity -------------------------------------------------------------------------


def test_identical_text_scores_one() -> None:
    text = "What is the capital of France?"
    assert similarity(text, text) == 1.0
    assert similarity("", "") == 1.0
    assert similarity("Hello, world", "hello world!") == 1.0  # same tokens


def test_disjoint_texts_score_zero() -> None:
    assert similarity("alpha beta", "gamma delta") == 0.0
    assert similarity("alpha", "") == 0.0


def test_one_meaningful_word_keeps_short_texts_apart() -> None:
    score = similarity("What is the capital of France?", "What is the capital of Spain?")
    assert score == pytest.approx(9 / 13)
    assert score < 0.9


def test_one_word_change_in_a_long_conversation_stays_high() -> None:
    rng = random.Random(7)
    text = _conversation(rng, 200)
    words = text.split()
    words[100] = "changed"
    assert similarity(text, " ".join(words)) > 0.9
    short = "system: you are a helpful assistant. user: list the files in the current directory"
    assert similarity(short, short.replace("list", "show")) > 0.7


def test_word_order_counts() -> None:
    assert similarity("dog bites man", "man bites dog") < 1.0
    assert similarity("dog bites man", "man bites dog") > 0.0


_TEXTS = st.text(
    alphabet=st.sampled_from(["a", "b", "c", "d", " ", ",", "É", "é", "<", "1"]), max_size=40
)


@settings(max_examples=300)
@given(_TEXTS, _TEXTS)
def test_similarity_is_symmetric_and_bounded(a: str, b: str) -> None:
    ab = similarity(a, b)
    assert ab == similarity(b, a)
    assert 0.0 <= ab <= 1.0


@settings(max_examples=200)
@given(st.text(max_size=60))
def test_similarity_identity(a: str) -> None:
    assert similarity(a, a) == 1.0


# -- index -------------------------------------------------------------------------------


def test_basic_query() -> None:
    index = NearestIndex()
    index.add(1, "what is the capital of france?")
    index.add(2, "what is the capital of spain?")
    index.add(3, "tell me a joke")
    assert len(index) == 3
    assert 2 in index
    assert 4 not in index
    assert index.query("what is the capital of france?") == [
        (1, 1.0),
        (2, pytest.approx(9 / 13)),
    ]
    assert index.query("capital of spain", k=1) == [
        (2, similarity("capital of spain", "what is the capital of spain?"))
    ]
    assert index.query("unrelated words only") == []
    assert index.query("joke", k=0) == []
    assert NearestIndex().query("anything") == []


def test_scores_are_the_similarity_function() -> None:
    rng = random.Random(3)
    texts = [_conversation(rng, rng.randint(5, 60)) for _ in range(300)]
    index = NearestIndex()
    for key, text in enumerate(texts):
        index.add(key, text)
    for _ in range(30):
        query = _conversation(rng, rng.randint(5, 60))
        hits = index.query(query, k=5)
        assert hits == sorted(hits, key=lambda hit: (-hit[1], hit[0]))
        for key, score in hits:
            assert score == similarity(query, texts[key])


def test_near_duplicates_are_found_like_brute_force() -> None:
    rng = random.Random(11)
    prompts = [_conversation(rng, 40) for _ in range(5)]
    texts = [
        f"system: {rng.choice(prompts)} user: {_conversation(rng, rng.randint(20, 150))}"
        for _ in range(1500)
    ]
    index = NearestIndex()
    for key, text in enumerate(texts):
        index.add(key, text)
    features = [_features(text) for text in texts]
    for _ in range(40):
        source = rng.randrange(len(texts))
        words = texts[source].split()
        for _ in range(rng.randint(1, 3)):
            words[rng.randrange(len(words))] = rng.choice(_WORDS)
        query = " ".join(words)
        wanted = _features(query)
        best = max(len(wanted & f) / len(wanted | f) for f in features)
        hits = index.query(query, k=1)
        assert hits and hits[0][1] == pytest.approx(best)
        assert hits[0][1] == similarity(query, texts[hits[0][0]])


def test_exact_duplicate_found_even_when_every_word_is_common() -> None:
    # A tiny postings budget: every word is "too common", only the newest
    # postings of the rarest are scanned; the exact duplicate is found anyway.
    index = NearestIndex(max_postings=4, candidates=1, shortlist=1)
    texts = [" ".join(random.Random(i).sample(["a", "b", "c", "d", "e"], 5)) for i in range(200)]
    for key, text in enumerate(texts):
        index.add(key, text)
    assert index.query(texts[0], k=1) == [(0, 1.0)]
    dups = [key for key, text in enumerate(texts) if text == texts[5]]
    assert [key for key, _ in index.query(texts[5], k=len(dups))] == dups


def test_keys_restrict_results() -> None:
    index = NearestIndex()
    for key in range(500):
        index.add(key, f"shared words here topic{key % 7} item{key}")
    query = "shared words here topic3 item10"

    def keys_of(hits: list[tuple[int, float]]) -> set[int]:
        return {key for key, _ in hits}

    assert keys_of(index.query(query, k=10, keys={1, 2, 3})) <= {1, 2, 3}  # small: direct
    assert len(index.query(query, k=10, keys={1, 2, 3})) == 3
    evens = range(0, 500, 2)
    hits = index.query(query, k=10, keys=evens)  # large: filtered
    assert hits and all(key % 2 == 0 for key, _ in hits)
    assert index.query(query, k=1, keys=range(10, 11)) == [
        (10, similarity(query, "shared words here topic3 item10"))
    ]

    class Odd:  # a Container that is not a Collection
        def __contains__(self, key: object) -> bool:
            return isinstance(key, int) and key % 2 == 1

    hits = index.query(query, k=10, keys=Odd())
    assert hits and all(key % 2 == 1 for key, _ in hits)
    assert index.query(query, keys=set()) == []
    assert index.query(query, keys={10_000}) == []


def test_adding_a_key_again_replaces_its_document() -> None:
    index = NearestIndex()
    index.add(1, "alpha beta gamma")
    index.add(2, "alpha beta gamma")
    index.add(1, "delta epsilon")
    assert len(index) == 2
    assert index.query("alpha beta gamma") == [(2, 1.0)]
    assert index.query("delta epsilon") == [(1, 1.0)]
    index.add(2, "zeta")
    assert index.query("alpha beta gamma") == []


def test_many_replacements_rebuild_the_postings() -> None:
    index = NearestIndex()
    for round_ in range(3):
        for key in range(700):
            index.add(key, f"doc {key} version {round_}")
    assert len(index) == 700
    assert index.query("doc 5 version 2", k=1) == [(5, 1.0)]
    assert all(
        similarity("doc 5 version 0", f"doc {key} version 2") == score
        for key, score in index.query("doc 5 version 0", k=3)
    )


def test_empty_and_wordless_documents() -> None:
    index = NearestIndex()
    index.add(1, "")
    index.add(2, "some words")
    assert index.query("") == [(1, 1.0)]
    assert index.query("!!!") == [(1, 1.0)]  # no words either: the same tokens


def test_options_are_validated() -> None:
    with pytest.raises(ValueError):
        NearestIndex(candidates=0)
    with pytest.raises(ValueError):
        NearestIndex(max_postings=0)


_DOC = st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f", "<id>", "x1"]), max_size=12).map(
    " ".join
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_DOC, min_size=1, max_size=30), st.data())
def test_query_finds_an_identical_document_first(docs: list[str], data: st.DataObject) -> None:
    index = NearestIndex(candidates=2, shortlist=1)
    for key, text in enumerate(docs):
        index.add(key, text)
    key = data.draw(st.integers(0, len(docs) - 1))
    hits = index.query(docs[key], k=3)
    assert hits[0][1] == 1.0
    assert similarity(docs[key], docs[hits[0][0]]) == 1.0
    # The document itself is returned, unless three others are as good (ties: smaller key).
    assert key in {k for k, _ in hits} or [score for _, score in hits] == [1.0, 1.0, 1.0]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(_DOC, min_size=1, max_size=40),
    _DOC,
    st.sets(st.integers(0, 45)),
    st.integers(1, 5),
)
def test_keys_are_honoured(docs: list[str], query: str, keys: set[int], k: int) -> None:
    index = NearestIndex()
    for key, text in enumerate(docs):
        index.add(key, text)
    hits = index.query(query, k=k, keys=keys)
    assert len(hits) <= k
    for key, score in hits:
        assert key in keys
        assert score == similarity(query, docs[key])
        assert 0.0 < score <= 1.0
    # Few keys are scored directly: nothing better among them is missed.
    ranked = sorted((-similarity(query, docs[key]), key) for key in keys if key < len(docs))
    assert hits == [(key, -neg) for neg, key in ranked if neg < 0][:k]
