"""The `guided_rollouts` stage: groups where every sample failed, resampled with their manager's hint.

See ``training/guide.py`` for the method. For each group of a task batch in which the verifier accepted
no sample, the stage picks the group's hint (``guide.choose_hint``), samples ``guide_generations``
completions from the policy that sampled the group with the hint after the task (the same place hinted
OPD's teacher sees it, ``opd.hinted_prompt``), and grades each as the pipeline grades a rollout: the
verifier's answer check, the format score, the calculator's step checks and the verifier manager's
score. Every sample is a row (correct or not, so SQL can count how many groups a hint rescued); the
correct ones become trajectories of their group, trained without the hint. Each row also carries the
hint's dense reward (``rewards/hint_reward.py``) under the policy that sampled: what the hint predicts,
beside what it did.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from tentalis_pipelines.inference.base import SamplingParams
from tentalis_pipelines.inference.models import resolve_model
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.rewards.hint_reward import HintQuery, hint_rewards, solution_steps
from tentalis_pipelines.rewards.managers import ReviewInput, VerifierManager
from tentalis_pipelines.rewards.math_answers import answers_match
from tentalis_pipelines.rewards.process import check_steps
from tentalis_pipelines.rewards.scoring import final_answer, format_score
from tentalis_pipelines.rewards.steps import parse_completion
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages.common import StageResult, markdown_table
from tentalis_pipelines.stages.kinds import EnvironmentBatch, TaskBatch, batch_kind
from tentalis_pipelines.stages.reviews import review_inputs, task_expression
from tentalis_pipelines.stages.teacher_logprobs import sampling_adapter
from tentalis_pipelines.training import guide, opd
from tentalis_pipelines.training.opd import hint_id
from tentalis_pipelines.training.trainer import GRPOConfig


def build_guided_rollouts(lake: Lakehouse, paths: Paths, batch_id: str, policy: PolicySettings, config: GRPOConfig,
                          backends: dict | None = None) -> StageResult:
    """The batch's guided samples (an empty partition when ``config.guide`` is off or the batch is a
    live-sessions batch; an environment batch's are episodes: ``env_batches.build_environment_guided_rollouts``).
    ``backends``: ``{policy_version: backend}`` to sample with (tests); by default the
    policy's own backend with the sampling checkpoint's adapter."""
    if not config.guide:
        lake.write_batch("guided_rollouts", batch_id, [])
        return StageResult(0, {"guide": "off (trainer.guide = false): no resampling"})
    kind = batch_kind(lake, batch_id)
    if isinstance(kind, EnvironmentBatch):  # episodes: hint, expert prefix or both (training/episode_guide.py)
        from tentalis_pipelines import env_batches

        backend = next(iter((backends or {}).values()), None)
        return StageResult(*env_batches.build_environment_guided_rollouts(lake, paths, batch_id, policy, config, backend))
    if not isinstance(kind, TaskBatch):
        lake.write_batch("guided_rollouts", batch_id, [])
        return StageResult(0, {"guide": "not built for live-session batches: no resampling"})
    tasks = {t["task_id"]: t for t in lake.read("tasks", batch_id=batch_id).to_pylist()}
    reviews = {r["rollout_id"]: r for r in lake.read("reviews", batch_id=batch_id).to_pylist()}
    graded = review_inputs(lake, batch_id)
    missing = [r["rollout_id"] for r, _ in graded if r["rollout_id"] not in reviews]
    if missing:
        raise ValueError(f"{len(missing)} rollouts of batch {batch_id!r} have no review (e.g. {missing[0]}): materialise reviews first")
    failed = guide.all_fail_groups((r["task_id"], r["policy_version"], x.correct) for r, x in graded)
    by_group: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r, _ in graded:
        by_group[(r["task_id"], r["policy_version"])].append(r)
    chosen, skipped = [], Counter()
    for task_id, version in failed:
        group = by_group[(task_id, version)]
        hint, why = guide.choose_hint(task_id, version, [{**reviews[r["rollout_id"]], "group_index": r["group_index"]} for r in group],
                                      tasks[task_id]["reference"])
        if hint is None:
            skipped[why] += 1
            continue
        prompt_text = group[0]["prompt_text"]
        # guide_with_hint = false (the ablation): the same resampling, the student's own prompt.
        behaviour = opd.hinted_prompt(prompt_text, tasks[task_id]["prompt"], hint.hint) if config.guide_with_hint else prompt_text
        chosen.append((hint, prompt_text, behaviour))
    params = SamplingParams(num_generations=config.guide_generations, max_new_tokens=policy.max_new_tokens,
                            temperature=policy.temperature, top_p=policy.top_p, seed=policy.seed)
    rows = []
    created = now_utc()
    for version in sorted({h.policy_version for h, _, _ in chosen}):
        todo = [(h, p, hp) for h, p, hp in chosen if h.policy_version == version]
        backend = (backends or {}).get(version) or policy.make_backend(resolve_model(policy.model, paths.models),
                                                                        sampling_adapter(lake, version))
        generations = backend.generate([hp for _, _, hp in todo], params)
        # The dense reward of each hint under the policy that sampled (one teacher-forced pass per side).
        dense = hint_rewards(backend.model, backend.tokenizer,
                             [HintQuery(p, tasks[h.task_id]["prompt"], h.hint, tasks[h.task_id]["reference"],
                                        solution_steps(tasks[h.task_id])) for h, p, _ in todo],
                             dtype=policy.dtype) if hasattr(backend, "model") else [None] * len(todo)
        for (h, prompt_text, hinted), gens, d in zip(todo, generations, dense):
            rows += [{**_graded_row(batch_id, tasks[h.task_id], h, prompt_text, hinted, i, g, policy.temperature, created),
                      "hint_reward": None if d is None else d.reward} for i, g in enumerate(gens)]
    n = lake.write_batch("guided_rollouts", batch_id, rows)
    rescued = {r["task_id"] for r in rows if r["correct"]}
    dense = [r["hint_reward"] for r in rows if r["group_index"] == 0 and r["hint_reward"] is not None]
    return StageResult(n, {
        "all_fail_groups": len(failed),
        "resampled_groups": len(chosen),
        "rescued_groups": len(rescued),
        "guided_samples": n,
        "guided_successes": sum(r["correct"] for r in rows),
        "mean_hint_reward": round(sum(dense) / len(dense), 4) if dense else None,
        "not_resampled": ", ".join(f"{k}: {v}" for k, v in sorted(skipped.items())) or "none",
        "preview": markdown_table([{"task_id": h.task_id, "hint": h.hint, "votes": h.votes,
                                    "successes": sum(r["correct"] for r in rows if r["task_id"] == h.task_id)}
                                   for h, _, _ in chosen]),
    })


def _graded_row(batch_id: str, task: dict, h: guide.GroupHint, prompt_text: str, hinted: str, index: int, g,
                temperature: float, created) -> dict:
    """One guided sample, graded as a rollout is: answer check, format, calculator steps, verifier review."""
    parsed = parse_completion(g.text)
    answer = final_answer(parsed, g.finish_reason)
    correct = answers_match(answer, task["reference"])
    checks = check_steps(task["prompt"], parsed.steps)
    fmt = format_score(parsed, g.finish_reason)
    review = VerifierManager().review(ReviewInput(
        reference=task["reference"], answer=answer, correct=correct, answer_tagged=parsed.has_answer_tag, format_score=fmt,
        steps=list(parsed.steps), step_scores=[c.score for c in checks], step_rationales=[c.rationale for c in checks],
        finish_reason=g.finish_reason, expression=task_expression(task)))
    hid = hint_id(h.source_rollout_id, h.hint_source, h.hint)
    return {
        "batch_id": batch_id, "rollout_id": guide.guided_rollout_id(batch_id, h.task_id, h.policy_version, hid, index),
        "task_id": h.task_id, "group_index": index, "policy_version": h.policy_version, "hint_id": hid,
        "hint_source": h.hint_source, "hint": h.hint, "source_rollout_id": h.source_rollout_id, "hint_votes": h.votes,
        "prompt_text": prompt_text, "behaviour_prompt_text": hinted, "completion": g.text, "steps": list(parsed.steps),
        "answer": answer, "completion_tokens": g.completion_tokens, "completion_token_ids": list(g.token_ids),
        "behaviour_logprobs": g.logprobs, "finish_reason": g.finish_reason, "temperature": float(temperature),
        "correct": bool(correct), "format_score": fmt, "step_rewards": [c.score for c in checks],
        "manager_score": review.score, "created_at": created,
    }
