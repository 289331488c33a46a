"""The warm start's loss on the tiny random model: it lowers the demonstrated turns' NLL and raises their
log-probability, and it sees the demonstrated tokens only (checked against a full forward pass by hand)."""

from __future__ import annotations

import torch
from transformers import AutoTokenizer

from tentalis_pipelines.training.trainer import GRPOConfig, build_policy
from tentalis_pipelines.training.warm_start import (
    WarmStartConfig,
    demonstration_samples,
    masked_nll,
    mean_nll,
    train_sft,
)

CONVERSATION = [
    {"role": "system", "content": "You are a shell agent.", "kind": "system"},
    {"role": "user", "content": "How many lines has notes.txt?", "kind": "instruction"},
    {"role": "assistant", "content": "```bash\nwc -l < notes.txt\n```", "kind": "assistant"},
    {"role": "user", "content": "3", "kind": "observation"},
    {"role": "assistant", "content": "```bash\nsubmit 3\n```", "kind": "assistant"},
]


def _policy(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok, build_policy(tiny_model_dir, None, GRPOConfig(lora_r=4, dtype="float32"))


@torch.no_grad()
def _token_logps(model, sample) -> list[float]:
    ids = torch.tensor([sample.prompt_ids + sample.completion_ids])
    logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    P = len(sample.prompt_ids)
    return [float(logp[P + i - 1, t]) for i, t in enumerate(sample.completion_ids)]


def test_the_loss_is_the_nll_of_the_demonstrated_tokens_only(tiny_model_dir):
    tok, model = _policy(tiny_model_dir)
    (sample,) = demonstration_samples(tok, CONVERSATION)
    lps = _token_logps(model, sample)
    by_hand = -sum(lp for lp, m in zip(lps, sample.loss_mask) if m)
    with torch.no_grad():
        total, n = masked_nll(model, [sample], tok.pad_token_id, torch.device("cpu"))
    assert n == sum(sample.loss_mask) < len(sample.completion_ids)
    assert abs(float(total) - by_hand) < 1e-3 * max(1.0, abs(by_hand))


def test_warm_start_lowers_the_nll_and_raises_each_demonstrated_turns_log_prob(tiny_model_dir):
    tok, model = _policy(tiny_model_dir)
    second = [*CONVERSATION[:1], {"role": "user", "content": "Print the last line of queue.txt.", "kind": "instruction"},
              {"role": "assistant", "content": "```bash\ntail -n 1 queue.txt\n```", "kind": "assistant"}]
    samples = demonstration_samples(tok, CONVERSATION, "d1") + demonstration_samples(tok, second, "d2")
    before = [_token_logps(model, s) for s in samples]
    nll0 = mean_nll(model, samples, tok.pad_token_id)
    result = train_sft(model, tok, samples, WarmStartConfig(epochs=6, learning_rate=2e-2, per_step_rows=2))
    after = [_token_logps(model, s) for s in samples]
    assert result.metrics["nll_after"] < result.metrics["nll_before"] - 0.2
    assert abs(result.metrics["nll_before"] - nll0) < 1e-4 and result.metrics["steps"] == 6
    for s, b, a in zip(samples, before, after):
        # Every demonstrated turn (a maximal run of mask 1) gains log-probability.
        runs, cur = [], []
        for i, m in enumerate(s.loss_mask):
            if m:
                cur.append(i)
            elif cur:
                runs, cur = runs + [cur], []
        runs += [cur] if cur else []
        assert len(runs) == (2 if s is samples[0] else 1)
        for r in runs:
            assert sum(a[i] for i in r) > sum(b[i] for i in r)
