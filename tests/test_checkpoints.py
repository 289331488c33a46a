"""Checkpoints are written atomically: a crash never leaves a half checkpoint that looks valid."""

import pytest
import torch

from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.training import checkpoints as ckpt
from tentalis_pipelines.training.trainer import GRPOConfig, build_policy


def test_crash_during_save_leaves_nothing_visible(tmp_path, tiny_model_dir):
    model = build_policy(tiny_model_dir, None, GRPOConfig())
    lake = Lakehouse(tmp_path / "lh")
    good = ckpt.save_adapter(model, tmp_path / "ck", "ckpt-good")
    ckpt.record_checkpoint(lake, {"checkpoint_id": "ckpt-good", "parent_id": None, "base_model": "tiny", "adapter_uri": str(good),
                                  "algorithm": "grpo", "config": {}, "trained_on": ["b"], "trajectory_ids": ["r"],
                                  "trajectory_count": 1, "metrics": {}, "promoted": False})
    ckpt.promote(lake, "ckpt-good")

    original = model.save_pretrained

    def crashing_save(path, **kw):
        original(path, **kw)
        raise KeyboardInterrupt("killed mid-save")

    model.save_pretrained = crashing_save
    with pytest.raises(KeyboardInterrupt):
        ckpt.save_adapter(model, tmp_path / "ck", "ckpt-bad")
    assert not (tmp_path / "ck" / "ckpt-bad").exists()
    assert ckpt.latest_promoted(lake)["checkpoint_id"] == "ckpt-good"
    # The leftover temp folder is not a valid checkpoint and is cleaned by the next save.
    leftovers = list((tmp_path / "ck").glob(".tmp-*"))
    assert leftovers
    with pytest.raises(ckpt.CheckpointError):
        ckpt.verify_adapter(leftovers[0])
    model.save_pretrained = original
    ckpt.save_adapter(model, tmp_path / "ck", "ckpt-next")
    assert not list((tmp_path / "ck").glob(".tmp-*"))


def test_saved_adapter_loads_with_same_weights(tmp_path, tiny_model_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = build_policy(tiny_model_dir, None, GRPOConfig())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(0.01)
    path = ckpt.save_adapter(model, tmp_path / "ck", "ckpt-a")
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(ckpt.verify_adapter(path)))
    x = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.allclose(model(input_ids=x).logits, loaded(input_ids=x).logits, atol=1e-5)
