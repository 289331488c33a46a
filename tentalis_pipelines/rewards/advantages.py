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
