"""The PRM head's agreement with the verifier and with people, as ``judge_agreement`` rows.

A step scorer is judged on the solution's verdict that its decision rule gives: *pass* when it finds no
wrong step (first error -1, score 1.0), *fail* otherwise (0.0). Two references:

* **people**: ProcessBench's human labels (``window_kind = "processbench"``, ``window_id`` = the split,
  ``rubric = "first_error"``). Besides the table's pass/fail statistics (the human side: 1.0 for an
  all-correct solution), the row carries ProcessBench's own metric: ``f1``, ``error_accuracy`` (the
  first wrong step found exactly) and ``correct_accuracy``.
* **the verifier**: the outcome of the same rollouts (``trajectories.outcome_reward``; ``window_kind =
  "verifier"``, ``window_id = "all"``, ``rubric = "outcome"``): does the head pass the rollouts the
  verifier accepts and fail the others?

The judge is named ``prm_head:<version>``. These rows need the trunk to compute, so the
``judge_agreement`` stage, which recomputes the rest of the table from reviews, carries them over
(:data:`CARRIED_WINDOWS`) rather than deleting them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tentalis_pipelines.evaluation.processbench import processbench_metrics
from tentalis_pipelines.rewards.agreement import agreement_stats

CARRIED_WINDOWS = ("processbench", "verifier")


def judge_name(version: str) -> str:
    return f"prm_head:{version}"


def verdict_score(first_error: int) -> float:
    """1.0 (pass) when no step is wrong, else 0.0."""
    return 1.0 if first_error == -1 else 0.0


def processbench_row(version: str, split: str, labels: Sequence[int], predictions: Sequence[int], now) -> dict[str, Any]:
    """One ``judge_agreement`` row: the head's first-error predictions against ProcessBench's human labels."""
    m = processbench_metrics(list(labels), list(predictions))
    stats = agreement_stats([verdict_score(p) for p in predictions], [verdict_score(y) for y in labels])
    return {"judge": judge_name(version), "rubric": "first_error", "window_kind": "processbench", "window_id": split,
            "window_start": now, **stats, "f1": m.f1, "error_accuracy": m.error_accuracy,
            "correct_accuracy": m.correct_accuracy, "computed_at": now}


def verifier_row(version: str, predictions: Sequence[int], outcomes: Sequence[float], now) -> dict[str, Any]:
    """One ``judge_agreement`` row: the head's pass/fail verdicts against the verifier's outcome (1 accepted)."""
    stats = agreement_stats([verdict_score(p) for p in predictions], [float(o) for o in outcomes])
    return {"judge": judge_name(version), "rubric": "outcome", "window_kind": "verifier", "window_id": "all",
            "window_start": now, **stats, "computed_at": now}


def rollouts_with_outcomes(lake) -> list[dict[str, Any]]:
    """Every rollout with steps, its task's prompt and the verifier's outcome (``trajectories``), oldest first."""
    if not all(lake.exists(t) for t in ("rollouts", "tasks", "trajectories")):
        return []
    prompts = {(t["batch_id"], t["task_id"]): t["prompt"] for t in lake.read("tasks", columns=["batch_id", "task_id", "prompt"]).to_pylist()}
    outcome = {(t["batch_id"], t["rollout_id"]): t["outcome_reward"]
               for t in lake.read("trajectories", columns=["batch_id", "rollout_id", "outcome_reward"]).to_pylist()}
    out = []
    for r in lake.read("rollouts", columns=["batch_id", "rollout_id", "task_id", "steps"]).to_pylist():
        o = outcome.get((r["batch_id"], r["rollout_id"]))
        prompt = prompts.get((r["batch_id"], r["task_id"]))
        if o is None or prompt is None or not r["steps"]:
            continue
        out.append({"batch_id": r["batch_id"], "rollout_id": r["rollout_id"], "problem": prompt, "steps": list(r["steps"]),
                    "outcome": float(o)})
    return sorted(out, key=lambda r: (r["batch_id"], r["rollout_id"]))


def store_rows(lake, rows: Sequence[dict[str, Any]]) -> int:
    """Put ``rows`` into ``judge_agreement``, replacing any row with the same judge, rubric and window (the
    table is small and derived: one atomic replace)."""
    keys = {(r["judge"], r["rubric"], r["window_kind"], r["window_id"]) for r in rows}
    kept = []
    if lake.exists("judge_agreement"):
        kept = [r for r in lake.read("judge_agreement").to_pylist()
                if (r["judge"], r["rubric"], r["window_kind"], r["window_id"]) not in keys]
    lake.replace_all("judge_agreement", kept + list(rows))
    return len(rows)


def carried_rows(lake) -> list[dict[str, Any]]:
    """The rows the ``judge_agreement`` stage keeps as they are (written by ``tentalis prm eval``)."""
    if not lake.exists("judge_agreement"):
        return []
    return [r for r in lake.read("judge_agreement").to_pylist() if r["window_kind"] in CARRIED_WINDOWS]


def verifier_agreement(lake, version: str, score: Callable[[list[str], list[list[str]]], list[list[float | None]]],
                       predict: Callable[[Sequence[float | None]], int], now, *, limit: int = 0) -> dict[str, Any] | None:
    """The verifier row for the lakehouse's rollouts (the newest ``limit`` when > 0), or None when there are none."""
    rollouts = rollouts_with_outcomes(lake)
    if limit > 0:
        rollouts = rollouts[-limit:]
    if not rollouts:
        return None
    scores = score([r["problem"] for r in rollouts], [r["steps"] for r in rollouts])
    return verifier_row(version, [predict(s) for s in scores], [r["outcome"] for r in rollouts], now)
