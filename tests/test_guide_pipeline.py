"""Hint-guided resampling through the Dagster assets on a real lakehouse and the tiny random model.

The tiny model never answers right, so every group fails and is resampled with its hint. The sampler of
the guided samples is the tiny model itself, teacher-forced onto a fixed completion (the right answer for
one task, a wrong one for the other): its behaviour log-probs are the model's real per-token log-probs
given the hinted prompt, so the ratio the trainer takes is checked against a hand computation."""

from __future__ import annotations

import json

import pytest
import torch
from dagster import DagsterInstance, materialize

from assets.batch_assets import (
    guided_rollouts,
    reviews,
    rollouts,
    step_scores,
    tasks,
    teacher_logprobs,
    trajectories,
)
from assets.resources import LakehouseResource, PolicyResource, ReviewResource, TrainerResource
from tentalis_pipelines import lineage, retraction
from tentalis_pipelines.inference.base import Generation
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages import guided_rollouts as guided_stage
from tentalis_pipelines.stages import training as stage_training
from tentalis_pipelines.stages.training import train_checkpoint
from tentalis_pipelines.tasks.batches import register_file_batch
from tentalis_pipelines.training import opd
from tentalis_pipelines.training.losses import per_token_loss, shaped_guided_loss
from tentalis_pipelines.training.trainer import (
    GRPOConfig,
    TrainSample,
    build_policy,
    completion_logps,
    pack,
    train_grpo,
)

PROMPTS = [
    {"prompt": "Ann has 2 pens and buys 3 more. How many pens does Ann have?", "reference": "5"},
    {"prompt": "What is 6*7?", "reference": "42"},
]
# What the teacher-forced sampler writes under each hint: right for the first task, wrong for the second.
FORCED = {"5": "<step>2 + 3 = 5</step><answer>5</answer>", "42": "<step>6 * 7 = 41</step><answer>41</answer>"}


class ForcedBackend:
    """Samples a fixed completion per task, with the model's own log-probs of it given the prompt it was
    asked with (the hinted one): a deterministic behaviour policy whose log-probs are real."""

    name = "forced"
    model_name = "tiny"

    def __init__(self, model_dir, tokenizer, forced=None):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.tokenizer = tokenizer
        self.prompts: list[str] = []
        self.forced = forced or FORCED  # reference -> a completion, or a list cycled over the generations

    def generate(self, prompts, params):
        out = []
        for p in prompts:
            self.prompts.append(p)
            texts = self.forced["5"] if "pens" in p else self.forced["42"]
            texts = [texts] if isinstance(texts, str) else texts
            gens = []
            for i in range(params.num_generations):
                text = texts[i % len(texts)]
                ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
                item = opd.OPDItem(self.tokenizer(p, add_special_tokens=False)["input_ids"], [], ids, params.temperature)
                lp = opd.side_logprobs(self.model, self.tokenizer, [item], "student", dtype="float32")[0]
                gens.append(Generation(text, ids, "stop", len(item.student_prompt_ids), 0.0, logprobs=lp))
            out.append(gens)
        return out


@pytest.fixture()
def batch(home, tiny_model_dir):
    paths = Paths.from_env(home).ensure()
    src = paths.inbox / "guide.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in PROMPTS) + "\n")
    batch_id = register_file_batch(paths.batches, src)
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("task_batches", [batch_id])
        yield paths, batch_id, instance


def _resources(home, tiny_model_dir, **trainer):
    return {"lakehouse": LakehouseResource(home=str(home)),
            "policy": PolicyResource(model=str(tiny_model_dir), num_generations=3, max_new_tokens=12, dtype="float32"),
            "review": ReviewResource(), "trainer": TrainerResource(dtype="float32", device="cpu", **trainer)}


def test_failed_groups_are_resampled_with_their_hint_and_the_successes_train_without_it(batch, home, tiny_model_dir, monkeypatch):
    from transformers import AutoTokenizer

    paths, batch_id, instance = batch
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    backend = ForcedBackend(tiny_model_dir, tok)
    real_build = guided_stage.build_guided_rollouts
    monkeypatch.setattr("assets.batch_assets.build_guided_rollouts",
                        lambda *a, **kw: real_build(*a, **kw, backends={"base": backend}))
    res = _resources(home, tiny_model_dir, guide=True, guide_generations=2)
    result = materialize([tasks, rollouts, step_scores, reviews, teacher_logprobs, guided_rollouts, trajectories],
                         partition_key=batch_id, instance=instance, resources=res)
    assert result.success
    lake = Lakehouse(paths.lakehouse)
    ro = lake.read("rollouts", batch_id=batch_id).to_pylist()
    revs = {r["rollout_id"]: r for r in lake.read("reviews", batch_id=batch_id).to_pylist()}
    task_rows = {t["task_id"]: t for t in lake.read("tasks", batch_id=batch_id).to_pylist()}
    assert all(revs[r["rollout_id"]]["score"] < 1.0 for r in ro)  # the tiny model fails every sample
    guided = lake.read("guided_rollouts", batch_id=batch_id).to_pylist()
    assert len(guided) == 2 * 2  # both groups failed: guide_generations samples each
    for g in guided:
        group = sorted((r for r in ro if r["task_id"] == g["task_id"]), key=lambda r: r["group_index"])
        # the hint is one of the group's own reviews', screened, and it sits after the task in the behaviour prompt
        assert g["hint"] in {revs[r["rollout_id"]]["hint"].strip() for r in group}
        assert opd.screen_hint(g["hint"], task_rows[g["task_id"]]["reference"])[0] == opd.USED
        assert g["prompt_text"] == group[0]["prompt_text"] and opd.HINT_PREFIX + g["hint"] not in g["prompt_text"]
        assert g["behaviour_prompt_text"] == opd.hinted_prompt(g["prompt_text"], task_rows[g["task_id"]]["prompt"], g["hint"])
        assert g["rollout_id"].startswith("g-") and g["hint_id"].startswith("h-")
        assert g["correct"] == (task_rows[g["task_id"]]["reference"] == "5")
    assert sorted(backend.prompts) == sorted({g["behaviour_prompt_text"] for g in guided})
    # The dense hint reward, by hand: one plain forward pass per side over prompt + "<answer>" + the value.
    def answer_logp(prompt: str, reference: str) -> float:
        p = tok(prompt, add_special_tokens=False)["input_ids"] + tok("<answer>", add_special_tokens=False)["input_ids"]
        a = tok(reference, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = backend.model(torch.tensor([p + a])).logits[0].float()
        logp = torch.log_softmax(logits[len(p) - 1:-1], -1)
        return float(logp[torch.arange(len(a)), torch.tensor(a)].sum())

    for g in guided:
        ref = task_rows[g["task_id"]]["reference"]
        expect = answer_logp(g["behaviour_prompt_text"], ref) - answer_logp(g["prompt_text"], ref)
        assert g["hint_reward"] == pytest.approx(expect, abs=2e-4) and g["hint_reward"] != 0.0

    traj = lake.read("trajectories", batch_id=batch_id).to_pylist()
    guided_traj = [t for t in traj if t["guide_hint_id"]]
    assert sorted(t["rollout_id"] for t in guided_traj) == sorted(g["rollout_id"] for g in guided if g["correct"])
    # The rescued group's advantage is over its 3 failures and 2 hinted successes (group-scaled, unbiased std).
    pens = next(t for t in task_rows.values() if t["reference"] == "5")["task_id"]
    group = [t for t in traj if t["task_id"] == pens]
    assert len(group) == 5
    rewards = [t["reward"] for t in group]
    mean = sum(rewards) / 5
    std = (sum((r - mean) ** 2 for r in rewards) / 4) ** 0.5
    for t in group:
        assert t["advantage"] == pytest.approx((t["reward"] - mean) / (std + 1e-4), rel=1e-3, abs=1e-4)
        assert t["kept"]
    assert all(t["advantage"] > 0 for t in guided_traj) and all(t["advantage"] < 0 for t in group if not t["guide_hint_id"])
    # The group no hint rescued still has no signal (DAPO drops it).
    assert not any(t["kept"] for t in traj if t["task_id"] != pens)

    seen = []
    real = stage_training.train_grpo
    monkeypatch.setattr(stage_training, "train_grpo", lambda m, tk, samples, cfg, **kw: seen.extend(samples) or real(m, tk, samples, cfg, **kw))
    policy = PolicySettings(model=str(tiny_model_dir), max_new_tokens=12)
    out = train_checkpoint(lake, paths, policy, res["trainer"].config(12), promote=False)
    g_samples = [s for s in seen if s.guided]
    assert len(g_samples) == 2 and out.metadata["guided_samples"] == 2
    by_ids = {tuple(g["completion_token_ids"]): g for g in guided if g["correct"]}
    for s in g_samples:
        g = by_ids[tuple(s.completion_ids)]
        assert s.old_logps == pytest.approx(g["behaviour_logprobs"])  # the ratio's denominator is the hinted sampler's
        assert s.prompt_ids == tok(g["prompt_text"], add_special_tokens=False)["input_ids"]  # trained without the hint
    manifest = lineage.load_manifest(lake, out.metadata["checkpoint_id"])
    assert sorted(h["rollout_id"] for h in manifest["guide_hints"]) == sorted(t["rollout_id"] for t in guided_traj)
    rows = [r for r in lake.read("lineage").to_pylist() if r["kind"] == "guide_hint"]
    assert sorted(r["row_id"] for r in rows) == sorted(t["rollout_id"] for t in guided_traj)
    assert {r["detail"] for r in rows} == {t["guide_hint_id"] for t in guided_traj}
    ok, report = lineage.verify_replay(lake, out.metadata["checkpoint_id"], tok)
    assert ok, report

    # Retracting the review whose hint was used takes the guided samples of its group with it.
    source = next(g for g in guided if g["correct"])["source_rollout_id"]
    deletes, _, _ = retraction.plan(lake, review=f"{batch_id}/{source}/verifier")
    assert sorted(c["rollout_id"] for c in deletes["guided_rollouts"]) == sorted(g["rollout_id"] for g in guided if g["task_id"] == pens)


def test_the_dense_reward_of_a_solution_scores_its_steps_and_value_by_hand(tiny_model_dir):
    """``HintQuery.steps``: log p of the solution's step text and value (the tags as context), with the
    hint minus without, by one plain forward pass per side."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tentalis_pipelines.rewards.hint_reward import HintQuery, hint_rewards

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids = lambda t: tok(t, add_special_tokens=False)["input_ids"]  # noqa: E731

    def logp(prompt: str) -> float:
        segs = [("<step>", False), ("12 + 7 = 19", True), ("</step><answer>", False), ("19", True)]
        p = ids(prompt)
        full, scored = list(p), []
        for text, flag in segs:
            scored += [flag] * len(ids(text))
            full += ids(text)
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([full])).logits[0].float(), -1)
        return sum(float(lp[len(p) + i - 1, full[len(p) + i]]) for i, flag in enumerate(scored) if flag)

    prompt, task, hint = "<user>What is 12 + 7?</user>", "What is 12 + 7?", "Add the two numbers in one step."
    [plain] = hint_rewards(model, tok, [HintQuery(prompt, task, hint, "19")], dtype="float32")
    [sol] = hint_rewards(model, tok, [HintQuery(prompt, task, hint, "19", ("12 + 7 = 19",))], dtype="float32")
    expect = logp(opd.hinted_prompt(prompt, task, hint)) - logp(prompt)
    assert sol.reward == pytest.approx(expect, abs=2e-4) and sol.with_hint == pytest.approx(logp(opd.hinted_prompt(prompt, task, hint)), abs=2e-4)
    assert sol.reward != pytest.approx(plain.reward, abs=1e-3)  # the steps are scored: another number than the value's alone


def test_a_task_with_an_expression_has_its_hints_scored_on_its_solution(home, tiny_model_dir, monkeypatch):
    """A task that knows its solution (a generated arithmetic task's expression, here in a file batch's
    metadata) has its hint's dense reward scored on the solution's steps and value; one without, on the
    value alone."""
    from transformers import AutoTokenizer

    paths = Paths.from_env(home).ensure()
    src = paths.inbox / "guide-expr.jsonl"
    src.write_text("\n".join(json.dumps({**r, **({"metadata": {"expression": "2 + 3"}} if r["reference"] == "5" else {})})
                             for r in PROMPTS) + "\n")
    batch_id = register_file_batch(paths.batches, src)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    backend = ForcedBackend(tiny_model_dir, tok)
    real_build, real_rewards, queries = guided_stage.build_guided_rollouts, guided_stage.hint_rewards, []
    monkeypatch.setattr("assets.batch_assets.build_guided_rollouts", lambda *a, **kw: real_build(*a, **kw, backends={"base": backend}))
    monkeypatch.setattr(guided_stage, "hint_rewards", lambda m, t, qs, **kw: queries.extend(qs) or real_rewards(m, t, qs, **kw))
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("task_batches", [batch_id])
        assert materialize([tasks, rollouts, step_scores, reviews, teacher_logprobs, guided_rollouts], partition_key=batch_id,
                           instance=instance, resources=_resources(home, tiny_model_dir, guide=True, guide_generations=2)).success
    assert sorted((q.reference, q.steps) for q in queries) == [("42", ()), ("5", ("2 + 3 = 5",))]
    guided = Lakehouse(paths.lakehouse).read("guided_rollouts", batch_id=batch_id).to_pylist()
    expect = {q.reference: r.reward for q, r in zip(queries, real_rewards(backend.model, tok, queries, dtype="float32"))}
    refs = {t["task_id"]: t["reference"] for t in Lakehouse(paths.lakehouse).read("tasks", batch_id=batch_id).to_pylist()}
    assert all(g["hint_reward"] == pytest.approx(expect[refs[g["task_id"]]], abs=2e-4) for g in guided)


def _guided_batch(batch, home, tiny_model_dir, monkeypatch, forced=None, **trainer):
    """Materialise the batch through trajectories with guidance on (2 hinted samples a group) and the
    forced sampler; returns (lakehouse, batch id, sampler)."""
    from transformers import AutoTokenizer

    paths, batch_id, instance = batch
    backend = ForcedBackend(tiny_model_dir, AutoTokenizer.from_pretrained(tiny_model_dir), forced)
    real_build = guided_stage.build_guided_rollouts
    monkeypatch.setattr("assets.batch_assets.build_guided_rollouts",
                        lambda *a, **kw: real_build(*a, **kw, backends={"base": backend}))
    res = _resources(home, tiny_model_dir, guide=True, guide_generations=2, **trainer)
    assert materialize([tasks, rollouts, step_scores, reviews, teacher_logprobs, guided_rollouts, trajectories],
                       partition_key=batch_id, instance=instance, resources=res).success
    return Lakehouse(paths.lakehouse), batch_id, backend


def test_the_ablation_resamples_the_same_groups_without_the_hint(batch, home, tiny_model_dir, monkeypatch):
    lake, batch_id, backend = _guided_batch(batch, home, tiny_model_dir, monkeypatch, guide_with_hint=False)
    guided = lake.read("guided_rollouts", batch_id=batch_id).to_pylist()
    assert len(guided) == 4 and all(g["behaviour_prompt_text"] == g["prompt_text"] for g in guided)
    assert sorted(backend.prompts) == sorted({g["prompt_text"] for g in guided})
    assert not any(opd.HINT_PREFIX in p for p in backend.prompts)
    assert all(g["hint"] for g in guided)  # the row still names the hint the group would have had


@pytest.mark.parametrize("answer_format, joined", [("lenient", 2), ("tagged", 1)])
def test_only_tagged_hinted_successes_join_their_group_when_asked(batch, home, tiny_model_dir, monkeypatch, answer_format, joined):
    """Both hinted samples of the pens task are right, one with the answer in tags and one untagged (its
    last number is the answer, which the verifier accepts): ``guide_answer_format='tagged'`` trains only
    the first, and the group's advantages are over its 3 failures and that one success."""
    forced = {"5": ["<step>2 + 3 = 5</step><answer>5</answer>", "2 + 3 = 5"], "42": FORCED["42"]}
    lake, batch_id, _ = _guided_batch(batch, home, tiny_model_dir, monkeypatch, forced, guide_answer_format=answer_format)
    guided = lake.read("guided_rollouts", batch_id=batch_id).to_pylist()
    pens = [g for g in guided if g["correct"]]
    assert len(pens) == 2  # the verifier accepts both: the table keeps every sample whatever the format setting
    tagged = [g["rollout_id"] for g in pens if "<answer>" in g["completion"]]
    traj = lake.read("trajectories", batch_id=batch_id).to_pylist()
    joined_ids = sorted(t["rollout_id"] for t in traj if t["guide_hint_id"])
    assert joined_ids == (sorted(g["rollout_id"] for g in pens) if answer_format == "lenient" else tagged)
    assert len(joined_ids) == joined
    group = [t for t in traj if t["task_id"] == pens[0]["task_id"]]
    assert len(group) == 3 + joined
    rewards = [t["reward"] for t in group]
    mean = sum(rewards) / len(rewards)
    std = (sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1)) ** 0.5
    for t in group:
        assert t["advantage"] == pytest.approx((t["reward"] - mean) / (std + 1e-4), rel=1e-3, abs=1e-4)
    assert all(t["advantage"] > 0 for t in group if t["guide_hint_id"])


def test_the_guided_answer_format_is_validated(home):
    from tentalis_pipelines.stages.trajectories import guided_successes

    with pytest.raises(ValueError, match="guide_answer_format must be one of"):
        guided_successes(Lakehouse(Paths.from_env(home).ensure().lakehouse), "b", "strict")
    with pytest.raises(ValueError, match="guide_answer_format must be one of"):
        GRPOConfig(guide_answer_format="strict")


@pytest.mark.parametrize("importance", ["clip", "shaping"])
def test_the_guided_loss_is_the_ratio_to_the_hinted_behaviour_policy(tiny_model_dir, importance):
    """One guided and one on-policy row, one step: the recorded loss equals the hand computation with
    the guided row's ratio taken against its behaviour log-probs (not against a recomputation)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = tok("What is 2+3?", add_special_tokens=False)["input_ids"]
    comp = tok("<answer>5</answer>", add_special_tokens=False)["input_ids"]
    other = tok("<answer>4</answer>", add_special_tokens=False)["input_ids"]
    behaviour = [-0.5 - 0.25 * i for i in range(len(comp))]  # the hinted sampler's log-probs (as recorded)
    cfg = GRPOConfig(dtype="float32", device="cpu", learning_rate=1e-3, loss_type="dapo", guide_importance=importance,
                     guide_shaping_gamma=0.3, share_prompt_prefix=False, shuffle=False)
    samples = [TrainSample(prompt, comp, 1.0, old_logps=behaviour, temperature=1.0, guided=True),
               TrainSample(prompt, other, -1.0, temperature=1.0)]
    model = build_policy(tiny_model_dir, None, cfg)
    with torch.no_grad():
        batch = pack(samples, tok.eos_token_id, "cpu", 1.0, shared=False)
        logps = completion_logps(model, batch).float()
    mask, adv = batch["loss_mask"], batch["advantages"]
    b = torch.tensor([behaviour + [0.0] * (logps.shape[1] - len(comp)), [0.0] * logps.shape[1]])
    guided_row = per_token_loss("dapo", logps[:1], b[:1], adv[:1], mask[:1], epsilon=0.2, epsilon_high=0.28).per_token
    if importance == "shaping":
        guided_row = shaped_guided_loss(logps[:1], b[:1], adv[:1], gamma=0.3)
    on_policy = per_token_loss("dapo", logps[1:], logps[1:], adv[1:], mask[1:], epsilon=0.2, epsilon_high=0.28).per_token
    expect = float(((guided_row * mask[:1]).sum() + (on_policy * mask[1:]).sum()) / mask.sum())
    result = train_grpo(model, tok, samples, cfg)
    assert result.history[0]["loss"] == pytest.approx(expect, rel=1e-4, abs=1e-6)
    # the recorded log-ratio is the guided tokens' mean log pi - log pi_b before the update
    ratio = float(((logps[:1] - b[:1]) * mask[:1]).sum() / mask[:1].sum())
    assert result.metrics["guided_log_ratio"] == pytest.approx(ratio, rel=1e-4)
    assert result.metrics["guided_samples"] == 1
