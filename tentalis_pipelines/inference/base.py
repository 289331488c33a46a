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
