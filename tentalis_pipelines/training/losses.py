"""GRPO-family policy losses, named and defined as in TRL's GRPOTrainer.

Two concerns, kept apart as verl does:

* the **surrogate** (``per_token_loss``): the clipped importance-weighted objective per token, chosen by
  ``loss_type`` (``grpo``/``dr_grpo``/``dapo``: PPO-style clip; ``cispo``: clipped, stop-gradient
  importance weight times log pi) and ``importance_sampling_level`` (``token``: one ratio per token;
  ``sequence``: GSPO's one ratio per sequence, the exponential of the mean token log-ratio), plus the
  k3 KL to the reference policy scaled by ``beta``;
* the **aggregation** (``aggregate``): how a micro-batch's per-token losses reduce so that summing
  micro-batches gives exactly the optimizer step's loss (``grpo``: mean of per-sequence means;
  ``dapo``/``cispo``: mean over all tokens of the step; ``dr_grpo``: sum over rows x
  ``max_completion_length``).

All tensors are [rows, completion_tokens] with a 0/1 ``mask`` (prompt and padding excluded).
``advantages`` is per token (a per-sequence advantage is broadcast), so process-supervised advantages
plug in unchanged. ``gspo`` as a ``loss_type`` is kept as a shorthand for ``grpo`` aggregation with
``importance_sampling_level="sequence"``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "cispo", "gspo")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


def k3_kl(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || ref): exp(ref - new) - (ref - new) - 1 (always >= 0)."""
    d = ref_logps - logps
    return torch.exp(d) - d - 1


@dataclass
class LossParts:
    per_token: torch.Tensor
    kl: torch.Tensor | None
    clipped: torch.Tensor  # bool per token: the ratio hit the clip range (the token gets no surrogate gradient)
    ratio: torch.Tensor  # the importance ratio each token saw (detached), for drift metrics


def importance_log_ratio(logps: torch.Tensor, old_logps: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """log(pi / pi_old) per token, or GSPO's per-sequence mean of it ([rows, 1], gradient kept), as TRL."""
    log_ratio = logps - old_logps
    if level == "token":
        return log_ratio
    if level == "sequence":
        return ((log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0))
    raise ValueError(f"importance_sampling_level must be one of {IMPORTANCE_SAMPLING_LEVELS}, got {level!r}")


def per_token_loss(
    loss_type: str,
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    beta: float = 0.0,
    ref_logps: torch.Tensor | None = None,
    importance_sampling_level: str | None = None,
) -> LossParts:
    """The surrogate loss per token (to be minimised) and its parts.

    ``importance_sampling_level`` defaults to ``sequence`` for ``loss_type='gspo'`` and ``token``
    otherwise."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"unknown loss_type {loss_type!r}; choose one of {LOSS_TYPES}")
    level = importance_sampling_level or ("sequence" if loss_type == "gspo" else "token")
    eps_low = epsilon
    eps_high = epsilon_high if epsilon_high is not None else epsilon
    ratio = torch.exp(importance_log_ratio(logps, old_logps, mask, level))
    if loss_type == "cispo":
        # CISPO: clip the importance weight itself (stop-gradient) and weight log pi by it, so clipped
        # tokens still get a gradient through log pi.
        weight = torch.clamp(ratio, max=1 + eps_high).detach()
        loss = -weight * advantages * logps
        clipped = (ratio > 1 + eps_high).expand_as(logps)
    else:
        unclipped = ratio * advantages
        clipped_obj = torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * advantages
        loss = -torch.min(unclipped, clipped_obj)
        clipped = ((ratio < 1 - eps_low) & (advantages < 0)) | ((ratio > 1 + eps_high) & (advantages > 0))
    kl = None
    if beta != 0.0:
        if ref_logps is None:
            raise ValueError("beta != 0 needs reference log-probs")
        kl = k3_kl(logps, ref_logps)
        loss = loss + beta * kl
    return LossParts(loss, kl, clipped.expand_as(logps), ratio.detach().expand_as(logps))


def shaped_guided_loss(logps: torch.Tensor, behaviour_logps: torch.Tensor, advantages: torch.Tensor, *,
                       gamma: float = 0.1) -> torch.Tensor:
    """LUFFY's policy shaping for guided (off-policy) tokens: ``-f(r) * A`` with ``r = pi / pi_b`` and
    ``f(r) = r / (r + gamma)``, unclipped. Its gradient ``gamma * r / (r + gamma)**2 * A * grad log pi``
    is largest near ``r = gamma``, so tokens the student finds unlikely but the hinted behaviour policy
    chose still get a gradient, where a plain or clipped ratio scales theirs down by ``r``."""
    if not gamma > 0:
        raise ValueError(f"gamma must be above 0, got {gamma}")
    ratio = torch.exp(logps - behaviour_logps)
    return -(ratio / (ratio + gamma)) * advantages


def aggregate(
    loss_type: str,
    per_token: torch.Tensor,
    mask: torch.Tensor,
    *,
    rows_in_step: int,
    tokens_in_step: int,
    max_completion_length: int,
) -> torch.Tensor:
    """Reduce a micro-batch's per-token loss so that summing micro-batches gives the step's loss.

    The normalisers are the optimizer step's (``rows_in_step``, ``tokens_in_step``), never the
    micro-batch's, so gradient accumulation gives the same gradient as one big batch:

    * ``grpo``/``gspo``: mean over each sequence's tokens, then mean over the step's sequences;
    * ``dapo``/``cispo``: token-level mean over all tokens of the step;
    * ``dr_grpo``: sum over tokens divided by rows x ``max_completion_length`` (a constant, so long
      and short answers are not weighted differently).
    """
    masked = per_token * mask
    if loss_type in ("grpo", "gspo"):
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1)).sum() / rows_in_step
    if loss_type in ("dapo", "cispo"):
        return masked.sum() / max(tokens_in_step, 1)
    if loss_type == "dr_grpo":
        return masked.sum() / (rows_in_step * max_completion_length)
    raise ValueError(f"unknown loss_type {loss_type!r}")
