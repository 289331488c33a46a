"""Idle-window training on the tiny model: a run that yields and resumes trains exactly like one that never stopped."""

from __future__ import annotations

import traceback

import pytest
import torch
from transformers import AutoTokenizer

from tentalis_pipelines.training.progress import Checkpointing, Preempted, ProgressStore
from tentalis_pipelines.training.trainer import GRPOConfig, TrainSample, build_policy, train_grpo

F32 = {"dtype": "float32", "device": "cpu"}


def _tok(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _samples(tok) -> list[TrainSample]:
    """Three groups of four rows (three prompts), advantages of both signs."""
    out = []
    for q, answers in (("What is 2 + 3?", [" 5", " 7 no", " <answer>5</answer>", " six"]),
                       ("What is 4 * 2?", [" 8", " 6 maybe", " <answer>8</answer>", " 42 42"]),
                       ("What is 9 - 1?", [" 8", " ten", " 7", " <answer>8"])):
        prompt = tok(q, add_special_tokens=False)["input_ids"]
        for a, adv in zip(answers, (1.0, -1.0, 0.5, -0.5)):
            out.append(TrainSample(prompt, tok(a, add_special_tokens=False)["input_ids"], adv, temperature=1.0))
    return out


# Two iterations over 3 optimizer steps of 4 rows, each step in 2+ micro-batches (a small token budget),
# a KL term (a reference pass) and LoRA dropout (the RNG matters): every piece of state a resume must restore.
CFG = dict(loss_type="dapo", beta=0.04, learning_rate=5e-3, per_step_rows=4, micro_batch_tokens=24, num_iterations=2,
           lora_r=4, lora_dropout=0.1, **F32)


def _adapter(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _fires_at(n: int):
    """A yield predicate that says yes on its n-th poll (a request arriving mid-run)."""
    calls = {"n": 0}

    def should_yield() -> bool:
        calls["n"] += 1
        return calls["n"] >= n

    return should_yield


def test_preempted_twice_and_resumed_ends_with_the_uninterrupted_adapter(tiny_model_dir, tmp_path):
    tok = _tok(tiny_model_dir)
    cfg = GRPOConfig(**CFG)
    model = build_policy(tiny_model_dir, None, cfg)
    plain = train_grpo(model, tok, _samples(tok), cfg)
    want = _adapter(model)
    assert plain.metrics["optimizer_steps"] == 6

    store = ProgressStore(tmp_path / "progress.pt")
    positions, in_pass = [], []
    for fire in (60, 35):  # polls: at micro-batch starts and inside forward/backward passes (poll_s = 0)
        model = build_policy(tiny_model_dir, None, cfg)
        cp = Checkpointing(store=store, every=2, should_yield=_fires_at(fire), poll_s=0.0, resume=store.load())
        with pytest.raises(Preempted) as err:
            train_grpo(model, tok, _samples(tok), cfg, progress=cp)
        positions.append(store.load().position)
        frames = [f.name for f in traceback.extract_tb(err.value.__traceback__) if f.filename.endswith("progress.py")]
        in_pass.append(bool({"before", "<lambda>"} & set(frames)))
        assert not list(tmp_path.glob(".*.tmp")), "no half-written progress is left"
    assert positions[0] < positions[1], positions  # the second window got further
    print("saved positions at the yields:", positions, "yield inside a pass:", in_pass)
    assert any(in_pass), "at least one yield abandoned a forward or backward pass in flight"

    model = build_policy(tiny_model_dir, None, cfg)
    cp = Checkpointing(store=store, every=2, resume=store.load())
    resumed = train_grpo(model, tok, _samples(tok), cfg, progress=cp)
    got = _adapter(model)
    assert max(float((got[n] - want[n]).abs().max()) for n in want) <= 1e-6
    assert [h["loss"] for h in resumed.history] == pytest.approx([h["loss"] for h in plain.history], abs=1e-6)
    # A run that trained nothing (a fresh adapter) would differ: the comparison can fail.
    fresh = _adapter(build_policy(tiny_model_dir, None, cfg))
    assert max(float((fresh[n] - want[n]).abs().max()) for n in want) > 1e-3


def test_checkpointing_without_a_yield_changes_nothing(tiny_model_dir, tmp_path):
    tok = _tok(tiny_model_dir)
    cfg = GRPOConfig(**CFG)
    model = build_policy(tiny_model_dir, None, cfg)
    train_grpo(model, tok, _samples(tok), cfg)
    want = _adapter(model)
    model = build_policy(tiny_model_dir, None, cfg)
    cp = Checkpointing(store=ProgressStore(tmp_path / "p.pt"), every=1)
    train_grpo(model, tok, _samples(tok), cfg, progress=cp)
    assert cp.saves >= 10 and cp.steps == 6
    got = _adapter(model)
    assert all(torch.equal(got[n], want[n]) for n in want)


def test_a_progress_for_other_rows_is_refused(tiny_model_dir, tmp_path):
    tok = _tok(tiny_model_dir)
    cfg = GRPOConfig(**CFG)
    store = ProgressStore(tmp_path / "p.pt")
    with pytest.raises(Preempted):
        train_grpo(build_policy(tiny_model_dir, None, cfg), tok, _samples(tok), cfg,
                   progress=Checkpointing(store=store, every=1, should_yield=_fires_at(50), poll_s=0.0))
    other = _samples(tok)
    other[0].advantage = -other[0].advantage
    with pytest.raises(ValueError, match="other rows"):
        train_grpo(build_policy(tiny_model_dir, None, cfg), tok, other, cfg, progress=Checkpointing(store=store, resume=store.load()))
