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


# Produced by ``_mixed_batch`` below with one thread, on this tiny model, at the commit that moved sampling
# from ``torch.multinomial`` to inverse-transform draws (``draw_categorical``: one uniform per row, so every
# seed draws other tokens than before; the stop strings and the extra EOS were re-chosen from the new
# draws so that every finish kind still happens). The earlier list was frozen at d9e4b20, before the
# one-transfer step, and the one-transfer step reproduced it exactly. (token ids, sampling log-probs,
# finish reason, text) per choice, requests in submission order. Frozen on purpose: do not regenerate
# them from the code they guard.
_FROZEN_STEPS = 15
_FROZEN = [
    ([31535, 15510, 28452],
     [-10.568230628967285, -10.938959121704102, -10.752252578735352],
     'stop', ''),
    ([12762, 13111, 35408, 22290, 16029, 10759, 16170, 18295, 24979, 19534, 17164, 12237],
     [-10.794669151306152, -11.021775245666504, -10.628471374511719, -10.650827407836914, -10.827231407165527, -10.839733123779297, -10.904269218444824, -10.829598426818848, -11.027060508728027, -10.880027770996094, -10.603158950805664, -11.1536226272583],
     'length', ''),
    ([17738, 41836, 41671, 17611, 39393, 5448, 17362, 37242, 32222, 1800, 41831, 8607],
     [-10.80380630493164, -11.005000114440918, -10.804880142211914, -11.015533447265625, -10.684879302978516, -10.930864334106445, -10.632927894592285, -10.762843132019043, -11.129253387451172, -10.68338394165039, -11.06680679321289, -10.657788276672363],
     'length', ''),
    ([13690, 42343, 45361, 14474, 37469],
     [-10.864490509033203, -10.733567237854004, -10.948781967163086, -10.773959159851074, -10.861863136291504],
     'stop', ' lenses retribution LiquTubevc'),
    ([13411, 32399, 41270, 27535, 37276, 3108, 2833, 8194, 1845, 5979],
     [-10.732637405395508, -10.49251651763916, -10.921122550964355, -10.903181076049805, -10.861346244812012, -10.814920425415039, -10.428810119628906, -10.386329650878906, -10.806941986083984, -10.848481178283691],
     'length', ' manipulation PK mutants Disaster THAT theoryrsopath range Whe'),
    ([30, 30, 30, 30, 30, 30, 30, 30, 30],
     [-9.76397705078125, -9.766450881958008, -9.76979923248291, -9.773788452148438, -9.778038024902344, -9.782269477844238, -9.786484718322754, -9.79086971282959, -9.795538902282715],
     'length', '.........'),
    ([12098, 16919, 2129, 5120, 7593, 28581, 27416, 14161, 28270, 17479, 37930, 583, 5818, 39792],
     [-10.620433807373047, -11.001709938049316, -10.581543922424316, -10.684162139892578, -10.895099639892578, -10.851597785949707, -10.639004707336426, -10.840957641601562, -10.745198249816895, -10.654720306396484, -10.820479393005371, -10.88723087310791, -10.822704315185547, -10.799993515014648],
     'length', ' buttisuretestanges################################ gorge Roh Custom latency unpredict parachuteveryrianako'),
    ([41222, 4078, 29858, 5480],
     [-10.693951606750488, -10.71641731262207, -10.787332534790039, -10.65868091583252],
     'stop', ' Halifax copSt'),
]


def _mixed_batch(model, tok, on_step=None):
    """Four requests, two joining after two steps: n 3/2/1/2, temperatures 0.9/0.7/0/1.2, top-p 1/0.8/1/0.95,
    a stop string spanning two tokens (no text tracked: A's first choice, "PN" + " thermost") and one cut from
    the text (D's second choice, "Stage" + "long"), and token 37469 made an EOS (request B's first choice
    samples it, "vc", at its fifth token)."""
    base = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [base, 37469]
    try:
        dec = BatchDecoder(model, tok)
    finally:
        model.generation_config.eos_token_id = base
    system = "You are a careful assistant. Answer briefly. " * 3
    reqs = [dec.submit(DecodeRequest(_ids(tok, system + "What is 2 + 3?"), n=3, max_new_tokens=12, temperature=0.9, seed=5,
                                     track_text=False, stop=("PN therm",))),
            dec.submit(DecodeRequest(_ids(tok, "Tom has 3 apples."), n=2, max_new_tokens=10, temperature=0.7, top_p=0.8, seed=7))]
    for _ in range(2):
        dec.step()
        on_step and on_step(dec)
    reqs.append(dec.submit(DecodeRequest(_ids(tok, system + "Name a colour."), n=1, max_new_tokens=9, temperature=0.0)))
    reqs.append(dec.submit(DecodeRequest(_ids(tok, "Once upon a time"), n=2, max_new_tokens=14, temperature=1.2, top_p=0.95, seed=9,
                                         stop=("agelo",))))
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



def test_a_slab_sized_up_front_in_uninitialised_memory_decodes_what_a_grown_one_does(policy, monkeypatch):
    """``slab_hint`` allocates the KV slab once, uninitialised (here: NaN-filled, the worst memory can
    hold); every token and log-prob of the mixed batch equals the frozen run's, where the slab grew
    from nothing. A padding column left unwritten would turn a row's attention into NaN."""
    import tentalis_pipelines.inference.batch_decoder as bd

    real_empty = torch.empty
    monkeypatch.setattr(bd.torch, "empty", lambda *a, **k: real_empty(*a, **k).fill_(float("nan")))
    real_init = bd.BatchDecoder.__init__
    monkeypatch.setattr(bd.BatchDecoder, "__init__", lambda self, *a, **k: real_init(self, *a, **{**k, "slab_hint": (16, 64)}))
    model, tok = policy
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        dec, reqs = _mixed_batch(model, tok)
    finally:
        torch.set_num_threads(threads)
    assert dec.cache.k[0].shape[0] == 16  # the hint was taken (8 rows at most: never grown past it)
    got = [(c.token_ids, c.logprobs, c.finish_reason, c.text) for r in reqs for c in r.choices]
    for (ids, logps, finish, text), (f_ids, f_logps, f_finish, f_text) in zip(got, _FROZEN, strict=True):
        assert (ids, finish, text) == (f_ids, f_finish, f_text)
        assert logps == pytest.approx(f_logps, abs=1e-5, rel=0)


def _decode_all(model, tok, prompts, **kw):
    dec = BatchDecoder(model, tok, **kw)
    reqs = [dec.submit(DecodeRequest(p, n=3, max_new_tokens=12, temperature=1.0, seed=21 + i, track_text=False))
            for i, p in enumerate(prompts)]
    dec.run()
    return dec, [(c.token_ids, c.logprobs) for r in reqs for c in r.choices]


def _padded_prompts(tok):
    return [_ids(tok, "Tom has 3 apples and buys 4 more. " * 3), _ids(tok, "Hi"), _ids(tok, "What is 12 - 5? Think first.")]


def test_fp32_and_block_mode_steps_keep_the_models_own_attention(policy, tiny_model_dir, monkeypatch):
    """The decode steps' own attention is for bf16/fp16 outside block mode only: an fp32 decoder, and a
    bf16 one in block mode, never build its bias, and the fp32 run is the decode_attention=False run
    token for token and bit for bit."""
    import tentalis_pipelines.inference.batch_decoder as bd

    model, tok = policy
    prompts = _padded_prompts(tok)
    biases = []
    real_bias = bd.decode_bias
    monkeypatch.setattr(bd, "decode_bias", lambda *a, **k: biases.append(1) or real_bias(*a, **k))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        own, want = _decode_all(model, tok, prompts, decode_attention=False)
        fp32, got = _decode_all(model, tok, prompts)
        bf16_model, _ = load_policy(tiny_model_dir, dtype="bfloat16")
        blocks, _ = _decode_all(bf16_model, tok, prompts, prefill_block=16)
    finally:
        torch.set_num_threads(threads)
    assert not biases and not fp32.decode_attention and not blocks.decode_attention
    assert not fp32.cache.zero_fill and not blocks.cache.zero_fill  # nothing read whole: nothing to zero
    assert got == want


def test_bf16_steps_read_every_slab_column_and_the_unwritten_ones_stay_masked(tiny_model_dir, monkeypatch):
    """bf16: the steps run ``decode_attention`` over every column of the slab (contiguous: no copy), the
    columns outside the live window masked. The slab is allocated in NaN-filled memory, the worst it can
    hold: the decoder must zero what it does not write, or a NaN reaches every row. Every sampled token's
    log-prob is the trainer's recomputation (a forward pass over prompt + completion, sdpa) to bf16's
    rounding, rows padded unequally, three samples a prompt."""
    import tentalis_pipelines.inference.batch_decoder as bd
    from tentalis_pipelines.inference.decode_attention import NAME

    model, tok = load_policy(tiny_model_dir, dtype="bfloat16")
    prompts = _padded_prompts(tok)
    real_empty = torch.empty
    monkeypatch.setattr(bd.torch, "empty", lambda *a, **k: real_empty(*a, **k).fill_(float("nan")))
    whole = []
    real_whole = bd.step_reads_whole_slab
    monkeypatch.setattr(bd, "step_reads_whole_slab", lambda cache: whole.append(real_whole(cache)) or whole[-1])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        dec, got = _decode_all(model, tok, prompts, slab_hint=(16, 64))
    finally:
        torch.set_num_threads(threads)
    assert dec.decode_attention and dec.cache.zero_fill and model.config._attn_implementation == NAME
    assert whole and all(whole)  # every step read the whole slab (capacity 64: at most 4 windows)
    worst = 0.0
    for i, (ids, lps) in enumerate(got):
        assert len(ids) == 12 and torch.isfinite(torch.tensor(lps)).all()
        expected = _recomputed(model, prompts[i // 3], ids, 1.0)
        worst = max(worst, (torch.tensor(lps) - expected).abs().max().item())
    assert worst < 0.02, worst  # bf16 rounding of products over other shapes (0.002 here), far below a change of token


def test_rows_moved_into_holes_decode_on_with_their_own_keys_and_logprobs(policy, monkeypatch):
    """Rows leave in the middle of the batch (the first request's limit is 3 tokens, the others' 12 and 7),
    so compaction moves rows from the end into the holes: a request's rows are then neither contiguous nor
    in order. Every sampled token's log-prob still equals the trainer's recomputation of its own row (a
    moved row attends over its own keys and values), each request is sampled once a step (its rows in
    choice order, from its own generator), and a request's samples are the ones it draws alone."""
    import tentalis_pipelines.inference.batch_decoder as bd

    model, tok = policy
    prompts = [_ids(tok, "Tom has 3 apples and buys 4 more."), _ids(tok, "Hi there"), _ids(tok, "What is 12 - 5? Think first.")]
    limits = [3, 12, 7]
    moves, calls = [], []
    real_select, real_sample = bd.SlabCache.select_rows, bd.sample_tokens
    monkeypatch.setattr(bd.SlabCache, "select_rows", lambda self, keep: moves.append(list(keep)) or real_select(self, keep))
    monkeypatch.setattr(bd, "sample_tokens", lambda logits, *a: calls.append(logits.shape[0]) or real_sample(logits, *a))
    dec = BatchDecoder(model, tok)
    reqs = [dec.submit(DecodeRequest(p, n=4, max_new_tokens=m, temperature=1.0, seed=3 + i, track_text=False))
            for i, (p, m) in enumerate(zip(prompts, limits))]
    dec.step()  # admits (each prefill samples a first token) and steps once: 12 rows, three requests
    assert calls == [4, 4, 4, 4, 4, 4] and len(dec.rows) == 12
    dec.step()  # the third token: the first request's rows end
    assert len(dec.rows) == 8
    assert moves[-1] == [8, 9, 10, 11, 4, 5, 6, 7]  # the last request's rows took the first one's places
    groups = dec._groups()
    assert [g[0] for g in groups] == reqs[1:]
    assert [[dec.rows[j].choice.index for j in idx] for _, idx in groups] == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert groups[1][1] == [0, 1, 2, 3] and groups[0][1] == [4, 5, 6, 7]
    with torch.inference_mode():  # as the decoder steps
        dec._select([3, 2, 1, 0, 4, 5, 6, 7])  # the last request's rows in reverse: still sampled in choice order
    assert dec._groups()[1][1] == [3, 2, 1, 0]
    calls.clear()
    dec.step()
    assert calls == [4, 4]  # one draw per request a step, in the order the requests joined
    dec.run()
    for i, req in enumerate(reqs):
        for c in req.choices:
            assert len(c.token_ids) == limits[i]
            expected = _recomputed(model, prompts[i], c.token_ids, 1.0)
            assert torch.tensor(c.logprobs) == pytest.approx(expected, abs=1e-4)
    alone = BatchDecoder(model, tok)
    last = alone.submit(DecodeRequest(prompts[2], n=4, max_new_tokens=7, temperature=1.0, seed=5, track_text=False))
    alone.run()
    assert [c.token_ids for c in last.choices] == [c.token_ids for c in reqs[2].choices]


def test_bf16_steps_with_packed_weights_decode_the_unpacked_tokens(tiny_model_dir):
    """A bf16 decoder outside block mode packs the model's linear weights once (where this CPU has oneDNN's
    bf16 kernels) and samples exactly the tokens and log-probs the plain products give; in block mode, or
    without those kernels, nothing is packed."""
    from tentalis_pipelines.inference.packed_linear import packing_supported

    model, tok = load_policy(tiny_model_dir, dtype="bfloat16")
    prompts = _padded_prompts(tok)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        plain, want = _decode_all(model, tok, prompts, packed_linears=False)
        packed, got = _decode_all(model, tok, prompts)
        blocks, _ = _decode_all(model, tok, prompts, prefill_block=16)
    finally:
        torch.set_num_threads(threads)
    assert plain.packed is None and blocks.packed is None
    if not packing_supported(model):
        assert packed.packed is None
        pytest.skip("this CPU has no oneDNN bf16 kernels: nothing to pack")
    assert packed.packed is not None and packed.packed.repacks == len(packed.packed.modules) > 0
    assert got == want
