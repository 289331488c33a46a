"""Where models run and in which precision: one place that resolves ``device`` and ``dtype`` settings.

* ``device="auto"``: CUDA when present, else the CPU.
* ``dtype="auto"``: bfloat16 where the hardware computes it natively (CUDA with bf16 support; a CPU with
  AVX512-BF16 or AMX-BF16, where bf16 matmuls run several times faster than fp32), else float32.

Training in bf16 keeps fp32 *master* weights for everything that learns (the LoRA adapter) and does the
loss maths (log-softmax, ratios, KL, advantages) in fp32; only the frozen base weights and the matmuls
run in bf16. This module imports nothing but torch, so the training and inference modules stay usable
on a bare GPU machine.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from pathlib import Path

import torch

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
_DTYPE_BY_NAME = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
                  "float16": torch.float16, "fp16": torch.float16}


_BF16_FLAGS = ("amx_bf16", "avx512_bf16", "avx2")


@functools.lru_cache(maxsize=1)
def host_cpu() -> dict:
    """The host CPU as figures must name it: the model name (``lscpu``'s), the core count and which of the
    flags that decide ``dtype = auto`` it has (``amx_bf16``, ``avx512_bf16``, ``avx2``). Empty values where
    ``/proc/cpuinfo`` is unreadable (not Linux)."""
    import os

    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    lines = text.splitlines()
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    flags = set(next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), []))
    return {"model": model, "cpus": os.cpu_count(), "flags": [f for f in _BF16_FLAGS if f in flags]}


def cpu_has_native_bf16() -> bool:
    """True when the CPU advertises AVX512-BF16 or AMX-BF16 (Linux ``/proc/cpuinfo`` flags)."""
    flags = host_cpu()["flags"]
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``auto`` -> CUDA when available, else CPU; ``cuda`` without a GPU is a clear error."""
    name = str(device)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device={name!r} but torch sees no CUDA device: use device='auto' or 'cpu'")
    if name.split(":")[0] not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {name!r}; choose one of {DEVICES} (or 'cuda:N')")
    return torch.device(name)


def resolve_dtype(dtype: str | torch.dtype = "auto", device: str | torch.device = "cpu") -> torch.dtype:
    """``auto`` -> bf16 where the device computes it natively, else fp32; names as in ``DTYPES``."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        dev = torch.device(device) if not isinstance(device, torch.device) else device
        if dev.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
        return torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    try:
        out = _DTYPE_BY_NAME[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {DTYPES}") from None
    dev = torch.device(device) if not isinstance(device, torch.device) else device
    if out == torch.bfloat16 and dev.type == "cpu" and not cpu_has_native_bf16():
        # Measured on an AVX2-only AMD EPYC: a bf16 forward of SmolLM2-135M ran 6x slower than fp32, a
        # bare bf16 matmul 140x slower (emulated). Allowed (results are correct), but never silently.
        warnings.warn(f"dtype={dtype!r} on a CPU without AVX512-BF16/AMX-BF16: bf16 is emulated here and runs several "
                      "times slower than float32; use dtype='auto' (float32 on this CPU)", RuntimeWarning, stacklevel=2)
    return out


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def autocast(device: torch.device, dtype: torch.dtype):
    """Mixed precision for the matmuls when ``dtype`` is lower than fp32; a no-op context otherwise."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
FREED_MEMORY_THRESHOLD = 128 << 10  # bytes: while decoding under a KV budget, a block this large is its own mapping
HEAP_THRESHOLD = 32 << 20  # bytes: afterwards, what glibc's own threshold grows to (its DEFAULT_MMAP_THRESHOLD_MAX)


@functools.cache
def _mallopt():
    import ctypes

    try:
        return ctypes.CDLL(None).mallopt  # the C library this interpreter is linked with (no ldconfig lookup)
    except (OSError, AttributeError):  # no mallopt: not glibc (macOS, musl)
        return None


@contextlib.contextmanager
def freed_memory_returned():
    """While inside, glibc's malloc gives every allocation of ``FREED_MEMORY_THRESHOLD`` bytes or more its
    own memory mapping, returned to the OS when freed; on leaving, the threshold is ``HEAP_THRESHOLD``
    (where glibc's dynamic threshold ends up in a long process). Yields whether it took effect (False
    where there is no glibc).

    Decoding episodes under a KV budget frees and allocates blocks of KV (a few hundred kB per layer
    and conversation) in other sizes turn after turn; from the heap, their freed holes stay in the
    process: a level-0 terminal cycle under a 1 GiB KV budget held 3.0 GB of RSS with glibc's default
    and 2.0 GB inside this context (``bench.episode_bench``). Scoped, not process-wide: left on, every
    allocation over 128 kB of the rest of the process (a training step's activations) would be an
    ``mmap`` and its page faults (not measured; a side effect no caller asked for)."""
    mallopt = _mallopt()
    if mallopt is None:
        yield False
        return
    done = bool(mallopt(M_MMAP_THRESHOLD, FREED_MEMORY_THRESHOLD))
    try:
        yield done
    finally:
        mallopt(M_MMAP_THRESHOLD, HEAP_THRESHOLD)
