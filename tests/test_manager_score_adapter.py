"""A manager whose score is written by an adapter of its own (``llm_manager.SCORE_ADAPTER``): the score pass
is that adapter's, the critique and hint the review adapter's, and a score update (``part = "score"``)
trains the score adapter on the verifier's scores while the review adapter is saved unchanged. On one
adapter every score update cost the hints rescue (experiments/manager_rl, round 16); here the hint side's
weights are checked equal, tensor by tensor. Scripted backends where what each pass wrote must be known,
the tiny random model and real Delta tables where the stage trains and saves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from assets.resources import ReviewResource
from tentalis_pipelines.inference.base import Generation, SamplingParams
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.rewards.llm_manager import (
    FALLBACK_CRITIQUE,
    SCORE_ADAPTER,
    SCORE_MAX_NEW_TOKENS,
    LLMManager,
    first_pass,
    score_adapter_of,
    score_written,
    through_stop,
)
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages import manager_training as mt
from tentalis_pipelines.stages.reviews import review_inputs
from tentalis_pipelines.training import manager_rl, serving
from tentalis_pipelines.training.manager_rl import ManagerRLConfig
from tests import test_manager_training as tm
from tests.rescore_rows import seed_batch

lake_with_failures = tm.lake_with_failures


class Recorder:
    """Replies with ``reply(prompt)``; keeps every call's prompts and sampling parameters."""

    name = model_name = "recorder"
    tokenizer = None

    def __init__(self, reply):
        self.reply, self.calls = reply, []

    def generate(self, prompts, params):
        self.calls.append((list(prompts), params))
        return [[Generation(self.reply(p), [], "stop", 0, 0.0)] for p in prompts]


def test_the_score_pass_is_the_score_adapters_and_the_words_go_on_from_it():
    score = Recorder(lambda p: {"A": '10,"', "B": "3}", "C": "good"}[p[-1]])
    words = Recorder(lambda p: ' "critique": "ok", "hint"')
    params = SamplingParams(num_generations=1, max_new_tokens=64, temperature=0.0, seed=5, stop=("}", '"hint"'))
    assert first_pass(words, ["pA", "pB", "pC"], params, score) == ['10, "critique": "ok", "hint"', "3}", "good"]
    [(asked, sp)] = score.calls
    assert asked == ["pA", "pB", "pC"] and (sp.stop, sp.max_new_tokens, sp.temperature, sp.seed) == ((",", "}"), SCORE_MAX_NEW_TOKENS, 0.0, 5)
    # The words pass is asked only where a score field was written, cut after the comma that ends it.
    assert words.calls == [(["pA10,"], params)]
    # Without a score adapter the one backend writes it all.
    assert first_pass(words, ["pA"], params) == [' "critique": "ok", "hint"'] and words.calls[-1] == (["pA"], params)
    with pytest.raises(ValueError, match="one reply per prompt"):
        first_pass(words, ["pA"], SamplingParams(num_generations=2), score)


@pytest.mark.parametrize(("text", "written"), [("10,", True), (" 7 ,", True), ("2.5,", True), ("10", False), ("7}", False),
                                               ("ten,", False), (",", False), ("1,2,", False)])
def test_a_score_field_is_a_number_and_its_comma(text, written):
    assert score_written(text) is written


def test_the_score_pass_is_cut_at_its_first_stop():
    assert through_stop('10, "critique', (",", "}")) == "10,"
    assert through_stop("7} and more, yes", (",", "}")) == "7}"
    assert through_stop("10", (",", "}")) == "10"


@pytest.fixture()
def seeded(home) -> Lakehouse:
    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    seed_batch(lake, "b1")  # r0 right and tagged, r1 wrong, r2 right without tags
    return lake


def test_the_review_carries_the_score_adapters_score_and_the_review_adapters_words(seeded):
    score = Recorder(lambda p: "garbled" if "He has 5 apples." in p else "9,")
    words = Recorder(lambda p: ' "critique": "c", "hint": "Add them."}')
    inputs = review_inputs(seeded, "b1")
    reviews = LLMManager(words, score_backend=score).review_many([("task", r["completion"], x) for r, x in inputs])
    assert [(rv.score, rv.hint, rv.fallback) for rv in reviews[:2]] == [(pytest.approx(0.9), "Add them.", False), (0.5, "Add them.", False)]
    assert reviews[2].fallback and reviews[2].critique.startswith(FALLBACK_CRITIQUE)  # the score pass wrote no score
    assert len(words.calls[0][0]) == 2  # r2 is never asked for words
    # The words backend alone writes no score (its reply starts after one): every review would be the verifier's.
    assert all(rv.fallback for rv in LLMManager(words).review_many([("task", r["completion"], x) for r, x in inputs]))


def test_with_a_hint_prefix_the_hint_pass_is_the_review_adapters(seeded):
    score = Recorder(lambda p: "10,")
    words = Recorder(lambda p: ' "critique": "c", "hint"' if p.endswith("10,") else ' the sum."')
    inputs = review_inputs(seeded, "b1")
    reviews = LLMManager(words, score_backend=score, hint_prefix="First compute").review_many(
        [("task", r["completion"], x) for r, x in inputs])
    assert [rv.hint for rv in reviews] == ["First compute the sum."] * 3
    assert len(score.calls) == 1 and len(words.calls) == 2
    assert all(p.endswith('10, "critique": "c", "hint": "First compute') for p in words.calls[1][0])


def _tensors(folder) -> dict[str, torch.Tensor]:
    return load_file(str(Path(folder) / "adapter_model.safetensors"))


def test_a_score_update_trains_the_score_adapter_on_the_verifiers_scores_and_keeps_the_review_adapter(
        lake_with_failures, tiny_model_dir, monkeypatch):
    from transformers import AutoTokenizer

    paths, lake, batch_id = lake_with_failures
    tasks = tm.accept_first_samples(lake, batch_id, 4)
    assert len(tasks) == 4
    policy = PolicySettings(model=str(tiny_model_dir), max_new_tokens=12, dtype="float32")
    manager, worker, tok = tm.scripted_backends(tiny_model_dir, lambda p, j: tm.GOOD if j == 0 else tm.GENERIC)
    parent = mt.train_manager(lake, paths, policy, tm.CONFIG, manager_model=str(tiny_model_dir), manager_backend=manager,
                              worker=worker, grpo={"device": "cpu"})
    serving.promote(lake, parent["checkpoint_id"], actor="test", reason="the review adapter", role="manager")
    assert score_adapter_of(parent["adapter_uri"]) is None
    configs = []
    seen = tm.record_trained_samples(monkeypatch, configs)
    cfg = ManagerRLConfig(**{**tm.CONFIG.as_dict(), "part": "score", "max_failures": 2})
    first = mt.train_manager_score(lake, paths, policy, cfg, manager_model=str(tiny_model_dir), grpo={"device": "cpu"})

    # What trained: the verifier's score as the manager writes it, after its exact prompt, two failures and two accepted answers.
    fails = mt.collect_failures(lake, heldout=False, config=cfg)[:2]
    accepted = mt.collect_accepted(lake, heldout=False, config=cfg, limit=2)
    taught = fails + accepted
    assert [f.task_id for f in accepted] == [f.task_id for f in fails] == tasks[:2]
    # a pair in each form: the verifier's 0.1 / 1.0 for the tagged one, 0.0 / 0.7 for the untagged one
    assert [(mt.answer_form(f), f.verifier_score) for f in taught] == [
        ("tagged", 0.1), ("untagged", 0.0), ("tagged", 1.0), ("untagged", 0.7)]
    prompts = mt.manager_prompts(type("T", (), {"tokenizer": AutoTokenizer.from_pretrained(tiny_model_dir)})(), taught)
    assert [(s.prompt_ids, s.completion_ids) for s in seen] == [
        (tok(p, add_special_tokens=False)["input_ids"], tok(t, add_special_tokens=False)["input_ids"])
        for p, t in zip(prompts, ["1,", "0,", "10,", "7,"])]
    assert all(s.token_advantages == [1.0] * len(s.completion_ids) and s.old_logps is None for s in seen)
    assert configs[0].old_logprobs == "current"  # demonstrations: every step against the policy as it is
    assert sorted(first["trajectory_ids"]) == sorted(f.rollout_id for f in taught) and first["parent_id"] == parent["checkpoint_id"]
    m = json.loads(first["metrics"])
    assert (m["part"], m["failures"], m["accepted"], m["score_adapter_parent"]) == ("score", 2, 2, None)
    rows = [r for r in lake.read("lineage").to_pylist() if r["checkpoint_id"] == first["checkpoint_id"]]
    assert sorted(r["row_id"] for r in rows if r["kind"] == "manager_failure") == sorted(f.rollout_id for f in taught)

    # The review adapter is the parent's, tensor for tensor; the score adapter is its own and trained (a fresh B is 0).
    folder = Path(first["adapter_uri"])
    assert score_adapter_of(folder) == folder / SCORE_ADAPTER
    parent_t, kept, score_t = _tensors(parent["adapter_uri"]), _tensors(folder), _tensors(folder / SCORE_ADAPTER)
    assert parent_t.keys() == kept.keys() and all(torch.equal(parent_t[k], kept[k]) for k in parent_t)
    assert any(k.endswith("lora_B.weight") and score_t[k].abs().sum() > 0 for k in score_t)
    assert any(not torch.equal(parent_t[k], score_t[k]) for k in parent_t)

    # The second update starts from the first one's score adapter (at a learning rate of 1e-12 it stays that adapter,
    # where a fresh one would have B = 0), on the two pairs left; the review adapter rides along.
    serving.promote(lake, first["checkpoint_id"], actor="test", reason="chain", role="manager")
    second = mt.train_manager_score(lake, paths, policy, ManagerRLConfig(**{**cfg.as_dict(), "learning_rate": 1e-12}),
                                    manager_model=str(tiny_model_dir), grpo={"device": "cpu"})
    assert json.loads(second["metrics"])["score_adapter_parent"] == first["checkpoint_id"]
    assert not set(second["trajectory_ids"]) & set(first["trajectory_ids"]) and len(second["trajectory_ids"]) == 4
    kept2, score2 = _tensors(second["adapter_uri"]), _tensors(Path(second["adapter_uri"]) / SCORE_ADAPTER)
    assert all(torch.equal(parent_t[k], kept2[k]) for k in parent_t)
    assert score_t.keys() == score2.keys() and all(torch.allclose(score_t[k], score2[k], rtol=0, atol=1e-8) for k in score_t)
    serving.promote(lake, second["checkpoint_id"], actor="test", reason="chain", role="manager")
    with pytest.raises(ValueError, match="0 fresh accepted answers"):
        mt.train_manager_score(lake, paths, policy, cfg, manager_model=str(tiny_model_dir), grpo={"device": "cpu"})
    # A review update would train one adapter for the whole reply: refused, naming the score's own update.
    with pytest.raises(ValueError, match="--part score"):
        mt.train_manager(lake, paths, policy, tm.CONFIG, manager_model=str(tiny_model_dir), manager_backend=manager, worker=worker,
                         grpo={"device": "cpu"})

    # Serving and evaluation load the score adapter beside the review adapter.
    review = ReviewResource(manager="llm", judge_model=str(tiny_model_dir))
    assert review.llm_manager(paths.models, adapter_dir=second["adapter_uri"]).score_backend is not None
    assert review.llm_manager(paths.models, adapter_dir=parent["adapter_uri"]).score_backend is None
    made = []
    real = PolicySettings.make_backend
    monkeypatch.setattr(PolicySettings, "make_backend", lambda self, model_dir, adapter_dir=None: made.append(adapter_dir) or real(
        self, model_dir, adapter_dir))
    mt.evaluate_manager(lake, paths, policy, ManagerRLConfig(**{**cfg.as_dict(), "eval_rescue_samples": 1}), second["checkpoint_id"],
                        manager_model=str(tiny_model_dir), worker=worker)
    assert [Path(a) for a in made] == [Path(second["adapter_uri"]), Path(second["adapter_uri"]) / SCORE_ADAPTER]


def test_a_score_update_of_the_untrained_manager_teaches_as_many_failures_as_accepted_answers(
        lake_with_failures, tiny_model_dir, monkeypatch):
    """One accepted answer and more fresh failures: one of each is taught. The untrained manager has no adapter: its
    review adapter is a fresh LoRA (B = 0, the base model's replies), saved beside the trained score adapter."""
    paths, lake, batch_id = lake_with_failures
    [task] = tm.accept_first_samples(lake, batch_id, 1)
    policy = PolicySettings(model=str(tiny_model_dir), max_new_tokens=12, dtype="float32")
    seen = tm.record_trained_samples(monkeypatch)
    row = mt.train_manager_score(lake, paths, policy, ManagerRLConfig(**{**tm.CONFIG.as_dict(), "part": "score", "max_failures": 3}),
                                 manager_model=str(tiny_model_dir), grpo={"device": "cpu"})
    fails = mt.collect_failures(lake, heldout=False, config=tm.CONFIG)
    assert len(fails) >= 3 and len(seen) == 2 and row["parent_id"] is None
    accepted = mt.collect_accepted(lake, heldout=False, config=tm.CONFIG, limit=None)
    assert [f.task_id for f in accepted] == [task]
    assert sorted(row["trajectory_ids"]) == sorted([fails[0].rollout_id, accepted[0].rollout_id])
    review_t = _tensors(row["adapter_uri"])
    assert all(v.abs().sum() == 0 for k, v in review_t.items() if k.endswith("lora_B.weight"))
    assert any(v.abs().sum() > 0 for k, v in _tensors(Path(row["adapter_uri"]) / SCORE_ADAPTER).items() if k.endswith("lora_B.weight"))


def test_a_score_update_balances_within_each_form_so_the_form_does_not_stand_for_the_class(
        lake_with_failures, tiny_model_dir, monkeypatch):
    """Round 22 in small: the first failure is untagged (the tiny model's), the only accepted answer tagged. Balanced
    over all rollouts, that pair would be taught and "tagged" would mean "accepted"; within each form only the tagged
    failure and the tagged answer are, and the untagged failure, with no untagged answer to pair, is not."""
    paths, lake, batch_id = lake_with_failures
    [task] = tm.accept_first_samples(lake, batch_id, 1, skip=1)
    policy = PolicySettings(model=str(tiny_model_dir), max_new_tokens=12, dtype="float32")
    seen = tm.record_trained_samples(monkeypatch)
    cfg = ManagerRLConfig(**{**tm.CONFIG.as_dict(), "part": "score", "max_failures": 2})
    fails = mt.collect_failures(lake, heldout=False, config=cfg, limit=2)
    [accepted] = mt.collect_accepted(lake, heldout=False, config=cfg, limit=None)
    assert [(f.task_id == task, mt.answer_form(f)) for f in fails] == [(False, "untagged"), (True, "tagged")]
    assert (accepted.task_id, mt.answer_form(accepted)) == (task, "tagged")
    row = mt.train_manager_score(lake, paths, policy, cfg, manager_model=str(tiny_model_dir), grpo={"device": "cpu"})
    assert sorted(row["trajectory_ids"]) == sorted([fails[1].rollout_id, accepted.rollout_id]) and len(seen) == 2
    m = json.loads(row["metrics"])
    assert (m["failures"], m["accepted"]) == (1, 1)


def test_evaluation_records_the_score_adapters_score(lake_with_failures, tiny_model_dir):
    paths, lake, batch_id = lake_with_failures
    tm.accept_first_samples(lake, batch_id, 1, heldout=True)
    policy = PolicySettings(model=str(tiny_model_dir), max_new_tokens=12, dtype="float32")
    _, worker, _ = tm.scripted_backends(tiny_model_dir, lambda p, j: tm.GOOD)
    score, words = Recorder(lambda p: "7,"), Recorder(lambda p: ' "critique": "c", "hint": "Add the two numbers in one step."}')
    rows = mt.evaluate_manager(lake, paths, policy, tm.CONFIG, serving.BASE, manager_model=str(tiny_model_dir), manager_backend=words,
                               worker=worker, score_backend=score)
    assert {r["worker_correct"] for r in rows} == {False, True} and [r["score"] for r in rows] == pytest.approx([0.7] * len(rows))
    assert all(r["rescued"] == r["rescue_k"] > 0 for r in rows if not r["worker_correct"])  # the words' plan rescues


def test_an_unknown_part_is_refused():
    with pytest.raises(ValueError, match="part 'scores' is unknown"):
        ManagerRLConfig(part="scores")
    assert manager_rl.PARTS == ("review", "score")
