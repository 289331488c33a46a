"""The trainer learns in the right direction (not just 'the loss is a number')."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from tentalis_pipelines.training.trainer import (
    GRPOConfig,
    TrainSample,
    build_policy,
    completion_logps,
    pack,
    pack_samples,
    prefix_micro_batches,
    step_sizes,
    train_grpo,
)


def _seq_logp(model, tok, prompt_ids, completion_ids) -> float:
    batch = pack_samples([TrainSample(prompt_ids, completion_ids, 0.0)], tok.pad_token_id, "cpu")
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
    model = build_policy(tiny_model_dir, None, GRPOConfig(lora_r=4, dtype="float32"))
    # Make the adapter non-trivial so that its gradient on the prompt path matters.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    prompt = tok("Sara has 4 pens and buys 3 more. How many pens?", add_special_tokens=False)["input_ids"]
    comps = [tok(t, add_special_tokens=False)["input_ids"] for t in (" <answer>7</answer>", " 4 + 3 = 7", " It is 12, I think so")]
    rows = [TrainSample(prompt, c, a) for c, a in zip(comps, (1.0, 0.5, -1.5))]
    shared, full = pack(rows, tok.pad_token_id, "cpu"), pack_samples(rows, tok.pad_token_id, "cpu")
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


# --------------------------------------------------------------------------- precision, padding, temperature
F32 = {"dtype": "float32", "device": "cpu"}


def _tok(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _perturbed_policy(tiny_model_dir, **cfg):
    model = build_policy(tiny_model_dir, None, GRPOConfig(lora_r=4, **{**F32, **cfg}))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return model


def test_left_padding_does_not_change_a_rows_log_probs(tiny_model_dir):
    tok = _tok(tiny_model_dir)
    model = _perturbed_policy(tiny_model_dir)
    short = TrainSample([5, 6], [7, 8, 9], 0.0)
    long = TrainSample([11, 12, 13, 14, 15, 16, 17], [18, 19], 0.0)
    with torch.inference_mode():
        alone = completion_logps(model, pack_samples([short], tok.pad_token_id, "cpu"), 1.0)
        padded = completion_logps(model, pack_samples([short, long], tok.pad_token_id, "cpu"), 1.0)
    assert torch.allclose(alone[0], padded[0, :3], atol=1e-5), (alone, padded)


def test_each_row_is_scored_at_its_own_sampling_temperature(tiny_model_dir):
    tok = _tok(tiny_model_dir)
    model = _perturbed_policy(tiny_model_dir)
    a = TrainSample([5, 6, 7], [8, 9], 0.0, temperature=0.5)
    b = TrainSample([10, 11], [12, 13, 14], 0.0, temperature=1.3)
    batch = pack_samples([a, b], tok.pad_token_id, "cpu", default_temperature=0.9)
    assert batch["temperature"].tolist() == pytest.approx([0.5, 1.3])
    with torch.inference_mode():
        got = completion_logps(model, batch)
        for i, (s, t) in enumerate(((a, 0.5), (b, 1.3))):
            ids = torch.tensor([s.prompt_ids + s.completion_ids])
            logits = model(input_ids=ids).logits[0, len(s.prompt_ids) - 1 : -1].float()
            want = torch.log_softmax(logits / t, -1).gather(-1, torch.tensor(s.completion_ids)[:, None]).squeeze(-1)
            assert torch.allclose(got[i, : len(s.completion_ids)], want, atol=1e-5), (i, got, want)
    # A row without its own temperature falls back to the config's.
    assert pack_samples([TrainSample([1], [2], 0.0)], 0, "cpu", default_temperature=0.7)["temperature"].item() == pytest.approx(0.7)


# --------------------------------------------------------------------------- off-policy steps
def _group(tok, n=8):
    prompt = tok("What is 2 + 3? Answer:", add_special_tokens=False)["input_ids"]
    texts = [" <answer>5</answer>", " 7", " <answer>6</answer>", " five", " 2 + 3 = 5", " no", " <answer>5", " 8 8"]
    comps = [tok(t, add_special_tokens=False)["input_ids"] for t in texts[:n]]
    advs = [1.5, -1.0, -0.5, -1.0, 1.0, -1.0, 0.5, 0.5][:n]
    return prompt, [TrainSample(prompt, c, a, temperature=1.0) for c, a in zip(comps, advs)]


def test_later_steps_of_a_batch_see_the_pre_update_policy_as_old(tiny_model_dir):
    """Two optimizer steps on one generation batch: the second is off-policy, so its ratio must be
    against the log-probs before the first update (drift > 0, the clip binds), not 1."""
    tok = _tok(tiny_model_dir)
    model = _perturbed_policy(tiny_model_dir)
    _, samples = _group(tok)
    cfg = GRPOConfig(beta=0.0, learning_rate=1e-2, per_step_rows=4, **F32)
    res = train_grpo(model, tok, samples, cfg)
    drift = [h["policy_drift"] for h in res.history]
    assert len(drift) == 2 and drift[0] == 0.0 and res.history[0]["clip_fraction"] == 0.0
    assert drift[1] > 0.05, drift
    assert res.history[1]["clip_fraction"] > 0.0, res.history


def test_current_old_logprobs_keep_every_step_on_policy(tiny_model_dir):
    """``old_logprobs='current'``: the same two steps as above, each against the policy as it is then (drift 0,
    nothing clipped), and the second step's loss is that policy's weighted log-likelihood: for CISPO at ratio 1,
    -sum(A * log p) over the step's tokens / their count (checked by a forward pass after the first step)."""
    tok = _tok(tiny_model_dir)
    model = _perturbed_policy(tiny_model_dir)
    _, samples = _group(tok)
    seen = {}
    cfg = GRPOConfig(loss_type="cispo", beta=0.0, learning_rate=1e-2, per_step_rows=4, old_logprobs="current", shuffle=False, **F32)

    def on_step(rec):  # the policy after the first step: what the second step's ratio is against
        if rec["step"] == 0:
            with torch.inference_mode():
                seen["lp"] = completion_logps(model, pack_samples(samples[4:], tok.pad_token_id, "cpu"))

    res = train_grpo(model, tok, samples, cfg, on_step=on_step)
    assert [h["policy_drift"] for h in res.history] == [0.0, 0.0] and res.history[1]["clip_fraction"] == 0.0
    lp, rows = seen["lp"], samples[4:]
    want = -sum(float(s.advantage * lp[i, : len(s.completion_ids)].sum()) for i, s in enumerate(rows)) / sum(len(s.completion_ids) for s in rows)
    assert res.history[1]["loss"] == pytest.approx(want, rel=1e-4)
    with pytest.raises(ValueError, match="old_logprobs"):
        GRPOConfig(old_logprobs="stale")


def test_step_sizes_by_hand():
    assert step_sizes(70, 64) == [35, 35] and step_sizes(65, 64) == [33, 32] and step_sizes(128, 64) == [64, 64]
    assert step_sizes(7, 3) == [3, 2, 2] and step_sizes(3, 64) == [3] and step_sizes(64, 64) == [64] and step_sizes(0, 4) == []
    for n in range(1, 200):
        for per in (1, 3, 8, 64):
            sizes = step_sizes(n, per)
            assert sum(sizes) == n and len(sizes) == -(-n // per) and max(sizes) <= per and max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError, match="per_step_rows"):
        step_sizes(5, 0)


def test_a_batch_is_split_into_steps_of_equal_size_not_a_remainder(tiny_model_dir):
    """7 rows at per_step_rows = 4: two steps of 4 and 3 rows, never a full step and a remainder of one
    (whose AdamW step would move the adapter as far on one row as the first did on all)."""
    tok = _tok(tiny_model_dir)
    _, samples = _group(tok, 7)
    for per, rows in ((4, [4, 3]), (3, [3, 2, 2]), (6, [4, 3])):
        res = train_grpo(_perturbed_policy(tiny_model_dir), tok, samples, GRPOConfig(beta=0.0, per_step_rows=per, **F32))
        assert [h["rows"] for h in res.history] == rows, per
        assert res.metrics["optimizer_steps"] == len(rows)


def test_num_iterations_reuses_the_pre_update_log_probs(tiny_model_dir):
    tok = _tok(tiny_model_dir)
    model = _perturbed_policy(tiny_model_dir)
    _, samples = _group(tok)
    res = train_grpo(model, tok, samples, GRPOConfig(loss_type="grpo", beta=0.0, learning_rate=3e-2, per_step_rows=8, num_iterations=3, **F32))
    assert [h["iteration"] for h in res.history] == [0, 1, 2]
    assert res.history[0]["policy_drift"] == 0.0
    assert res.history[1]["policy_drift"] > 1e-3 and res.history[2]["policy_drift"] > res.history[1]["policy_drift"]


def test_sampling_old_logprobs_are_used_when_asked(tiny_model_dir):
    """``old_logprobs='sampling'``: the ratio is against the stored per-token log-probs. Stored values
    0.5 nats below the policy's give ratio e^0.5 on the first step: every positive-advantage token is
    clipped."""
    tok = _tok(tiny_model_dir)
    model = _perturbed_policy(tiny_model_dir)
    _, samples = _group(tok)
    batch = pack_samples(samples, tok.pad_token_id, "cpu")
    with torch.inference_mode():
        lp = completion_logps(model, batch)
    for i, s in enumerate(samples):
        s.old_logps = (lp[i, : len(s.completion_ids)] - 0.5).tolist()
    res = train_grpo(model, tok, samples, GRPOConfig(beta=0.0, per_step_rows=8, old_logprobs="sampling", **F32))
    pos_tokens = sum(len(s.completion_ids) for s in samples if s.advantage > 0)
    all_tokens = sum(len(s.completion_ids) for s in samples)
    assert res.history[0]["policy_drift"] == pytest.approx(0.5, abs=1e-4)
    assert res.history[0]["clip_fraction"] == pytest.approx(pos_tokens / all_tokens)


def test_micro_batch_split_does_not_change_the_step_gradient(tiny_model_dir):
    tok = _tok(tiny_model_dir)
    _, samples = _group(tok)
    norms = {}
    for loss_type in ("grpo", "dapo", "dr_grpo"):
        for budget in (100_000, 30):
            model = _perturbed_policy(tiny_model_dir)
            cfg = GRPOConfig(loss_type=loss_type, beta=0.04, per_step_rows=8, micro_batch_tokens=budget,
                             share_prompt_prefix=False, max_grad_norm=1e9, **F32)
            res = train_grpo(model, tok, samples, cfg)
            norms[(loss_type, budget)] = res.history[0]["grad_norm"]
        assert norms[(loss_type, 30)] == pytest.approx(norms[(loss_type, 100_000)], rel=1e-4), norms


def test_gradient_checkpointing_gives_the_same_gradient(tiny_model_dir):
    tok = _tok(tiny_model_dir)
    _, samples = _group(tok)
    out = {}
    for gc in (False, True):
        model = _perturbed_policy(tiny_model_dir)
        cfg = GRPOConfig(beta=0.04, per_step_rows=8, gradient_checkpointing=gc, share_prompt_prefix=False, max_grad_norm=1e9, **F32)
        out[gc] = train_grpo(model, tok, samples, cfg).history[0]["grad_norm"]
    assert out[True] == pytest.approx(out[False], rel=1e-4)


# --------------------------------------------------------------------------- a chain of cycles = one run
def _lora_weights(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def test_resumed_chain_equals_one_uninterrupted_run(tiny_model_dir, tmp_path):
    """Cycle 1 trains on batch A and saves adapter + optimizer state; cycle 2 loads both in a fresh model
    and trains on batch B. That must equal one run over A then B (same steps, same schedule), and differ
    from a chain that restarts Adam from zero (the old sign-SGD behaviour)."""
    from tentalis_pipelines.training.trainer import load_trainer_state, save_trainer_state

    tok = _tok(tiny_model_dir)
    _, a = _group(tok)
    _, b = _group(tok)
    b = [TrainSample(s.prompt_ids, s.completion_ids, -s.advantage, temperature=1.0) for s in b[::-1]]
    cfg = GRPOConfig(beta=0.04, learning_rate=1e-2, per_step_rows=8, shuffle=False, old_logprobs="sampling",
                     lr_scheduler_type="linear", warmup_steps=1, max_steps=3, **F32)

    def stamp(model, rows):  # B was sampled by the policy after cycle 1: its stored old log-probs
        batch = pack_samples(rows, tok.pad_token_id, "cpu")
        with torch.inference_mode():
            lp = completion_logps(model, batch)
        for i, s in enumerate(rows):
            s.old_logps = lp[i, : len(s.completion_ids)].tolist()

    # The chain: two calls, state saved to disk and loaded into a freshly built model.
    m1 = _perturbed_policy(tiny_model_dir)
    start = _lora_weights(m1)
    stamp(m1, a)
    r1 = train_grpo(m1, tok, a, cfg)
    m1.save_pretrained(tmp_path / "c1")
    save_trainer_state(tmp_path / "c1", r1.state)
    m2 = build_policy(tiny_model_dir, tmp_path / "c1", cfg)
    stamp(m2, b)
    state = load_trainer_state(tmp_path / "c1")
    assert state.global_step == 1
    r2 = train_grpo(m2, tok, b, cfg, state=state)
    assert [h["global_step"] for h in r2.history] == [1]
    assert r2.history[0]["lr"] == pytest.approx(1e-2 * (1 - 0 / 2))  # warmup 1 step, then linear over 2

    # One uninterrupted run over A then B.
    m = _perturbed_policy(tiny_model_dir)
    assert all(torch.equal(start[n], p) for n, p in _lora_weights(m).items())
    one = train_grpo(m, tok, a + b, cfg)
    assert len(one.history) == 2
    chain, whole = _lora_weights(m2), _lora_weights(m)
    for n in whole:
        assert torch.allclose(chain[n], whole[n], atol=1e-6), n

    # Without the state, cycle 2 restarts Adam (and the schedule): a different model.
    m3 = build_policy(tiny_model_dir, tmp_path / "c1", cfg)
    train_grpo(m3, tok, b, cfg)
    fresh = _lora_weights(m3)
    assert max((fresh[n] - whole[n]).abs().max().item() for n in whole) > 1e-4


def test_lr_schedule_by_hand():
    from tentalis_pipelines.training.trainer import lr_factor

    cfg = GRPOConfig(lr_scheduler_type="linear", warmup_steps=2)
    assert [lr_factor(cfg, s, 6) for s in range(6)] == pytest.approx([0.5, 1.0, 1.0, 0.75, 0.5, 0.25])
    cos = GRPOConfig(lr_scheduler_type="cosine")
    assert lr_factor(cos, 2, 4) == pytest.approx(0.5)
    assert lr_factor(GRPOConfig(), 5, 6) == 1.0


def test_optimizer_state_of_another_adapter_shape_is_refused(tiny_model_dir, tmp_path):
    tok = _tok(tiny_model_dir)
    _, samples = _group(tok, 2)
    r = train_grpo(_perturbed_policy(tiny_model_dir), tok, samples, GRPOConfig(per_step_rows=2, **F32))
    other = build_policy(tiny_model_dir, None, GRPOConfig(lora_r=2, lora_target_modules=("q_proj",), **F32))
    with pytest.raises(ValueError, match="optimizer state does not match"):
        train_grpo(other, tok, samples, GRPOConfig(per_step_rows=2, **F32), state=r.state)


# --------------------------------------------------------------------------- bf16 (the GPU code path, on this CPU)
def test_bf16_policy_keeps_fp32_master_weights_and_learns(tiny_model_dir):
    tok = _tok(tiny_model_dir)
    cfg = GRPOConfig(dtype="bfloat16", device="auto", learning_rate=5e-3, beta=0.0, per_step_rows=4)
    model = build_policy(tiny_model_dir, None, cfg)
    trainable = [p for p in model.parameters() if p.requires_grad]
    frozen = [p for n, p in model.named_parameters() if not p.requires_grad and "layers" in n]
    assert trainable and all(p.dtype == torch.float32 for p in trainable)
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)
    prompt, _ = _group(tok)
    a = tok(" <answer>5</answer>", add_special_tokens=False)["input_ids"]
    b = tok(" I think it is 7", add_special_tokens=False)["input_ids"]
    samples = [TrainSample(prompt, c, x, temperature=1.0) for c, x in zip([a, a, b, b], [0.87, 0.87, -0.87, -0.87])]
    before = _seq_logp(model, tok, prompt, a) - _seq_logp(model, tok, prompt, b)
    state = None
    for _ in range(4):
        res = train_grpo(model, tok, samples, cfg, state=state)
        state = res.state
    assert res.metrics["dtype"] == "bfloat16"
    after = _seq_logp(model, tok, prompt, a) - _seq_logp(model, tok, prompt, b)
    assert after > before + 0.5, (before, after)


def test_optimizer_applies_the_schedule_and_the_gradient_clip(tiny_model_dir):
    """Adam's first step moves each weight by about lr (sign-like), so the warmup factor shows in the step
    size; Adam's first moment is (1 - beta1) x the clipped gradient, so the clip shows in its norm."""
    tok = _tok(tiny_model_dir)
    _, samples = _group(tok)
    model = _perturbed_policy(tiny_model_dir)
    before = _lora_weights(model)
    cfg = GRPOConfig(beta=0.0, learning_rate=1e-2, warmup_steps=4, max_grad_norm=1e-3, per_step_rows=8, **F32)
    res = train_grpo(model, tok, samples, cfg)
    assert res.history[0]["lr"] == pytest.approx(2.5e-3)
    step = max((p - before[n]).abs().max().item() for n, p in _lora_weights(model).items())
    assert step == pytest.approx(2.5e-3, rel=0.02)
    moments = [s["exp_avg"] for s in res.state.optimizer["state"].values()]
    first_moment_norm = torch.sqrt(sum((m.float() ** 2).sum() for m in moments)).item()
    assert res.history[0]["grad_norm"] > 1e-2  # the clip binds
    assert first_moment_norm / 0.1 == pytest.approx(1e-3, rel=1e-3)


def test_process_token_advantages_are_packed_per_token():
    rows = [TrainSample([1, 2], [3, 4, 5], 0.3, token_advantages=[1.0, -0.5, 0.25]), TrainSample([1], [6], -2.0)]
    batch = pack_samples(rows, 0, "cpu")
    assert batch["advantages"].tolist() == [[1.0, -0.5, 0.25], [-2.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="token_advantages has 2 entries for 3"):
        pack_samples([TrainSample([1], [3, 4, 5], 0.0, token_advantages=[1.0, 2.0])], 0, "cpu")


def test_gradient_checkpointing_is_really_on_during_training(tiny_model_dir):
    tok = _tok(tiny_model_dir)
    _, samples = _group(tok, 2)
    model = _perturbed_policy(tiny_model_dir)
    seen = []
    train_grpo(model, tok, samples, GRPOConfig(per_step_rows=2, gradient_checkpointing=True, **F32),
               on_step=lambda rec: seen.append(model.base_model.model.is_gradient_checkpointing))
    assert seen == [True] and not model.base_model.model.is_gradient_checkpointing
