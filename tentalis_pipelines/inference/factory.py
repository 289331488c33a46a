"""Backends by name. Kept apart from ``base`` (the interface every backend imports), so the interface
and its implementations never import each other."""

from __future__ import annotations

from tentalis_pipelines.inference.base import BackendNotAvailable, GenerationBackend

BACKENDS = ("transformers", "openai", "vllm")


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
