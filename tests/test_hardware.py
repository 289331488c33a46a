"""Device/dtype resolution, and the core importing on a bare GPU machine (no data stack)."""

import subprocess
import sys

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
print("ok")
"""


def test_training_and_inference_import_without_the_data_stack():
    proc = subprocess.run([sys.executable, "-c", BLOCKER], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
