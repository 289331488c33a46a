"""The `judge_agreement` stage: automatic reviewers against the human managers of the same rollouts."""

from __future__ import annotations

import json
from typing import Any

from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.reviewers.prm_agreement import carried_rows
from tentalis_pipelines.rewards.agreement import (
    PASS_THRESHOLD,
    DriftOutcome,
    DriftSettings,
    agreement_rows,
    drift_outcomes,
    human_scores,
    pair_scores,
)
from tentalis_pipelines.sessions import LIVE_BATCH
from tentalis_pipelines.stages.common import StageResult, markdown_table


def judge_scores(lake: Lakehouse) -> list[dict[str, Any]]:
    """Every automatic score of a rollout: the batch reviews no human wrote (``manager`` = llm,
    verifier; judge = the manager, rubric = the row's or 'default'), and every re-scoring manager's own
    score in ``reward_versions`` (judge = '<version>:<manager>', rubric = the version's rubric name)."""
    out = []
    if lake.exists("reviews"):
        cols = ["batch_id", "rollout_id", "manager", "score", "created_at", "session_id", "rubric"]
        for r in lake.read("reviews", columns=cols).to_pylist():
            # Live reviews and their copies in sessions batches are the human side, and an episode's or a session's
            # row belongs to its session: the judges are a task batch's reviews (no session), whatever their
            # reviewer column says (the llm manager's names its checkpoint, ``llm-manager:<version>``).
            if r["batch_id"] == LIVE_BATCH or r["session_id"] is not None or r["manager"] in (None, "human"):
                continue
            out.append({"judge": r["manager"], "rubric": r["rubric"] or "default", "batch_id": r["batch_id"],
                        "rollout_id": r["rollout_id"], "score": r["score"], "created_at": r["created_at"]})
    if lake.exists("reward_versions") and lake.exists("reward_version_defs"):
        defs = {d["reward_version"]: json.loads(d["definition"]) for d in lake.read("reward_version_defs").to_pylist()}
        cols = ["reward_version", "batch_id", "rollout_id", "judge_score", "created_at"]
        for r in lake.read("reward_versions", columns=cols).to_pylist():
            d = defs.get(r["reward_version"]) or {}
            if r["judge_score"] is None or d.get("manager") in (None, "stored"):
                continue
            out.append({"judge": f"{r['reward_version']}:{d['manager']}", "rubric": d.get("rubric_name") or "default",
                        "batch_id": r["batch_id"], "rollout_id": r["rollout_id"], "score": r["judge_score"], "created_at": r["created_at"]})
    return out


def manager_scores(lake: Lakehouse) -> dict[str, float]:
    """The human managers' score per rollout: imported reviews, else the live reviewers' (latest each, averaged)."""
    imported = lake.read("human_reviews", columns=["rollout_id", "score"]).to_pylist() if lake.exists("human_reviews") else []
    live = []
    if lake.exists("reviews"):
        live = lake.read("reviews", batch_id=LIVE_BATCH, columns=["rollout_id", "reviewer", "score", "created_at"]).to_pylist()
    return human_scores(imported, live)


def build_judge_agreement(lake: Lakehouse, *, window: str = "batch", threshold: float = PASS_THRESHOLD,
                          drift: DriftSettings = DriftSettings()) -> tuple[StageResult, list[DriftOutcome], list[dict[str, Any]]]:
    """Recompute ``judge_agreement`` (replaced whole: it is a summary of the reviews) per judge, rubric
    and window (``batch`` or ``day``) and overall, and decide which judges drift. Returns the stage
    result, the drift outcomes and the rows."""
    pairs = pair_scores(judge_scores(lake), manager_scores(lake))
    rows = agreement_rows(pairs, window=window, threshold=threshold)
    computed = now_utc()
    for r in rows:
        r["computed_at"] = computed
    # One atomic replace of every row: the table is derived, never edited. The step scorer's rows
    # (`tentalis prm eval`) need a model to recompute: they are carried over as they are.
    lake.replace_all("judge_agreement", rows + carried_rows(lake))
    outcomes = drift_outcomes(rows, drift)
    overall = [r for r in rows if r["window_kind"] == "all"]
    meta = {
        "pairs": len(pairs),
        "judges": len(overall),
        "window": window,
        "drifting": ", ".join(f"{o.judge}/{o.rubric}" for o in outcomes if o.drifting) or "none",
        "overall": markdown_table([{k: r[k] for k in ("judge", "rubric", "n", "mean_abs_diff", "spearman", "pass_agreement",
                                                       "judge_mean", "human_mean")} for r in overall]),
        "windows": markdown_table([{k: r[k] for k in ("judge", "rubric", "window_id", "n", "mean_abs_diff", "spearman", "pass_agreement")}
                                   for r in rows if r["window_kind"] != "all"], limit=30),
    }
    return StageResult(len(rows), meta), outcomes, rows
