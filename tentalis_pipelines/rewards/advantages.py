"""Group-relative advantages (GRPO): each sample is compared with the other samples of its task."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np


def group_advantages(
    group_keys: Sequence[str], rewards: Sequence[float], *, scale_rewards: str = "group", eps: float = 1e-4
) -> tuple[list[float], list[bool]]:
    """Return (advantage, group_has_signal) per sample.

    ``scale_rewards='group'`` divides by the group's (unbiased) std + eps, as TRL's GRPOTrainer does;
    ``'none'`` only centres (Dr. GRPO). A group whose rewards are all equal has no learning signal.
    """
    if scale_rewards not in ("group", "none"):
        raise ValueError(f"scale_rewards must be 'group' or 'none', got {scale_rewards!r}")
    idx: dict[str, list[int]] = defaultdict(list)
    for i, k in enumerate(group_keys):
        idx[k].append(i)
    r = np.asarray(rewards, dtype=np.float64)
    adv = np.zeros_like(r)
    signal = np.zeros(len(r), dtype=bool)
    for members in idx.values():
        g = r[members]
        centred = g - g.mean()
        std = g.std(ddof=1) if len(g) > 1 else 0.0
        adv[members] = centred / (std + eps) if scale_rewards == "group" else centred
        signal[members] = bool(np.ptp(g) > 0)
    return adv.tolist(), signal.tolist()


def process_advantages(group_keys: Sequence[str], step_rewards: Sequence[Sequence[float | None]], *,
                       scale_rewards: str = "group", eps: float = 1e-4) -> list[list[float]]:
    """DeepSeekMath process supervision: each step reward is normalised with the mean and std of all
    step rewards in its group; a step's advantage is the sum of the normalised rewards of that step and
    every later step of the same sample, divided by the sample's number of scored steps. Unscored steps
    (None) contribute 0. ``scale_rewards`` as for :func:`group_advantages`: ``'none'`` only centres the step
    rewards (Dr. GRPO), so a scorer whose scores barely differ adds little, where the std would have
    blown its differences up to the outcome's scale.

    The division is ours: DeepSeekMath's plain suffix sum grows with the number of steps, so padding a
    solution with many cheap, correct steps (``1 + 1 = 2`` nine times) outscored an honest right
    answer. Per scored step, a solution's process advantage is bounded by the best normalised step, however many
    steps it writes."""
    if scale_rewards not in ("group", "none"):
        raise ValueError(f"scale_rewards must be 'group' or 'none', got {scale_rewards!r}")
    idx: dict[str, list[int]] = defaultdict(list)
    for i, k in enumerate(group_keys):
        idx[k].append(i)
    out: list[list[float]] = [[] for _ in step_rewards]
    for members in idx.values():
        pool = np.array([r for i in members for r in step_rewards[i] if r is not None], dtype=np.float64)
        mean = pool.mean() if pool.size else 0.0
        scale = (pool.std(ddof=1) if pool.size > 1 else 0.0) + eps if scale_rewards == "group" else 1.0
        for i in members:
            norm = [0.0 if r is None else (r - mean) / scale for r in step_rewards[i]]
            scored = max(1, sum(r is not None for r in step_rewards[i]))
            out[i] = (np.cumsum(norm[::-1])[::-1] / scored).tolist() if norm else []
    return out


def token_advantages(owner: Sequence[int | None], outcome_advantage: float, step_advantages: Sequence[float]) -> list[float]:
    """Process-mode advantage of every completion token: the outcome advantage (the group-normalised
    total reward: verifier, format, manager, process) plus the process advantage of the token's step.
    Tokens after the last step (the ``<answer>`` tag) carry the outcome advantage alone, so the answer
    is credited, and a batch whose steps carry no signal still trains on the outcome."""
    return [outcome_advantage + (step_advantages[j] if j is not None and j < len(step_advantages) else 0.0) for j in owner]


def token_step_index(tokenizer, token_ids: Sequence[int], completion: str, steps: Sequence[str]) -> list[int | None]:
    """Which step each completion token belongs to (None after the last step, e.g. the answer tag).

    Steps are located in the completion text in order; a token belongs to the first step whose span
    ends after the token starts."""
    ends, pos = [], 0
    for step in steps:
        at = completion.find(step, pos)
        if at < 0:
            at = pos
        pos = at + len(step)
        ends.append(pos)
    out: list[int | None] = []
    prev = ""
    for k in range(len(token_ids)):
        text = tokenizer.decode(token_ids[: k + 1], skip_special_tokens=True)
        start = len(prev)
        prev = text
        out.append(next((j for j, e in enumerate(ends) if start < e), None))
    return out
