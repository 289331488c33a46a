"""The continuous-batching decoder on the tiny random model: requests that join a running batch decode
what they would alone, keep their own sampling settings, and record the log-probs their sampler used."""

from __future__ import annotations

import pytest
import torch

from tentalis_pipelines.inference.batch_decoder import BatchDecoder, DecodeRequest
from tentalis_pipelines.inference.transformers_backend import load_policy


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return load_policy(tiny_model_dir)


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _recomputed(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """The completion's log-probs from one forward pass over prompt + completion (at ``temperature``;
    raw logits when greedy), the trainer's recomputation."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].float()
    logits = logits / temperature if temperature > 0 else logits
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None]).squeeze(1)


def test_requests_joining_mid_batch_decode_what_they_would_alone(policy):
    """Greedy: a short prompt, a longer one (the window grows to its left) and an n=2 one join while a
    first request is decoding; each one's tokens equal Hugging Face's generate on that prompt alone."""
    model, tok = policy
    prompts = [_ids(tok, "The quick brown fox jumps over the lazy dog " * 2), _ids(tok, "Hi"),
               _ids(tok, "A much longer prompt that is longer than the running window " * 4), _ids(tok, "What is 12 - 5?")]
    dec = BatchDecoder(model, tok, prefix_cache_tokens=0)
    first = dec.submit(DecodeRequest(prompts[0], max_new_tokens=14, temperature=0.0, track_text=False))
    dec.step()
    dec.step()
    assert len(dec.rows) == 1 and len(first.choices[0].token_ids) == 3
    late = [dec.submit(DecodeRequest(p, n=2 if i == 2 else 1, max_new_tokens=10, temperature=0.0)) for i, p in enumerate(prompts[1:])]
    dec.step()
    assert len(dec.rows) == 5  # all of them in one forward pass
    dec.run()
    for prompt, req in zip(prompts, [first, *late]):
        for c in req.choices:
            x = torch.tensor([prompt])
            ref = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=len(c.token_ids), do_sample=False,
                                 pad_token_id=tok.pad_token_id)[0, len(prompt):].tolist()
            assert c.token_ids == ref
            assert c.finish_reason == "length" and len(c.token_ids) == req.max_new_tokens


def test_each_request_keeps_its_settings_and_its_logprobs_equal_a_recomputation(policy):
    """Three requests with different temperatures, top-p, n and limits, in one batch: every token's
    recorded log-prob equals a forward pass over prompt + completion at that request's temperature."""
    model, tok = policy
    dec = BatchDecoder(model, tok)
    system = "You are a careful assistant. Answer briefly. " * 3
    settings = [dict(temperature=0.7, top_p=0.9, n=2, max_new_tokens=9), dict(temperature=1.3, top_p=1.0, n=1, max_new_tokens=5),
                dict(temperature=0.0, top_p=1.0, n=1, max_new_tokens=7)]
    reqs = []
    for i, kw in enumerate(settings):
        reqs.append(dec.submit(DecodeRequest(_ids(tok, system + f"Question {i}: what is {i} + 2?"), seed=11 + i, **kw)))
        dec.step()  # each joins a running batch
    dec.run()
    assert dec.prefixes.hits >= 2  # the shared system prompt was prefilled once
    for req in reqs:
        assert [len(c.token_ids) for c in req.choices] == [req.max_new_tokens] * req.n
        for c in req.choices:
            expected = _recomputed(model, req.prompt_ids, c.token_ids, req.temperature)
            assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-4), (req.temperature, c.logprobs, expected.tolist())


def test_a_seed_gives_the_same_samples_and_a_stop_string_ends_only_its_row(policy):
    model, tok = policy
    prompt = _ids(tok, "Tom has 3 apples and gets 4 more. How many?")

    def sample(**kw):
        dec = BatchDecoder(model, tok)
        req = dec.submit(DecodeRequest(prompt, n=3, max_new_tokens=12, temperature=0.9, seed=5, **kw))
        dec.run()
        return req

    a, b = sample(), sample()
    assert [c.token_ids for c in a.choices] == [c.token_ids for c in b.choices]
    assert len({tuple(c.token_ids) for c in a.choices}) > 1
    # a piece of what choice 0 writes becomes the stop string: choice 0 ends there (its text cut before it)
    text0 = a.choices[0].text
    stop = next(text0[i : i + 3] for i in range(4, len(text0) - 3) if text0[i : i + 3].strip())
    c = sample(stop=(stop,))
    assert c.choices[0].finish_reason == "stop" and stop not in c.choices[0].text
    assert c.choices[0].token_ids == a.choices[0].token_ids[: len(c.choices[0].token_ids)]
    assert text0.startswith(c.choices[0].text)
    ended = len(c.choices[0].token_ids)
    for other_a, other_c in zip(a.choices[1:], c.choices[1:]):
        # the same draws until choice 0 left (then the request's generator draws for fewer rows)
        assert other_c.token_ids[:ended] == other_a.token_ids[:ended]
        if stop not in other_c.text and other_c.finish_reason != "stop":
            assert len(other_c.token_ids) == 12 and other_c.finish_reason == "length"


def test_a_cancelled_request_leaves_the_batch_and_the_others_go_on(policy):
    model, tok = policy
    ended = []
    dec = BatchDecoder(model, tok)
    keep = dec.submit(DecodeRequest(_ids(tok, "one two three"), max_new_tokens=8, temperature=0.0, on_done=lambda e: ended.append(("keep", e))))
    gone = dec.submit(DecodeRequest(_ids(tok, "four five six seven"), n=2, max_new_tokens=8, temperature=0.0,
                                    on_done=lambda e: ended.append(("gone", e))))
    dec.step()
    assert len(dec.rows) == 3
    gone.cancel()
    dec.step()
    assert len(dec.rows) == 1 and ended == [("gone", None)]
    dec.run()
    assert ended == [("gone", None), ("keep", None)]
    assert len(keep.choices[0].token_ids) == 8 and all(c.finish_reason is None for c in gone.choices)
