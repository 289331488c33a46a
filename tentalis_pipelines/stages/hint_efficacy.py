"""The `hint_efficacy` stage: per checkpoint, manager, hint kind and task family, the success of the same
family before and after the checkpoint that trained on hinted failures (``efficacy.py``)."""

from __future__ import annotations

from tentalis_pipelines import efficacy
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.stages.common import StageResult, markdown_table


def build_hint_efficacy(lake: Lakehouse) -> StageResult:
    """Recompute the whole `hint_efficacy` table from checkpoints, trajectories, reviews, tasks and
    teacher_logprobs (it is small: one row per checkpoint x manager x hint kind x family)."""
    def rows(name: str, columns: list[str]) -> list[dict]:
        if not lake.exists(name):
            return []
        have = set(lake.dataset(name).schema.names)
        return lake.read(name, columns=[c for c in columns if c in have]).to_pylist()

    out = efficacy.hint_efficacy(
        rows("checkpoints", ["checkpoint_id", "parent_id", "trajectory_ids"]),
        rows("trajectories", ["batch_id", "rollout_id", "task_id", "policy_version", "outcome_reward"]),
        rows("reviews", ["batch_id", "rollout_id", "manager", "hint"]),
        rows("tasks", ["batch_id", "task_id", "metadata", "environment", "source"]),
        rows("teacher_logprobs", ["rollout_id", "decision"]),
    )
    computed = now_utc()
    for r in out:
        r["computed_at"] = computed
    n = lake.replace_all("hint_efficacy", out)
    measured = [r for r in out if r["delta"] is not None]
    return StageResult(n, {
        "rows": n,
        "measured": len(measured),
        "helped": sum(1 for r in measured if r["delta_ci_low"] > 0),
        "hurt": sum(1 for r in measured if r["delta_ci_high"] < 0),
        "table": markdown_table([{k: r[k] for k in ("checkpoint_id", "manager", "hint_kind", "family", "hinted_failures",
                                                      "before_success", "after_success", "delta")} for r in out], limit=20),
    })
