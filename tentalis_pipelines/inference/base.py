"""One interface for every generation backend (transformers, vLLM, OpenAI-compatible servers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class SamplingParams:
    num_generations: int = 4
    max_new_tokens: int = 128
    temperature: float = 0.8
    top_p: float = 1.0
    seed: int = 0
    stop: tuple[str, ...] = ("</answer>",)


@dataclass
class Generation:
    """One sampled completion. ``logprobs`` (when kept) are the sampled tokens' log-probabilities,
    aligned one-to-one with ``token_ids``. ``completion_tokens`` defaults to ``len(token_ids)``; a
    backend that knows the count but not the ids (a server without token ids or tokenizer) sets it."""

    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    seconds: float
    logprobs: list[float] | None = field(default=None)
    completion_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.completion_tokens is None:
            self.completion_tokens = len(self.token_ids)


class GenerationBackend(Protocol):
    """Generates ``num_generations`` samples for each prompt (already rendered to text)."""

    name: str
    model_name: str

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Generation]]: ...


class BackendNotAvailable(RuntimeError):
    pass


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
