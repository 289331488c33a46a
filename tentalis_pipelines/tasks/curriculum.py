"""A curriculum that follows the agent: a batch's levels drawn by the policy's recent success per level.

The rule (:func:`level_weights`, then :func:`choose_levels`), with ``s`` a level's recent success:

* a level is **mastered** when ``s >= 0.8`` (``MASTERED``);
* the **frontier** is the lowest level not mastered (no history counts as not mastered), so with no
  history at all the frontier is the lowest level (terminal: level 0);
* weights: a level in the **learning zone** (``0.2 <= s < 0.8``, at or above the frontier) weighs
  ``1.0``; the frontier weighs at least ``0.5`` (some mass always stays on the lowest unmastered level,
  even at ``s < 0.2``); a mastered level weighs ``0.1`` (review, so it is not forgotten); a level above
  the frontier with ``s < 0.2`` or no history weighs ``0`` (not before the levels below it);
* when every level is mastered, the highest weighs ``1.0`` and the others ``0.1``;
* ``n_tasks`` are shared out in proportion to the weights by largest remainders (each level its whole
  share, the seats left over to the largest fractions, ties broken by ``rng``), and the frontier gets
  at least one task.

So one run starts on level 0, and once level 0's recent success reaches 80% most of the next batch is
level 1 (weights 0.1 and 0.5: 2 of 12 tasks stay on level 0), and so on upward.

``recent_success`` reads the figures from the lakehouse: the last ``WINDOW`` episodes per level of the
family's training rollouts (every batch's, newest first). The choice and the figures it used are
recorded in the batch's manifest (``"curriculum"``) and shown on the ``tasks`` asset's page.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MASTERED = 0.8
LEARNING_LOW = 0.2
ZONE_WEIGHT = 1.0
FRONTIER_WEIGHT = 0.5
REVIEW_WEIGHT = 0.1
WINDOW = 64  # recent episodes per level


def frontier(success_by_level: Mapping[int, float], levels: Sequence[int]) -> int | None:
    """The lowest level not mastered (no history: not mastered); None when every level is."""
    return next((lv for lv in sorted(levels) if success_by_level.get(lv, 0.0) < MASTERED or lv not in success_by_level), None)


def level_weights(success_by_level: Mapping[int, float], levels: Sequence[int]) -> dict[int, float]:
    """Each level's weight by the module's rule (levels without a history are absent from ``success_by_level``)."""
    levels = sorted(set(levels))
    if not levels:
        raise ValueError("the curriculum needs at least one level to choose from")
    front = frontier(success_by_level, levels)
    weights = {}
    for lv in levels:
        s = success_by_level.get(lv)
        if front is None:
            weights[lv] = ZONE_WEIGHT if lv == levels[-1] else REVIEW_WEIGHT
        elif s is not None and s >= MASTERED:
            weights[lv] = REVIEW_WEIGHT
        elif lv == front:
            weights[lv] = ZONE_WEIGHT if s is not None and s >= LEARNING_LOW else FRONTIER_WEIGHT
        elif lv > front and s is not None and s >= LEARNING_LOW:
            weights[lv] = ZONE_WEIGHT
        else:
            weights[lv] = 0.0
    return weights


def choose_levels(success_by_level: Mapping[int, float], n_tasks: int, rng: random.Random,
                  levels: Sequence[int] = (0, 1, 2, 3)) -> list[int]:
    """The levels of a batch of ``n_tasks`` tasks (ascending, one entry per task) by the module's rule."""
    if n_tasks < 1:
        raise ValueError(f"n_tasks must be at least 1 (got {n_tasks})")
    weights = level_weights(success_by_level, levels)
    total = sum(weights.values())
    exact = {lv: n_tasks * w / total for lv, w in weights.items()}
    counts = {lv: int(x) for lv, x in exact.items()}
    left = n_tasks - sum(counts.values())
    order = sorted(weights, key=lambda lv: (-(exact[lv] - counts[lv]), rng.random()))
    for lv in order[:left]:
        counts[lv] += 1
    front = frontier(success_by_level, levels)
    if front is not None and counts[front] == 0:  # the frontier always gets a task
        counts[max(counts, key=lambda lv: (counts[lv], lv))] -= 1
        counts[front] += 1
    return [lv for lv in sorted(counts) for _ in range(counts[lv])]


@dataclass(frozen=True)
class CurriculumChoice:
    """A batch's levels and what they were chosen from (written into its manifest)."""

    levels: tuple[int, ...]
    success_by_level: dict[int, float]
    episodes_by_level: dict[int, int]
    weights: dict[int, float]

    def record(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for lv in self.levels:
            counts[str(lv)] = counts.get(str(lv), 0) + 1
        return {"rule": f"success-zone {LEARNING_LOW:.0%}-{MASTERED:.0%} (tasks/curriculum.py)", "tasks_per_level": counts,
                "success_by_level": {str(k): round(v, 4) for k, v in sorted(self.success_by_level.items())},
                "episodes_by_level": {str(k): v for k, v in sorted(self.episodes_by_level.items())},
                "weights": {str(k): v for k, v in sorted(self.weights.items())}, "window": WINDOW}


def recent_success(lake, levels: Sequence[int], environment: str = "terminal", window: int = WINDOW) -> tuple[dict[int, float], dict[int, int]]:
    """({level: success}, {level: episodes}) over each level's last ``window`` training episodes of
    ``environment`` (the ``rollouts`` table's episode records, one per episode, newest first). Levels
    never tried are absent."""
    if not lake.exists("rollouts"):
        return {}, {}
    rows = lake.read("rollouts", columns=["session_id", "episode", "created_at"]).to_pylist()
    seen: set[str] = set()
    outcomes: dict[int, list[bool]] = {}
    for r in sorted(rows, key=lambda r: r["created_at"], reverse=True):
        if not r["episode"] or r["session_id"] in seen:
            continue
        seen.add(r["session_id"])  # one episode, several segments: counted once
        ep = json.loads(r["episode"])
        lv = ep.get("level")
        if ep.get("environment") != environment or lv not in levels:
            continue
        got = outcomes.setdefault(int(lv), [])
        if len(got) < window:
            got.append(bool(ep.get("passed")))
    return ({lv: sum(v) / len(v) for lv, v in outcomes.items() if v}, {lv: len(v) for lv, v in outcomes.items() if v})


def plan(lake, n_tasks: int, rng: random.Random, levels: Sequence[int] = (0, 1, 2, 3), environment: str = "terminal") -> CurriculumChoice:
    """The next batch's levels from the policy's recent success in the lakehouse."""
    success, episodes = recent_success(lake, levels, environment)
    return CurriculumChoice(tuple(choose_levels(success, n_tasks, rng, levels)), success, episodes, level_weights(success, levels))


def curriculum_table(record: Mapping[str, Any]) -> str:
    """A manifest's curriculum record as a markdown table (the ``tasks`` asset's page)."""
    levels = sorted({*record.get("weights", {}), *record.get("tasks_per_level", {})}, key=int)
    lines = ["| level | recent success | episodes | weight | tasks |", "|---|---|---|---|---|"]
    for lv in levels:
        s = record.get("success_by_level", {}).get(lv)
        lines.append(f"| {lv} | {'—' if s is None else f'{s:.0%}'} | {record.get('episodes_by_level', {}).get(lv, 0)} | "
                     f"{record.get('weights', {}).get(lv, 0.0)} | {record.get('tasks_per_level', {}).get(lv, 0)} |")
    return "\n".join(lines)
