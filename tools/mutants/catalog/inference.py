"""Planted bugs in device/dtype handling (see tools/mutants/mutants.py)."""

H = "tentalis_pipelines/hardware.py"
B = "tentalis_pipelines/inference/transformers_backend.py"
TH = ["tests/test_hardware.py"]
TB = ["tests/test_transformers_backend.py"]

MUTANTS = [
    {"id": "auto-dtype-never-bf16-on-cpu", "file": H, "find": "return torch.bfloat16 if cpu_has_native_bf16() else torch.float32",
     "replace": "return torch.float32", "tests": TH, "why": "dtype=auto ignores the CPU's native bf16"},
    {"id": "auto-dtype-always-bf16-on-cpu", "file": H, "find": "return torch.bfloat16 if cpu_has_native_bf16() else torch.float32",
     "replace": "return torch.bfloat16", "tests": TH, "why": "dtype=auto picks bf16 on CPUs without it"},
    {"id": "cuda-without-gpu-accepted", "file": H,
     "find": "    if name.startswith(\"cuda\") and not torch.cuda.is_available():\n        raise",
     "replace": "    if False:\n        raise", "tests": TH + TB, "why": "device='cuda' on a CPU machine fails later and unclearly"},
    {"id": "backend-dtype-ignored", "file": B, "find": "    model = model.to(device=device, dtype=dtype)\n",
     "replace": "    model = model.to(device=device)\n", "tests": TB, "why": "the backend's dtype setting has no effect"},
]
