"""The `trajectories` stage: rewards, their weighted sum and group-relative advantages."""

from __future__ import annotations

from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.rewards.advantages import (
    group_advantages,
    process_advantages,
)
from tentalis_pipelines.rewards.rescore import weights_for
from tentalis_pipelines.rewards.scoring import (
    DEFAULT_WEIGHTS,
    RewardWeights,
    combine,
    overlong_penalty,
    process_credit,
)
from tentalis_pipelines.rewards.steps import parse_completion
from tentalis_pipelines.stages.common import StageResult
from tentalis_pipelines.stages.kinds import batch_kind
from tentalis_pipelines.stages.rescore import active_weight_overrides
from tentalis_pipelines.stages.reviews import review_inputs
from tentalis_pipelines.training import opd
from tentalis_pipelines.training.policy_lag import with_policy_lag
from tentalis_pipelines.training.trainer import GUIDE_ANSWER_FORMATS


def build_trajectories(
    lake: Lakehouse, batch_id: str, *, scale_rewards: str = "group", dynamic_sampling: bool = False,
    overlong_buffer: int = 0, max_completion_length: int = 128, advantage_mode: str = "outcome",
    w_rl: float = 1.0, w_opd: float = 0.0, weights: RewardWeights | None = None, guide_answer_format: str = "lenient",
    episode_format_weight: float = 0.0,
) -> StageResult:
    """Rewards (outcome, format, process, manager, optional overlong penalty), their weighted sum and
    the group-relative advantage. With ``dynamic_sampling`` groups whose rewards are all equal are
    marked ``kept = False`` (DAPO) and the trainer skips them. ``weights`` (the run's ``review.reward_weights``
    setting) replaces, for every row, the per-environment defaults and an activated reward version's
    weights. A sessions batch gets multi-turn rows.

    With ``w_opd > 0`` each row whose hint the teacher used carries ``opd_signal`` (from
    ``teacher_logprobs``) and the weights; the trainer's per-token advantage is then
    ``w_rl * A_rl + w_opd * opd_signal``. A row is kept when it carries a signal of either kind that
    has a weight: a group with equal rewards still teaches through its hints.

    The batch's kind builds the rows (``stages/kinds.py``): :func:`single_turn_trajectories` for a task
    batch, ``sessions.build_session_trajectories`` for a sessions batch. ``guide_answer_format`` says which
    hint-guided successes join their group (:func:`guided_successes`)."""
    return batch_kind(lake, batch_id).trajectories(
        lake, batch_id, scale_rewards=scale_rewards, dynamic_sampling=dynamic_sampling, overlong_buffer=overlong_buffer,
        max_completion_length=max_completion_length, advantage_mode=advantage_mode, w_rl=w_rl, w_opd=w_opd, weights=weights,
        guide_answer_format=guide_answer_format, episode_format_weight=episode_format_weight)


def single_turn_trajectories(
    lake: Lakehouse, batch_id: str, *, scale_rewards: str = "group", dynamic_sampling: bool = False,
    overlong_buffer: int = 0, max_completion_length: int = 128, advantage_mode: str = "outcome",
    w_rl: float = 1.0, w_opd: float = 0.0, weights: RewardWeights | None = None, guide_answer_format: str = "lenient",
) -> StageResult:
    """A task batch's trajectories: one ``single`` row per rollout (see :func:`build_trajectories`)."""
    tasks = {t["task_id"]: t for t in lake.read("tasks", batch_id=batch_id).to_pylist()}
    reviews = {r["rollout_id"]: r for r in lake.read("reviews", batch_id=batch_id).to_pylist()}
    # The active reward version's weights (`tentalis rescore --activate`); v0: the defaults.
    reward_version, overrides = active_weight_overrides(lake)
    opd_signals = {}
    if w_opd > 0:
        opd_signals = {r["rollout_id"]: r["opd_signal"] for r in lake.read("teacher_logprobs", batch_id=batch_id).to_pylist()
                       if r["decision"] == "used"}
    created = now_utc()
    rows = []
    for r, x in review_inputs(lake, batch_id):
        if r["rollout_id"] not in reviews:
            raise ValueError(f"rollout {r['rollout_id']} has no review: materialise reviews for batch {batch_id!r}")
        env = tasks[r["task_id"]]["environment"]
        # The run's explicit weights (review.reward_weights) win; else the active reward version's; else the defaults.
        w = weights or (weights_for(overrides, env, None) if overrides else DEFAULT_WEIGHTS.get(env, DEFAULT_WEIGHTS["math"]))
        process = process_credit(x.step_scores, x.answer)
        outcome = 1.0 if x.correct else 0.0
        manager = reviews[r["rollout_id"]]["score"]
        penalty = overlong_penalty(r["completion_tokens"], max_completion_length, overlong_buffer)
        rows.append(
            {
                "batch_id": batch_id,
                "rollout_id": r["rollout_id"],
                "task_id": r["task_id"],
                "group_index": r["group_index"],
                "policy_version": r["policy_version"],
                "outcome_reward": outcome,
                "format_reward": x.format_score,
                "process_reward": process,
                "step_rewards": x.step_scores,
                "manager_score": manager,
                "overlong_penalty": penalty,
                "reward": combine(w, outcome=outcome, format=x.format_score, process=process, manager=manager) + penalty,
                "reward_weights": w.to_json(),
                "created_at": created,
                "reward_version": reward_version,
            }
        )
    # Hint-guided resampling (training/guide.py): a failed group's hinted successes join it, so the group
    # that had no signal now has one; they are trained without the hint (trainer: the guided ratio).
    for g in guided_successes(lake, batch_id, guide_answer_format):
        env = tasks[g["task_id"]]["environment"]
        w = weights or (weights_for(overrides, env, None) if overrides else DEFAULT_WEIGHTS.get(env, DEFAULT_WEIGHTS["math"]))
        process = process_credit(g["step_rewards"] or [], g["answer"])
        penalty = overlong_penalty(g["completion_tokens"], max_completion_length, overlong_buffer)
        rows.append({
            "batch_id": batch_id, "rollout_id": g["rollout_id"], "task_id": g["task_id"], "group_index": g["group_index"],
            "policy_version": g["policy_version"], "outcome_reward": 1.0, "format_reward": g["format_score"],
            "process_reward": process, "step_rewards": g["step_rewards"], "manager_score": g["manager_score"],
            "overlong_penalty": penalty,
            "reward": combine(w, outcome=1.0, format=g["format_score"], process=process, manager=g["manager_score"]) + penalty,
            "reward_weights": w.to_json(), "created_at": created, "reward_version": reward_version, "guide_hint_id": g["hint_id"],
        })
    if advantage_mode not in ("outcome", "process"):
        raise ValueError(f"advantage_mode must be 'outcome' or 'process', got {advantage_mode!r}")
    keys = [f"{r['task_id']}|{r['policy_version']}" for r in rows]
    adv, signal = group_advantages(keys, [r["reward"] for r in rows], scale_rewards=scale_rewards)
    step_adv = process_advantages(keys, [r["step_rewards"] for r in rows], scale_rewards=scale_rewards)
    for row, a, s, sa in zip(rows, adv, signal, step_adv):
        row["advantage"] = a
        row["step_advantages"] = sa
        row["advantage_mode"] = advantage_mode
        signal_opd = opd_signals.get(row["rollout_id"])
        row["opd_signal"] = signal_opd
        row["w_rl"], row["w_opd"] = float(w_rl), float(w_opd)
        rl_signal = bool(s) if dynamic_sampling else True
        # OPD only (w_rl = 0): a row without a used hint has no signal at all and is not trained on.
        row["kept"] = opd.keeps(rl_signal, signal_opd, w_rl=w_rl, w_opd=w_opd)
        row["kind"] = "single"
    n = lake.write_batch("trajectories", batch_id, with_policy_lag(lake, rows))  # how stale each row is
    return StageResult(
        n,
        {
            "num_trajectories": n,
            "reward_mean": round(sum(r["reward"] for r in rows) / max(n, 1), 4),
            "accuracy": round(sum(r["outcome_reward"] for r in rows) / max(n, 1), 4),
            "groups": len({r["task_id"] for r in rows}),
            "groups_with_signal": len({r["task_id"] for r, s in zip(rows, signal) if s}),
            "opd_rows": sum(r["opd_signal"] is not None for r in rows),
            "guided_rows": sum(r.get("guide_hint_id") is not None for r in rows),
            "kept": sum(r["kept"] for r in rows),
        },
    )


def guided_successes(lake: Lakehouse, batch_id: str, answer_format: str = "lenient") -> list[dict]:
    """The batch's guided samples that the verifier accepted (none when the table does not exist yet).

    ``answer_format='tagged'`` keeps only those whose answer is inside ``<answer>`` tags. The verifier also
    accepts an untagged completion's last number, and a hinted sample often answers that way (the hint's
    words pull it out of the worker's format); trained as the all-fail group's only success, such a sample
    teaches the student to drop the tag that the held-out benchmark requires."""
    if answer_format not in GUIDE_ANSWER_FORMATS:
        raise ValueError(f"guide_answer_format must be one of {GUIDE_ANSWER_FORMATS}, got {answer_format!r}")
    if not lake.exists("guided_rollouts"):
        return []
    rows = [g for g in lake.read("guided_rollouts", batch_id=batch_id).to_pylist() if g["correct"]]
    if answer_format == "tagged":
        rows = [g for g in rows if parse_completion(g["completion"]).has_answer_tag]
    return rows
