"""Backends by name. Kept apart from ``base`` (the interface every backend imports), so the interface
and its implementations never import each other."""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from typing import Any

from tentalis_pipelines.inference.base import BackendNotAvailable, GenerationBackend

BACKENDS = ("transformers", "openai", "vllm")
log = logging.getLogger(__name__)


def make_backend(kind: str, **kwargs) -> GenerationBackend:
    """Construct a backend by name; backends that need extras fail with a clear message.

    ``transformers`` (default, CPU or GPU), ``openai`` (any OpenAI-compatible server: vLLM, llama.cpp,
    SGLang, ...; see ``openai_backend.OpenAIBackend``) or ``vllm`` (offline vLLM engine on a GPU)."""
    if kind == "transformers":
        from tentalis_pipelines.inference.transformers_backend import TransformersBackend

        return TransformersBackend(**kwargs)
    if kind == "openai":
        from tentalis_pipelines.inference.openai_backend import OpenAIBackend

        return OpenAIBackend(**kwargs)
    if kind == "vllm":
        try:
            import vllm  # noqa: F401
        except ImportError:
            raise BackendNotAvailable(
                "backend 'vllm' needs vLLM and a GPU: pip install 'tentalis[vllm]' on a CUDA machine, "
                "or choose backend='transformers' (or 'openai' with a running server)"
            ) from None
        from tentalis_pipelines.inference.vllm_backend import VLLMBackend

        return VLLMBackend(**kwargs)
    raise BackendNotAvailable(f"unknown backend {kind!r}: choose one of {', '.join(BACKENDS)}")


@dataclass(frozen=True)
class EngineChoice:
    """Which decoding engine to use and why (the reason is logged)."""

    engine: str  # "vllm" or "batch_decoder"
    reason: str


def choose_rollout_engine(device: Any, *, vllm_installed: bool | None = None) -> EngineChoice:
    """The fastest engine present for rollouts on ``device`` (a ``torch.device``, or its name): on CUDA
    vLLM when it is installed (a LoRA request per checkpoint; the design card's choice for rollouts),
    otherwise the continuous-batching decoder (``inference/batch_decoder``), which is also the CPU's.
    ``vllm_installed``: None looks for the package (without importing it). The choice and its reason
    are logged."""
    kind = getattr(device, "type", None) or str(device).split(":", 1)[0].strip().lower()
    if vllm_installed is None:
        vllm_installed = importlib.util.find_spec("vllm") is not None
    if kind != "cuda":
        choice = EngineChoice("batch_decoder", f"the device is {kind or 'unnamed'}, not CUDA: vLLM runs on CUDA only")
    elif vllm_installed:
        choice = EngineChoice("vllm", "CUDA with vLLM installed: vLLM is the fastest engine present")
    else:
        choice = EngineChoice("batch_decoder", "CUDA without vLLM: pip install 'tentalis[vllm]' for the faster engine")
    log.info("rollout engine: %s (%s)", choice.engine, choice.reason)
    return choice
