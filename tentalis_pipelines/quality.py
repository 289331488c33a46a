"""Data-quality checks on a batch's tables: plain functions that Dagster asset checks report.

Each check returns a :class:`CheckOutcome` (passed, a one-line description, numbers for the UI). The
assets attach them as asset checks; ``no_held_out_items`` is blocking, so a batch that contains a gate
or benchmark item (or a near duplicate of one, see :mod:`tentalis_pipelines.contamination`) never
reaches rollouts or training.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tentalis_pipelines import contamination
from tentalis_pipelines.lakehouse import Lakehouse


@dataclass(frozen=True)
class CheckOutcome:
    passed: bool
    description: str
    metadata: dict[str, Any] = field(default_factory=dict)


def no_held_out_items(lake: Lakehouse, batch_id: str, *, cache_dir: Path | None = None) -> CheckOutcome:
    """No task of the batch is a held-out or benchmark item, exactly or as a near duplicate (the three
    tiers of :mod:`tentalis_pipelines.contamination`). Fails closed: an index that cannot be built
    (a benchmark file missing) is a failure naming the file and the fix, never a pass."""
    tasks = lake.read("tasks", batch_id=batch_id, columns=["task_id", "prompt"]).to_pylist()
    try:
        index = contamination.build_index(lake, cache_dir=cache_dir)
        matches = index.match([t["prompt"] or "" for t in tasks])
    except (contamination.ContaminationIndexUnavailable, ValueError) as exc:
        return CheckOutcome(False, f"cannot screen batch {batch_id} for contamination: {exc}", {"index_error": str(exc)})
    hits = [(t["task_id"], m) for t, m in zip(tasks, matches) if m is not None]
    sizes = ", ".join(f"{k} {v}" for k, v in sorted(index.counts.items()))
    if hits:
        named = ", ".join(f"{tid} = {m.describe()}" for tid, m in hits[:5])
        return CheckOutcome(False, f"{len(hits)} task(s) are held-out or benchmark items: {named}",
                            {"contaminated": len(hits), "matches": contamination.matches_markdown(hits),
                             "compared_with": len(index.items), "index": sizes})
    return CheckOutcome(True, f"no task of {len(tasks)} matches any of {len(index.items)} held-out/benchmark items ({sizes})",
                        {"contaminated": 0, "compared_with": len(index.items), "index": sizes})


def rollouts_cover_tasks(lake: Lakehouse, batch_id: str, num_generations: int | None) -> CheckOutcome:
    """Every task of the batch has exactly ``num_generations`` rollouts (None: at least one, as a session
    has one per segment), and every rollout names a task of the batch."""
    tasks = {t["task_id"] for t in lake.read("tasks", batch_id=batch_id, columns=["task_id"]).to_pylist()}
    counts = Counter(r["task_id"] for r in lake.read("rollouts", batch_id=batch_id, columns=["task_id"]).to_pylist())
    if num_generations is None:
        wrong = sorted(t for t in tasks | set(counts) if counts.get(t, 0) < 1 or t not in tasks)
        if wrong:
            return CheckOutcome(False, f"{len(wrong)} session(s) without a rollout or rollouts of unknown sessions: {', '.join(wrong[:5])}",
                                {"tasks": len(tasks), "wrong": len(wrong)})
        return CheckOutcome(True, f"{len(tasks)} sessions, {sum(counts.values())} segments", {"tasks": len(tasks)})
    wrong = sorted(t for t in tasks | set(counts) if counts.get(t, 0) != num_generations or t not in tasks)
    if wrong:
        return CheckOutcome(False, f"{len(wrong)} task(s) without exactly {num_generations} rollouts: {', '.join(wrong[:5])}",
                            {"tasks": len(tasks), "wrong": len(wrong)})
    return CheckOutcome(True, f"{len(tasks)} tasks x {num_generations} rollouts", {"tasks": len(tasks)})


def each_session_reviewed(lake: Lakehouse, batch_id: str) -> CheckOutcome:
    """Every session of a sessions batch has at least one review (of a turn or of the whole session), and
    every review names a session of the batch."""
    known = set(lake.read("tasks", batch_id=batch_id, columns=["task_id"]).column("task_id").to_pylist())
    reviewed = Counter(r["session_id"] for r in lake.read("reviews", batch_id=batch_id, columns=["session_id"]).to_pylist())
    missing, orphans = sorted(known - set(reviewed)), sorted(set(reviewed) - known)
    if missing or orphans:
        return CheckOutcome(False, f"{len(missing)} session(s) without a review, {len(orphans)} review(s) of unknown sessions",
                            {"missing": len(missing), "orphans": len(orphans)})
    return CheckOutcome(True, f"{len(known)} sessions, {sum(reviewed.values())} reviews", {"sessions": len(known)})


def each_rollout_reviewed_once(lake: Lakehouse, batch_id: str) -> CheckOutcome:
    """Every rollout of the batch has exactly one review, and every review names a rollout of the batch."""
    rollouts = {r["rollout_id"] for r in lake.read("rollouts", batch_id=batch_id, columns=["rollout_id"]).to_pylist()}
    counts = Counter(r["rollout_id"] for r in lake.read("reviews", batch_id=batch_id, columns=["rollout_id"]).to_pylist())
    missing = sorted(rollouts - set(counts))
    doubled = sorted(r for r, n in counts.items() if n > 1)
    orphans = sorted(set(counts) - rollouts)
    if missing or doubled or orphans:
        return CheckOutcome(False, f"{len(missing)} rollout(s) without a review, {len(doubled)} reviewed twice, "
                            f"{len(orphans)} review(s) of unknown rollouts",
                            {"missing": len(missing), "doubled": len(doubled), "orphans": len(orphans)})
    return CheckOutcome(True, f"{len(rollouts)} rollouts, one review each", {"rollouts": len(rollouts)})


def rewards_in_range(lake: Lakehouse, batch_id: str) -> CheckOutcome:
    """Rewards and advantages are finite; outcome, format and manager scores lie in [0, 1]."""
    bad = []
    for r in lake.read("trajectories", batch_id=batch_id).to_pylist():
        for name in ("reward", "advantage"):
            v = r[name]
            if v is None or not math.isfinite(v):
                bad.append(f"{r['rollout_id']}.{name}={v}")
        for name in ("outcome_reward", "format_reward", "manager_score"):
            v = r[name]
            if v is not None and not (math.isfinite(v) and 0.0 <= v <= 1.0):
                bad.append(f"{r['rollout_id']}.{name}={v}")
        if any(not math.isfinite(x) for x in r["step_advantages"] or []):
            bad.append(f"{r['rollout_id']}.step_advantages")
    if bad:
        return CheckOutcome(False, f"{len(bad)} value(s) out of range or not finite: {', '.join(bad[:5])}", {"bad": len(bad)})
    return CheckOutcome(True, "every reward and advantage finite, scores in [0, 1]")
