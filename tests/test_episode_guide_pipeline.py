"""Guided resampling on a terminal batch through rollout_job and train_job: the tiny random model, real
sandbox episodes, hint and expert prefix together (``guide_rescue = both``).

2 tasks x 2 episodes, 2 turns of 12 tokens. The terminal verifier is replaced by one that fails the
batch's own 4 episodes (every group all-fail) and passes every other guided episode after them, so each
group is rescued once. Everything else is real: the sandbox runs the demonstrated command, ChatPolicy
samples with the hint in context, the stages, the trainer."""

from __future__ import annotations

import json
import os
import sys

import pytest
from dagster import DagsterInstance

import jobs.runner as runner
from tentalis_pipelines import env_batches, lineage
from tentalis_pipelines.definitions import defs
from tentalis_pipelines.envs import terminal
from tentalis_pipelines.envs.base import Verdict
from tentalis_pipelines.inference.transformers_backend import load_policy
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.training import episode_guide
from tentalis_pipelines.training.samples import build_training_samples

needs_sandbox = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                   reason="the sandbox needs Linux namespaces and root (CI runs as root)")


def _contains(seq, sub):
    return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


@needs_sandbox
def test_all_fail_groups_of_episodes_are_rescued_with_hint_and_prefix_and_trained_without_the_hint(home, tiny_model_dir, monkeypatch):
    monkeypatch.delenv("TENTALIS_MODEL", raising=False)
    judged = []

    def stub(task, answer, tree):
        judged.append(task.task_id)
        n = len(judged)
        return Verdict(True, 1.0, "stub: passed") if n > 4 and n % 2 == 1 else Verdict(False, 0.0, "stub: failed")

    monkeypatch.setattr(terminal, "verify", stub)
    paths = Paths.from_env(str(home)).ensure()
    lake = Lakehouse(paths.lakehouse)
    config = {"resources": {"policy": {"config": {"model": str(tiny_model_dir), "num_generations": 2, "max_new_tokens": 12,
                                                  "temperature": 1.0}},
                            "trainer": {"config": {"guide": True, "guide_generations": 2, "guide_rescue": "both"}}},
              "loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
    with DagsterInstance.ephemeral() as instance:
        batch_id = runner.register_batch(instance, paths, num_tasks=2, seed=None, levels=(1,), task_source="terminal", max_turns=3)
        runner.run_job(defs, instance, "rollout_job", partition_key=batch_id, run_config=config)
        before = {r["checkpoint_id"] for r in lake.read("checkpoints").to_pylist()} if lake.exists("checkpoints") else set()
        runner.run_job(defs, instance, "train_job", run_config=config)

    tasks = {t["task_id"]: t for t in lake.read("tasks", batch_id=batch_id).to_pylist()}
    reviews = lake.read("reviews", batch_id=batch_id).to_pylist()
    assert len(reviews) == 4 and all(r["score"] == 0.0 for r in reviews)  # every group failed
    guided = lake.read("guided_rollouts", batch_id=batch_id).to_pylist()
    assert len(guided) == 4 and sorted(g["task_id"] for g in guided) == sorted(list(tasks) * 2)
    assert sum(g["correct"] for g in guided) == 2 and {g["task_id"] for g in guided if g["correct"]} == set(tasks)
    _, tok = load_policy(tiny_model_dir, None, device="cpu", dtype="float32")
    for g in guided:
        meta = json.loads(tasks[g["task_id"]]["metadata"])
        look = meta["solution"][0]  # the level-1 demonstration: the look-up command, then the submission
        hints = {r["hint"] for r in reviews}
        assert g["rescue"] == "both" and g["prefix_turns"] == 1 and g["demo_source"] == "oracle:terminal" and g["hint"] in hints
        assert g["hint_id"].startswith("both-") and g["rollout_id"].startswith("g-") and g["session_id"] == g["rollout_id"]
        assert f"Manager's hint: {g['hint']}" in g["behaviour_prompt_text"] and "Manager's hint" not in g["prompt_text"]
        assert look in g["prompt_text"]  # the demonstrated command is in the student's context
        rec = json.loads(g["episode"])
        assert rec["passed"] == g["correct"] and 1 <= rec["turns"] <= 2  # the prefix used one of the 3 turns
        if not g["turn_spans"]:
            continue
        prompt = tok.decode(g["prompt_token_ids"])
        assert "Manager's hint" not in prompt and look in prompt and tasks[g["task_id"]]["prompt"] in prompt
        mask, ids, lps = g["assistant_mask"], g["completion_token_ids"], g["behaviour_logprobs"]
        assert len(mask) == len(ids) == len(lps) == g["completion_tokens"]
        covered = {i for s in g["turn_spans"] for i in range(s["start"], s["end"])}
        assert [i for i, m in enumerate(mask) if m] == sorted(covered)
        assert all((x is None) != bool(m) for x, m in zip(lps, mask))
        # The student's prompt is the un-hinted first observation + prefix, rendered as ChatPolicy renders it.
        plain = [m for m in rec["transcript"]["messages"]]
        first = next(i for i, m in enumerate(plain) if m.get("role") == "assistant" and m.get("kind") == "assistant")
        unhinted = [{"role": m["role"], "content": m["content"].replace(f"\n\nManager's hint: {g['hint']}", "")} for m in plain[:first]]
        assert g["prompt_token_ids"] == episode_guide.render_prompt_ids(tok, unhinted)
        hint_ids = tok(f"Manager's hint: {g['hint']}", add_special_tokens=False)["input_ids"]
        assert not _contains(g["prompt_token_ids"], hint_ids[2:]) and not _contains(ids, hint_ids[2:])
    trajectories = {t["rollout_id"]: t for t in lake.read("trajectories", batch_id=batch_id).to_pylist()}
    ok = [g for g in guided if g["correct"] and g["turn_spans"]]
    assert ok, "no trainable guided success"
    for g in ok:
        t = trajectories[g["rollout_id"]]
        assert t["guide_hint_id"] == g["hint_id"] and t["advantage"] > 0 and t["loss_mask"] == g["assistant_mask"]
    assert all(trajectories[r["rollout_id"]]["advantage"] < 0 for r in reviews if r["rollout_id"] in trajectories)
    # The trainer's samples: the un-hinted prompt, flagged guided, the hinted sampler's log-probs as pi_b.
    rows = [trajectories[g["rollout_id"]] for g in ok]
    samples, _ = build_training_samples(lake, tok, rows)
    for g, s in zip(ok, samples):
        assert s.guided and s.prompt_ids == g["prompt_token_ids"] and s.loss_mask == g["assistant_mask"]
        assert [x for x, m in zip(s.old_logps, s.loss_mask) if m] == pytest.approx([x for x in g["behaviour_logprobs"] if x is not None])
    meta = env_batches.level_success(lake, batch_id)
    assert meta == {1: 0.0}
    [new] = [c for c in lake.read("checkpoints").to_pylist() if c["checkpoint_id"] not in before]
    assert batch_id in new["trained_on"] and new["trajectory_count"] == 4 + len(ok)
    # Lineage names every guided episode the checkpoint trained on and what produced it.
    manifest = lineage.load_manifest(lake, new["checkpoint_id"])
    assert {h["rollout_id"] for h in manifest["guide_hints"]} == {g["rollout_id"] for g in ok}
    rows = [r for r in lake.read("lineage").to_pylist() if r["kind"] == "guide_hint" and r["checkpoint_id"] == new["checkpoint_id"]]
    assert {(r["row_id"], r["detail"]) for r in rows} == {(g["rollout_id"], g["hint_id"]) for g in ok}
    assert {r["table_name"] for r in rows} == {"guided_rollouts"}


def test_the_students_prompt_is_rendered_as_the_policy_renders_a_new_conversation(embedded_model_dir, tiny_model_dir):
    """Against the real SmolLM2 chat template (not the hand tokenizer, whose defaults match the call):
    the generation prompt is there, the template is rendered as text and tokenised without special
    tokens added, exactly as ``ChatPolicy`` renders the first turn of a conversation it has not seen."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tentalis_pipelines.envs.policies import ChatPolicy
    from tentalis_pipelines.training.episode_guide import render_prompt_ids

    tok = AutoTokenizer.from_pretrained(embedded_model_dir)
    msgs = [{"role": "system", "content": "You run commands."}, {"role": "user", "content": "How many lines does a.txt have?"}]
    ids = render_prompt_ids(tok, msgs)
    policy = ChatPolicy(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tok, kv_budget_bytes=None)
    assert ids == policy.prompt_ids(msgs)
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")  # the generation prompt
    assert tok.decode(ids).startswith("<|im_start|>system\nYou run commands.")  # no special token added in front
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 3

