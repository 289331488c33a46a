"""train_checkpoint end to end over a real lakehouse: what reaches the trainer from the tables."""

from __future__ import annotations

from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages import training as stage_training
from tentalis_pipelines.stages.rollouts import current_policy
from tentalis_pipelines.stages.training import train_checkpoint
from tentalis_pipelines.training.trainer import GRPOConfig


def _write_batch(lake: Lakehouse, tok, batch_id: str, policy_version: str, temperature: float) -> None:
    prompt = "What is 2 + 3?"
    texts = [" <answer>5</answer>", " 7", " <answer>6</answer>", " five"]
    rewards = [1.0, 0.0, 0.0, 0.2]
    advantages = [1.3, -0.7, -0.7, 0.1]
    now = now_utc()
    rollouts, trajectories = [], []
    for i, (text, r, a) in enumerate(zip(texts, rewards, advantages)):
        rid = f"{batch_id}-r{i}"
        ids = tok(text, add_special_tokens=False)["input_ids"]
        rollouts.append({
            "batch_id": batch_id, "rollout_id": rid, "task_id": "t0", "group_index": i, "policy_version": policy_version,
            "backend": "transformers", "model": "tiny", "prompt_text": prompt, "completion": text, "steps": [], "answer": None,
            "parse_mode": "fallback", "prompt_tokens": 5, "completion_tokens": len(ids), "completion_token_ids": ids,
            "sampling_logprobs": [-1.0] * len(ids), "finish_reason": "stop", "temperature": temperature, "seconds": 0.1,
            "created_at": now,
        })
        trajectories.append({
            "batch_id": batch_id, "rollout_id": rid, "task_id": "t0", "group_index": i, "policy_version": policy_version,
            "outcome_reward": r, "format_reward": 0.0, "process_reward": None, "step_rewards": [], "manager_score": r,
            "overlong_penalty": 0.0, "reward": r, "reward_weights": "{}", "advantage": a, "step_advantages": [],
            "advantage_mode": "outcome", "kept": True, "created_at": now,
        })
    lake.write_batch("rollouts", batch_id, rollouts)
    lake.write_batch("trajectories", batch_id, trajectories)


def test_training_cycles_use_row_temperatures_and_continue_the_optimizer(home, tiny_model_dir, monkeypatch):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    paths = Paths.from_env(home)
    lake = Lakehouse(paths.lakehouse)
    seen = []
    real = stage_training.train_grpo

    def spy(model, tokenizer, samples, config, *, state=None, on_step=None):
        seen.append({"temperatures": [s.temperature for s in samples], "advantages": sorted(s.advantage for s in samples),
                     "start_step": None if state is None else state.global_step, "config_temperature": config.temperature})
        return real(model, tokenizer, samples, config, state=state, on_step=on_step)

    monkeypatch.setattr(stage_training, "train_grpo", spy)
    policy = PolicySettings(model=str(tiny_model_dir), temperature=0.9)
    cfg = GRPOConfig(beta=0.0, per_step_rows=4, dtype="float32", device="cpu")

    _write_batch(lake, tok, "b1", "base", temperature=0.6)
    first = train_checkpoint(lake, paths, policy, cfg, promote=True)
    version, adapter = current_policy(lake, paths)
    assert version == first.metadata["checkpoint_id"]
    _write_batch(lake, tok, "b2", version, temperature=1.1)
    train_checkpoint(lake, paths, policy, cfg, promote=True)

    # Each row is scored at the temperature it was sampled at, not today's policy setting (0.9).
    assert seen[0]["temperatures"] == [0.6] * 4 and seen[1]["temperatures"] == [1.1] * 4
    assert seen[0]["advantages"] == sorted([1.3, -0.7, -0.7, 0.1])
    # The second cycle continues the first one's optimizer: its schedule starts at global step 1.
    assert seen[0]["start_step"] is None and seen[1]["start_step"] == 1
    second = [r for r in lake.read("checkpoints").to_pylist() if r["parent_id"] == version]
    assert len(second) == 1 and '"global_step": 2' in second[0]["metrics"]


def test_training_refuses_a_batch_without_learning_signal(home, tiny_model_dir):
    import pytest
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    paths = Paths.from_env(home)
    lake = Lakehouse(paths.lakehouse)
    _write_batch(lake, tok, "b1", "base", temperature=0.6)
    rows = lake.read("trajectories", batch_id="b1").to_pylist()
    for r in rows:
        r["advantage"] = 0.0
    lake.write_batch("trajectories", "b1", rows)
    with pytest.raises(ValueError, match="carry no learning signal"):
        train_checkpoint(lake, paths, PolicySettings(model=str(tiny_model_dir)),
                                  GRPOConfig(dtype="float32", device="cpu"))
    assert not lake.exists("checkpoints") or lake.read("checkpoints").num_rows == 0


def test_each_cycle_starts_from_its_parents_lora_weights_over_three_generations(home, tiny_model_dir, monkeypatch):
    """The chain continues the weights, not only the optimizer: cycle k starts from exactly the adapter
    that cycle k-1 saved (the first from a fresh adapter, whose lora_B is zero), over three generations.
    Seen failing against the mutant lineage-child-from-base (every cycle from a fresh adapter)."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    paths = Paths.from_env(home)
    lake = Lakehouse(paths.lakehouse)
    starts = []
    real = stage_training.train_grpo

    def spy(model, tokenizer, samples, config, *, state=None, on_step=None):
        starts.append({n.replace(".default", ""): p.detach().clone() for n, p in model.named_parameters() if "lora_" in n})
        return real(model, tokenizer, samples, config, state=state, on_step=on_step)

    monkeypatch.setattr(stage_training, "train_grpo", spy)
    policy = PolicySettings(model=str(tiny_model_dir))
    cfg = GRPOConfig(beta=0.0, per_step_rows=4, dtype="float32", device="cpu", learning_rate=1e-2)
    version, ids = "base", []
    for k in range(3):
        _write_batch(lake, tok, f"b{k}", version, temperature=0.8)
        ids.append(train_checkpoint(lake, paths, policy, cfg, promote=True).metadata["checkpoint_id"])
        version = ids[-1]
    rows = {r["checkpoint_id"]: r for r in lake.read("checkpoints").to_pylist()}
    assert [rows[c]["parent_id"] for c in ids] == [None, ids[0], ids[1]]
    assert all(float(v.abs().max()) == 0.0 for n, v in starts[0].items() if "lora_B" in n)  # a fresh adapter
    for k in (1, 2):
        saved = load_file(f"{rows[ids[k - 1]]['adapter_uri']}/adapter_model.safetensors")
        assert sorted(saved) == sorted(starts[k]), "the adapter's tensors are the model's LoRA parameters"
        assert all(starts[k][n].equal(saved[n].to(starts[k][n].dtype)) for n in saved), f"cycle {k} did not start from its parent"
        assert any(float(saved[n].abs().max()) > 0 for n in saved if "lora_B" in n)  # the parent had learnt something
    # Each generation moved on from its parent: the third's start is not the second's.
    assert any(not starts[2][n].equal(starts[1][n]) for n in starts[1])
