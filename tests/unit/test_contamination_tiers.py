"""The contamination guard's three tiers at their edges (issue #33): a containment exactly at the
threshold, a short item fully contained beside a long one with more shared n-grams, the embedding tier
(with embeddings given by hand, so no model) naming the right item when generated (exact-only) items come
first in the index, and several texts screened in one batched call. Each test names the planted bug
it was seen failing against (tools/mutants/catalog/contamination.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tentalis_pipelines import contamination
from tentalis_pipelines.contamination import ContaminationIndex, ReferenceItem


def test_thirteen_grams_by_hand():
    """Mutant contamination-ngrams-last-dropped: 15 characters have 3 distinct 13-grams; 13 have one."""
    assert contamination.char_ngrams("abcdefghijklmno") == {"abcdefghijklm", "bcdefghijklmn", "cdefghijklmno"}
    assert contamination.char_ngrams("abcdefghijklm") == {"abcdefghijklm"}
    assert contamination.char_ngrams("abcdefghijklmn") == {"abcdefghijklm", "bcdefghijklmn"}
    assert contamination.char_ngrams("") == set()


def test_number_words_and_decimals_fold_to_their_digits():
    """Mutants contamination-number-words-tens, contamination-decimal-zeros-kept."""
    assert contamination.normalize_text("thirty-two and forty and ninety") == "30 2 and 40 and 90"
    assert contamination.normalize_text("twenty") == "20"
    assert contamination.normalize_text("$2.50 and 3.0") == contamination.normalize_text("$2.5 and 3")


def test_a_containment_exactly_at_the_threshold_is_a_match():
    """Mutant contamination-ngram-strict: 'at least' the threshold, as documented."""
    index = ContaminationIndex([ReferenceItem("gsm8k", "i1", "abcdefghijklmno")])
    index.ngram_threshold = 2 / 3
    (m,) = index.match(["abcdefghijklmnz"], use_embeddings=False)  # 2 of the item's 3 grams
    assert m is not None and (m.item_id, m.tier, m.similarity) == ("i1", "ngram", 2 / 3)


def test_containment_is_over_the_items_grams_and_the_best_item_is_by_share():
    """Mutants contamination-containment-over-task, contamination-best-by-count: a short item pasted into a
    long prompt is fully contained (1.0), and it beats a long item that shares more n-grams but a smaller
    share of its own."""
    short = "the farmer sells eggs"  # 9 grams after normalising
    long_item = "a long question about trains and a farmer who sells many eggs at the market every day"
    index = ContaminationIndex([ReferenceItem("gsm8k", "long", long_item), ReferenceItem("gsm8k", "short", short)])
    task = "Please answer: the farmer sells eggs. Also: a long question about trains and a farmer"
    best, share = index.ngram_scores(task)
    assert (index.items[best].item_id, share) == ("short", 1.0)
    grams_task = contamination.char_ngrams(contamination.ngram_text(task))
    assert len(grams_task) > 9  # the task has more grams than the item: a share over the task's would be < 1


def test_names_are_folded_on_the_tasks_side_too():
    """Mutant contamination-task-not-name-folded: the same question with other names is caught."""
    index = ContaminationIndex([ReferenceItem("gsm8k", "g1", "Natalia sold clips to 48 of her friends in April")])
    (m,) = index.match(["Priya sold clips to 48 of her friends in March"], use_embeddings=False)
    assert m is not None and m.item_id == "g1" and m.tier == "ngram" and m.similarity == 1.0


def test_generated_items_are_matched_exactly_only():
    """Mutant contamination-exact-only-fuzzy: a fresh arithmetic task from the same template is not a
    held-out item, however many n-grams it shares; the same item is, exactly."""
    index = ContaminationIndex([ReferenceItem("arithmetic", "h1", "Ava has 12 apples and gets 7 more. How many apples?")])
    assert index.fuzzy == [] and dict(index.postings) == {}
    assert index.match(["Ava has 12 apples and gets 9 more. How many apples?"], use_embeddings=False) == [None]
    (m,) = index.match(["ava has 12 apples, and gets 7 more how many apples"], use_embeddings=False)
    assert (m.item_id, m.tier) == ("h1", "exact")


VEC = {"fresh question one": [1.0, 0.0, 0.0], "fresh question two": [0.0, 1.0, 0.0],
       "item a": [0.0, 0.0, 1.0], "item b": [0.5, math.sqrt(0.75), 0.0], "item c": [math.sqrt(0.75), 0.5, 0.0]}


@pytest.fixture
def fake_embeddings(monkeypatch):
    monkeypatch.setattr(contamination, "embed", lambda texts: np.array([VEC[t] for t in texts], dtype=np.float64))


def test_the_embedding_tier_names_the_right_item_for_each_text(fake_embeddings):
    """Mutants contamination-embedding-argmax-axis, contamination-embedding-item-index,
    contamination-embedding-strict: two texts in one batch, behind an exact-only item; text one's cosine
    with item c is sqrt(0.75), text two's with item b is sqrt(0.75); at a threshold of exactly 0.5
    a cosine of exactly 0.5 matches."""
    items = [ReferenceItem("arithmetic", "h1", "What is 1 + 1?"), ReferenceItem("gsm8k", "a", "item a"),
             ReferenceItem("gsm8k", "b", "item b"), ReferenceItem("math500", "c", "item c")]
    index = ContaminationIndex(items)
    assert index.fuzzy == [1, 2, 3]
    index.embedding_threshold = 0.8
    one, two = index.match(["fresh question one", "fresh question two"])
    assert (one.benchmark, one.item_id, one.tier) == ("math500", "c", "embedding") and one.similarity == pytest.approx(math.sqrt(0.75))
    assert (two.benchmark, two.item_id) == ("gsm8k", "b") and two.similarity == pytest.approx(math.sqrt(0.75))
    index.embedding_threshold = 0.87
    assert index.match(["fresh question one", "fresh question two"]) == [None, None]
    only_b = ContaminationIndex([items[0], items[2]])
    only_b.embedding_threshold = 0.5  # cosine(one, b) is exactly 0.5
    (m,) = only_b.match(["fresh question one"])
    assert m is not None and m.item_id == "b" and m.similarity == 0.5
