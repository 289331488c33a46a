"""Each loss_type's defining property (names and definitions as in TRL's GRPOTrainer)."""

import pytest
import torch

from tentalis_pipelines.rewards.advantages import group_advantages
from tentalis_pipelines.rewards.scoring import overlong_penalty
from tentalis_pipelines.training.losses import aggregate, k3_kl, per_token_loss
from tentalis_pipelines.training.trainer import GRPOConfig


def test_dr_grpo_advantages_are_not_std_scaled_and_normaliser_is_constant():
    rewards = [3.0, 1.0, 0.0, 0.0]
    scaled, _ = group_advantages(["g"] * 4, rewards, scale_rewards="group")
    raw, _ = group_advantages(["g"] * 4, rewards, scale_rewards="none")
    assert raw == [2.0, 0.0, -1.0, -1.0] and scaled != raw
    # Dr. GRPO divides by rows x max_completion_length: a short and a long sequence with the same
    # per-token loss contribute in proportion to their length, unlike grpo's per-sequence mean.
    per_token = torch.ones(2, 4)
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.float32)
    assert aggregate("dr_grpo", per_token, mask, rows_in_step=2, tokens_in_step=5, max_completion_length=8) == pytest.approx(5 / 16)
    assert aggregate("grpo", per_token, mask, rows_in_step=2, tokens_in_step=5, max_completion_length=8) == pytest.approx(1.0)


def test_dapo_clip_higher_token_mean_and_dynamic_sampling_flag():
    cfg = GRPOConfig(loss_type="dapo")
    assert (cfg.epsilon, cfg.epsilon_high) == (0.2, 0.28)
    per_token = torch.tensor([[1.0, 1.0, 1.0, 1.0], [3.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.float32)
    assert aggregate("dapo", per_token, mask, rows_in_step=2, tokens_in_step=5, max_completion_length=8) == pytest.approx(7 / 5)
    _, signal = group_advantages(["a", "a", "b", "b"], [1.0, 1.0, 0.0, 1.0])
    assert signal == [False, False, True, True]  # the all-equal group is dropped
    # clip-higher: a ratio of 1.25 on a positive advantage is inside DAPO's range but clipped by GRPO's.
    logps, old = torch.log(torch.tensor([[1.25]])), torch.zeros(1, 1)
    adv, m = torch.ones(1, 1), torch.ones(1, 1)
    assert not per_token_loss("dapo", logps, old, adv, m, epsilon=0.2, epsilon_high=0.28).clipped.any()
    assert per_token_loss("grpo", logps, old, adv, m, epsilon=0.2).clipped.all()


def test_dapo_overlong_shaping():
    assert overlong_penalty(90, 128, 32) == 0.0
    assert overlong_penalty(112, 128, 32) == pytest.approx(-0.5)
    assert overlong_penalty(128, 128, 32) == -1.0


def _grad_on_clipped_token(loss_type):
    logps = torch.tensor([[0.5, -0.1]], requires_grad=True)  # first token: ratio e^0.5 = 1.65 (clipped)
    old = torch.zeros(1, 2)
    parts = per_token_loss(loss_type, logps, old, torch.ones(1, 2), torch.ones(1, 2), epsilon=0.2, epsilon_high=0.28)
    parts.per_token.sum().backward()
    return logps.grad[0, 0].item(), parts


def test_cispo_keeps_a_gradient_on_clipped_tokens_and_grpo_does_not():
    g_cispo, parts = _grad_on_clipped_token("cispo")
    g_grpo, _ = _grad_on_clipped_token("grpo")
    assert g_grpo == 0.0
    assert g_cispo == pytest.approx(-1.28)  # -clip(ratio, max=1+eps_high) * A
    assert parts.clipped[0, 0]


def test_gspo_uses_one_sequence_level_ratio():
    logps = torch.tensor([[0.3, -0.1, 0.1, 0.0]], requires_grad=True)
    old = torch.zeros(1, 4)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    adv = torch.full((1, 4), 0.5)
    parts = per_token_loss("gspo", logps, old, adv, mask, epsilon=3e-4, epsilon_high=4e-4)
    ratio = torch.exp(torch.tensor(0.1))  # exp(mean of the masked log-ratios)
    # every token sees the same (clipped) ratio value
    vals = parts.per_token[0, :3].detach()
    assert torch.allclose(vals, vals[0].expand(3)) and parts.clipped[0, :3].all()
    assert ratio > 1 + 4e-4


def test_k3_is_nonnegative_and_zero_at_equality():
    a = torch.randn(10)
    assert torch.all(k3_kl(a, a) == 0)
    assert torch.all(k3_kl(a, a + torch.randn(10)) >= 0)


def test_beta_zero_computes_no_reference_pass(tiny_model_dir):
    from transformers import AutoTokenizer

    from tentalis_pipelines.training.trainer import TrainSample, build_policy, train_grpo

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    samples = [TrainSample([1, 2, 3], [4, 5], 1.0), TrainSample([1, 2, 3], [6, 7], -1.0)]
    for beta, expected_calls in ((0.0, 0), (0.04, 1)):
        model = build_policy(tiny_model_dir, None, GRPOConfig())
        calls = []
        original = model.disable_adapter

        def counting(*a, _orig=original, _calls=calls, **k):
            _calls.append(1)
            return _orig(*a, **k)

        model.disable_adapter = counting
        res = train_grpo(model, tok, samples, GRPOConfig(beta=beta, per_step_rows=2))
        assert len(calls) == expected_calls
        assert (res.metrics["kl"] == 0.0) if beta == 0.0 else True
