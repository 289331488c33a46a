"""The manager that learns (training/manager_rl.py, stages/manager_training.py) on a real lakehouse.

The worker's batch is real (the Dagster assets, the tiny random model: every sample fails). The manager's
reviews and the worker's rescue are scripted backends whose log-probs are the tiny model's own, so the
rewards, advantages and training samples are checked by hand: a review whose hint names the plan is
rescued by the worker, a generic one is not, and a review whose score is far from the verifier's is
charged for it."""

from __future__ import annotations

import json

import pytest
import torch
from dagster import DagsterInstance, materialize

from assets.batch_assets import reviews, rollouts, step_scores, tasks
from assets.resources import LakehouseResource, PolicyResource, ReviewResource
from tentalis_pipelines.inference.base import Generation
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.promotion import GateNotReady
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages import manager_training as mt
from tentalis_pipelines.tasks.batches import register_file_batch
from tentalis_pipelines.training import manager_rl, opd, serving
from tentalis_pipelines.training.manager_rl import ManagerRLConfig

PROMPTS = [{"prompt": f"Ann has {a} pens and buys {b} more. How many pens does Ann have?", "reference": str(a + b)}
           for a, b in [(2, 3), (4, 5), (6, 2), (7, 8), (3, 9), (5, 5), (8, 1), (9, 4)]]
GOOD = ' 2, "critique": "The sum is wrong.", "hint": "Add the two numbers in one step, then answer."}'
GENERIC = ' 9, "critique": "Fine.", "hint": "try again"}'


class Scripted:
    """Writes a fixed reply per prompt, with the tiny model's own log-probs of it given that prompt."""

    name = "scripted"

    def __init__(self, model_dir, tokenizer, reply):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.tokenizer, self.reply, self.prompts = tokenizer, reply, []

    def generate(self, prompts, params):
        out = []
        for p in prompts:
            self.prompts.append(p)
            texts = [self.reply(p, j) for j in range(params.num_generations)]
            group = []
            for text in texts:
                ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
                item = opd.OPDItem(self.tokenizer(p, add_special_tokens=False)["input_ids"], [], ids, max(params.temperature, 1e-3))
                lp = opd.side_logprobs(self.model, self.tokenizer, [item], "student", dtype="float32")[0]
                group.append(Generation(text, ids, "stop", len(item.student_prompt_ids), 0.0, logprobs=lp))
            out.append(group)
        return out


def worker_reply(prompt: str, _j: int) -> str:
    """The worker: right when the plan hint is in its context, wrong otherwise."""
    import re

    a, b = map(int, re.findall(r"Ann has (\d+) pens and buys (\d+)", prompt)[-1])
    if "Add the two numbers" in prompt:
        return f"<step>{a} + {b} = {a + b}</step><answer>{a + b}</answer>"
    return "<step>I guess</step><answer>0</answer>"


@pytest.fixture()
def lake_with_failures(home, tiny_model_dir):
    paths = Paths.from_env(home).ensure()
    src = paths.inbox / "mgr.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in PROMPTS) + "\n")
    batch_id = register_file_batch(paths.batches, src)
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("task_batches", [batch_id])
        res = {"lakehouse": LakehouseResource(home=str(home)),
               "policy": PolicyResource(model=str(tiny_model_dir), num_generations=2, max_new_tokens=8, dtype="float32"),
               "review": ReviewResource()}
        assert materialize([tasks, rollouts, step_scores, reviews], partition_key=batch_id, instance=instance, resources=res).success
    return paths, Lakehouse(paths.lakehouse), batch_id


def scripted_backends(tiny_model_dir, manager_reply):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    return Scripted(tiny_model_dir, tok, manager_reply), Scripted(tiny_model_dir, tok, worker_reply), tok


def accept_first_samples(lake, batch_id, n, heldout=False, skip=0, forms=("tagged", "untagged")):
    """The first sample of ``n`` training-side (or held-out) tasks, after the first ``skip``, now answers right, and
    their second a wrong number in the same form: ``forms`` in turn (by default tagged for the first such task, the
    third, …, untagged for the second, …; a score update balances within each form, ``mt.answer_form``). The tiny
    model's own samples, the fixture's other failures, are untagged."""
    tasks = [f.task_id for f in mt.collect_failures(lake, heldout=heldout, config=CONFIG)][skip:skip + n]
    ro = lake.read("rollouts", batch_id=batch_id).to_pylist()
    refs = {t["task_id"]: t["reference"] for t in lake.read("tasks", batch_id=batch_id).to_pylist()}
    for r in ro:
        if r["task_id"] in tasks and r["group_index"] in (0, 1):
            value = int(refs[r["task_id"]]) + r["group_index"]  # the second sample one off
            if forms[tasks.index(r["task_id"]) % len(forms)] == "tagged":
                r["completion"], r["steps"] = f"<step>sum {value}</step><answer>{value}</answer>", [f"sum {value}"]
            else:
                r["completion"], r["steps"] = f"The pens add up to {value}.", []
            r["finish_reason"] = "stop"
    lake.write_batch("rollouts", batch_id, ro)
    return tasks


def record_trained_samples(monkeypatch, configs: list | None = None) -> list:
    """The samples every ``train_grpo`` call of the test trains on (the real trainer still runs); each call's
    config is appended to ``configs`` when given."""
    from tentalis_pipelines.training import trainer as trainer_mod

    seen, real, configs = [], trainer_mod.train_grpo, [] if configs is None else configs
    monkeypatch.setattr(trainer_mod, "train_grpo",
                        lambda m, t, samples, cfg, **kw: seen.extend(samples) or configs.append(cfg) or real(m, t, samples, cfg, **kw))
    return seen


CONFIG = ManagerRLConfig(num_generations=2, rescue_samples=3, heldout_fraction=0.5, accuracy_weight=0.5, max_new_tokens=40,
                         learning_rate=1e-2)


def test_the_manager_trains_on_what_its_hints_did_and_lands_with_lineage(lake_with_failures, tiny_model_dir, monkeypatch):
    paths, lake, batch_id = lake_with_failures
    policy = PolicySettings(model=str(tiny_model_dir), max_new_tokens=12, dtype="float32")
    train_side = mt.collect_failures(lake, heldout=False, config=CONFIG)
    held_side = mt.collect_failures(lake, heldout=True, config=CONFIG)
    assert train_side and held_side  # 8 tasks, half held out by hash
    assert not {f.task_id for f in train_side} & {f.task_id for f in held_side}
    assert len({f.task_id for f in train_side}) == len(train_side)  # one failure per task
    manager, worker, tok = scripted_backends(tiny_model_dir, lambda p, j: GOOD if j == 0 else GENERIC)
    seen = record_trained_samples(monkeypatch)
    row = mt.train_manager(lake, paths, policy, CONFIG, manager_model=str(tiny_model_dir), manager_backend=manager, worker=worker,
                           grpo={"device": "cpu"})

    # The worker was asked with the usable hint after the task, never with the generic one.
    assert worker.prompts and all("Add the two numbers" in p for p in worker.prompts)
    assert len(worker.prompts) == len(train_side)
    samples = lake.read("manager_samples").to_pylist()
    assert len(samples) == 2 * len(train_side) and {s["checkpoint_id"] for s in samples} == {row["checkpoint_id"]}
    by_failure = {}
    for s in samples:
        by_failure.setdefault(s["rollout_id"], {})[s["sample_index"]] = s
    for f in train_side:
        good, generic = by_failure[f.rollout_id][0], by_failure[f.rollout_id][1]
        v = f.verifier_score
        assert good["hint_decision"] == opd.USED and good["rescued"] == 3 and good["rescue_k"] == 3
        assert generic["hint_decision"] == opd.TRIVIAL and generic["rescue_k"] == 0
        # by hand: 3/3 rescued - 0.5 * |0.2 - v|, and 0 - 0.5 * |0.9 - v|
        assert good["reward"] == pytest.approx(1.0 - 0.5 * abs(0.2 - v))
        assert generic["reward"] == pytest.approx(-0.5 * abs(0.9 - v))
        # credit "fields" (the default): the hint values 1 and 0 and the score charges are normalised apart
        assert good["credit"] == "fields"
        assert good["advantage"] == pytest.approx(0.5 / (1 / 2 ** 0.5 + 1e-4), rel=1e-4)  # (1 - 0.5) / unbiased std
        assert generic["advantage"] == pytest.approx(-good["advantage"])
        ds = -0.5 * abs(0.2 - v) + 0.5 * abs(0.9 - v)
        assert good["score_advantage"] == pytest.approx((ds / 2) / (abs(ds) / 2 ** 0.5 + 1e-4), rel=1e-4)
        assert generic["score_advantage"] == pytest.approx(-good["score_advantage"])
    # What the trainer saw: the manager's exact prompt, the review's tokens as sampled, its advantage.
    prompts = dict(zip([f.rollout_id for f in train_side], mt.manager_prompts(manager, train_side)))
    assert len(seen) == 2 * len(train_side)
    good_ids = tok(GOOD, add_special_tokens=False)["input_ids"]
    for s in seen:
        match = [f for f in train_side if s.prompt_ids == tok(prompts[f.rollout_id], add_special_tokens=False)["input_ids"]]
        assert len(match) == 1
        assert (s.advantage > 0) == (s.completion_ids == good_ids)
        # the score's tokens (' 2,' of GOOD, ' 9,' of GENERIC) carry the score's advantage, the critique and hint the hint's
        n = manager_rl.score_token_count(tok.decode, s.completion_ids)
        assert tok.decode(s.completion_ids[:n]).strip() in ("2,", "9,")
        sampled = by_failure[match[0].rollout_id][0 if s.completion_ids == good_ids else 1]
        assert s.token_advantages == pytest.approx([sampled["score_advantage"]] * n
                                                   + [sampled["advantage"]] * (len(s.completion_ids) - n))
    # The checkpoint: a row, an adapter with its manifest, lineage to every failure and sampled review.
    assert row["parent_id"] is None and row["trajectory_ids"] == sorted(f.rollout_id for f in train_side)
    assert lake.read("manager_checkpoints").num_rows == 1 and not lake.exists("checkpoints")
    manifest = json.loads((paths.checkpoints / "managers" / row["checkpoint_id"] / "lineage.json").read_text())
    assert manifest["role"] == "manager" and manifest["worker_version"] == "base"
    lin = [r for r in lake.read("lineage").to_pylist() if r["checkpoint_id"] == row["checkpoint_id"]]
    assert sorted(r["row_id"] for r in lin if r["kind"] == "manager_failure") == row["trajectory_ids"]
    assert sorted(r["row_id"] for r in lin if r["kind"] == "manager_sample") == sorted(s["sample_id"] for s in samples)
    m = json.loads(row["metrics"])
    assert m["usable_hint_share"] == pytest.approx(0.5) and m["rescue_rate"] == pytest.approx(1.0)
    # Not promoted: the worker's and the manager's serving pointers are untouched.
    assert serving.serving_checkpoint(lake, "manager") == serving.BASE and serving.serving_checkpoint(lake) == serving.BASE
    # A second run learns from fresh failures only (each task's other failed sample), then says there are none.
    second = mt.train_manager(lake, paths, policy, CONFIG, manager_model=str(tiny_model_dir), manager_backend=manager, worker=worker,
                              grpo={"device": "cpu"})
    assert set(second["trajectory_ids"]).isdisjoint(row["trajectory_ids"]) and len(second["trajectory_ids"]) == len(train_side)
    with pytest.raises(ValueError, match="no fresh failed rollouts"):
        mt.train_manager(lake, paths, policy, CONFIG, manager_model=str(tiny_model_dir), manager_backend=manager, worker=worker,
                         grpo={"device": "cpu"})


def test_credit_review_trains_every_token_with_the_summed_rewards_advantage(lake_with_failures, tiny_model_dir, monkeypatch):
    paths, lake, _ = lake_with_failures
    policy = PolicySettings(model=str(tiny_model_dir), max_new_tokens=12, dtype="float32")
    manager, worker, _ = scripted_backends(tiny_model_dir, lambda p, j: GOOD if j == 0 else GENERIC)
    seen = record_trained_samples(monkeypatch)
    cfg = ManagerRLConfig(**{**CONFIG.as_dict(), "credit": "review"})
    mt.train_manager(lake, paths, policy, cfg, manager_model=str(tiny_model_dir), manager_backend=manager, worker=worker, grpo={"device": "cpu"})
    rows = lake.read("manager_samples").to_pylist()
    for r in rows:
        assert r["credit"] == "review" and r["score_advantage"] == pytest.approx(r["advantage"])
    for good in (r for r in rows if r["sample_index"] == 0):
        generic = next(r for r in rows if r["rollout_id"] == good["rollout_id"] and r["sample_index"] == 1)
        d = good["reward"] - generic["reward"]
        assert good["advantage"] == pytest.approx((d / 2) / (abs(d) / 2 ** 0.5 + 1e-4), rel=1e-4)
    assert seen and all(s.token_advantages is None for s in seen)


def test_a_hint_written_in_the_second_pass_is_trained_by_the_hints_advantage(lake_with_failures, tiny_model_dir, monkeypatch):
    """A reply that leaves the hint out is asked for it (``llm_manager.hint_prompt``). Its score (9, far from
    the failure's verifier score) is the group's worse one and its hint the better: the reply's score
    tokens get the negative score advantage, the hint pass the positive hint advantage."""
    from tentalis_pipelines.rewards.llm_manager import HINT_BRIDGE

    def reply(p, j):
        if p.endswith(HINT_BRIDGE):
            return 'Add the two numbers in one step, then answer."'
        return ' 9, "critique": "The sum is wrong."}' if j == 0 else ' 2, "critique": "Fine.", "hint": "try again"}'

    paths, lake, _ = lake_with_failures
    policy = PolicySettings(model=str(tiny_model_dir), max_new_tokens=12, dtype="float32")
    manager, worker, tok = scripted_backends(tiny_model_dir, reply)
    seen = record_trained_samples(monkeypatch)
    mt.train_manager(lake, paths, policy, CONFIG, manager_model=str(tiny_model_dir), manager_backend=manager, worker=worker, grpo={"device": "cpu"})
    rows = [r for r in lake.read("manager_samples").to_pylist() if r["sample_index"] == 0]
    assert rows and all(r["hint"].startswith("Add the two numbers") and r["rescued"] == 3 for r in rows)
    assert all(r["advantage"] > 0 > r["score_advantage"] for r in rows)
    passes = [s for s in seen if tok.decode(s.prompt_ids).endswith(HINT_BRIDGE)]
    assert len(passes) == len(rows)
    for s in passes:
        assert s.token_advantages is None and s.advantage == pytest.approx(rows[0]["advantage"])


def test_a_hint_prefix_is_prefilled_in_every_hint_pass_and_only_the_rest_is_trained(lake_with_failures, tiny_model_dir, monkeypatch):
    """With ``hint_prefix`` every parsed reply is asked for its hint, the prefix pre-filled: the first pass
    stops at the hint's key (a hint it wrote anyway is dropped), the hint is the prefix and what the
    manager wrote after it, and the hint pass trains only the written tokens (the prefix is prompt)."""
    from dataclasses import replace

    from tentalis_pipelines.rewards.llm_manager import HINT_BRIDGE

    def reply(p, j):
        if p.endswith(HINT_BRIDGE + "Add"):
            return ' the two numbers in one step, then answer."'
        return ' 2, "critique": "The sum is wrong.", "hint"' if j == 0 else ' 2, "critique": "Wrong.", "hint": "try again"}'

    paths, lake, _ = lake_with_failures
    policy = PolicySettings(model=str(tiny_model_dir), max_new_tokens=12, dtype="float32")
    manager, worker, tok = scripted_backends(tiny_model_dir, reply)
    stops = []
    real_generate = manager.generate
    monkeypatch.setattr(manager, "generate", lambda prompts, params: stops.append(params.stop) or real_generate(prompts, params))
    seen = record_trained_samples(monkeypatch)
    config = replace(CONFIG, hint_prefix="Add")
    mt.train_manager(lake, paths, policy, config, manager_model=str(tiny_model_dir), manager_backend=manager, worker=worker,
                     grpo={"device": "cpu"})
    assert stops[0] == ("}", '"hint"') and stops[1] == ('"',)
    rows = lake.read("manager_samples").to_pylist()
    failed = [r for r in rows if not r["worker_correct"]]
    assert failed and all(r["hint"] == "Add the two numbers in one step, then answer." for r in failed)  # 'try again' dropped
    assert all(r["rescued"] == 3 for r in failed)  # the worker was helped by the whole hint, prefix included
    passes = [s for s in seen if tok.decode(s.prompt_ids).endswith(HINT_BRIDGE + "Add")]
    assert len(passes) == len(rows)  # every review, the accepted answers' too
    assert all(tok.decode(s.completion_ids) == ' the two numbers in one step, then answer."' for s in passes)
    dropped = [p for p in manager.prompts if p.endswith(HINT_BRIDGE + "Add") and "try again" in p]
    assert not dropped  # the reply's own hint is not in the prompt that asks for the prefixed one


def test_a_failure_carries_its_tasks_solution_steps_for_the_dense_reward(lake_with_failures):
    paths, lake, batch_id = lake_with_failures
    assert all(f.steps == () for f in mt.collect_failures(lake, heldout=False, config=CONFIG))  # no expression: no steps
    rows = lake.read("tasks", batch_id=batch_id).to_pylist()
    for r in rows:
        a, b = r["prompt"].split("has ")[1].split(" pens and buys ")
        r["metadata"] = json.dumps({"expression": f"{a} + {b.split()[0]}"})
    lake.write_batch("tasks", batch_id, rows)
    failures = mt.collect_failures(lake, heldout=False, config=CONFIG)
    assert failures and all(f.steps == (f"{f.task_prompt.split('has ')[1].split(' pens')[0]} + "
                                        f"{f.task_prompt.split('buys ')[1].split()[0]} = {f.reference}",) for f in failures)


def test_accepted_answers_train_the_score_alone(lake_with_failures, tiny_model_dir):
    """A rollout the verifier accepts is reviewed for its score only: no hint is measured, and its reward
    is minus the weighted distance of the score from the verifier's."""
    paths, lake, batch_id = lake_with_failures
    train_side = mt.collect_failures(lake, heldout=False, config=CONFIG)
    f = train_side[0]
    ro = lake.read("rollouts", batch_id=batch_id).to_pylist()
    for r in ro:  # the first training-side task's first sample now answers right, in the required format
        if r["rollout_id"] == f.rollout_id:
            r["completion"] = f"<step>the sum is {f.reference}</step><answer>{f.reference}</answer>"
            r["steps"] = [f"the sum is {f.reference}"]
            r["finish_reason"] = "stop"
    lake.write_batch("rollouts", batch_id, ro)
    accepted = mt.collect_failures(lake, heldout=False, config=CONFIG, correct=True)
    assert [a.rollout_id for a in accepted] == [f.rollout_id] and accepted[0].correct and accepted[0].verifier_score == 1.0
    assert f.rollout_id not in {x.rollout_id for x in mt.collect_failures(lake, heldout=False, config=CONFIG)}
    policy = PolicySettings(model=str(tiny_model_dir), max_new_tokens=12, dtype="float32")
    manager, worker, _ = scripted_backends(tiny_model_dir, lambda p, j: GOOD if j == 0 else GENERIC)
    cfg = ManagerRLConfig(**{**CONFIG.as_dict(), "success_share": 1.0})
    row = mt.train_manager(lake, paths, policy, cfg, manager_model=str(tiny_model_dir), manager_backend=manager, worker=worker,
                           grpo={"device": "cpu"})
    # One accepted answer for the share's one per failure: the shortfall is recorded (the CLI warns of it).
    m = json.loads(row["metrics"])
    assert (m["accepted"], m["accepted_wanted"]) == (1, len(train_side)) and len(train_side) > 1
    rows = [r for r in lake.read("manager_samples").to_pylist() if r["rollout_id"] == f.rollout_id]
    assert len(rows) == 2 and all(r["worker_correct"] and r["rescue_k"] == 0 for r in rows)
    by = {r["sample_index"]: r for r in rows}
    assert by[0]["reward"] == pytest.approx(-0.5 * abs(0.2 - 1.0)) and by[1]["reward"] == pytest.approx(-0.5 * abs(0.9 - 1.0))
    assert by[1]["score_advantage"] > 0 > by[0]["score_advantage"]  # on a right answer, the high score is the accurate one
    assert by[0]["advantage"] == by[1]["advantage"] == 0.0  # no hint was needed: its tokens learn nothing
    # The worker is asked to be rescued once per failure (the task's other, failed sample now stands for
    # it), never on the accepted answer.
    assert len(worker.prompts) == len(mt.collect_failures(lake, heldout=False, config=CONFIG)) == len(train_side)


def test_the_gate_promotes_a_manager_whose_hints_rescue_and_refuses_one_whose_scores_drift(lake_with_failures, tiny_model_dir):
    paths, lake, _ = lake_with_failures
    policy = PolicySettings(model=str(tiny_model_dir), max_new_tokens=12, dtype="float32")
    # every rollout failed: no accepted answer to check the score's discrimination on, so the check is waived here
    cfg = ManagerRLConfig(num_generations=2, rescue_samples=2, heldout_fraction=0.5, eval_rescue_samples=2, max_new_tokens=40,
                          gate_min_accepted=0)
    good_mgr, worker, _ = scripted_backends(tiny_model_dir, lambda p, j: GOOD)
    generic_mgr, _, _ = scripted_backends(tiny_model_dir, lambda p, j: GENERIC)
    row = mt.train_manager(lake, paths, policy, cfg, manager_model=str(tiny_model_dir), manager_backend=good_mgr, worker=worker,
                           grpo={"device": "cpu"})
    cid = row["checkpoint_id"]
    with pytest.raises(GateNotReady, match="manager evaluate"):
        mt.decide_manager_gate(lake, cid, cfg)
    base_rows = mt.evaluate_manager(lake, paths, policy, cfg, "base", manager_model=str(tiny_model_dir), manager_backend=generic_mgr,
                                    worker=worker)
    cand_rows = mt.evaluate_manager(lake, paths, policy, cfg, cid, manager_model=str(tiny_model_dir), manager_backend=good_mgr,
                                    worker=worker)
    held = mt.collect_failures(lake, heldout=True, config=cfg)
    assert sorted(r["rollout_id"] for r in cand_rows) == sorted(f.rollout_id for f in held)
    assert all(r["rescued"] == 2 for r in cand_rows) and all(r["rescue_k"] == 0 for r in base_rows)
    # By default the gate will not decide without accepted answers to check the score on, and says how to get them.
    with pytest.raises(GateNotReady, match=r"only 0 held-out accepted answers.*at least 40.*--accepted-per-task"):
        mt.decide_manager_gate(lake, cid, ManagerRLConfig(heldout_fraction=0.5))
    assert not lake.exists("gate_decisions")
    incumbent, d, err_c, err_i = mt.decide_manager_gate(lake, cid, cfg)
    assert incumbent == "base" and d.promote and d.diff == pytest.approx(1.0) and d.n_paired == len(held)
    verifier = [f.verifier_score for f in held]  # every held-out rollout failed: one class, a plain mean
    assert err_c == pytest.approx(sum(abs(0.2 - v) for v in verifier) / len(held))
    assert err_i == pytest.approx(sum(abs(0.9 - v) for v in verifier) / len(held))
    assert serving.serving_checkpoint(lake, "manager") == cid and serving.serving_checkpoint(lake) == serving.BASE
    gd = [r for r in lake.read("gate_decisions").to_pylist() if r["benchmark"] == mt.GATE_BENCHMARK]
    assert len(gd) == 1 and gd[0]["promote"]
    # Rolled back by hand, like the worker; the worker's pointer does not move.
    serving.rollback(lake, actor="test", reason="check", role="manager")
    assert serving.serving_checkpoint(lake, "manager") == serving.BASE and not lake.exists("serving")

    # A candidate whose hints rescue as well but whose scores drift from the verifier's is refused.
    drift = lambda p, j: GOOD.replace(" 2,", " 10,")  # noqa: E731
    drift_mgr, _, _ = scripted_backends(tiny_model_dir, drift)
    mt.evaluate_manager(lake, paths, policy, cfg, cid, manager_model=str(tiny_model_dir), manager_backend=drift_mgr, worker=worker)
    _, d2, err_c2, _ = mt.decide_manager_gate(lake, cid, ManagerRLConfig(score_tolerance=0.05, heldout_fraction=0.5,
                                                                          gate_min_accepted=0))
    assert not d2.promote and "drift" in d2.reason and err_c2 > err_i
    assert serving.serving_checkpoint(lake, "manager") == serving.BASE
    # Two managers whose hints were measured with different workers are not compared.
    lake.replace_where("manager_evals", {"checkpoint_id": "base"}, [{**r, "worker_version": "ckpt-other"} for r in base_rows])
    with pytest.raises(GateNotReady, match="different workers"):
        mt.decide_manager_gate(lake, cid, cfg)


def test_several_accepted_answers_per_task_are_collected_and_reviewed_on_the_heldout_side(lake_with_failures, tiny_model_dir):
    """``accepted_per_task`` takes a task's accepted rollouts in group order (failures too, through
    ``per_task``); the evaluation reviews up to ``eval_accepted`` of them for the score alone."""
    paths, lake, batch_id = lake_with_failures
    cfg = ManagerRLConfig(num_generations=2, heldout_fraction=0.5, eval_rescue_samples=2, max_new_tokens=40)
    held = mt.collect_failures(lake, heldout=True, config=cfg)
    both = mt.collect_failures(lake, heldout=True, config=cfg, per_task=2)
    assert len(both) == 2 * len(held) >= 4  # the fixture's two samples per task, every one failed
    assert [f.task_id for f in both[::2]] == [f.task_id for f in held] == [f.task_id for f in both[1::2]]
    assert [f.rollout_id for f in both[::2]] == [f.rollout_id for f in held]  # the lowest group index first
    assert len(mt.collect_failures(lake, heldout=True, config=cfg, per_task=2, limit=3)) == 3
    ro = lake.read("rollouts", batch_id=batch_id).to_pylist()
    right = {f.task_id: f.reference for f in held[:2]}
    for r in ro:  # both samples of two held-out tasks now answer right
        if r["task_id"] in right:
            r["completion"], r["steps"], r["finish_reason"] = (f"<step>sum {right[r['task_id']]}</step><answer>{right[r['task_id']]}</answer>",
                                                              [f"sum {right[r['task_id']]}"], "stop")
    lake.write_batch("rollouts", batch_id, ro)
    policy = PolicySettings(model=str(tiny_model_dir), max_new_tokens=12, dtype="float32")
    mgr, worker, _ = scripted_backends(tiny_model_dir, lambda p, j: GOOD)

    def accepted(config):
        rows = mt.evaluate_manager(lake, paths, policy, config, "base", manager_model=str(tiny_model_dir), manager_backend=mgr,
                                   worker=worker)
        assert all(r["rescue_k"] == 0 for r in rows if r["worker_correct"])  # reviewed for the score alone
        return sorted(r["rollout_id"] for r in rows if r["worker_correct"])

    by_task = {t: sorted(r["rollout_id"] for r in ro if r["task_id"] == t) for t in right}
    assert len(accepted(cfg)) == 2  # one per task by default
    assert accepted(ManagerRLConfig(**{**cfg.as_dict(), "accepted_per_task": 2})) == sorted(i for ids in by_task.values() for i in ids)
    assert len(accepted(ManagerRLConfig(**{**cfg.as_dict(), "accepted_per_task": 2, "eval_accepted": 3}))) == 3


def test_the_heldout_split_does_not_move_with_the_sampling_seed_and_evaluation_never_sees_a_trained_task(
        lake_with_failures, tiny_model_dir):
    """The split is keyed by ``split_seed``, not ``seed`` (round 8 trained at --seed 8 and evaluated at 0 in one
    home: two splits); and ``evaluate_manager`` passes over every task a manager update of the home reviewed,
    whatever split that update drew."""
    paths, lake, _ = lake_with_failures

    def side(heldout, **kw):
        return [f.task_id for f in mt.collect_failures(lake, heldout=heldout, config=ManagerRLConfig(heldout_fraction=0.5, **kw))]

    assert side(True) == side(True, seed=5) and side(False) == side(False, seed=5)  # another sampling seed, the same split
    assert side(True, split_seed=1) != side(True)  # the key decides the split
    # An update under another key trains on some tasks that key 0 holds out, not all (a key found on the fixture's 8 tasks).
    held = set(side(True))
    key = next(k for k in range(1, 50) if held & set(side(False, split_seed=k)) and held - set(side(False, split_seed=k)))
    mgr, worker, _ = scripted_backends(tiny_model_dir, lambda p, j: GOOD)
    policy = PolicySettings(model=str(tiny_model_dir), max_new_tokens=12, dtype="float32")
    evaluation = ManagerRLConfig(num_generations=2, heldout_fraction=0.5, eval_rescue_samples=2, max_new_tokens=40)

    def train_and_evaluate(split_seed):
        mt.train_manager(lake, paths, policy, ManagerRLConfig(**{**evaluation.as_dict(), "split_seed": split_seed, "seed": 3}),
                         manager_model=str(tiny_model_dir), manager_backend=mgr, worker=worker, grpo={"device": "cpu"})
        return mt.evaluate_manager(lake, paths, policy, evaluation, "base", manager_model=str(tiny_model_dir),
                                   manager_backend=mgr, worker=worker)

    rows = train_and_evaluate(key)
    trained = {r["task_id"] for r in lake.read("manager_samples").to_pylist()}
    assert trained == set(side(False, split_seed=key)) == mt.trained_tasks(lake)
    assert {r["task_id"] for r in rows} == held - trained  # the tasks trained on are not evaluated, the rest are
    # A second update under the key whose training side holds every task key 0 holds out: nothing left to evaluate.
    cover = next(k for k in range(1, 50) if held <= set(side(False, split_seed=k)) | trained)
    with pytest.raises(ValueError, match="held-out side that no manager update trained on"):
        train_and_evaluate(cover)


def test_the_reviews_asset_uses_the_serving_manager_and_names_it(lake_with_failures, tiny_model_dir, home):
    paths, lake, batch_id = lake_with_failures
    policy = PolicySettings(model=str(tiny_model_dir), max_new_tokens=12, dtype="float32")
    good_mgr, worker, _ = scripted_backends(tiny_model_dir, lambda p, j: GOOD if j == 0 else GENERIC)
    row = mt.train_manager(lake, paths, policy, CONFIG, manager_model=str(tiny_model_dir), manager_backend=good_mgr, worker=worker,
                           grpo={"device": "cpu"})
    serving.promote(lake, row["checkpoint_id"], actor="test", reason="serve the trained manager", role="manager")
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("task_batches", [batch_id])
        res = {"lakehouse": LakehouseResource(home=str(home)),
               "policy": PolicyResource(model=str(tiny_model_dir), num_generations=2, max_new_tokens=8, dtype="float32"),
               "review": ReviewResource(manager="llm", judge_model=str(tiny_model_dir), manager_max_new_tokens=8)}
        result = materialize([reviews], partition_key=batch_id, instance=instance, resources=res, selection=[reviews])
        assert result.success
    name = f"llm-manager:{row['checkpoint_id']}"
    meta = result.asset_materializations_for_node("reviews")[0].metadata
    revs = lake.read("reviews", batch_id=batch_id).to_pylist()
    # The tiny random manager rarely writes a parseable reply: those rows are the verifier's, under its name.
    assert revs and meta["llm_manager"].value == name
    assert {(r["manager"], r["reviewer"]) for r in revs} <= {("llm", name), ("verifier", None)}
    assert meta["llm_unparseable"].value == sum(r["manager"] == "verifier" for r in revs)
    # A serving manager whose adapter is gone is an error naming the way back, never a silent base model.
    import shutil

    shutil.rmtree(row["adapter_uri"])
    with pytest.raises(serving.ServingError, match="rollback --role manager"):
        serving.serving_policy(lake, "manager")


def test_roles_are_checked_and_the_worker_pointer_is_separate(lake_with_failures):
    _, lake, _ = lake_with_failures
    with pytest.raises(ValueError, match="unknown role"):
        serving.serving_checkpoint(lake, "critic")
    with pytest.raises(serving.ServingError, match="manager_checkpoints"):
        serving.promote(lake, "m-missing", actor="t", reason="r", role="manager")
    assert manager_rl.ManagerRLConfig().reward == "rescue"


def test_the_gate_refuses_a_manager_that_scores_everything_alike(lake_with_failures, tiny_model_dir):
    """Failures outnumber accepted answers: a manager that scores every rollout 0 has a small error on
    them, but its scores no longer tell a right answer from a wrong one, and the gate says so."""
    paths, lake, batch_id = lake_with_failures
    cfg = ManagerRLConfig(num_generations=2, rescue_samples=2, heldout_fraction=0.5, eval_rescue_samples=2, max_new_tokens=40,
                          success_share=1.0, gate_min_accepted=1)
    held = mt.collect_failures(lake, heldout=True, config=cfg)
    ro = lake.read("rollouts", batch_id=batch_id).to_pylist()
    for r in ro:  # one held-out task's first sample answers right
        if r["rollout_id"] == held[0].rollout_id:
            r["completion"], r["steps"], r["finish_reason"] = (f"<step>sum {held[0].reference}</step><answer>{held[0].reference}</answer>",
                                                              [f"sum {held[0].reference}"], "stop")
    lake.write_batch("rollouts", batch_id, ro)
    policy = PolicySettings(model=str(tiny_model_dir), max_new_tokens=12, dtype="float32")
    right = f"<answer>{held[0].reference}</answer>"
    # The incumbent scores the accepted answer 10 and failures 2; the candidate says 0 to everything, same hint.
    discerning, worker, _ = scripted_backends(tiny_model_dir, lambda p, j: GOOD.replace(" 2,", " 10,") if right in p else GOOD)
    flat, _, _ = scripted_backends(tiny_model_dir, lambda p, j: GOOD.replace(" 2,", " 0,"))
    row = mt.train_manager(lake, paths, policy, cfg, manager_model=str(tiny_model_dir), manager_backend=flat, worker=worker,
                           grpo={"device": "cpu"})
    cid = row["checkpoint_id"]
    base_rows = mt.evaluate_manager(lake, paths, policy, cfg, "base", manager_model=str(tiny_model_dir), manager_backend=discerning,
                                    worker=worker)
    mt.evaluate_manager(lake, paths, policy, cfg, cid, manager_model=str(tiny_model_dir), manager_backend=flat, worker=worker)
    assert sum(r["worker_correct"] for r in base_rows) == 1
    # A loose error tolerance (0.45) lets the balanced error pass (0.5 vs 0.1): the gap alone must refuse it.
    loose = ManagerRLConfig(**{**cfg.as_dict(), "score_tolerance": 0.45})
    _, d, err_c, err_i = mt.decide_manager_gate(lake, cid, loose)
    assert not d.promote and "separate" in d.reason and "+0.000 vs +0.800" in d.reason
    # the gap's comparison and its interval, in the decision's words: constant scores per class, so every
    # resample gives -0.8
    assert "on 1 accepted answers (95% CI of the difference [-0.800, -0.800])" in d.reason
    # one accepted answer is too few for a gate that asks for two
    with pytest.raises(GateNotReady, match="only 1 held-out accepted answers"):
        mt.decide_manager_gate(lake, cid, ManagerRLConfig(**{**loose.as_dict(), "gate_min_accepted": 2}))
    # by hand: the incumbent's gap is 1.0 - 0.2 = 0.8, the candidate's 0; the balanced errors
    fails = [r for r in base_rows if not r["worker_correct"]]
    v = [r["verifier_score"] for r in fails]
    assert err_i == pytest.approx((sum(abs(0.2 - x) for x in v) / len(v) + 0.0) / 2)
    assert err_c == pytest.approx((sum(abs(0.0 - x) for x in v) / len(v) + 1.0) / 2)
    assert serving.serving_checkpoint(lake, "manager") == serving.BASE


def test_best_of_n_trains_each_failures_best_hint_as_a_demonstration(lake_with_failures, tiny_model_dir, monkeypatch):
    """``update = "best_of_n"``: per failure the review whose hint rescued (3 of 3, value 1 > 0.5) is
    trained, with advantage 1 on its critique and hint and 0 on its score (no accepted answer scored
    well, so no score is taught); the generic review is not trained at all; the loss is CISPO's."""
    paths, lake, _ = lake_with_failures
    policy = PolicySettings(model=str(tiny_model_dir), max_new_tokens=12, dtype="float32")
    manager, worker, tok = scripted_backends(tiny_model_dir, lambda p, j: GENERIC if j == 0 else GOOD)
    configs: list = []
    seen = record_trained_samples(monkeypatch, configs)
    cfg = ManagerRLConfig(**{**CONFIG.as_dict(), "update": "best_of_n", "num_iterations": 2, "per_step_rows": 1})
    row = mt.train_manager(lake, paths, policy, cfg, manager_model=str(tiny_model_dir), manager_backend=manager, worker=worker,
                           grpo={"device": "cpu"})
    train_side = mt.collect_failures(lake, heldout=False, config=CONFIG)
    good_ids = tok(GOOD, add_special_tokens=False)["input_ids"]
    assert len(seen) == len(train_side) and all(s.completion_ids == good_ids for s in seen)
    n = manager_rl.score_token_count(tok.decode, good_ids)
    assert all(s.token_advantages == [0.0] * n + [1.0] * (len(good_ids) - n) for s in seen)
    assert configs[0].loss_type == "cispo" and configs[0].num_iterations == 2 and configs[0].per_step_rows == 1
    rows = lake.read("manager_samples").to_pylist()
    assert {(r["sample_index"], r["advantage"], r["score_advantage"]) for r in rows} == {(0, 0.0, 0.0), (1, 1.0, 0.0)}
    m = json.loads(row["metrics"])
    assert (m["update"], m["hint_demonstrations"], m["score_demonstrations"]) == ("best_of_n", len(train_side), 0)
    # A bar no hint clears leaves nothing to train on: refused by name, and no checkpoint is written.
    strict = ManagerRLConfig(**{**cfg.as_dict(), "best_min_value": 1.0})
    with pytest.raises(ValueError, match="best_min_value = 1.0"):
        mt.train_manager(lake, paths, policy, strict, manager_model=str(tiny_model_dir), manager_backend=manager, worker=worker,
                         grpo={"device": "cpu"})
    assert lake.read("manager_checkpoints").num_rows == 1


def test_verifier_score_targets_teach_the_verifiers_own_score_for_as_many_failures_as_accepted_answers(
        lake_with_failures, tiny_model_dir, monkeypatch):
    """``score_targets = "verifier"``: no sampled score is taught (the scripted scores, 0.9 and 0.2, are both
    within 0.5 of a failure's verifier score, and 0.9 of an accepted answer's); instead the verifier's
    score, written as the manager writes it after the pre-filled prompt, for as many failures as accepted
    answers in each form of answer: the two tagged accepted answers and the two tagged failures, not the first
    failure (the tiny model's, untagged), which balanced over all rollouts would be taught in place of one of
    them; hints are chosen as before."""
    paths, lake, batch_id = lake_with_failures
    made = accept_first_samples(lake, batch_id, 2, skip=1, forms=("tagged",))
    policy = PolicySettings(model=str(tiny_model_dir), max_new_tokens=12, dtype="float32")
    manager, worker, tok = scripted_backends(tiny_model_dir, lambda p, j: GENERIC if j == 0 else GOOD)
    configs = []
    seen = record_trained_samples(monkeypatch, configs)
    cfg = ManagerRLConfig(**{**CONFIG.as_dict(), "update": "best_of_n", "score_targets": "verifier", "success_share": 1.0})
    row = mt.train_manager(lake, paths, policy, cfg, manager_model=str(tiny_model_dir), manager_backend=manager, worker=worker,
                           grpo={"device": "cpu"})
    failures = mt.collect_failures(lake, heldout=False, config=CONFIG)
    accepted = mt.collect_failures(lake, heldout=False, config=CONFIG, correct=True)
    assert [a.task_id for a in accepted] == [f.task_id for f in failures[1:3]] == made and len(failures) > 3
    assert [mt.answer_form(f) for f in failures[:3] + accepted] == ["untagged"] + ["tagged"] * 4
    taught = failures[1:3] + accepted
    targets = [s for s in seen if s.old_logps is None]  # not sampled: no sampling log-probs
    # the verifier's scores by hand: a tagged wrong answer 0.1, a tagged right one 1.0
    want = [(tok(p, add_special_tokens=False)["input_ids"], tok(text, add_special_tokens=False)["input_ids"])
            for p, text in zip(mt.manager_prompts(manager, taught), ["1,", "1,", "10,", "10,"])]
    assert [(s.prompt_ids, s.completion_ids) for s in targets] == want
    assert all(s.advantage == 1.0 and s.token_advantages == [1.0] * len(s.completion_ids) for s in targets)
    # the sampled reviews: each failure's rescuing hint, its score tokens untrained
    good_ids = tok(GOOD, add_special_tokens=False)["input_ids"]
    n = manager_rl.score_token_count(tok.decode, good_ids)
    sampled = [s for s in seen if s.old_logps is not None]
    assert len(sampled) == len(failures) and all(s.token_advantages == [0.0] * n + [1.0] * (len(good_ids) - n) for s in sampled)
    assert all(r["score_advantage"] == 0.0 for r in lake.read("manager_samples").to_pylist())
    m = json.loads(row["metrics"])
    assert (m["hint_demonstrations"], m["score_demonstrations"], m["score_targets"]) == (len(failures), 4, "verifier")
    # Demonstrations, at ratio 1 every step: against the pre-update policy the class that gains first takes all.
    assert (configs[0].loss_type, configs[0].old_logprobs) == ("cispo", "current")



def rescued_by(hints):
    """A worker right when the plan hint or any of ``hints`` is in its context, wrong otherwise."""
    def reply(prompt, j):
        return worker_reply(prompt + " Add the two numbers" if any(h in prompt for h in hints) else prompt, j)
    return reply


def proposal_setup(lake, tiny_model_dir, manager_reply):
    from transformers import AutoTokenizer

    train_side = mt.collect_failures(lake, heldout=False, config=CONFIG)
    proposals = {f.rollout_id: manager_rl.proposed_hint(f.review_input, "verifier") for f in train_side}
    assert all(proposals.values())  # every failure has a verifier hint to propose
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    manager = Scripted(tiny_model_dir, tok, manager_reply)
    worker = Scripted(tiny_model_dir, tok, rescued_by(set(proposals.values())))
    return train_side, proposals, manager, worker, tok


PROPOSING = ManagerRLConfig(**{**CONFIG.as_dict(), "update": "best_of_n", "hint_proposals": "verifier"})


def test_verifier_hint_proposals_train_the_proposal_where_it_alone_rescues(lake_with_failures, tiny_model_dir, monkeypatch):
    """``hint_proposals = "verifier"``: each failure's group gains the verifier's hint (row ``proposer`` =
    'verifier', index num_generations), measured like the sampled ones. Where only the proposal rescues
    (3 of 3, value 1 against the generic hints' 0), it is the demonstration: its tokens and the closing
    quote, after the manager's prompt, the first sampled reply that parsed up to its hint's key and the hint
    bridge; every token advantage 1; no sampling log-probs."""
    paths, lake, _ = lake_with_failures
    policy = PolicySettings(model=str(tiny_model_dir), max_new_tokens=12, dtype="float32")
    # the first sampled review does not parse: the proposal follows the second (GENERIC), the first that does
    train_side, proposals, manager, worker, tok = proposal_setup(lake, tiny_model_dir, lambda p, j: GENERIC if j else "no review")
    seen = record_trained_samples(monkeypatch)
    row = mt.train_manager(lake, paths, policy, PROPOSING, manager_model=str(tiny_model_dir), manager_backend=manager,
                           worker=worker, grpo={"device": "cpu"})
    prompts = dict(zip([f.rollout_id for f in train_side], mt.manager_prompts(manager, train_side)))
    body = ' 9, "critique": "Fine."'  # GENERIC up to its hint's key: where the manager writes a hint
    want = sorted((tok(prompts[f.rollout_id] + body + ', "hint": "', add_special_tokens=False)["input_ids"],
                   tok(proposals[f.rollout_id] + '"', add_special_tokens=False)["input_ids"]) for f in train_side)
    assert sorted((s.prompt_ids, s.completion_ids) for s in seen) == want
    assert all(s.old_logps is None and s.token_advantages == [1.0] * len(s.completion_ids) for s in seen)
    rows = lake.read("manager_samples").to_pylist()
    assert {(r["sample_index"], r["proposer"], r["advantage"], r["rescued"]) for r in rows} == {
        (0, "manager", 0.0, 0), (1, "manager", 0.0, 0), (2, "verifier", 1.0, 3)}
    assert {r["hint"] for r in rows if r["proposer"] == "verifier"} == set(proposals.values())
    m = json.loads(row["metrics"])
    assert (m["proposals_offered"], m["proposal_demonstrations"], m["hint_demonstrations"]) == (len(train_side),) * 3
    # the manager's own reviews alone: every failure counted once, none of their hints usable
    assert (m["failures"], m["usable_hint_share"], m["unparseable"]) == (len(train_side), 0.0, len(train_side))


def test_a_tie_goes_to_the_managers_own_hint_and_the_proposal_trains_nothing(lake_with_failures, tiny_model_dir, monkeypatch):
    paths, lake, _ = lake_with_failures
    policy = PolicySettings(model=str(tiny_model_dir), max_new_tokens=12, dtype="float32")
    train_side, proposals, manager, worker, tok = proposal_setup(lake, tiny_model_dir, lambda p, j: GENERIC if j == 0 else GOOD)
    seen = record_trained_samples(monkeypatch)
    row = mt.train_manager(lake, paths, policy, PROPOSING, manager_model=str(tiny_model_dir), manager_backend=manager,
                           worker=worker, grpo={"device": "cpu"})
    good_ids = tok(GOOD, add_special_tokens=False)["input_ids"]
    assert len(seen) == len(train_side) and all(s.completion_ids == good_ids for s in seen)
    rows = lake.read("manager_samples").to_pylist()
    assert {(r["sample_index"], r["proposer"], r["advantage"], r["rescued"]) for r in rows} == {
        (0, "manager", 0.0, 0), (1, "manager", 1.0, 3), (2, "verifier", 0.0, 3)}
    m = json.loads(row["metrics"])
    assert (m["proposals_offered"], m["proposal_demonstrations"], m["hint_demonstrations"]) == (len(train_side), 0, len(train_side))


@pytest.mark.parametrize("change, match", [({"update": "grpo"}, "use it with update = 'best_of_n'"),
                                            ({"hint_prefix": "First compute"}, "set hint_prefix to ''"),
                                            ({"hint_proposals": "teacher"}, "hint_proposals 'teacher' is unknown")])
def test_hint_proposals_refuse_settings_they_cannot_train_with(change, match):
    with pytest.raises(ValueError, match=match):
        ManagerRLConfig(**{**PROPOSING.as_dict(), **change})
