"""Device/dtype resolution, and the core importing on a bare GPU machine (no data stack)."""

import subprocess
import sys
import warnings

import pytest
import torch

from tentalis_pipelines.hardware import resolve_device, resolve_dtype


def test_auto_device_and_dtype_on_this_machine(monkeypatch):
    import tentalis_pipelines.hardware as hw

    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_dtype("float32") == torch.float32 and resolve_dtype("bf16") == torch.bfloat16
    monkeypatch.setattr(hw, "cpu_has_native_bf16", lambda: True)
    assert resolve_dtype("auto", "cpu") == torch.bfloat16
    monkeypatch.setattr(hw, "cpu_has_native_bf16", lambda: False)
    assert resolve_dtype("auto", "cpu") == torch.float32
    # bf16 asked for explicitly on a CPU that only emulates it: allowed, but with a warning naming the fix
    with pytest.warns(RuntimeWarning, match="dtype='auto'"):
        assert resolve_dtype("bfloat16", "cpu") == torch.bfloat16
    monkeypatch.setattr(hw, "cpu_has_native_bf16", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_dtype("bfloat16", "cpu") == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("int8")
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device("tpu")


BLOCKER = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("dagster", "deltalake", "duckdb", "polars", "pyarrow"):
            raise ImportError(f"{name} is not on a bare GPU machine")
        return None
sys.meta_path.insert(0, Block())
import tentalis_pipelines.training.trainer, tentalis_pipelines.training.losses, tentalis_pipelines.hardware
import tentalis_pipelines.inference.transformers_backend
import bench.gpu_bench, bench.dtype_bench
import tentalis_pipelines.rewards.advantages
print("ok")
"""


def test_training_and_inference_import_without_the_data_stack():
    proc = subprocess.run([sys.executable, "-c", BLOCKER], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_gpu_bench_path_runs_on_cpu_with_a_tiny_config(embedded_model_dir):
    """bench/gpu_bench.py's whole Tentalis side (model from a config, rollouts, one GRPO update, on the
    resolved device in the resolved dtype) on this CPU; the TRL side needs TRL (not in `make test`)."""
    from bench.gpu_bench import GpuBenchConfig, gpu_bench

    cfg = GpuBenchConfig.tiny()
    report = gpu_bench(embedded_model_dir, cfg, with_trl=False)
    t = report["tentalis"]
    assert len(t["updates"]) == cfg.updates
    u = t["updates"][0]
    assert 0 < u["completion_tokens"] <= cfg.prompts * cfg.num_generations * cfg.max_new_tokens
    assert u["update_s"] == pytest.approx(u["generation_s"] + u["train_s"], abs=2e-3)
    assert u["device"] == "cpu" and u["dtype"] in ("bfloat16", "float32")
    hf = report["hf_generate"]
    assert len(hf["repeats"]) == 2
    assert all(0 < r["completion_tokens"] <= cfg.prompts * cfg.num_generations * cfg.max_new_tokens for r in hf["repeats"])
    assert report["generation_ratio_tentalis_over_hf"] == pytest.approx(
        t["median_tokens_per_s"] / hf["median_tokens_per_s"], abs=1e-3)


def test_dtype_bench_compares_both_precisions(tiny_model_dir):
    from bench.dtype_bench import dtype_benchmark

    d = dtype_benchmark(tiny_model_dir, prompts=2, num_generations=2, max_new_tokens=6, update_rows=4, repeats=1)
    for dtype in ("float32", "bfloat16"):
        assert len(d[dtype]["runs"]["tokens_per_s"]) == 1 and d[dtype]["tokens_per_s"] > 0
    # Ratios are rounded to 2 decimals (the tiny model can make bf16 ~0.09x on a shared CPU), hence abs.
    assert d["bf16_over_fp32_tokens_per_s"] == pytest.approx(d["bfloat16"]["tokens_per_s"] / d["float32"]["tokens_per_s"], rel=0.02, abs=0.01)
    assert d["fp32_over_bf16_update_time"] == pytest.approx(d["float32"]["update_s"] / d["bfloat16"]["update_s"], rel=0.02, abs=0.01)
