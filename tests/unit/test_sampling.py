"""Drawing a token: inverse transform sampling over a row's cumulative mass (``draw_categorical``),
checked against the distribution it must draw from, with zero-probability and unnormalised rows (what
nucleus filtering leaves), and the recorded log-prob against the row it came from."""

from __future__ import annotations

import torch

from tentalis_pipelines.inference.transformers_backend import draw_categorical, sample_tokens


def _frequencies(probs: torch.Tensor, draws: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    tokens = draw_categorical(probs.expand(draws, -1).contiguous(), gen)
    return torch.bincount(tokens, minlength=probs.shape[-1]).double() / draws


def test_draws_follow_the_row_and_never_a_zero_probability_token():
    """40,000 draws of (0, 0.5, 0, 0.2, 0.3, 0): every frequency within 5 standard errors of its
    probability (0.0025 for 0.5), the zeros, first and last included, never drawn."""
    p = torch.tensor([0.0, 0.5, 0.0, 0.2, 0.3, 0.0])
    f = _frequencies(p, 40_000)
    assert f[0] == f[2] == f[5] == 0
    se = (p * (1 - p) / 40_000).sqrt()
    assert ((f - p.double()).abs() <= 5 * se + 1e-12).all(), f.tolist()


def test_an_unnormalised_row_draws_from_its_normalisation():
    """Nucleus filtering zeroes the tail without renormalising: (2, 1, 1) must draw as (0.5, 0.25, 0.25),
    not as a row whose mass is cut at 1 (which would never reach the last two)."""
    f = _frequencies(torch.tensor([2.0, 1.0, 1.0]), 40_000, seed=1)
    assert abs(f[0] - 0.5) < 0.0125 and abs(f[1] - 0.25) < 0.011 and abs(f[2] - 0.25) < 0.011, f.tolist()


def test_rows_draw_from_their_own_distributions_and_one_uniform_each():
    """Three different rows in one call: row i draws token i (a one-hot row each), and the generator
    advances by one double per row (a request's stream does not depend on its vocabulary)."""
    probs = torch.eye(3)[[2, 0, 1]] * 0.7
    gen = torch.Generator().manual_seed(3)
    assert draw_categorical(probs, gen).tolist() == [2, 0, 1]
    ref = torch.Generator().manual_seed(3)
    torch.rand(3, 1, generator=ref, dtype=torch.float64)
    assert torch.equal(torch.rand(4, generator=gen), torch.rand(4, generator=ref))


def test_a_sampled_tokens_log_prob_is_its_temperature_scaled_log_softmax():
    """The log-prob recorded with a sampled token is ``log_softmax(logits / T)`` at that token, and at
    top-p < 1 a token outside the nucleus is never drawn; greedy takes the argmax with the raw log-prob."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 3.0, 0.5, 0.2]])
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        nxt, logp = sample_tokens(logits, 0.7, 0.6, gen)
        ref = torch.log_softmax(logits / 0.7, -1).gather(1, nxt[:, None]).squeeze(1)
        assert torch.allclose(logp, ref)
        assert nxt.tolist() == [0, 1]  # p(0) = 0.80 and p(1) = 0.94 at T 0.7: each nucleus of 0.6 is one token
    nxt, logp = sample_tokens(logits, 0.0, 1.0, gen)
    assert nxt.tolist() == [0, 1] and torch.allclose(logp, torch.log_softmax(logits, -1)[[0, 1], [0, 1]])
