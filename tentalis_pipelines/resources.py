"""Dagster resources: configuration a person can read and change in the UI or with env vars."""

from __future__ import annotations

import dataclasses
import os

from dagster import ConfigurableResource, EnvVar

from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.pipeline import PolicySettings
from tentalis_pipelines.settings import Paths, lakehouse_location
from tentalis_pipelines.training.trainer import GRPOConfig


def env_or(name: str, default):
    """``EnvVar(name)`` when the variable is set (the UI then shows where the value came from), else the default."""
    return EnvVar(name) if os.environ.get(name) else default


class LakehouseResource(ConfigurableResource):
    """Where state lives: ``home`` (default ``$TENTALIS_HOME`` or ``./.tentalis``) holds the Delta
    tables, checkpoints, model cache and inbox. ``lakehouse_uri`` (default ``$TENTALIS_LAKEHOUSE_URI``)
    moves the Delta tables elsewhere, e.g. ``s3://bucket/prefix``; the store's credentials and endpoint
    come from the environment (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ...), never from run config."""

    home: str | None = None
    lakehouse_uri: str | None = None  # None = $TENTALIS_LAKEHOUSE_URI, else <home>/lakehouse

    def paths(self) -> Paths:
        paths = Paths.from_env(self.home)
        if self.lakehouse_uri:
            paths = dataclasses.replace(paths, lakehouse_uri=lakehouse_location(self.lakehouse_uri))
        return paths.ensure()

    def lakehouse(self) -> Lakehouse:
        return Lakehouse(self.paths().lakehouse)


class PolicyResource(ConfigurableResource):
    """The policy that samples rollouts: model (``embedded`` = SmolLM2-135M-Instruct, or a local folder),
    backend and sampling settings (TRL names: ``num_generations``, ``temperature``).

    ``backend``: ``transformers`` (default), ``openai`` (an OpenAI-compatible server at ``base_url``,
    default ``$OPENAI_BASE_URL``; the API key comes from ``$OPENAI_API_KEY``; ``model`` still names the
    local folder whose tokenizer renders prompts) or ``vllm`` (GPU, ``pip install 'tentalis[vllm]'``)."""

    # None = $TENTALIS_MODEL, else embedded; read when the resource is used, so that a run config that
    # sets only some fields (the CLI's, a CI run.yaml) never silently swaps the model for the default.
    model: str | None = None
    backend: str = "transformers"
    num_generations: int = 4
    max_new_tokens: int = 128
    temperature: float = 0.8
    top_p: float = 1.0
    seed: int = 0
    base_url: str | None = None  # None = $OPENAI_BASE_URL (read when used)
    served_model: str | None = None  # the model name the server knows (default: the policy's model name)
    max_concurrency: int = 8
    device: str = "auto"  # transformers backend: auto = CUDA when present
    dtype: str = "auto"  # transformers backend: auto = bf16 where native (this CPU: AMX-BF16), else float32
    max_prompt_tokens: int = 2048  # task prompts longer than this (policy tokenizer) are quarantined at `tasks`

    def settings(self) -> PolicySettings:
        return PolicySettings(
            model=self.model or os.environ.get("TENTALIS_MODEL") or "embedded", backend=self.backend, num_generations=self.num_generations,
            max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p, seed=self.seed,
            base_url=self.base_url or os.environ.get("OPENAI_BASE_URL") or None, served_model=self.served_model, max_concurrency=self.max_concurrency,
            device=self.device, dtype=self.dtype, max_prompt_tokens=self.max_prompt_tokens,
        )


class TrainerResource(ConfigurableResource):
    """GRPO-family training settings (names as in TRL's GRPOConfig) and the promotion policy."""

    loss_type: str = "grpo"
    beta: float = 0.04
    epsilon: float | None = None  # default: 0.2, or GSPO's 3e-4 at sequence level
    epsilon_high: float | None = None  # default: epsilon, DAPO's 0.28, or GSPO's 4e-4
    importance_sampling_level: str | None = None  # token | sequence (default: sequence for gspo)
    num_iterations: int = 1
    old_logprobs: str = "recompute"  # recompute (one pre-update pass) | sampling (stored per-token log-probs)
    learning_rate: float = 1e-4
    lr_scheduler_type: str = "constant"
    warmup_steps: int = 0
    max_steps: int = 0  # horizon of linear/cosine schedules across the whole chain of cycles
    per_step_rows: int = 64
    gradient_checkpointing: bool = False
    device: str = "auto"  # auto: CUDA when present
    dtype: str = "auto"  # auto: bf16 where the hardware computes it natively, else float32
    seed: int = 0  # LoRA init and row shuffling
    scale_rewards: str | None = None  # default: "none" for dr_grpo, else "group"
    dynamic_sampling: bool | None = None  # default: on for dapo
    advantage_mode: str = "outcome"  # outcome | process (DeepSeekMath, from the step scores)
    overlong_buffer: int | None = None  # DAPO soft overlong punishment window (tokens); default: 1/4 of max for dapo
    promotion: str = "gate"  # gate: benchmarks decide (see BenchmarkResource); always: promote on training
    fresh_trajectory_threshold: int = 64

    def trajectory_settings(self, max_completion_length: int) -> dict:
        """How trajectories are built for this algorithm (TRL/DAPO defaults unless set)."""
        dapo = self.loss_type == "dapo"
        return {
            "scale_rewards": self.scale_rewards or ("none" if self.loss_type == "dr_grpo" else "group"),
            "dynamic_sampling": dapo if self.dynamic_sampling is None else self.dynamic_sampling,
            "overlong_buffer": (max_completion_length // 4 if dapo else 0) if self.overlong_buffer is None else self.overlong_buffer,
            "max_completion_length": max_completion_length,
            "advantage_mode": self.advantage_mode,
        }

    def config(self) -> GRPOConfig:
        return GRPOConfig(
            loss_type=self.loss_type, beta=self.beta, epsilon=self.epsilon, epsilon_high=self.epsilon_high,
            importance_sampling_level=self.importance_sampling_level, num_iterations=self.num_iterations,
            old_logprobs=self.old_logprobs, learning_rate=self.learning_rate, lr_scheduler_type=self.lr_scheduler_type,
            warmup_steps=self.warmup_steps, max_steps=self.max_steps, per_step_rows=self.per_step_rows,
            gradient_checkpointing=self.gradient_checkpointing, device=self.device, dtype=self.dtype, seed=self.seed,
        )


class ReviewResource(ConfigurableResource):
    """How rollouts are judged: the step scorer (``calculator`` or the LLM ``judge`` with ``num_votes``
    votes per step) and the manager (``verifier``, ``llm`` or ``human``; set it per run to choose per
    batch). The judge and the llm manager use ``judge_model`` (``embedded`` or a local folder)."""

    manager: str = "verifier"
    step_scorer: str = "calculator"
    judge_model: str = "embedded"
    num_votes: int = 3
    judge_temperature: float = 0.7
    judge_forced_verdict: bool = True
    manager_max_new_tokens: int = 96

    def judge(self, models_dir):
        from tentalis_pipelines.inference.factory import make_backend
        from tentalis_pipelines.inference.models import resolve_model
        from tentalis_pipelines.rewards.judge import JudgeConfig, JudgePRM

        backend = make_backend("transformers", model_dir=resolve_model(self.judge_model, models_dir))
        cfg = JudgeConfig(num_votes=self.num_votes, temperature=self.judge_temperature, forced_verdict=self.judge_forced_verdict)
        return JudgePRM(backend, cfg)

    def llm_manager(self, models_dir):
        from tentalis_pipelines.inference.factory import make_backend
        from tentalis_pipelines.inference.models import resolve_model
        from tentalis_pipelines.rewards.llm_manager import LLMManager

        return LLMManager(make_backend("transformers", model_dir=resolve_model(self.judge_model, models_dir)),
                          max_new_tokens=self.manager_max_new_tokens)


class BenchmarkResource(ConfigurableResource):
    """Which benchmarks run for every new checkpoint, and the promotion gate's benchmark and margin.

    ``limit`` overrides each benchmark's CPU-sized default subset (arithmetic 64, gsm8k 100,
    math500 100, humaneval 20); the subset is fixed by ``seed``."""

    benchmarks: list[str] = ["arithmetic"]
    gate_benchmark: str = "arithmetic"
    gate_margin: float = 0.0
    limit: int | None = None
    seed: int = 0
    max_new_tokens: int | None = None  # default per benchmark (arithmetic 128, gsm8k 256, math500 320, humaneval 256)


class CycleResource(ConfigurableResource):
    """What the nightly learning cycle generates: a seeded batch of arithmetic word problems (the next
    unused training seed) of ``num_tasks`` tasks at difficulty ``levels`` (1-4)."""

    num_tasks: int = 16
    levels: list[int] = [1, 2]
