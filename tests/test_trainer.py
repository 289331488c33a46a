"""The trainer learns in the right direction (not just 'the loss is a number')."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from tentalis_pipelines.training.trainer import (
    GRPOConfig,
    TrainSample,
    _pack,
    build_policy,
    completion_logps,
    train_grpo,
)


def _seq_logp(model, tok, prompt_ids, completion_ids) -> float:
    batch = _pack([TrainSample(prompt_ids, completion_ids, 0.0)], tok.pad_token_id, "cpu")
    with torch.inference_mode():
        return float(completion_logps(model, batch, 1.0).sum())


@pytest.mark.parametrize("reward_a,reward_b", [(1.0, 0.0), (0.0, 1.0)])
def test_rewarded_completion_gains_probability(tiny_model_dir, reward_a, reward_b):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = build_policy(tiny_model_dir, None, GRPOConfig())
    prompt = tok("What is 2 + 3? Answer:", add_special_tokens=False)["input_ids"]
    a = tok(" <answer>5</answer>", add_special_tokens=False)["input_ids"]
    b = tok(" I think it is 7", add_special_tokens=False)["input_ids"]
    # One group: two samples of each completion, advantages from the group-normalised rewards.
    from tentalis_pipelines.rewards.advantages import group_advantages

    rewards = [reward_a, reward_a, reward_b, reward_b]
    adv, _ = group_advantages(["g"] * 4, rewards)
    samples = [TrainSample(prompt, c, x) for c, x in zip([a, a, b, b], adv)]
    before = _seq_logp(model, tok, prompt, a) - _seq_logp(model, tok, prompt, b)
    cfg = GRPOConfig(learning_rate=5e-3, beta=0.04, temperature=1.0, per_step_rows=4)
    for _ in range(4):
        train_grpo(model, tok, samples, cfg)
    after = _seq_logp(model, tok, prompt, a) - _seq_logp(model, tok, prompt, b)
    if reward_a > reward_b:
        assert after > before + 0.5, (before, after)
    else:
        assert after < before, (before, after)
