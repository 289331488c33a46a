"""The warm start: a supervised (cross-entropy) loss on demonstrated assistant turns, on a LoRA adapter.

RL cannot start where every group fails: GRPO's advantages are all zero. A warm start on verified
demonstrations (``demonstrations.py``) gets a small policy off zero first (the recipe of Guide-GRPO,
LUFFY, BREAD: demonstrations before or between RL cycles), and the checkpoint it writes is gated like
any other.

**Samples.** A demonstration's conversation (the verifying episode's messages) becomes a training
sample exactly as an episode the policy ran would (``env_batches.episode_rollout_rows``): each
assistant turn's prompt is rendered the way ``envs.policies.ChatPolicy`` renders it (the chat template
for the first turn; for each later turn, the previous turn's context extended by the template's
tokens for what came after, never a re-rendering), the turn's tokens are its text as the policy would
have sampled it followed by the end-of-turn token the template closes an assistant message with, and
``envs.runner.episode_to_turns`` then ``training.multiturn.build_segments`` make the sample and its
assistant mask. The loss mask is 1 on the demonstrated assistant turns' tokens only: the system
prompt, the task, every observation and the template's tokens are context (0).

**Loss.** The mean negative log-likelihood of the masked tokens at temperature 1 (one mean over every
trained token of an optimizer step), AdamW on the adapter, ``epochs`` passes over the demonstrations.
No optimizer state is saved with the checkpoint: the RL cycle after a warm start starts its AdamW
afresh (its moments would mean nothing for a policy-gradient loss).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from tentalis_pipelines.config_fields import config_field
from tentalis_pipelines.envs.base import AssistantTurn, Episode, Verdict
from tentalis_pipelines.envs.runner import episode_to_turns, is_policy_turn, model_messages
from tentalis_pipelines.hardware import autocast
from tentalis_pipelines.training import multiturn
from tentalis_pipelines.training.trainer import (
    TrainResult,
    TrainSample,
    completion_logps,
    micro_batches,
    pack_samples,
)

ALGORITHM = "sft_warm_start"


@dataclass
class WarmStartConfig:
    """The warm start's own settings (the LoRA, device and dtype come from the trainer's GRPOConfig)."""

    epochs: int = config_field(3, "passes over the demonstrations")
    learning_rate: float = config_field(1e-4, "AdamW learning rate of the LoRA parameters")
    per_step_rows: int = config_field(8, "demonstrations per optimizer step")
    micro_batch_tokens: int = config_field(4096, "token budget of one forward/backward micro-batch")
    max_grad_norm: float = config_field(1.0, "gradient clipping norm")
    seed: int = config_field(0, "shuffling of the demonstrations")

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"epochs must be at least 1 (got {self.epochs})")
        if self.per_step_rows < 1:
            raise ValueError(f"per_step_rows must be at least 1 (got {self.per_step_rows})")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be positive (got {self.learning_rate})")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------- samples
def end_of_turn_ids(tokenizer: Any) -> list[int]:
    """The tokens a policy samples to end an assistant turn: the tokenizer's EOS (ChatML's ``<|im_end|>``)."""
    return [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]


class TemplateContext:
    """Prompt token ids per assistant turn, rendered as ``ChatPolicy.prompt_ids`` renders them: the
    template's rendering for the first turn; for a later one the previous context (prompt + the turn's
    tokens) extended by the tokens of the text the template adds after it, when the template's
    rendering starts with that context's text (else the conversation is rendered afresh, and
    ``build_segments`` starts a new segment there, as for a policy)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.context: list[int] | None = None
        self.text = ""

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        full = self.tokenizer.apply_chat_template(model_messages(messages), add_generation_prompt=True, tokenize=False)
        if self.context is not None and full.startswith(self.text):
            return self.context + list(self.tokenizer(full[len(self.text):], add_special_tokens=False)["input_ids"])
        return list(self.tokenizer(full, add_special_tokens=False)["input_ids"])

    def remember(self, context: list[int]) -> None:
        self.context = list(context)
        self.text = self.tokenizer.decode(self.context, skip_special_tokens=False)


def demonstration_episode(tokenizer: Any, messages: list[dict[str, Any]], environment: str = "demo",
                          task_id: str = "demo") -> Episode:
    """The demonstration as an :class:`Episode` whose assistant turns carry the token ids a policy would
    have seen and sampled (module doc), ready for ``episode_to_turns``."""
    ctx = TemplateContext(tokenizer)
    eot = end_of_turn_ids(tokenizer)
    turns, seen = [], []
    for m in messages:
        if is_policy_turn(m):
            prompt = ctx.prompt_ids(seen)
            ids = list(tokenizer(str(m["content"]), add_special_tokens=False)["input_ids"]) + eot
            turns.append(AssistantTurn(index=len(turns), text=str(m["content"]), token_ids=ids, prompt_token_ids=prompt))
            ctx.remember(prompt + ids)
        seen.append(m)
    return Episode(environment=environment, task_id=task_id, messages=[dict(m) for m in messages], turns=turns,
                   verdict=Verdict(True, 1.0, "demonstration"), end_reason="submitted", reward=1.0, max_turns=len(turns))


def demonstration_samples(tokenizer: Any, messages: list[dict[str, Any]], demonstration_id: str = "demo") -> list[TrainSample]:
    """The warm start's samples of one demonstration (usually one; one per segment), advantage 1 and the
    loss mask 1 on the demonstrated assistant turns only."""
    ep = demonstration_episode(tokenizer, messages, task_id=demonstration_id)
    turns = episode_to_turns(ep, session_id=demonstration_id, policy_version="demonstration", temperature=1.0)
    out = []
    for seg in multiturn.build_segments(demonstration_id, turns):
        out.append(TrainSample(seg.prompt_ids, seg.completion_ids, 1.0, loss_mask=seg.assistant_mask, temperature=1.0))
    return out


# --------------------------------------------------------------------------- loss and training
def masked_nll(model, samples: list[TrainSample], pad_id: int, device) -> tuple[torch.Tensor, int]:
    """(sum of -log p over the masked completion tokens of ``samples``, how many tokens that is)."""
    batch = pack_samples(samples, pad_id, device, 1.0)
    # As the GRPO trainer does: bf16/fp16 base weights compute under autocast, the LoRA weights and the
    # loss maths stay fp32.
    base_dtype = next((p.dtype for p in model.parameters() if not p.requires_grad), torch.float32)
    with autocast(torch.device(device), base_dtype):
        logps = completion_logps(model, batch, temperature=1.0)
    mask = batch["loss_mask"]
    return -(logps * mask).sum(), int(mask.sum().item())


@torch.no_grad()
def mean_nll(model, samples: list[TrainSample], pad_id: int, token_budget: int = 4096) -> float:
    """Mean negative log-likelihood per demonstrated token (the warm start's loss, without a gradient)."""
    device = next(model.parameters()).device
    total, n = 0.0, 0
    for mb in micro_batches(samples, token_budget):
        s, k = masked_nll(model, mb, pad_id, device)
        total, n = total + float(s), n + k
    return total / max(n, 1)


def train_sft(model, tokenizer, samples: list[TrainSample], config: WarmStartConfig, on_step=None) -> TrainResult:
    """``config.epochs`` passes of AdamW on the mean NLL of the demonstrated tokens (module doc).
    Metrics: the NLL per demonstrated token before and after, the steps and tokens."""
    if not samples:
        raise ValueError("no demonstration samples to train on")
    if not any(any(s.loss_mask or []) for s in samples):
        raise ValueError("the demonstrations have no assistant token to train on")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameter (a LoRA adapter is expected)")
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=0.0)
    rng = random.Random(config.seed)
    model.eval()  # LoRA dropout off: the same pass the policy samples with
    before = mean_nll(model, samples, pad_id, config.micro_batch_tokens)
    history, step, t0 = [], 0, time.perf_counter()
    tokens = sum(sum(s.loss_mask or []) for s in samples)
    for epoch in range(config.epochs):
        order = list(samples)
        rng.shuffle(order)
        for k in range(0, len(order), config.per_step_rows):
            rows = order[k:k + config.per_step_rows]
            n_tokens = sum(sum(s.loss_mask or []) for s in rows)
            if n_tokens == 0:
                continue
            optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for mb in micro_batches(rows, config.micro_batch_tokens):
                s, _ = masked_nll(model, mb, pad_id, device)
                (s / n_tokens).backward()  # one mean over the step's tokens, whatever the micro-batches
                total += float(s.detach())
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm))
            optimizer.step()
            step += 1
            rec = {"step": step, "epoch": epoch, "loss": total / n_tokens, "grad_norm": grad_norm, "tokens": n_tokens}
            history.append(rec)
            if on_step is not None:
                on_step(rec)
    after = mean_nll(model, samples, pad_id, config.micro_batch_tokens)
    metrics = {"nll_before": before, "nll_after": after, "steps": step, "demonstrated_tokens": tokens, "samples": len(samples),
               "epochs": config.epochs, "seconds": round(time.perf_counter() - t0, 2),
               "perplexity_after": math.exp(min(after, 50.0))}
    return TrainResult(metrics, history, None)

