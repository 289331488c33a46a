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


# Produced by the decoder BEFORE the one-transfer step (main at d9e4b20: per-request ``sample_next`` with
# its ``.tolist()``s and ``torch.isin``), by ``_mixed_batch`` below with one thread, on this tiny model:
# (token ids, sampling log-probs, finish reason, text) per choice, requests in submission order. Frozen on
# purpose: do not regenerate them from the code they guard.
_FROZEN_STEPS = 15
_FROZEN = [
    ([46934, 3895, 11809, 47481, 46691, 21074, 2782, 12031, 48812, 15102, 23266, 42032],
     [-10.558265686035156, -11.106023788452148, -10.744393348693848, -11.04084300994873, -10.78734302520752, -10.662495613098145, -10.55783462524414, -10.718006134033203, -10.71500015258789, -10.88602066040039, -10.661314964294434, -11.035101890563965],
     'length', ''),
    ([17841, 6666, 25587, 32473, 15850, 25200],
     [-10.864590644836426, -10.970012664794922, -10.944334030151367, -10.809930801391602, -11.069819450378418, -10.527030944824219],
     'stop', ''),
    ([16108, 42734, 35138, 15531, 46685, 43222, 30720, 27431, 14747, 7903, 3684, 10900],
     [-10.895686149597168, -10.564017295837402, -10.768118858337402, -10.522944450378418, -10.823974609375, -10.68274974822998, -10.50001335144043, -11.222208976745605, -10.760943412780762, -11.065053939819336, -10.720032691955566, -10.991743087768555],
     'length', ''),
    ([23697, 39671, 24788, 37055, 2464],
     [-10.573328018188477, -10.699809074401855, -10.401786804199219, -10.86776351928711, -10.62130069732666],
     'stop', ' landownersVirginontology violentlyII'),
    ([7201, 47927, 28858, 48248, 47824, 34563, 25747, 21765, 10035, 47019],
     [-10.590076446533203, -10.948649406433105, -10.673161506652832, -10.955740928649902, -10.557039260864258, -10.914291381835938, -10.741474151611328, -10.739205360412598, -10.446317672729492, -10.50202751159668],
     'length', ' moodactiv bottlednearesthogs vinyl landl vagueoler catap'),
    ([30, 30, 30, 30, 30, 30, 30, 30, 30],
     [-9.76397705078125, -9.766450881958008, -9.76979923248291, -9.773788452148438, -9.778038024902344, -9.782269477844238, -9.786484718322754, -9.79086971282959, -9.795538902282715],
     'length', '.........'),
    ([17124, 11985, 34490, 6404, 16555, 3707, 5782, 41008],
     [-10.72036075592041, -10.783720970153809, -10.696452140808105, -10.839783668518066, -10.735594749450684, -10.712943077087402, -10.913238525390625, -10.826272964477539],
     'stop', "aho compensation aerosols Group '< laws obst"),
    ([25247, 37307, 25351, 14111, 38543, 21396, 5381, 16392, 43773, 26327, 32876, 8387, 41044, 12919],
     [-10.958494186401367, -10.675543785095215, -10.999641418457031, -10.723313331604004, -10.800244331359863, -10.727995872497559, -10.910228729248047, -10.893369674682617, -10.957700729370117, -10.901988983154297, -10.89576244354248, -10.861254692077637, -10.79322624206543, -10.545470237731934],
     'length', ' lonelinessdigitsketsAug booming bilingualicks hypot witty mosque sickle facility DV supplied'),
]


def _mixed_batch(model, tok, on_step=None):
    """Four requests, two joining after two steps: n 3/2/1/2, temperatures 0.9/0.7/0/1.2, top-p 1/0.8/1/0.95,
    a stop string spanning two tokens (no text tracked) and one cut from the text, and token 2464 made an
    EOS (request B's first choice samples it at its fifth token)."""
    base = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [base, 2464]
    try:
        dec = BatchDecoder(model, tok)
    finally:
        model.generation_config.eos_token_id = base
    system = "You are a careful assistant. Answer briefly. " * 3
    reqs = [dec.submit(DecodeRequest(_ids(tok, system + "What is 2 + 3?"), n=3, max_new_tokens=12, temperature=0.9, seed=5,
                                     track_text=False, stop=("htmcli",))),
            dec.submit(DecodeRequest(_ids(tok, "Tom has 3 apples."), n=2, max_new_tokens=10, temperature=0.7, top_p=0.8, seed=7))]
    for _ in range(2):
        dec.step()
        on_step and on_step(dec)
    reqs.append(dec.submit(DecodeRequest(_ids(tok, system + "Name a colour."), n=1, max_new_tokens=9, temperature=0.0)))
    reqs.append(dec.submit(DecodeRequest(_ids(tok, "Once upon a time"), n=2, max_new_tokens=14, temperature=1.2, top_p=0.95, seed=9,
                                         stop=(" osmosis",))))
    while dec.busy():
        dec.step()
        on_step and on_step(dec)
    return dec, reqs


def test_a_mixed_batch_decodes_exactly_what_the_per_request_step_did(policy):
    """The step that samples every request on the device and reads all rows back at once gives the token
    ids, finish reasons and texts the per-request step gave, and the same log-probs (bit for bit on the
    host they were frozen on; the tolerance is for other CPUs' matmul kernels, far below any change of
    distribution); every finish kind happens: EOS, a stop string with and without tracked text, the limit."""
    model, tok = policy

    def rows_line_up(dec):  # after every step: each live row's mask covers its prompt and its fed tokens
        lengths = [len(r.req.prompt_ids) + len(r.choice.token_ids) - 1 for r in dec.rows]
        assert dec.mask.sum(1).tolist() == lengths and dec.pos.tolist() == lengths
        assert dec.nxt.tolist() == [r.choice.token_ids[-1] for r in dec.rows]

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the matmuls' summation order, so a log-prob's last bit, depends on it
    try:
        dec, reqs = _mixed_batch(model, tok, rows_line_up)
    finally:
        torch.set_num_threads(threads)
    got = [(c.token_ids, c.logprobs, c.finish_reason, c.text) for r in reqs for c in r.choices]
    assert dec.steps == _FROZEN_STEPS and len(got) == len(_FROZEN)
    for (ids, logps, finish, text), (f_ids, f_logps, f_finish, f_text) in zip(got, _FROZEN):
        assert (ids, finish, text) == (f_ids, f_finish, f_text)
        assert logps == pytest.approx(f_logps, abs=1e-5, rel=0)
    assert {f for _, _, f, _ in got} == {"stop", "length"} and all(r.done and r.live == 0 for r in reqs)
    assert not dec.rows and not dec.busy()


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

