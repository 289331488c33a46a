"""Hint-guided resampling (``tentalis learn --method guide``): a failed group learns from its hint.

A small model fails most tasks in every one of its G samples, and a group whose rewards are all equal
gives GRPO no signal. Guidance (Nath et al., "Adaptive Guidance Accelerates Reinforcement Learning of
Reasoning Models", 2025; LUFFY, Yan et al., 2025) resamples such a group with help in the context and
trains the student **without** that help on the samples that then succeed, as off-policy samples with
an importance ratio between the student and the guided behaviour policy:

    r_t = pi_theta(a_t | s) / pi_b(a_t | s + hint)

Here the help is the manager's hint of that group (the one written most often for its failed samples,
screened by the OPD hint filter: no empty, generic or answer-leaking hint is used). The guided successes
join their group, so the group's advantage is taken over the G failures and the k successes together:
the successes get a positive advantage, the failures a negative one, where before the whole group had
none. ``GRPOConfig.guide_importance`` chooses how the ratio enters the loss: ``clip`` (the loss type's
clipped surrogate with pi_b as the old policy: Guide-GRPO) or ``shaping`` (LUFFY's ``r / (r + gamma)``,
unclipped, ``losses.shaped_guided_loss``).

This module holds the pure decisions (which groups, which hint, which ids); the sampling is the
``guided_rollouts`` stage (``stages/guided_rollouts.py``), the ratio is the trainer's.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tentalis_pipelines.training import opd


@dataclass(frozen=True)
class GroupHint:
    """The hint a failed group is resampled with, and where it came from."""

    task_id: str
    policy_version: str
    hint: str
    hint_source: str  # the manager that wrote it
    source_rollout_id: str  # the first failed rollout (by group index) whose review carries the hint
    votes: int  # how many of the group's reviews gave this hint


def all_fail_groups(rows: Iterable[tuple[str, str, bool]]) -> list[tuple[str, str]]:
    """The groups ``(task_id, policy_version)`` in which no sample is correct, in first-seen order.
    ``rows``: ``(task_id, policy_version, correct)`` per rollout."""
    order: list[tuple[str, str]] = []
    correct: dict[tuple[str, str], bool] = {}
    for task_id, version, ok in rows:
        key = (task_id, version)
        if key not in correct:
            order.append(key)
            correct[key] = False
        correct[key] = correct[key] or bool(ok)
    return [k for k in order if not correct[k]]


def choose_hint(task_id: str, policy_version: str, reviews: Sequence[dict],
                reference: str | Sequence[str] | None) -> tuple[GroupHint | None, str]:
    """The hint to resample a failed group with, or None and why not.

    ``reviews``: the group's reviews as dicts with ``rollout_id``, ``group_index``, ``manager`` and
    ``hint``. Every hint is screened by :func:`opd.screen_hint` (empty, generic or answer-leaking hints
    are never used: a hint that gives the answer teaches copying) against ``reference``, or against each
    of several (an episode's expected outputs: ``episode_guide.hint_references``). Among the usable ones
    the most frequent wins; a tie goes to the one of the lowest group index."""
    refs = [reference] if reference is None or isinstance(reference, str) else list(reference) or [None]
    usable: list[tuple[int, str, str, str]] = []
    reasons: Counter[str] = Counter()
    for r in sorted(reviews, key=lambda r: r["group_index"]):
        hint = (r.get("hint") or "").strip()
        # the first refusal among the references, else USED
        decision = next((d for d in (opd.screen_hint(hint, ref)[0] for ref in refs) if d != opd.USED), opd.USED)
        if decision == opd.USED:
            usable.append((r["group_index"], hint, r["manager"], r["rollout_id"]))
        else:
            reasons[decision] += 1
    if not usable:
        why = ", ".join(f"{k}: {v}" for k, v in sorted(reasons.items())) or "no reviews"
        return None, f"no usable hint ({why})"
    votes = Counter(h for _, h, _, _ in usable)
    best = max(votes.values())
    first = next(u for u in usable if votes[u[1]] == best)  # usable is in group order: the lowest index wins a tie
    return GroupHint(task_id, policy_version, first[1], first[2], first[3], best), ""


def guided_rollout_id(batch_id: str, task_id: str, policy_version: str, hint_id: str, index: int) -> str:
    """A guided sample's id: ``g-`` and a hash of where it came from (distinct from every ``r-`` rollout)."""
    key = f"{batch_id}\x1f{task_id}\x1f{policy_version}\x1f{hint_id}\x1f{index}"
    return "g-" + hashlib.sha1(key.encode()).hexdigest()[:16]


def is_guided(rollout_id: str) -> bool:
    return rollout_id.startswith("g-")
