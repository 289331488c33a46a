"""Each loss_type's defining property (names and definitions as in TRL's GRPOTrainer)."""

import math

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




# --------------------------------------------------------------------------- gradients vs hand computation
E = math.e


def _grad(loss_type, logps, old, adv, mask, *, rows, tokens, max_len=4, **kw):
    lp = torch.tensor(logps, requires_grad=True)
    parts = per_token_loss(loss_type, lp, torch.tensor(old), torch.tensor(adv), torch.tensor(mask), **kw)
    loss = aggregate(loss_type, parts.per_token, torch.tensor(mask), rows_in_step=rows, tokens_in_step=tokens,
                     max_completion_length=max_len)
    loss.backward()
    return lp.grad, parts, loss


# Row 0: ratios e^0 (inside), e^0.3 (above 1 + 0.2, A > 0: clipped), e^-0.3 (below 1 - 0.2, A > 0: not clipped).
# Row 1 (A < 0): e^0.3 (above, A < 0: not clipped), e^-0.3 (below, A < 0: clipped), padding.
LOGPS = [[0.0, 0.3, -0.3], [0.3, -0.3, 0.0]]
OLD = [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
ADV = [[2.0, 2.0, 2.0], [-1.0, -1.0, -1.0]]
MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]


def test_grpo_gradient_matches_hand_computation_clip_from_both_sides():
    g, parts, _ = _grad("grpo", LOGPS, OLD, ADV, MASK, rows=2, tokens=5, epsilon=0.2)
    # d/dlogp of -r*A is -A*r where the clip does not bind, 0 where it does; grpo divides by the row's
    # token count and by the rows in the step.
    expected = torch.tensor([
        [-2.0 * 1.0 / 3 / 2, 0.0, -2.0 * E ** -0.3 / 3 / 2],
        [1.0 * E ** 0.3 / 2 / 2, 0.0, 0.0],
    ])
    assert torch.allclose(g, expected, atol=1e-6), g
    assert parts.clipped.tolist() == [[False, True, False], [False, True, False]]


def test_epsilon_high_binds_only_above_its_own_bound():
    logps = [[0.25, 0.2]]  # ratios 1.284 (> 1.28: clipped) and 1.221 (> 1.2 but < 1.28: not clipped)
    g, parts, _ = _grad("dapo", logps, [[0.0, 0.0]], [[1.0, 1.0]], [[1.0, 1.0]], rows=1, tokens=2,
                        epsilon=0.2, epsilon_high=0.28)
    assert g[0, 0] == 0.0
    assert g[0, 1].item() == pytest.approx(-(E ** 0.2) / 2, rel=1e-6)  # token-mean over the step's 2 tokens
    assert parts.clipped.tolist() == [[True, False]]


def test_dapo_normaliser_is_the_steps_tokens_across_micro_batches():
    # One step of 5 tokens in two micro-batches: each micro-batch divides by 5, not by its own count.
    g_a, _, loss_a = _grad("dapo", [LOGPS[0]], [OLD[0]], [ADV[0]], [MASK[0]], rows=2, tokens=5, epsilon=0.2, epsilon_high=0.28)
    g_b, _, loss_b = _grad("dapo", [LOGPS[1]], [OLD[1]], [ADV[1]], [MASK[1]], rows=2, tokens=5, epsilon=0.2, epsilon_high=0.28)
    g_all, _, loss_all = _grad("dapo", LOGPS, OLD, ADV, MASK, rows=2, tokens=5, epsilon=0.2, epsilon_high=0.28)
    assert torch.allclose(torch.cat([g_a, g_b]), g_all, atol=1e-7)
    assert (loss_a + loss_b).item() == pytest.approx(loss_all.item(), rel=1e-6)
    # By hand: ratio e^0.3 = 1.35 > 1.28 with A = 2 is clipped at 1.28; e^-0.3 with A = -1 is clipped at 0.8.
    by_hand = -(2 * 1 + 2 * 1.28 + 2 * E ** -0.3 + (-1) * E ** 0.3 + (-1) * 0.8) / 5
    assert loss_all.item() == pytest.approx(by_hand, rel=1e-6)


def test_dr_grpo_gradient_uses_the_constant_normaliser():
    g, _, _ = _grad("dr_grpo", LOGPS, OLD, ADV, MASK, rows=2, tokens=5, max_len=4, epsilon=0.2)
    assert g[0, 0].item() == pytest.approx(-2.0 / (2 * 4))
    assert g[1, 0].item() == pytest.approx(E ** 0.3 / (2 * 4), rel=1e-6)


def test_cispo_gradient_is_clipped_weight_times_advantage():
    g, _, _ = _grad("cispo", LOGPS, OLD, ADV, MASK, rows=2, tokens=5, epsilon=0.2, epsilon_high=0.28)
    # loss = -sg(min(r, 1 + eps_high)) * A * logp  ->  d/dlogp = -min(r, 1.28) * A / tokens
    expected = torch.tensor([
        [-1.0 * 2 / 5, -1.28 * 2 / 5, -(E ** -0.3) * 2 / 5],
        [1.28 * 1 / 5, E ** -0.3 * 1 / 5, 0.0],
    ])
    assert torch.allclose(g, expected, atol=1e-6), g


def test_kl_term_sign_and_size():
    # logp above the reference: the k3 gradient beta * (1 - exp(ref - logp)) is positive, pulling logp down.
    lp = torch.tensor([[0.5]], requires_grad=True)
    ref = torch.tensor([[0.0]])
    parts = per_token_loss("grpo", lp, lp.detach(), torch.zeros(1, 1), torch.ones(1, 1), beta=0.1, ref_logps=ref)
    assert parts.kl.item() == pytest.approx(math.exp(-0.5) + 0.5 - 1, rel=1e-6)
    parts.per_token.sum().backward()
    assert lp.grad.item() == pytest.approx(0.1 * (1 - math.exp(-0.5)), rel=1e-6)
    assert lp.grad.item() > 0


def test_gspo_defaults_and_sequence_gradient():
    cfg = GRPOConfig(loss_type="gspo")
    assert (cfg.importance_sampling_level, cfg.epsilon, cfg.epsilon_high) == ("sequence", 3e-4, 4e-4)
    # Orthogonal to the loss type, as TRL's importance_sampling_level.
    dapo_seq = GRPOConfig(loss_type="dapo", importance_sampling_level="sequence")
    assert (dapo_seq.epsilon, dapo_seq.epsilon_high) == (3e-4, 4e-4)
    assert GRPOConfig(loss_type="grpo").importance_sampling_level == "token"
    # Inside the clip: s = exp(mean log-ratio); d(-s*A)/dlogp_t = -A * s / n, then / rows.
    d = 1e-4
    g, parts, _ = _grad("grpo", [[d, 0.0, -d / 2]], [[0.0, 0.0, 0.0]], [[1.5, 1.5, 1.5]], [[1.0, 1.0, 1.0]], rows=1, tokens=3,
                        epsilon=3e-4, epsilon_high=4e-4, importance_sampling_level="sequence")
    s = math.exp(d / 2 / 3)
    assert torch.allclose(g, torch.full((1, 3), -1.5 * s / 3), rtol=1e-5)
    assert not parts.clipped.any()
    # Outside it (mean log-ratio 1e-3 > log(1 + 4e-4)) with A > 0: no gradient at all.
    g2, parts2, _ = _grad("grpo", [[1e-3, 1e-3]], [[0.0, 0.0]], [[1.0, 1.0]], [[1.0, 1.0]], rows=1, tokens=2,
                          epsilon=3e-4, epsilon_high=4e-4, importance_sampling_level="sequence")
    assert torch.all(g2 == 0) and parts2.clipped.all()
    # A token-level ratio would not have clipped the small token of a mixed sequence; the sequence ratio does.
    g3, _, _ = _grad("grpo", [[3e-3, 0.0]], [[0.0, 0.0]], [[1.0, 1.0]], [[1.0, 1.0]], rows=1, tokens=2,
                     epsilon=3e-4, epsilon_high=4e-4, importance_sampling_level="sequence")
    assert torch.all(g3 == 0)


# --------------------------------------------------------------------------- contracts at their edges (mutmut survivors)
def _lp(*xs):
    return torch.log(torch.tensor(xs, dtype=torch.float32))


def test_importance_log_ratio_sequence_level_is_each_rows_own_masked_mean():
    from tentalis_pipelines.training.losses import importance_log_ratio

    # two rows of three tokens; row 0 has its last token masked, row 1 has one real token
    logps = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -7.0, -7.0]])
    old = torch.tensor([[-1.5, -1.0, 0.0], [-1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    tok = importance_log_ratio(logps, old, mask, "token")
    assert torch.allclose(tok, logps - old)
    seq = importance_log_ratio(logps, old, mask, "sequence")
    assert seq.shape == (2, 1)  # one ratio per row, broadcast over its tokens
    assert seq[:, 0].tolist() == pytest.approx([(0.5 + -1.0) / 2, 0.5 / 1])
    # a row with no real token gives 0 (no division by zero), not NaN
    empty = importance_log_ratio(logps[:1], old[:1], torch.zeros(1, 3), "sequence")
    assert empty.tolist() == [[0.0]]
    with pytest.raises(ValueError, match=r"importance_sampling_level must be one of .*'tokens'"):
        importance_log_ratio(logps, old, mask, "tokens")


def test_gspo_uses_the_sequence_ratio_on_every_token_of_its_row():
    logps = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -7.0, -7.0]])
    old = torch.tensor([[-1.5, -1.0, 0.0], [-1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([[1.0], [-1.0]])
    parts = per_token_loss("gspo", logps, old, adv, mask, epsilon=10.0)  # wide clip: the surrogate is -ratio * A
    r0, r1 = math.exp(-0.25), math.exp(0.5)
    assert parts.ratio[0].tolist() == pytest.approx([r0] * 3) and parts.ratio[1].tolist() == pytest.approx([r1] * 3)
    assert parts.per_token.expand(2, 3).tolist() == [pytest.approx([-r0] * 3), pytest.approx([r1] * 3)]


def test_aggregate_normalisers_at_their_edges():
    per_token = torch.tensor([[2.0, 4.0, 6.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    kw = dict(rows_in_step=2, tokens_in_step=3, max_completion_length=4)
    # grpo and gspo: each row's own token mean ((2+4)/2 = 3 and 3/1 = 3), then the mean over the step's rows
    assert aggregate("grpo", per_token, mask, **kw) == pytest.approx(3.0)
    assert aggregate("gspo", per_token, mask, **kw) == pytest.approx(3.0)
    # dapo and cispo: a token mean over the step's tokens, even when the step has one token
    one = dict(rows_in_step=1, tokens_in_step=1, max_completion_length=4)
    assert aggregate("dapo", per_token[1:], mask[1:], **one) == pytest.approx(3.0)
    assert aggregate("cispo", per_token[1:], mask[1:], **one) == pytest.approx(3.0)
    # a step with no real token (0 means unset): 0, not a division by zero
    nothing = torch.zeros(1, 3)
    assert aggregate("dapo", per_token[:1], nothing, rows_in_step=1, tokens_in_step=0, max_completion_length=4) == 0.0
    with pytest.raises(ValueError, match="unknown loss_type 'ppo'"):
        aggregate("ppo", per_token, mask, **kw)


def test_per_token_loss_default_epsilon_is_0_2_and_ratio_is_reported():
    logps, adv, mask = _lp(1.25, 1.1), torch.tensor([[1.0]]), torch.ones(1, 2)
    parts = per_token_loss("grpo", logps.view(1, 2), torch.zeros(1, 2), adv, mask)
    # ratio 1.25 > 1 + 0.2 with A > 0: clipped at 1.2; ratio 1.1 is inside the trust region
    assert parts.per_token[0].tolist() == pytest.approx([-1.2, -1.1], rel=1e-5)
    assert parts.clipped[0].tolist() == [True, False]
    assert parts.ratio[0].tolist() == pytest.approx([1.25, 1.1], rel=1e-5)
    assert parts.kl is None  # beta = 0 (unset): no KL term at all


def test_clip_flags_are_strict_at_the_bound_and_need_the_advantages_sign():
    zero = torch.zeros(1, 4)
    mask = torch.ones(1, 4)
    # ratio exactly 1 with a zero-width trust region (epsilon = 0): on the bound, not past it
    for loss_type in ("grpo", "dapo", "cispo"):
        for a in (1.0, -1.0):
            parts = per_token_loss(loss_type, zero, zero, torch.tensor([[a]]), mask, epsilon=0.0, epsilon_high=0.0)
            assert not parts.clipped.any(), (loss_type, a)
    # ratio 0.5 (below 1 - eps) is clipped only for a negative advantage; ratio 2 (above 1 + eps) only for a positive one
    low, high = _lp(0.5, 0.5, 0.5).view(1, 3), _lp(2.0, 2.0, 2.0).view(1, 3)
    m3 = torch.ones(1, 3)
    for adv, want in ((-1.0, True), (0.0, False), (0.5, False)):
        assert per_token_loss("grpo", low, torch.zeros(1, 3), torch.tensor([[adv]]), m3).clipped.all() == want, adv
    for adv, want in ((1.0, True), (0.0, False), (-0.5, False)):
        assert per_token_loss("grpo", high, torch.zeros(1, 3), torch.tensor([[adv]]), m3).clipped.all() == want, adv
    # cispo: ratio 1 with the default bound is not clipped; ratio 2 is
    assert not per_token_loss("cispo", zero, zero, torch.tensor([[1.0]]), mask).clipped.any()
    assert per_token_loss("cispo", high, torch.zeros(1, 3), torch.tensor([[1.0]]), m3).clipped.all()


def test_per_token_loss_errors_name_the_input_and_the_fix():
    zero, mask = torch.zeros(1, 2), torch.ones(1, 2)
    with pytest.raises(ValueError, match=r"unknown loss_type 'ppo'; choose one of .*grpo"):
        per_token_loss("ppo", zero, zero, torch.ones(1, 1), mask)
    with pytest.raises(ValueError, match=r"^beta != 0 needs reference log-probs$"):
        per_token_loss("grpo", zero, zero, torch.ones(1, 1), mask, beta=0.1)


def test_shaped_guided_loss_default_gamma_is_luffys_0_1():
    from tentalis_pipelines.training.losses import shaped_guided_loss

    logps, behaviour, adv = torch.log(torch.tensor([[0.5, 0.1]])), torch.zeros(1, 2), torch.tensor([[2.0]])
    # r = (0.5, 0.1): -(r / (r + 0.1)) * A
    assert shaped_guided_loss(logps, behaviour, adv).tolist()[0] == pytest.approx([-(0.5 / 0.6) * 2, -(0.1 / 0.2) * 2], rel=1e-6)
