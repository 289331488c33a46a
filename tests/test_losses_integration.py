"""Each loss_type's defining property (names and definitions as in TRL's GRPOTrainer)."""

import math

import torch

from tentalis_pipelines.training.losses import aggregate, per_token_loss
from tentalis_pipelines.training.trainer import GRPOConfig


def _grad_on_clipped_token(loss_type):
    logps = torch.tensor([[0.5, -0.1]], requires_grad=True)  # first token: ratio e^0.5 = 1.65 (clipped)
    old = torch.zeros(1, 2)
    parts = per_token_loss(loss_type, logps, old, torch.ones(1, 2), torch.ones(1, 2), epsilon=0.2, epsilon_high=0.28)
    parts.per_token.sum().backward()
    return logps.grad[0, 0].item(), parts








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














