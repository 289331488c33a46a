"""The grounding tagger trained on the real MiniLM (a few pairs, one epoch): the loss weight it used is the
fit sessions' own supported-to-unsupported ratio, its threshold is chosen on the held-out sessions and
travels with the saved tagger; a tagger saved before thresholds were stored loads at 0.5."""

from __future__ import annotations

import json

import pytest

from tentalis_pipelines.reviewers.grounding_data import make_sessions, split_by_session
from tentalis_pipelines.reviewers.grounding_tagger import (
    TAGGER_META,
    GroundingTagger,
    TaggerConfig,
    choose_threshold,
    positive_weight,
    threshold_split,
    token_labels,
    train_tagger,
)
from tentalis_pipelines.skills.embedder import model_dir


def test_tagger_weighs_its_fit_sessions_chooses_its_threshold_on_held_out_ones_and_keeps_it(tmp_path):
    # the train side of the benchmark's own split, as grounding_bench passes it (same seed as the tagger's)
    pairs, _ = split_by_session(make_sessions(16, seed=3), test_fraction=0.25, seed=1)
    config = TaggerConfig(epochs=1, batch_size=16, held_out=0.2, seed=1)  # a share below the test split's
    fit, held = threshold_split(pairs, config)
    assert fit and held and len(fit) + len(held) == len(pairs)
    assert not {p.session_id for p in fit} & {p.session_id for p in held}
    tagger = train_tagger(pairs, model_dir(), config)
    by_hand = positive_weight([token_labels(tagger.encode([p.answer], [p.context]), [p]) for p in fit])
    assert by_hand > 2 and tagger.positive_weight == pytest.approx(by_hand)  # unsupported tokens are the rare class
    t, f1 = choose_threshold(held, [tagger.probabilities(p.answer, p.context) for p in held])
    assert (tagger.threshold, tagger.held_out_f1) == (t, f1)
    folder = tagger.save(tmp_path / "tagger")
    assert GroundingTagger.load(folder).threshold == t
    assert GroundingTagger.load(folder, threshold=0.3).threshold == 0.3
    meta = json.loads((folder / TAGGER_META).read_text())
    assert meta["positive_weight"] == pytest.approx(by_hand)
    (folder / TAGGER_META).unlink()  # a tagger saved before thresholds were stored
    assert GroundingTagger.load(folder).threshold == 0.5
    fixed = train_tagger(pairs[:4], model_dir(), TaggerConfig(epochs=1, batch_size=4, held_out=0.0, threshold=0.6,
                                                               positive_weight=1.0))
    assert (fixed.threshold, fixed.positive_weight, fixed.held_out_f1) == (0.6, 1.0, None)
