"""Judge-versus-manager agreement: how closely an automatic reviewer (the LLM manager, the verifier, a
re-scoring judge) tracks the human managers who reviewed the same rollouts, and whether it drifts.

Plain functions over rows: :func:`agreement_rows` groups paired scores per judge, rubric and time window
and measures the mean absolute difference, the Spearman rank correlation and the pass/fail agreement at
a threshold; :func:`drift_outcomes` flags a judge whose latest window falls below a floor or drops by
more than a margin from the window before. Scores are on the reviews' scale, [0, 1].
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

PASS_THRESHOLD = 0.5
WINDOW_KINDS = ("batch", "day")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def average_ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing the mean of the ranks they span (as ``scipy.stats.rankdata``)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rho: the Pearson correlation of the average ranks. ``None`` when fewer than two pairs
    or either side is constant (the correlation is undefined, not zero)."""
    if len(x) != len(y):
        raise ValueError(f"spearman needs pairs: {len(x)} x values, {len(y)} y values")
    if len(x) < 2:
        return None
    rx, ry = average_ranks(x), average_ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


@dataclass(frozen=True)
class Pair:
    """One rollout scored by a judge and by its human manager(s)."""

    judge: str
    rubric: str
    batch_id: str
    judged_at: datetime
    judge_score: float
    human_score: float


def agreement_stats(judge: Sequence[float], human: Sequence[float], threshold: float = PASS_THRESHOLD) -> dict[str, Any]:
    """n, mean absolute difference, Spearman and pass/fail agreement (``score >= threshold`` is a pass)."""
    n = len(judge)
    if n == 0 or n != len(human):
        raise ValueError(f"agreement needs the same positive number of judge and human scores, got {n} and {len(human)}")
    return {
        "n": n,
        "mean_abs_diff": sum(abs(a - b) for a, b in zip(judge, human)) / n,
        "spearman": spearman(judge, human),
        "pass_agreement": sum((a >= threshold) == (b >= threshold) for a, b in zip(judge, human)) / n,
        "judge_mean": sum(judge) / n,
        "human_mean": sum(human) / n,
    }


def human_scores(human_reviews: Iterable[dict], live_reviews: Iterable[dict]) -> dict[str, float]:
    """The human managers' score of each reviewed rollout (turn or session for live reviews): an imported
    review (``human_reviews``, one per rollout), else the mean over the live reviewers of each one's
    latest review. An imported review wins: it is the one the ``human`` manager trains on."""
    latest: dict[tuple[str, str], dict] = {}
    for r in live_reviews:
        if r.get("score") is None or not r.get("reviewer"):
            continue
        key = (r["rollout_id"], r["reviewer"])
        if key not in latest or (r.get("created_at") or _EPOCH) >= (latest[key].get("created_at") or _EPOCH):
            latest[key] = r
    per_target: dict[str, list[float]] = defaultdict(list)
    for (target, _), r in latest.items():
        per_target[target].append(float(r["score"]))
    out = {t: sum(v) / len(v) for t, v in per_target.items()}
    out.update({r["rollout_id"]: float(r["score"]) for r in human_reviews if r.get("score") is not None})
    return out


def pair_scores(judge_rows: Iterable[dict], human: dict[str, float]) -> list[Pair]:
    """Judge scores (rows with judge, rubric, batch_id, rollout_id, score, created_at) paired with the
    human score of the same rollout; rollouts no human reviewed are left out."""
    return [Pair(r["judge"], r.get("rubric") or "default", r["batch_id"], r["created_at"], float(r["score"]), human[r["rollout_id"]])
            for r in judge_rows if r.get("score") is not None and r["rollout_id"] in human]


def agreement_rows(pairs: Sequence[Pair], *, window: str = "batch", threshold: float = PASS_THRESHOLD) -> list[dict[str, Any]]:
    """One row per (judge, rubric) over all its pairs (``window_kind = 'all'``) and one per (judge,
    rubric, window), the windows being batches or UTC days of the judge's scores, in time order."""
    if window not in WINDOW_KINDS:
        raise ValueError(f"window must be one of {WINDOW_KINDS}, got {window!r}")
    groups: dict[tuple[str, str, str, str], list[Pair]] = defaultdict(list)
    for p in pairs:
        key = p.batch_id if window == "batch" else p.judged_at.date().isoformat()
        groups[(p.judge, p.rubric, window, key)].append(p)
        groups[(p.judge, p.rubric, "all", "all")].append(p)
    rows = []
    for (judge, rubric, kind, key), members in groups.items():
        stats = agreement_stats([m.judge_score for m in members], [m.human_score for m in members], threshold)
        rows.append({"judge": judge, "rubric": rubric, "window_kind": kind, "window_id": key,
                     "window_start": min(m.judged_at for m in members), **stats})
    rows.sort(key=lambda r: (r["judge"], r["rubric"], r["window_kind"] == "all", r["window_start"], r["window_id"]))
    return rows


@dataclass(frozen=True)
class DriftSettings:
    """When a judge counts as drifting from its human managers: its latest window (with at least
    ``min_n`` pairs) agrees on pass/fail less than ``min_pass_agreement``, or its pass/fail agreement
    fell by more than ``max_drop`` from the window before it (windows with fewer pairs are skipped)."""

    min_n: int = 5
    min_pass_agreement: float = 0.7
    max_drop: float = 0.2


@dataclass
class DriftOutcome:
    judge: str
    rubric: str
    drifting: bool
    reasons: list[str] = field(default_factory=list)
    latest: dict[str, Any] | None = None
    previous: dict[str, Any] | None = None


def drift_outcomes(rows: Sequence[dict[str, Any]], settings: DriftSettings = DriftSettings()) -> list[DriftOutcome]:
    """Per (judge, rubric): is its latest window below the floor, or did it drop by more than the margin?"""
    by_judge: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        if r["window_kind"] != "all" and r["n"] >= settings.min_n:
            by_judge[(r["judge"], r["rubric"])].append(r)
    out = []
    for (judge, rubric), windows in sorted(by_judge.items()):
        windows.sort(key=lambda r: (r["window_start"], r["window_id"]))
        latest = windows[-1]
        previous = windows[-2] if len(windows) > 1 else None
        reasons = []
        if latest["pass_agreement"] < settings.min_pass_agreement:
            reasons.append(f"pass/fail agreement {latest['pass_agreement']:.2f} < {settings.min_pass_agreement:.2f} "
                           f"in {latest['window_id']} (n={latest['n']})")
        if previous is not None and previous["pass_agreement"] - latest["pass_agreement"] > settings.max_drop:
            reasons.append(f"pass/fail agreement fell {previous['pass_agreement']:.2f} -> {latest['pass_agreement']:.2f} "
                           f"({previous['window_id']} -> {latest['window_id']}), more than {settings.max_drop:.2f}")
        out.append(DriftOutcome(judge, rubric, bool(reasons), reasons, latest, previous))
    return out
