"""Planted bugs in the contamination guard (``tentalis_pipelines/contamination.py``): its normalisation,
the n-gram tier's containment and threshold, the embedding tier's item, and which items are fuzzy-matched.

Guarded by tests/unit/test_contamination_tiers.py (pure: embeddings given by hand, no model, no data
files), which reaches the edges: a containment exactly at the threshold, a short item pasted into a long
prompt beside a long item sharing more n-grams, two texts screened in one batched embedding call behind
an exact-only item.

One mutant is equivalent (explained on it)."""

C = "tentalis_pipelines/contamination.py"
T = ["tests/unit/test_contamination_tiers.py"]

MUTANTS = [
    {"id": "contamination-ngram-strict", "file": C, "find": "scored[1] >= self.ngram_threshold", "replace": "scored[1] > self.ngram_threshold",
     "tests": T, "why": "a containment exactly at the threshold passes: 'at least' read as 'more than'"},
    {"id": "contamination-containment-over-task", "file": C, "find": "return best, hits[best] / float(self.gram_counts[best])",
     "replace": "return best, hits[best] / float(len(grams))", "tests": T,
     "why": "the share of the task's n-grams, not the item's: a benchmark question pasted into a long prompt slips through"},
    {"id": "contamination-best-by-count", "file": C, "find": "key=lambda i: (hits[i] / self.gram_counts[i], -i))",
     "replace": "key=lambda i: (hits[i], -i))", "tests": T,
     "why": "the best item by shared n-grams, not by share: a long item partly shared hides a short one fully contained"},
    {"id": "contamination-exact-only-fuzzy", "file": C, "find": "if it.exact_only or not norm:", "replace": "if not norm:", "tests": T,
     "why": "generated arithmetic items are n-gram matched: every fresh training problem of the same template is quarantined"},
    {"id": "contamination-task-not-name-folded", "file": C, "find": "grams = char_ngrams(ngram_text(text))",
     "replace": "grams = char_ngrams(normalize_text(text))", "tests": T,
     "why": "names folded on the index's side only: the same question with other names scores lower"},
    {"id": "contamination-embedding-strict", "file": C, "find": "if s >= self.embedding_threshold:", "replace": "if s > self.embedding_threshold:",
     "tests": T, "why": "a cosine exactly at the threshold passes"},
    {"id": "contamination-embedding-argmax-axis", "file": C, "find": "best = sims.argmax(axis=1)", "replace": "best = sims.argmax(axis=0)",
     "tests": T, "why": "the argmax over texts, not items: each text is compared with the wrong item"},
    {"id": "contamination-embedding-item-index", "file": C, "find": "out[k] = self._match(self.fuzzy[int(best[row])], \"embedding\", s)",
     "replace": "out[k] = self._match(int(best[row]), \"embedding\", s)", "tests": T,
     "why": "the embedding row's index used as the item's: with exact-only items first in the index, the wrong item is named"},
    {"id": "contamination-number-words-tens", "file": C, "find": "\"seventy\", \"eighty\", \"ninety\"], start=3)",
     "replace": "\"seventy\", \"eighty\", \"ninety\"], start=2)", "tests": T,
     "why": "the tens off by one: 'thirty' folds to 20, so 'thirty apples' and '30 apples' differ"},
    {"id": "contamination-decimal-zeros-kept", "file": C, "find": "    frac = m.group(2).rstrip(\"0\")\n", "replace": "    frac = m.group(2)\n",
     "tests": T, "why": "trailing decimal zeros kept: '$2.50' and '$2.5' are different items"},
    {"id": "contamination-ngrams-last-dropped", "file": C, "find": "for i in range(len(normalized) - n + 1)}",
     "replace": "for i in range(len(normalized) - n)}", "tests": T,
     "why": "the last n-gram of every text dropped (off by one)"},
    {"id": "contamination-short-text-boundary", "file": C, "find": "    if len(normalized) <= n:\n", "replace": "    if len(normalized) < n:\n",
     "tests": T, "why": "a text of exactly 13 characters goes through the sliding window",
     "equivalent": "for a text of exactly n characters the window yields one n-gram, the whole text: the same set "
                   "{normalized} the short-text branch returns"},
]
