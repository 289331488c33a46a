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
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    seconds: float
    logprobs: list[float] | None = field(default=None)


class GenerationBackend(Protocol):
    """Generates ``num_generations`` samples for each prompt (already rendered to text)."""

    name: str
    model_name: str

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Generation]]: ...


class BackendNotAvailable(RuntimeError):
    pass


def make_backend(kind: str, **kwargs) -> GenerationBackend:
    """Construct a backend by name; backends that need extras fail with a clear message."""
    if kind == "transformers":
        from tentalis_pipelines.inference.transformers_backend import TransformersBackend

        return TransformersBackend(**kwargs)
    if kind == "vllm":
        try:
            import vllm  # noqa: F401
        except ImportError:
            raise BackendNotAvailable(
                "backend 'vllm' needs vLLM and a GPU: pip install 'tentalis[vllm]' on a CUDA machine, "
                "or choose backend='transformers'"
            ) from None
        raise BackendNotAvailable("backend 'vllm' is not wired into this version yet; use 'transformers'")
    raise BackendNotAvailable(f"unknown backend {kind!r}: choose 'transformers' or 'vllm'")
