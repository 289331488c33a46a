"""Attention for the batch decoder's steps on a CPU: one new token per row over the KV slab.

``torch``'s scaled-dot-product attention on a CPU runs its flash kernel for every call, and that
kernel is built for long queries: for a decode step (one query per row, transformers packs a grouped
head's queries to ``[rows, kv_heads, group, dim]``) it spent 31% of a bf16 rollout of the bench's 16 x 8
samples (1.9 ms per layer at 128 rows; the matrix products of the whole model 44%). The same step as
two batched matrix products and a softmax over ``[rows, kv_heads, group, columns]`` reads the slab once
and costs a third of that in bf16 (``bench/README.md``).

The function is registered with transformers' ``AttentionInterface`` as ``tentalis_decode`` and a model
on ``sdpa`` is switched to it by ``enable_decode_attention``; it runs only when the caller passes
``decode_bias`` (the batch decoder does on its bf16/fp16 decode steps outside block mode, reading the
whole slab: ``batch_decoder.step_reads_whole_slab``): every other call (prefill, fp32 steps, agent
episodes' block mode, the trainer's forward, Hugging Face's ``generate``) is handed to transformers' own
``sdpa_attention_forward`` with the same arguments, so nothing but those steps changes.

Precision: the scores ``q @ k^T`` come out of the product in the model's dtype and the softmax runs in
float32, transformers' ``eager`` attention's arithmetic; in float32 the outputs match ``sdpa`` to float
rounding, in bf16 the scores are rounded to bf16 before the softmax (``sdpa``'s flash kernel keeps them
in float32). The sampled tokens' log-probs are the ones the sampler drew from in either case.
"""

from __future__ import annotations

import torch

NAME = "tentalis_decode"


def decode_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     decode_bias: torch.Tensor | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract (``query`` ``[rows, heads, q, dim]``, ``key``/``value``
    ``[rows, kv_heads, columns, dim]``; returns ``[rows, q, heads, dim]`` and no weights).

    With ``decode_bias`` (float32 ``[rows, 1, 1, columns]``: 0 where a row attends, ``-inf`` where it
    does not, the whole mask, so ``attention_mask`` is not read) and one query per row it computes the
    attention itself; otherwise it is ``sdpa_attention_forward``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if decode_bias is None or query.shape[2] != 1 or dropout:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    rows, heads, _, dim = query.shape
    kv_heads, columns = key.shape[1], key.shape[2]
    if decode_bias.shape != (rows, 1, 1, columns):
        raise ValueError(f"decode_bias has shape {tuple(decode_bias.shape)}, the step needs ({rows}, 1, 1, {columns}): "
                         "one bias per row and key column")
    scale = dim ** -0.5 if scaling is None else scaling
    q = query.reshape(rows, kv_heads, heads // kv_heads, dim)  # a kv head's group of query heads, no repeat of K/V
    scores = torch.matmul(q, key.transpose(-1, -2)).float().mul_(scale).add_(decode_bias)
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(probs, value)  # [rows, kv_heads, group, dim]
    return out.reshape(rows, heads, 1, dim).transpose(1, 2), None


def decode_bias(mask: torch.Tensor, start: int = 0, columns: int | None = None) -> torch.Tensor:
    """The additive bias ``decode_attention`` takes, ``[rows, 1, 1, columns]``, from a ``[rows, width]``
    0/1 attention mask over the key columns ``[start, start + width)``; every other column is masked
    (``columns`` defaults to ``start + width``)."""
    rows, width = mask.shape
    columns = start + width if columns is None else columns
    if start < 0 or start + width > columns:
        raise ValueError(f"the mask's {width} columns from {start} do not fit in {columns} key columns")
    bias = torch.full((rows, 1, 1, columns), float("-inf"), dtype=torch.float32, device=mask.device)
    bias[:, 0, 0, start : start + width].masked_fill_(mask != 0, 0.0)
    return bias


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, decode_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)  # every call it hands on is sdpa's: so is its mask


def enable_decode_attention(model: torch.nn.Module) -> bool:
    """Switch a CPU model on ``sdpa`` to ``decode_attention`` (idempotent); whether it now uses it. A model
    on another implementation (eager, flash) or another device is left alone: the decoder then passes
    no ``decode_bias`` and its steps run the model's own attention."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) not in ("sdpa", NAME):
        return False
    try:
        device = next(model.parameters()).device
    except StopIteration:
        return False
    if device.type != "cpu":
        return False
    if config._attn_implementation != NAME:
        _register()
        config._attn_implementation = NAME
    return True
