"""The transformers backend's own decode loop: shared-prefix samples, early exit of finished rows,
sampled-token log-probs."""

from __future__ import annotations

import pytest
import torch

from tentalis_pipelines.inference.base import SamplingParams
from tentalis_pipelines.inference.transformers_backend import TransformersBackend, load_policy


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    model, tok = load_policy(tiny_model_dir)
    return TransformersBackend(tiny_model_dir, model=model, tokenizer=tok)


PROMPTS = ["Tom has 3 apples and gets 4 more. How many?", "What is 12 - 5?", "A much longer prompt " * 6]


def test_greedy_matches_hf_generate(backend):
    """Left padding, shared prefill and dropping rows must not change what greedy decoding produces."""
    tok, model = backend.tokenizer, backend.model
    gens = backend.generate(PROMPTS, SamplingParams(num_generations=1, max_new_tokens=12, temperature=0.0, stop=()))
    for prompt, (g,) in zip(PROMPTS, gens):
        ids = tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(g.token_ids), do_sample=False,
                             pad_token_id=tok.pad_token_id)
        assert out[0, ids.shape[1]:].tolist() == g.token_ids


def test_samples_per_prompt_logprobs_and_seed(backend):
    params = SamplingParams(num_generations=5, max_new_tokens=10, temperature=0.9, seed=3, stop=())
    gens = backend.generate(PROMPTS, params)
    assert [len(g) for g in gens] == [5, 5, 5]
    assert len({tuple(g.token_ids) for g in gens[0]}) > 1, "samples of one prompt should differ"
    for group in gens:
        for g in group:
            assert g.finish_reason in ("stop", "length")
            assert len(g.logprobs) == len(g.token_ids) and all(lp <= 0 for lp in g.logprobs)
    again = backend.generate(PROMPTS, params)
    assert [[g.token_ids for g in grp] for grp in again] == [[g.token_ids for g in grp] for grp in gens]


def test_sampled_logprobs_equal_a_recomputation(backend):
    """The log-probs returned with a sample are the policy's at the sampling temperature: the trainer may
    use them as the old policy's."""
    tok, model = backend.tokenizer, backend.model
    temperature = 0.7
    (g,) = backend.generate(PROMPTS[:1], SamplingParams(num_generations=1, max_new_tokens=8, temperature=temperature, stop=()))[0]
    ids = tok(PROMPTS[0], add_special_tokens=False)["input_ids"]
    full = torch.tensor([ids + g.token_ids])
    with torch.no_grad():
        logits = model(full).logits[0, len(ids) - 1 : -1] / temperature
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(g.token_ids)[:, None]).squeeze(1)
    assert torch.allclose(torch.tensor(g.logprobs), expected, atol=1e-4)


def test_stop_string_ends_a_row_early(backend):
    """A row that emits the stop string leaves the batch; the others keep decoding to the limit."""
    tok = backend.tokenizer
    free = backend.generate(PROMPTS[:1], SamplingParams(num_generations=1, max_new_tokens=16, temperature=0.0, stop=()))[0][0]
    # Use a piece of what greedy decoding will emit as the stop string: it must end the row right there.
    stop = next(tok.decode(free.token_ids[i : i + 2]) for i in range(3, 14) if tok.decode(free.token_ids[i : i + 2]).strip())
    g = backend.generate(PROMPTS[:1], SamplingParams(num_generations=1, max_new_tokens=16, temperature=0.0, stop=(stop,)))[0][0]
    assert g.finish_reason == "stop"
    assert stop in g.text and len(g.token_ids) < len(free.token_ids)
    assert g.token_ids == free.token_ids[: len(g.token_ids)]


def test_bf16_generation_runs_on_the_models_device(tiny_model_dir):
    """The GPU code path exercised on this CPU: a bf16 policy, every tensor of the decode loop on the
    model's device, fp32 log-probs; greedy output is stable across calls."""
    import math

    import torch

    from tentalis_pipelines.inference.base import SamplingParams
    from tentalis_pipelines.inference.transformers_backend import TransformersBackend

    backend = TransformersBackend(tiny_model_dir, device="auto", dtype="bfloat16")
    assert backend.model.dtype == torch.bfloat16 and backend.model.device.type == "cpu"
    greedy = SamplingParams(num_generations=1, max_new_tokens=8, temperature=0.0, seed=0)
    a = backend.generate(["What is 2 + 3?", "Hi"], greedy)
    b = backend.generate(["What is 2 + 3?", "Hi"], greedy)
    assert [g[0].token_ids for g in a] == [g[0].token_ids for g in b]
    sampled = backend.generate(["What is 2 + 3?"], SamplingParams(num_generations=3, max_new_tokens=8, temperature=0.8, seed=1))
    vocab = backend.model.config.vocab_size
    for g in sampled[0]:
        assert g.token_ids and all(0 <= t < vocab for t in g.token_ids)
        assert len(g.logprobs) == len(g.token_ids) and all(lp <= 0 and math.isfinite(lp) for lp in g.logprobs)
    with __import__("pytest").raises(RuntimeError, match="no CUDA device"):
        TransformersBackend(tiny_model_dir, device="cuda")
