"""An llm manager's reply that does not parse: the rollout gets the verifier's review, and every table says
it is the verifier's (the reviews' ``manager``, a re-score's ``manager`` and ``judge_score``, the judge
agreement's judge), so the verifier's score is never credited to the model. Real Delta tables, the real
review, re-score and agreement stages, a scripted backend whose replies are known."""

from __future__ import annotations

import json

import pytest

from tentalis_pipelines.inference.base import Generation, SamplingParams
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.rewards.llm_manager import FALLBACK_CRITIQUE, LLMManager
from tentalis_pipelines.rewards.managers import VerifierManager
from tentalis_pipelines.rewards.rescore import RescoreSpec
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages.human_reviews import import_human_reviews
from tentalis_pipelines.stages.judge_agreement import judge_scores
from tentalis_pipelines.stages.rescore import read_version, rescore
from tentalis_pipelines.stages.reviews import build_reviews, review_inputs
from tests.rescore_rows import seed_batch

# r0 (right, tagged), r1 (wrong, tagged), r2 (right, untagged): the verifier gives 1.0, 0.1, 0.7.
GARBLED = "the sum looks fine to me"  # no score anywhere: unparseable


class _ByCompletion:
    """Replies with a parseable 6/10 review, except to the prompt holding r2's completion: garbage."""

    name = model_name = "by-completion"
    tokenizer = None

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Generation]]:
        return [[Generation(GARBLED if "He has 5 apples." in p else '6, "critique": "ok", "hint": "Recheck."}', [], "stop", 0, 0.0)]
                for p in prompts]


@pytest.fixture()
def lake(home) -> Lakehouse:
    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    seed_batch(lake, "b1")
    return lake


def test_the_manager_marks_the_review_it_could_not_write(lake):
    inputs = review_inputs(lake, "b1")
    reviews = LLMManager(_ByCompletion()).review_many([("task", r["completion"], x) for r, x in inputs])
    assert [rev.fallback for rev in reviews] == [False, False, True]
    verifier = VerifierManager().review(inputs[2][1])
    assert (reviews[2].score, reviews[2].hint) == (verifier.score, verifier.hint) == (0.7, verifier.hint)
    assert reviews[2].critique == f"{FALLBACK_CRITIQUE} {verifier.critique}"
    assert (reviews[0].score, reviews[1].score) == (pytest.approx(0.6), 0.5)  # r1 is wrong: capped at 0.5


def test_the_stored_review_names_the_verifier(lake):
    res = build_reviews(lake, "b1", "llm", llm_manager=lambda: LLMManager(_ByCompletion(), version="m-1"))
    rows = {r["rollout_id"]: r for r in lake.read("reviews", batch_id="b1").to_pylist()}
    assert {rid: (r["manager"], r["reviewer"], r["score"]) for rid, r in rows.items()} == {
        "r0": ("llm", "llm-manager:m-1", pytest.approx(0.6)), "r1": ("llm", "llm-manager:m-1", 0.5), "r2": ("verifier", None, 0.7)}
    assert rows["r2"]["critique"].startswith(FALLBACK_CRITIQUE)
    assert res.metadata["llm_manager"] == "llm-manager:m-1" and res.metadata["llm_unparseable"] == 1 and json.loads(res.metadata["by_manager"]) == {"llm": 2, "verifier": 1}


def test_a_rescore_records_no_judge_score_for_the_reply_that_did_not_parse(lake):
    rescore(lake, RescoreSpec("llm6", manager="llm"), llm_manager=LLMManager(_ByCompletion()))
    rows = {r["rollout_id"]: r for r in read_version(lake, "llm6")}
    assert {rid: (r["manager"], r["manager_score"], r["judge_score"]) for rid, r in rows.items()} == {
        "r0": ("llm", pytest.approx(0.6), pytest.approx(0.6)), "r1": ("llm", 0.5, 0.5), "r2": ("verifier", 0.7, None)}


def test_judge_agreement_measures_the_llm_managers_batch_reviews(lake, tmp_path):
    """The llm manager's task-batch reviews name their checkpoint in ``reviewer``; they are still judge scores
    (the agreement had dropped them as if they were a person's), and a fallback is the verifier's."""
    build_reviews(lake, "b1", "llm", llm_manager=lambda: LLMManager(_ByCompletion(), version="m-1"))
    f = tmp_path / "human.jsonl"
    f.write_text("".join(json.dumps({"rollout_id": r, "score": s}) + "\n" for r, s in {"r0": 0.9, "r1": 0.2, "r2": 0.8}.items()))
    import_human_reviews(lake, f)
    judged = {r["rollout_id"]: (r["judge"], r["score"]) for r in judge_scores(lake)}
    assert judged == {"r0": ("llm", pytest.approx(0.6)), "r1": ("llm", 0.5), "r2": ("verifier", 0.7)}
