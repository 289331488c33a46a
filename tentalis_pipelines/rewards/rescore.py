"""Re-scoring stored rollouts into a new reward version: the definition, the reward arithmetic and the
diff against the version it replaces. Plain functions over rows; ``stages/rescore.py`` reads and writes
the tables.

A reward version is a definition (weight overrides, which manager scores, which step scorer, which
rubric) applied to rollouts that were already sampled: nothing is generated again. Its rewards and
advantages are computed exactly as the ``trajectories`` stage computes them (``scoring.combine`` plus
the stored overlong penalty, ``advantages.group_advantages`` over task x policy version groups).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tentalis_pipelines.rewards.advantages import group_advantages, process_advantages
from tentalis_pipelines.rewards.scoring import DEFAULT_WEIGHTS, WEIGHT_COMPONENTS, RewardWeights, combine

BASELINE = "v0"  # the pipeline's own trajectories, before any re-score is activated
MANAGERS = ("stored", "verifier", "llm")
STEP_SCORERS = ("stored", "calculator", "judge", "prm_head")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
SIGN_EPS = 1e-9


def validate_version(name: str) -> str:
    """A reward version name: letters, digits, '.', '_', '-', at most 64 characters, not the baseline's."""
    if not isinstance(name, str) or not _VERSION.match(name):
        raise ValueError(f"invalid reward version {name!r}: use letters, digits, '.', '_' or '-' (at most 64), e.g. v1 or manager-heavy")
    if name == BASELINE:
        raise ValueError(f"{BASELINE!r} names the pipeline's own rewards; choose another name for a re-score")
    return name


def weights_for(overrides: Mapping[str, Mapping[str, float]], environment: str | None, stored: str | None) -> RewardWeights:
    """The weights of one row: its stored weights (else the environment's defaults), then the ``*``
    overrides, then the environment's."""
    base = asdict(DEFAULT_WEIGHTS.get(environment or "math", DEFAULT_WEIGHTS["math"]))
    if stored:
        base.update({k: float(v) for k, v in json.loads(stored).items() if k in WEIGHT_COMPONENTS})
    base.update(overrides.get("*", {}))
    base.update(overrides.get(environment or "math", {}))
    return RewardWeights(**base)


@dataclass(frozen=True)
class RescoreSpec:
    """What a reward version changes. ``manager``: ``stored`` keeps the stored reviews' scores,
    ``verifier`` / ``llm`` score every rollout again (the llm manager with ``rubric``, or its default
    rubric). ``step_scorer``: ``stored`` keeps the stored step scores, ``calculator`` / ``judge`` score
    every step again. With ``keep_human`` a rollout whose stored review a human wrote keeps the human's
    score (the new manager's score is still recorded, as ``judge_score``)."""

    version: str
    weights: dict[str, dict[str, float]] = field(default_factory=dict)
    manager: str = "stored"
    step_scorer: str = "stored"
    rubric: str | None = None
    rubric_name: str = "default"
    judge_model: str | None = None
    keep_human: bool = True

    def __post_init__(self) -> None:
        validate_version(self.version)
        if self.manager not in MANAGERS:
            raise ValueError(f"unknown manager {self.manager!r}: choose {', '.join(MANAGERS)}")
        if self.step_scorer not in STEP_SCORERS:
            raise ValueError(f"unknown step scorer {self.step_scorer!r}: choose {', '.join(STEP_SCORERS)}")
        if self.rubric is not None and self.manager != "llm":
            raise ValueError("a rubric is for the llm manager: add --manager llm")
        if self.rubric is not None and not self.rubric.strip():
            raise ValueError("the rubric is empty: give the rubric text the llm manager should grade by")

    @property
    def weights_only(self) -> bool:
        return self.manager == "stored" and self.step_scorer == "stored"

    def definition(self, **advantage_settings: Any) -> dict[str, Any]:
        """What the version is, as stored in ``reward_version_defs.definition``."""
        return {"weights": self.weights, "manager": self.manager, "step_scorer": self.step_scorer,
                "rubric_name": self.rubric_name if self.manager == "llm" else None, "rubric": self.rubric,
                "rubric_sha256": hashlib.sha256(self.rubric.encode()).hexdigest() if self.rubric else None,
                "judge_model": self.judge_model if not self.weights_only else None, "keep_human": self.keep_human,
                **advantage_settings}


def group_key(row: Mapping[str, Any]) -> str:
    """The GRPO group of a trajectory, as the trajectories stage forms it."""
    return f"{row['task_id']}|{row['policy_version']}"


def competition_ranks(keys: Sequence[str], rewards: Sequence[float]) -> list[int]:
    """Rank within each group, 1 = highest reward; ties share the better rank (1, 1, 3)."""
    idx: dict[str, list[int]] = defaultdict(list)
    for i, k in enumerate(keys):
        idx[k].append(i)
    out = [0] * len(rewards)
    for members in idx.values():
        for i in members:
            out[i] = 1 + sum(rewards[j] > rewards[i] for j in members)
    return out


def sign(x: float) -> int:
    return 0 if abs(x) < SIGN_EPS else (1 if x > 0 else -1)


def finish_rows(rows: list[dict[str, Any]], *, scale_rewards: str, dynamic_sampling: bool) -> list[dict[str, Any]]:
    """Rewards -> advantages, step advantages, kept, rank and the diff against each row's ``base_*``.

    Each row holds the components (outcome_reward, format_reward, process_reward, manager_score,
    overlong_penalty), ``weights`` (a RewardWeights), task_id, policy_version, step_rewards and the
    base version's ``base_reward`` and ``base_advantage``."""
    for r in rows:
        w: RewardWeights = r.pop("weights")
        r["reward"] = combine(w, outcome=r["outcome_reward"], format=r["format_reward"], process=r["process_reward"],
                              manager=r["manager_score"]) + (r["overlong_penalty"] or 0.0)
        r["reward_weights"] = w.to_json()
    keys = [group_key(r) for r in rows]
    adv, signal = group_advantages(keys, [r["reward"] for r in rows], scale_rewards=scale_rewards)
    step_adv = process_advantages(keys, [r["step_rewards"] or [] for r in rows], scale_rewards=scale_rewards)
    ranks = competition_ranks(keys, [r["reward"] for r in rows])
    base_ranks = competition_ranks(keys, [r["base_reward"] for r in rows])
    for r, a, s, sa, rank, base_rank in zip(rows, adv, signal, step_adv, ranks, base_ranks):
        r.update({"advantage": a, "step_advantages": sa, "kept": bool(s) if dynamic_sampling else True, "rank": rank,
                  "base_rank": base_rank, "reward_delta": r["reward"] - r["base_reward"], "rank_change": rank - base_rank,
                  "sign_flip": sign(a) != sign(r["base_advantage"])})
    return rows


def diff_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The diff of a version against its base: how many rewards changed and by how much, how many
    rollouts moved rank in their group, how many advantages changed sign, per batch."""
    n = len(rows)
    deltas = [r["reward_delta"] for r in rows]
    per_batch: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        per_batch[r["batch_id"]].append(r)
    from tentalis_pipelines.rewards.agreement import spearman

    return {
        "n": n,
        "changed": sum(abs(d) > 1e-12 for d in deltas),
        "mean_delta": sum(deltas) / n if n else 0.0,
        "mean_abs_delta": sum(abs(d) for d in deltas) / n if n else 0.0,
        "max_abs_delta": max((abs(d) for d in deltas), default=0.0),
        "rank_changes": sum(r["rank_change"] != 0 for r in rows),
        "sign_flips": sum(bool(r["sign_flip"]) for r in rows),
        "kept_before": sum(bool(r.get("base_kept", True)) for r in rows),
        "kept_after": sum(bool(r["kept"]) for r in rows),
        "reward_spearman": spearman([r["base_reward"] for r in rows], [r["reward"] for r in rows]) if n > 1 else None,
        "batches": [{"batch_id": b, "n": len(m), "base_reward": sum(x["base_reward"] for x in m) / len(m),
                     "reward": sum(x["reward"] for x in m) / len(m), "sign_flips": sum(bool(x["sign_flip"]) for x in m)}
                    for b, m in sorted(per_batch.items(), key=lambda kv: min(str(x.get("base_created_at") or "") for x in kv[1]) + kv[0])],
    }
