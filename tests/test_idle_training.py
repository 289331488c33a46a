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
    polls = []  # asked at every poll, never yields
    cp = Checkpointing(store=ProgressStore(tmp_path / "p.pt"), every=1, should_yield=lambda: polls.append(1) is not None, poll_s=0.0)
    train_grpo(model, tok, _samples(tok), cfg, progress=cp)
    assert cp.saves >= 10 and cp.steps == 6
    got = _adapter(model)
    assert all(torch.equal(got[n], want[n]) for n in want)
    # The run's poll hooks go with it: using the model afterwards never asks whether to yield.
    asked = len(polls)
    assert asked > 0
    with torch.no_grad():
        model(input_ids=torch.tensor([[1, 2, 3]]))
    assert len(polls) == asked


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


def test_a_progress_saved_under_another_step_split_is_refused(tiny_model_dir, tmp_path, monkeypatch):
    """A run saved by code that cut the rows into other steps (before ``step_sizes``: a full step and a
    remainder) must not resume: its saved step index points into other rows. 12 rows at 5 a step: the old
    plan was 5 + 5 + 2, the equal one is 4 + 4 + 4; the same rows and config otherwise."""
    from tentalis_pipelines.training import trainer

    tok = _tok(tiny_model_dir)
    cfg = GRPOConfig(**{**CFG, "per_step_rows": 5})
    assert trainer.step_sizes(12, 5) == [4, 4, 4]
    store = ProgressStore(tmp_path / "p.pt")
    with monkeypatch.context() as m:
        m.setattr(trainer, "step_sizes", lambda n, k: [k] * (n // k) + ([n % k] if n % k else []))
        with pytest.raises(Preempted):
            train_grpo(build_policy(tiny_model_dir, None, cfg), tok, _samples(tok), cfg,
                       progress=Checkpointing(store=store, every=1, should_yield=_fires_at(50), poll_s=0.0))
    with pytest.raises(ValueError, match="other rows, another config"):
        train_grpo(build_policy(tiny_model_dir, None, cfg), tok, _samples(tok), cfg, progress=Checkpointing(store=store, resume=store.load()))
    # The same split resumes (the refusal above is the plan's, not the store's).
    with monkeypatch.context() as m:
        m.setattr(trainer, "step_sizes", lambda n, k: [k] * (n // k) + ([n % k] if n % k else []))
        done = train_grpo(build_policy(tiny_model_dir, None, cfg), tok, _samples(tok), cfg, progress=Checkpointing(store=store, resume=store.load()))
    assert done.metrics["optimizer_steps"] == 6  # 3 steps (5 + 5 + 2) x 2 iterations


# --------------------------------------------------------------------------- the stage: windows over a real lakehouse
def _write_rows(lake, tok, batch_id: str, policy_version: str = "base") -> None:
    from tentalis_pipelines.lakehouse import now_utc

    now = now_utc()
    rollouts, trajectories = [], []
    for t, (q, answers) in enumerate((("What is 2 + 3?", [" 5", " 7 no", " <answer>5</answer>", " six"]),
                                      ("What is 4 * 2?", [" 8", " 6 maybe", " <answer>8</answer>", " 42 42"]))):
        for i, (text, adv) in enumerate(zip(answers, (1.0, -1.0, 0.5, -0.5))):
            rid, ids = f"{batch_id}-t{t}-r{i}", tok(text, add_special_tokens=False)["input_ids"]
            rollouts.append({"batch_id": batch_id, "rollout_id": rid, "task_id": f"t{t}", "group_index": i,
                             "policy_version": policy_version, "backend": "transformers", "model": "tiny", "prompt_text": q,
                             "completion": text, "steps": [], "completion_tokens": len(ids), "completion_token_ids": ids,
                             "sampling_logprobs": [-1.0] * len(ids), "finish_reason": "stop", "temperature": 1.0, "created_at": now})
            trajectories.append({"batch_id": batch_id, "rollout_id": rid, "task_id": f"t{t}", "group_index": i,
                                 "policy_version": policy_version, "reward": adv, "outcome_reward": float(adv > 0), "advantage": adv, "advantage_mode": "outcome",
                                 "kept": True, "created_at": now})
    lake.write_batch("rollouts", batch_id, rollouts)
    lake.write_batch("trajectories", batch_id, trajectories)


def _window_setup(home, tiny_model_dir):
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.policy import PolicySettings
    from tentalis_pipelines.settings import Paths

    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    tok = _tok(tiny_model_dir)
    for b in ("b1", "b2"):
        _write_rows(lake, tok, b)
    cfg = GRPOConfig(**{**CFG, "num_iterations": 1, "micro_batch_tokens": 40})
    return paths, lake, tok, PolicySettings(model=str(tiny_model_dir)), cfg


def _saved_adapter(lake, checkpoint_id):
    from safetensors.torch import load_file

    [row] = [r for r in lake.read("checkpoints").to_pylist() if r["checkpoint_id"] == checkpoint_id]
    return row, load_file(f"{row['adapter_uri']}/adapter_model.safetensors")


def test_a_window_preempted_twice_resumes_its_pinned_rows_to_the_uninterrupted_checkpoint(tmp_path, tiny_model_dir, monkeypatch):
    from tentalis_pipelines import activity
    from tentalis_pipelines.stages.idle_window import progress_path, run_window
    from tentalis_pipelines.training import checkpoints as ckpt

    # The uninterrupted window, in its own home.
    monkeypatch.setenv("TENTALIS_HOME", str(tmp_path / "a"))
    paths, lake, tok, policy, cfg = _window_setup(tmp_path / "a", tiny_model_dir)
    plain = run_window(lake, paths, policy, cfg, promote=False, activity_file=activity.activity_path(paths.home))
    assert plain.metadata["outcome"] == "finished" and plain.metadata["steps"] == 4
    _, want = _saved_adapter(lake, plain.metadata["checkpoint_id"])

    # The same rows in another home; a request arrives after the first optimizer step of each of two windows.
    monkeypatch.setenv("TENTALIS_HOME", str(tmp_path / "b"))
    paths, lake, tok, policy, cfg = _window_setup(tmp_path / "b", tiny_model_dir)
    marker = activity.activity_path(paths.home)
    activity.touch(marker)
    for _ in range(2):
        out = run_window(lake, paths, policy, cfg, promote=False, activity_file=marker, progress_every=1,
                         on_step=lambda rec: activity.touch(marker))
        assert out.metadata["outcome"] == "preempted", out.metadata
        assert progress_path(paths).exists() and not lake.exists("checkpoints")
        assert not ckpt.active_claims(lake)  # the claim was given up: nothing holds the trajectories
    _write_rows(lake, tok, "b3")  # new fresh rows between windows: the resumed run keeps its pinned ones
    last = run_window(lake, paths, policy, cfg, promote=False, activity_file=marker, progress_every=1)
    assert last.metadata["outcome"] == "finished", last.metadata
    assert not progress_path(paths).exists()
    row, got = _saved_adapter(lake, last.metadata["checkpoint_id"])
    assert sorted(row["trajectory_ids"]) == sorted(f"b{b}-t{t}-r{i}" for b in (1, 2) for t in (0, 1) for i in range(4))
    assert set(got) == set(want)
    assert max(float((got[k] - want[k]).abs().max()) for k in want) <= 1e-6

    windows = sorted(lake.read("training_windows").to_pylist(), key=lambda r: r["started_at"])
    assert [w["outcome"] for w in windows] == ["preempted", "preempted", "finished"]
    assert [w["steps"] for w in windows] == [1, 1, 2]  # 4 optimizer steps in all, none done twice
    assert windows[0]["resumed_from"] is None and windows[1]["resumed_from"] and windows[2]["resumed_from"]
    assert all(w["trained_minutes"] > 0 and w["idle_minutes"] is not None for w in windows)


def test_a_window_yields_within_30_seconds_of_a_request(home, tiny_model_dir):
    import threading
    import time

    from tentalis_pipelines import activity
    from tentalis_pipelines.stages.idle_window import run_window

    paths, lake, tok, policy, cfg = _window_setup(home, tiny_model_dir)
    cfg = GRPOConfig(**{**CFG, "num_iterations": 200})  # minutes of training if it never yields
    marker = activity.activity_path(paths.home)
    activity.touch(marker)
    result, steps = {}, []
    worker = threading.Thread(target=lambda: result.update(out=run_window(
        lake, paths, policy, cfg, promote=False, activity_file=marker, on_step=steps.append)))
    worker.start()
    deadline = time.monotonic() + 120
    while not steps and time.monotonic() < deadline:
        time.sleep(0.01)
    assert steps, "training never started"
    t_request = time.monotonic()
    activity.touch(marker)  # what the gateway does when a request arrives
    worker.join(timeout=60)
    stopped = time.monotonic() - t_request
    assert not worker.is_alive()
    assert result["out"].metadata["outcome"] == "preempted"
    assert stopped < 30, stopped
    [w] = lake.read("training_windows").to_pylist()
    assert 0 <= w["yield_seconds"] < 30 and w["steps"] < 200 * 4
    print(f"yielded {stopped:.3f} s after the request (recorded {w['yield_seconds']:.3f} s), after {w['steps']} steps")


def test_the_gateway_records_model_requests_and_not_health_checks(tmp_path, tiny_model_dir):
    from fastapi.testclient import TestClient

    from tentalis_pipelines.activity import activity_path, last_activity_ns
    from tentalis_pipelines.gateway.app import GatewayConfig, create_app

    home = tmp_path / "home"
    marker = activity_path(home)
    cfg = GatewayConfig(home=home, lakehouse=home / "lakehouse", model_dir=tiny_model_dir, no_auth=True, poll_seconds=0,
                        device="cpu", dtype="float32")
    chat = {"model": "tentalis", "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": "hi"}]}
    with TestClient(create_app(cfg)) as client:
        assert client.get("/health").status_code == 200 and last_activity_ns(marker) is None
        assert client.post("/v1/chat/completions", json=chat).status_code == 200
        first = last_activity_ns(marker)
        assert first is not None
        for path in ("/health", "/v1/models"):
            client.get(path)
        assert last_activity_ns(marker) == first  # monitoring never wakes the box
        assert client.post("/v1/completions", json={"model": "tentalis", "prompt": "1 + 1 =", "max_tokens": 2}).status_code == 200
        assert last_activity_ns(marker) > first
