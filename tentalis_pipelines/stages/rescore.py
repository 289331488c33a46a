"""Reward versions: re-score stored rollouts without sampling them again, compare, then activate.

``rescore`` computes a new reward version of the stored single-turn trajectories (new weights, a new
manager or rubric, a new step scorer) into ``reward_versions`` and its definition and diff into
``reward_version_defs``. It writes nothing else: ``trajectories``, and so training, keep the active
version's rewards until ``activate_reward_version`` rewrites them (and records the switch in
``reward_activations``). The first re-score snapshots the pipeline's own rewards as version ``v0``,
so every version stays in the table and any of them can be activated again.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from typing import Any

from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.rewards.managers import VerifierManager
from tentalis_pipelines.rewards.rescore import (
    BASELINE,
    RescoreSpec,
    competition_ranks,
    diff_summary,
    finish_rows,
    group_key,
    validate_version,
    weights_for,
)
from tentalis_pipelines.rewards.scoring import process_credit
from tentalis_pipelines.stages.common import StageResult, markdown_table
from tentalis_pipelines.stages.reviews import review_inputs
from tentalis_pipelines.stages.step_scores import judge_formatted, step_reward

# The trajectory columns a reward version carries (what activation writes back).
VERSION_COLUMNS = ("outcome_reward", "format_reward", "process_reward", "step_rewards", "manager_score", "overlong_penalty",
                   "reward", "reward_weights", "advantage", "step_advantages", "advantage_mode", "kept")


# --------------------------------------------------------------------------- which version is active
def reward_activations(lake: Lakehouse) -> list[dict[str, Any]]:
    """Every activation, oldest first (by seq)."""
    if not lake.exists("reward_activations"):
        return []
    return sorted(lake.read("reward_activations").to_pylist(), key=lambda r: r["seq"])


def active_reward_version(lake: Lakehouse) -> str:
    """The reward version ``trajectories`` carry and training uses: the last activation's, else ``v0``."""
    log = reward_activations(lake)
    return log[-1]["to_version"] if log else BASELINE


def version_definition(lake: Lakehouse, version: str) -> dict[str, Any] | None:
    """A version's definition (``None`` for ``v0``, the pipeline's own rewards, or an unknown name)."""
    if version == BASELINE or not lake.exists("reward_version_defs"):
        return None
    rows = [r for r in lake.read("reward_version_defs").to_pylist() if r["reward_version"] == version]
    return json.loads(rows[0]["definition"]) if rows else None


def active_weight_overrides(lake: Lakehouse) -> tuple[str, dict[str, dict[str, float]]]:
    """(active version, its weight overrides): what the trajectories stage applies to a new batch. Read
    from the activation log alone, so the trajectories stage depends on `reward_activations` only."""
    log = reward_activations(lake)
    if not log:
        return BASELINE, {}
    return log[-1]["to_version"], json.loads(log[-1]["weights"] or "{}")


def known_versions(lake: Lakehouse) -> list[str]:
    if not lake.exists("reward_version_defs"):
        return []
    return [r["reward_version"] for r in sorted(lake.read("reward_version_defs").to_pylist(), key=lambda r: r["created_at"])]


# --------------------------------------------------------------------------- re-scoring
def single_turn_batches(lake: Lakehouse) -> list[str]:
    """Batches with single-turn trajectories (what a re-score covers), in order of creation."""
    if not lake.exists("trajectories"):
        return []
    rows = lake.read("trajectories", columns=["batch_id", "kind", "created_at"]).to_pylist()
    first: dict[str, Any] = {}
    for r in rows:
        if (r["kind"] or "single") == "single":
            first[r["batch_id"]] = min(first.get(r["batch_id"], r["created_at"]), r["created_at"])
    return sorted(first, key=lambda b: (first[b], b))


def _version_row(t: dict[str, Any], version: str, created_at) -> dict[str, Any]:
    return {"reward_version": version, **{k: t.get(k) for k in ("rollout_id", "batch_id", "task_id", "group_index", "policy_version")},
            **{k: t.get(k) for k in VERSION_COLUMNS}, "created_at": created_at}


def snapshot_baseline(lake: Lakehouse, batches: list[str]) -> int:
    """Keep the pipeline's own rewards (``v0``) of these batches in ``reward_versions`` before anything
    could replace them in ``trajectories``. Only while ``v0`` is active and only rollouts not yet kept;
    returns the rows added."""
    if active_reward_version(lake) != BASELINE:
        return 0
    have = set()
    if lake.exists("reward_versions"):
        have = {r["rollout_id"] for r in lake.read("reward_versions", columns=["reward_version", "rollout_id"]).to_pylist()
                if r["reward_version"] == BASELINE}
    rows = []
    for b in batches:
        traj = [t for t in lake.read("trajectories", batch_id=b).to_pylist() if (t.get("kind") or "single") == "single"]
        managers = _stored_managers(lake, b)
        ranks = competition_ranks([group_key(t) for t in traj], [t["reward"] for t in traj])
        for t, rank in zip(traj, ranks):
            if t["rollout_id"] not in have:
                rows.append({**_version_row(t, BASELINE, t["created_at"]), "rank": rank, "manager": managers.get(t["rollout_id"], "stored")})
    if rows:
        lake.append("reward_versions", rows)
        kept = read_version(lake, BASELINE)
        first = [d["created_at"] for d in lake.read("reward_version_defs").to_pylist()
                 if d["reward_version"] == BASELINE] if lake.exists("reward_version_defs") else []
        lake.replace_where("reward_version_defs", {"reward_version": BASELINE}, [{
            "reward_version": BASELINE, "base_version": None, "batches": sorted({r["batch_id"] for r in kept}), "n": len(kept),
            "definition": json.dumps({"pipeline": True, "note": "the trajectories stage's own rewards, kept before the first activation"}),
            "summary": "{}", "created_by": "snapshot", "created_at": first[0] if first else now_utc()}])
    return len(rows)


def _stored_managers(lake: Lakehouse, batch_id: str) -> dict[str, str]:
    if not lake.exists("reviews"):
        return {}
    return {r["rollout_id"]: r["manager"] or "stored" for r in lake.read("reviews", batch_id=batch_id, columns=["rollout_id", "manager"]).to_pylist()}


def rescore(
    lake: Lakehouse, spec: RescoreSpec, *, batches: list[str] | None = None, judge=None, llm_manager=None,
    scale_rewards: str = "group", dynamic_sampling: bool = False, created_by: str = "cli",
) -> StageResult:
    """Re-score the stored single-turn trajectories of ``batches`` (default: all) into reward version
    ``spec.version`` and diff it against the active version. Writes ``reward_versions`` and
    ``reward_version_defs`` only; ``trajectories`` are untouched until :func:`activate_reward_version`.

    ``judge`` (a ``JudgePRM``) is needed for ``step_scorer='judge'``, ``llm_manager`` (an
    ``LLMManager``, with the spec's rubric) for ``manager='llm'``. ``scale_rewards`` and
    ``dynamic_sampling`` are the trainer's, as the trajectories stage uses them."""
    active = active_reward_version(lake)
    if spec.version == active:
        raise ValueError(f"reward version {spec.version!r} is active (trajectories carry it): activate another version "
                         "before re-scoring under this name, or choose a new name")
    available = single_turn_batches(lake)
    if not available:
        raise ValueError("no single-turn trajectories to re-score: materialise a batch's trajectories first (tentalis run)")
    chosen = list(dict.fromkeys(batches)) if batches else available
    unknown = [b for b in chosen if b not in available]
    if unknown:
        raise ValueError(f"no single-turn trajectories for batch(es) {unknown}: choose from {available[-10:]}")
    if spec.manager == "llm" and llm_manager is None:
        raise ValueError("manager 'llm' needs a manager model: set the review resource's judge_model")
    if spec.step_scorer == "judge" and judge is None:
        raise ValueError("step scorer 'judge' needs a judge model: set the review resource's judge_model")
    if spec.step_scorer == "prm_head" and judge is None:
        raise ValueError("step scorer 'prm_head' needs a trained PRM head (passed as judge): train one with `tentalis prm train`")
    snapshot_baseline(lake, chosen)
    created = now_utc()
    rows: list[dict[str, Any]] = []
    skipped_multi = 0
    for b in chosen:
        traj = lake.read("trajectories", batch_id=b).to_pylist()
        single = [t for t in traj if (t.get("kind") or "single") == "single"]
        skipped_multi += len(traj) - len(single)
        tasks = {t["task_id"]: t for t in lake.read("tasks", batch_id=b, columns=["task_id", "environment", "prompt"]).to_pylist()}
        managers = _stored_managers(lake, b)
        new_steps, new_scores = _rescore_batch(lake, b, spec, tasks, judge, llm_manager) if not spec.weights_only else ({}, {})
        for t in single:
            rid = t["rollout_id"]
            row = {k: t.get(k) for k in ("rollout_id", "batch_id", "task_id", "group_index", "policy_version", "outcome_reward",
                                         "format_reward", "process_reward", "step_rewards", "manager_score", "overlong_penalty",
                                         "advantage_mode")}
            row.update({"reward_version": spec.version, "manager": managers.get(rid, "stored"), "judge_score": None,
                        "base_version": active, "base_reward": t["reward"], "base_advantage": t["advantage"], "base_kept": t["kept"],
                        "base_created_at": t["created_at"], "created_at": created,
                        "weights": weights_for(spec.weights, tasks.get(t["task_id"], {}).get("environment"), t["reward_weights"])})
            row["overlong_penalty"] = row["overlong_penalty"] or 0.0
            if rid in new_steps:
                row["step_rewards"], row["process_reward"] = new_steps[rid]
            if rid in new_scores:
                score, by = new_scores[rid]
                row["judge_score"] = score if by == spec.manager else None  # not the verifier's, in a fallback
                if not (spec.keep_human and row["manager"] == "human"):  # a human manager's score is never overridden
                    row["manager_score"], row["manager"] = score, by
            rows.append(row)
    finish_rows(rows, scale_rewards=scale_rewards, dynamic_sampling=dynamic_sampling)
    summary = diff_summary(rows)
    summary["skipped_multi_turn"] = skipped_multi
    for r in rows:
        r.pop("base_kept", None)
        r.pop("base_created_at", None)
    lake.replace_where("reward_versions", {"reward_version": spec.version}, rows)
    definition = spec.definition(scale_rewards=scale_rewards, dynamic_sampling=dynamic_sampling)
    lake.replace_where("reward_version_defs", {"reward_version": spec.version}, [{
        "reward_version": spec.version, "base_version": active, "definition": json.dumps(definition, sort_keys=True),
        "batches": chosen, "n": len(rows), "summary": json.dumps(summary), "created_by": created_by, "created_at": created}])
    return StageResult(len(rows), diff_metadata(spec.version, active, summary, rows))


def _rescore_batch(lake: Lakehouse, batch_id: str, spec: RescoreSpec, tasks: dict, judge, llm_manager):
    """New step rewards (rollout -> (step_rewards, process)) and new manager scores (rollout -> score)
    of one batch (rollout -> (score, the manager that wrote it: an llm reply that did not parse is the verifier's)), through the pipeline's own scorers: ``check_steps``, ``JudgePRM.score_steps``,
    ``VerifierManager`` and ``LLMManager.review_many``."""
    inputs = review_inputs(lake, batch_id)
    new_steps: dict[str, tuple[list[float | None], float | None]] = {}
    if spec.step_scorer == "calculator":
        from tentalis_pipelines.rewards.process import check_steps

        judged = [[(c.score, c.rationale) for c in check_steps(tasks[r["task_id"]]["prompt"], list(r["steps"] or []))] for r, _ in inputs]
        scorer = "calculator"
    elif spec.step_scorer in ("judge", "prm_head"):
        from tentalis_pipelines.rewards.judge import JudgeRequest

        verdicts = judge_formatted(judge, [JudgeRequest(tasks[r["task_id"]]["prompt"], list(r["steps"] or [])) for r, _ in inputs],
                                   [r["completion"] for r, _ in inputs])  # the pipeline's rule: only formatted completions
        judged = [[(v.score, v.rationale) for v in vs] for vs in verdicts]
        scorer = spec.step_scorer
    else:
        judged = None
    if judged is not None:
        updated = []
        for (r, x), steps in zip(inputs, judged):
            scores = [step_reward(s, scorer) for s, _ in steps]
            x = dataclasses.replace(x, step_scores=scores, step_rationales=[why for _, why in steps])
            new_steps[r["rollout_id"]] = (scores, process_credit(scores, x.answer))
            updated.append((r, x))
        inputs = updated
    new_scores: dict[str, tuple[float, str]] = {}
    if spec.manager == "verifier":
        verifier = VerifierManager()
        new_scores = {r["rollout_id"]: (verifier.review(x).score, "verifier") for r, x in inputs}
    elif spec.manager == "llm":
        prompts = {t: v["prompt"] for t, v in tasks.items()}
        reviews = llm_manager.review_many([(prompts[r["task_id"]], r["completion"], x) for r, x in inputs])
        # a reply that did not parse scores as the verifier, and the row says so
        new_scores = {r["rollout_id"]: (rev.score, "verifier" if rev.fallback else "llm") for (r, _), rev in zip(inputs, reviews)}
    return new_steps, new_scores


def diff_metadata(version: str, base: str, summary: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The diff as UI metadata: the numbers, the per-batch means and the most changed rollouts."""
    top = sorted(rows, key=lambda r: -abs(r["reward_delta"]))[:10]
    return {
        "reward_version": version,
        "base_version": base,
        **{k: (round(v, 5) if isinstance(v, float) else v) for k, v in summary.items() if not isinstance(v, (list, dict))},
        "per_batch": markdown_table([{k: (round(v, 4) if isinstance(v, float) else v) for k, v in b.items()} for b in summary["batches"]]),
        "most_changed": markdown_table([{"rollout_id": r["rollout_id"], "base_reward": r["base_reward"], "reward": r["reward"],
                                         "delta": r["reward_delta"], "rank": f"{r['base_rank']} -> {r['rank']}",
                                         "advantage": f"{r['base_advantage']:+.3f} -> {r['advantage']:+.3f}"} for r in top]),
        "activate_with": f"tentalis rescore --activate {version}",
    }


def read_version(lake: Lakehouse, version: str) -> list[dict[str, Any]]:
    if not lake.exists("reward_versions"):
        return []
    ds = lake.dataset("reward_versions")
    import pyarrow.compute as pc

    return ds.to_table(filter=pc.field("reward_version") == version).to_pylist()


# --------------------------------------------------------------------------- activation
def activate_reward_version(lake: Lakehouse, version: str, *, actor: str, reason: str) -> dict[str, Any]:
    """Make ``version`` the one training uses: rewrite the rewards, advantages and ``kept`` flags of the
    trajectories it covers (one commit per batch, other rows untouched) and append the switch to
    ``reward_activations`` (who, why, which batches, how many rows). ``v0`` restores the pipeline's own
    rewards kept by the first re-score. Returns the activation row."""
    if version != BASELINE:
        validate_version(version)
    if not reason.strip():
        raise ValueError("give a reason for the activation (--reason): it is recorded with who activated what")
    current = active_reward_version(lake)
    if version == current:
        raise ValueError(f"reward version {version!r} is already active")
    rows = read_version(lake, version)
    if not rows:
        known = [BASELINE] * bool(read_version(lake, BASELINE)) + [v for v in known_versions(lake) if v != BASELINE]
        raise ValueError(f"unknown reward version {version!r}: re-score first (tentalis rescore --version {version} ...); "
                         f"known versions: {known}")
    by_batch: dict[str, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        by_batch[r["batch_id"]][r["rollout_id"]] = r
    current_rows = {b: lake.read("trajectories", batch_id=b).to_pylist() for b in sorted(by_batch)}
    # The diff was shown against the rewards trajectories had then: if they changed since (a batch's reviews
    # or trajectories were rebuilt), the version would silently bring back stale components. Refuse.
    stale = sorted(t["rollout_id"] for b, traj in current_rows.items() for t in traj
                   if (v := by_batch[b].get(t["rollout_id"])) is not None and v["base_version"] == current
                   and v["base_reward"] is not None and abs(t["reward"] - v["base_reward"]) > 1e-12)
    if stale:
        raise ValueError(f"the trajectories of {len(stale)} rollout(s) changed since {version!r} was re-scored (e.g. {stale[:3]}; "
                         f"a batch's reviews or trajectories were rebuilt): re-score again under a new name, look at the diff, "
                         "then activate that")
    snapshot_baseline(lake, sorted(by_batch))  # the rewards about to be replaced stay on record
    rewritten = 0
    for b, version_rows in sorted(by_batch.items()):
        traj = current_rows[b]
        for t in traj:
            v = version_rows.get(t["rollout_id"])
            if v is not None and (t.get("kind") or "single") == "single":
                t.update({k: v[k] for k in VERSION_COLUMNS})
                t["reward_version"] = version
                rewritten += 1
        lake.write_batch("trajectories", b, traj)
    log = reward_activations(lake)
    weights = (version_definition(lake, version) or {}).get("weights") or {}
    row = {"seq": (log[-1]["seq"] + 1) if log else 1, "from_version": current, "to_version": version, "actor": actor,
           "reason": reason, "weights": json.dumps(weights, sort_keys=True), "batches": sorted(by_batch), "rows": rewritten,
           "created_at": now_utc()}
    lake.append("reward_activations", [row])
    return row
