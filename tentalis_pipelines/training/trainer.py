"""A GRPO-family trainer on a LoRA adapter (peft), on per-completion-token log-probs.

* log-probs are computed only for completion tokens (``logits_to_keep``), at the sampling temperature;
* the reference policy for the KL is the base model: the adapter disabled (no second model in memory),
  and no reference pass at all when ``beta == 0``;
* old log-probs are the detached current ones when ``num_iterations == 1`` (ratio 1, as in TRL), and are
  computed once before the first update otherwise;
* rows are split into optimizer steps of ``per_step_rows``; each step is cut into micro-batches by a
  token budget, with gradient accumulation.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from tentalis_pipelines.training.losses import LOSS_TYPES, aggregate, per_token_loss

DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class GRPOConfig:
    """Training settings, named as in TRL's GRPOConfig where the idea is the same."""

    loss_type: str = "grpo"
    beta: float = 0.04
    epsilon: float = 0.2
    epsilon_high: float | None = None
    num_iterations: int = 1
    learning_rate: float = 1e-4
    lr_scheduler_type: str = "constant"  # constant | linear | cosine
    warmup_ratio: float = 0.0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    per_step_rows: int = 64
    micro_batch_tokens: int = 4096
    # Rows that share a prompt (a group's samples) run the prompt once and branch from its KV cache:
    # the prompt (system message + worked example) is most of each row's tokens.
    share_prompt_prefix: bool = True
    temperature: float = 0.8
    max_completion_length: int = 128
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: tuple[str, ...] = DEFAULT_LORA_TARGETS
    seed: int = 0

    def __post_init__(self):
        # DAPO's clip-higher: a wider upper clip keeps low-probability tokens explorable.
        if self.loss_type == "dapo" and self.epsilon_high is None:
            self.epsilon_high = 0.28
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {self.loss_type!r}")
        if self.num_iterations < 1:
            raise ValueError("num_iterations must be >= 1")
        if self.lr_scheduler_type not in ("constant", "linear", "cosine"):
            raise ValueError("lr_scheduler_type must be constant, linear or cosine")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["lora_target_modules"] = list(self.lora_target_modules)
        return d


@dataclass
class TrainSample:
    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float
    token_advantages: list[float] | None = None  # process supervision: one advantage per completion token
    old_logps: list[float] | None = None


@dataclass
class TrainResult:
    metrics: dict
    history: list[dict] = field(default_factory=list)


def build_policy(model_dir: Path, parent_adapter: Path | None, config: GRPOConfig):
    """Base model with a trainable LoRA adapter: a fresh one, or the parent checkpoint's to continue."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if parent_adapter is not None:
        model = PeftModel.from_pretrained(base, str(parent_adapter), is_trainable=True)
    else:
        lora = LoraConfig(
            r=config.lora_r,
            lora_alpha=config.lora_alpha,
            lora_dropout=config.lora_dropout,
            target_modules=list(config.lora_target_modules),
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(base, lora)
    return model


def _pack(samples: list[TrainSample], pad_id: int, device) -> dict[str, torch.Tensor]:
    """Left-pad prompts and right-pad completions so every completion occupies the last C positions."""
    P = max(len(s.prompt_ids) for s in samples)
    C = max(len(s.completion_ids) for s in samples)
    ids, attn, cmask, adv = [], [], [], []
    for s in samples:
        p, c = s.prompt_ids, s.completion_ids
        ids.append([pad_id] * (P - len(p)) + p + c + [pad_id] * (C - len(c)))
        attn.append([0] * (P - len(p)) + [1] * (len(p) + len(c)) + [0] * (C - len(c)))
        cmask.append([1] * len(c) + [0] * (C - len(c)))
        ta = s.token_advantages if s.token_advantages is not None else [s.advantage] * len(c)
        adv.append(list(ta) + [0.0] * (C - len(c)))
    attn_t = torch.tensor(attn, device=device)
    return {
        "input_ids": torch.tensor(ids, device=device),
        "attention_mask": attn_t,
        "position_ids": (attn_t.cumsum(-1) - 1).clamp(min=0),
        "completion_mask": torch.tensor(cmask, dtype=torch.float32, device=device),
        "advantages": torch.tensor(adv, dtype=torch.float32, device=device),
        "completion_len": C,
    }


def _pack_shared(samples: list[TrainSample], pad_id: int, device) -> dict[str, torch.Tensor]:
    """Rows with one common prompt: the prompt once, completions right-padded."""
    C = max(len(s.completion_ids) for s in samples)
    comp, cmask, adv = [], [], []
    for s in samples:
        c = s.completion_ids
        comp.append(list(c) + [pad_id] * (C - len(c)))
        cmask.append([1] * len(c) + [0] * (C - len(c)))
        ta = s.token_advantages if s.token_advantages is not None else [s.advantage] * len(c)
        adv.append(list(ta) + [0.0] * (C - len(c)))
    return {
        "shared": True,
        "prompt_ids": torch.tensor([samples[0].prompt_ids], device=device),
        "completion_ids": torch.tensor(comp, device=device),
        "completion_mask": torch.tensor(cmask, dtype=torch.float32, device=device),
        "advantages": torch.tensor(adv, dtype=torch.float32, device=device),
        "completion_len": C,
    }


def pack(samples: list[TrainSample], pad_id: int, device) -> dict[str, torch.Tensor]:
    """A micro-batch as tensors: the shared-prefix layout when every row has the same prompt."""
    first = samples[0].prompt_ids
    if len(samples) > 1 and all(s.prompt_ids == first for s in samples):
        return _pack_shared(samples, pad_id, device)
    return _pack(samples, pad_id, device)


def _shared_prefix_logps(model, batch: dict[str, torch.Tensor], temperature: float) -> torch.Tensor:
    """One prompt pass, its KV cache repeated per row, then the completions on top. Gradients flow
    through the repeated cache into the prompt pass, so this equals the full-sequence computation."""
    prompt, comp, cmask = batch["prompt_ids"], batch["completion_ids"], batch["completion_mask"]
    rows, C = comp.shape
    P = prompt.shape[1]
    out = model(input_ids=prompt, use_cache=True, logits_to_keep=1)
    logits = out.logits[:, -1:, :].expand(rows, 1, -1)  # predicts each row's first completion token
    if C > 1:
        cache = out.past_key_values
        cache.batch_repeat_interleave(rows)
        fed = comp[:, :-1]
        attention = torch.cat([torch.ones(rows, P, dtype=torch.long, device=comp.device), cmask[:, :-1].long()], dim=1)
        positions = torch.arange(P, P + C - 1, device=comp.device).expand(rows, -1)
        rest = model(input_ids=fed, attention_mask=attention, position_ids=positions, past_key_values=cache, use_cache=True).logits
        logits = torch.cat([logits, rest], dim=1)
    logits = logits.float() / max(temperature, 1e-6)
    return torch.log_softmax(logits, dim=-1).gather(-1, comp.unsqueeze(-1)).squeeze(-1)


def completion_logps(model, batch: dict[str, torch.Tensor], temperature: float) -> torch.Tensor:
    """Per-token log-probs of the completion tokens, [rows, C]."""
    if batch.get("shared"):
        return _shared_prefix_logps(model, batch, temperature)
    C = batch["completion_len"]
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        logits_to_keep=C + 1,
        use_cache=False,
    )
    logits = out.logits[:, :-1, :].float() / max(temperature, 1e-6)
    targets = batch["input_ids"][:, -C:]
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def prefix_micro_batches(samples: list[TrainSample], token_budget: int) -> list[list[TrainSample]]:
    """One micro-batch per prompt (its group's rows), split when prompt + rows x longest completion
    exceeds ``token_budget``; rows whose prompt is unique fall back to ``micro_batches``."""
    by_prompt: dict[tuple[int, ...], list[TrainSample]] = {}
    for s in samples:
        by_prompt.setdefault(tuple(s.prompt_ids), []).append(s)
    out, singles = [], []
    for prompt, rows in by_prompt.items():
        if len(rows) == 1:
            singles.extend(rows)
            continue
        rows = sorted(rows, key=lambda s: len(s.completion_ids))
        cur, longest = [], 0
        for s in rows:
            c = len(s.completion_ids)
            if cur and len(prompt) + max(longest, c) * (len(cur) + 1) > token_budget:
                out.append(cur)
                cur, longest = [], 0
            cur.append(s)
            longest = max(longest, c)
        out.append(cur)
    return out + (micro_batches(singles, token_budget) if singles else [])


def micro_batches(samples: list[TrainSample], token_budget: int) -> list[list[TrainSample]]:
    """Group rows (sorted by length) so that rows x padded length stays within ``token_budget``."""
    order = sorted(samples, key=lambda s: len(s.prompt_ids) + len(s.completion_ids))
    out, cur, longest = [], [], 0
    for s in order:
        length = len(s.prompt_ids) + len(s.completion_ids)
        if cur and max(longest, length) * (len(cur) + 1) > token_budget:
            out.append(cur)
            cur, longest = [], 0
        cur.append(s)
        longest = max(longest, length)
    if cur:
        out.append(cur)
    return out


def _fixed_logps(model, mb: list[TrainSample], config: GRPOConfig, pad_id: int, device) -> dict:
    """Reference log-probs (adapter disabled; skipped when beta == 0) and old log-probs (only when
    num_iterations > 1: from sampling if the backend kept them, else one forward pass now)."""
    out = {"ref": None, "old": None}
    if config.beta == 0.0 and config.num_iterations == 1:
        return out
    batch = pack(mb, pad_id, device)
    with torch.inference_mode():
        if config.beta != 0.0:
            with model.disable_adapter():
                out["ref"] = completion_logps(model, batch, config.temperature).clone()
        if config.num_iterations > 1:
            if all(s.old_logps is not None for s in mb):
                C = batch["completion_len"]
                out["old"] = torch.tensor([s.old_logps + [0.0] * (C - len(s.old_logps)) for s in mb], device=device)
            else:
                out["old"] = completion_logps(model, batch, config.temperature).clone()
    return out


def _lr_lambda(config: GRPOConfig, total_steps: int):
    warmup = int(config.warmup_ratio * total_steps)

    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if config.lr_scheduler_type == "constant":
            return 1.0
        progress = (step - warmup) / max(1, total_steps - warmup)
        if config.lr_scheduler_type == "linear":
            return max(0.0, 1.0 - progress)
        return 0.5 * (1 + math.cos(math.pi * progress))

    return f


def train_grpo(model, tokenizer, samples: list[TrainSample], config: GRPOConfig, *, on_step=None) -> TrainResult:
    """Run ``num_iterations`` passes of GRPO-family updates over ``samples`` (in place on ``model``)."""
    if not samples:
        raise ValueError("no training samples: every group had equal rewards or the batch was empty")
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    t0 = time.perf_counter()

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)
    steps_per_iter = math.ceil(len(samples) / config.per_step_rows)
    total_steps = steps_per_iter * config.num_iterations
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(config, total_steps))
    # Fixed micro-batch split per step across iterations, so cached old/ref log-probs line up.
    order = list(range(len(samples)))
    rng.shuffle(order)
    steps = [[samples[i] for i in order[k : k + config.per_step_rows]] for k in range(0, len(order), config.per_step_rows)]
    split = prefix_micro_batches if config.share_prompt_prefix else micro_batches
    plan = [split(step, config.micro_batch_tokens) for step in steps]
    # Reference and old log-probs do not change during this call: one no-grad pass per micro-batch.
    fixed = {(si, mi): _fixed_logps(model, mb, config, pad_id, device) for si, mbs in enumerate(plan) for mi, mb in enumerate(mbs)}

    history = []
    model.train()
    for it in range(config.num_iterations):
        for si, (step_rows, mbs) in enumerate(zip(steps, plan)):
            tokens_in_step = sum(len(s.completion_ids) for s in step_rows)
            totals = {"loss": 0.0, "kl": 0.0, "clipped": 0.0, "tokens": 0.0}
            optimizer.zero_grad(set_to_none=True)
            for mi, mb in enumerate(mbs):
                batch = pack(mb, pad_id, device)
                ex = fixed[(si, mi)]
                logps = completion_logps(model, batch, config.temperature)
                old = ex["old"] if ex["old"] is not None else logps.detach()
                mask = batch["completion_mask"]
                parts = per_token_loss(
                    config.loss_type, logps, old, batch["advantages"], mask,
                    epsilon=config.epsilon, epsilon_high=config.epsilon_high, beta=config.beta, ref_logps=ex["ref"],
                )
                loss = aggregate(
                    config.loss_type, parts.per_token, mask, rows_in_step=len(step_rows),
                    tokens_in_step=tokens_in_step, max_completion_length=config.max_completion_length,
                )
                loss.backward()
                n_tok = float(mask.sum())
                totals["loss"] += float(loss.detach())
                totals["tokens"] += n_tok
                totals["clipped"] += float((parts.clipped.float() * mask).sum())
                if parts.kl is not None:
                    totals["kl"] += float((parts.kl.detach() * mask).sum())
            grad_norm = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
            optimizer.step()
            scheduler.step()
            rec = {
                "iteration": it,
                "step": len(history),
                "loss": totals["loss"],
                "kl": totals["kl"] / max(totals["tokens"], 1),
                "clip_fraction": totals["clipped"] / max(totals["tokens"], 1),
                "grad_norm": float(grad_norm),
                "lr": scheduler.get_last_lr()[0],
                "rows": len(step_rows),
            }
            history.append(rec)
            if on_step:
                on_step(rec)
    model.eval()
    metrics = {
        "loss": sum(h["loss"] for h in history) / len(history),
        "kl": sum(h["kl"] for h in history) / len(history),
        "clip_fraction": sum(h["clip_fraction"] for h in history) / len(history),
        "grad_norm": history[-1]["grad_norm"],
        "optimizer_steps": len(history),
        "samples": len(samples),
        "completion_tokens": sum(len(s.completion_ids) for s in samples),
        "seconds": time.perf_counter() - t0,
    }
    return TrainResult(metrics, history)
