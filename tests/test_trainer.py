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
    pack,
    prefix_micro_batches,
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


def test_shared_prefix_equals_full_sequences(tiny_model_dir):
    """A group's rows computed from one prompt pass give the same log-probs and the same LoRA gradients
    as each row computed whole."""
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = build_policy(tiny_model_dir, None, GRPOConfig(lora_r=4))
    # Make the adapter non-trivial so that its gradient on the prompt path matters.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    prompt = tok("Sara has 4 pens and buys 3 more. How many pens?", add_special_tokens=False)["input_ids"]
    comps = [tok(t, add_special_tokens=False)["input_ids"] for t in (" <answer>7</answer>", " 4 + 3 = 7", " It is 12, I think so")]
    rows = [TrainSample(prompt, c, a) for c, a in zip(comps, (1.0, 0.5, -1.5))]
    shared, full = pack(rows, tok.pad_token_id, "cpu"), _pack(rows, tok.pad_token_id, "cpu")
    assert shared.get("shared") and not full.get("shared")

    def logps_and_grads(batch):
        model.zero_grad(set_to_none=True)
        lp = completion_logps(model, batch, 0.8)
        (-(lp * batch["advantages"] * batch["completion_mask"]).sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        return (lp * batch["completion_mask"]).detach(), grads

    lp_s, g_s = logps_and_grads(shared)
    lp_f, g_f = logps_and_grads(full)
    assert torch.allclose(lp_s, lp_f, atol=1e-4)
    assert any("lora_A" in n and g.abs().sum() > 0 for n, g in g_s.items())
    for n in g_f:
        assert torch.allclose(g_s[n], g_f[n], atol=1e-4, rtol=1e-3), n


def test_prefix_micro_batches_group_rows_by_prompt():
    a, b = [1, 2, 3], [4, 5]
    rows = [TrainSample(a, [9] * n, 0.0) for n in (3, 1, 2)] + [TrainSample(b, [8], 0.0), TrainSample([7], [6, 6], 0.0)]
    mbs = prefix_micro_batches(rows, token_budget=100)
    # The group of three shares one micro-batch; the two rows with unique prompts go the ordinary way.
    assert sorted(len(m) for m in mbs) == [2, 3]
    assert [len({tuple(s.prompt_ids) for s in m}) for m in sorted(mbs, key=len)] == [2, 1]
    # A tight budget splits a group: prompt 3 + rows x longest completion must fit.
    assert max(len(m) for m in prefix_micro_batches(rows[:3], token_budget=8)) == 2
