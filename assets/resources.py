"""Dagster resources: configuration a person can read and change in the UI or with env vars.

They live on the Dagster side (the library never imports Dagster): each mirrors a library config
(``PolicySettings``, ``GRPOConfig``) field for field and builds it, so the library's config stays the one
place that defines a setting."""

from __future__ import annotations

import dataclasses
import os

from dagster import ConfigurableResource, EnvVar
from pydantic import Field

from assets import launchers
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.policy import PolicySettings
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


def mirrored(config_cls: type, name: str):
    """The resource field for ``config_cls.<name>``: the same default and help, so the library's config
    stays the one place that defines a setting (tests/test_resources.py checks every field is mirrored)."""
    f = {f.name: f for f in dataclasses.fields(config_cls)}[name]
    default = f.default_factory() if f.default is dataclasses.MISSING else f.default
    return Field(default=list(default) if isinstance(default, tuple) else default, description=f.metadata.get("help"))


def _build(config_cls: type, resource: ConfigurableResource, **overrides):
    """``config_cls`` from the resource's mirrored fields (validated once, by the config)."""
    names = {f.name for f in dataclasses.fields(config_cls)}
    values = {k: v for k, v in resource.model_dump().items() if k in names}
    return config_cls(**{**values, **overrides})


class PolicyResource(ConfigurableResource):
    """The policy that samples rollouts: :class:`~tentalis_pipelines.policy.PolicySettings`, field for
    field (see its help). ``model`` and ``base_url`` left unset are read when the resource is used, from
    ``$TENTALIS_MODEL`` (else ``embedded``) and ``$OPENAI_BASE_URL``, so that a run config that sets only
    some fields (the CLI's, a CI run.yaml) never silently swaps the model for the default."""

    model: str | None = Field(default=None, description="'embedded' or a local model folder (unset: $TENTALIS_MODEL, else embedded)")
    backend: str = mirrored(PolicySettings, "backend")
    num_generations: int = mirrored(PolicySettings, "num_generations")
    max_new_tokens: int = mirrored(PolicySettings, "max_new_tokens")
    temperature: float = mirrored(PolicySettings, "temperature")
    top_p: float = mirrored(PolicySettings, "top_p")
    seed: int = mirrored(PolicySettings, "seed")
    max_batch_tokens: int = mirrored(PolicySettings, "max_batch_tokens")
    device: str = mirrored(PolicySettings, "device")
    dtype: str = mirrored(PolicySettings, "dtype")
    worked_example: bool = mirrored(PolicySettings, "worked_example")
    max_prompt_tokens: int = mirrored(PolicySettings, "max_prompt_tokens")
    base_url: str | None = mirrored(PolicySettings, "base_url")
    served_model: str | None = mirrored(PolicySettings, "served_model")
    max_concurrency: int = mirrored(PolicySettings, "max_concurrency")
    skills_top_k: int = mirrored(PolicySettings, "skills_top_k")

    def settings(self) -> PolicySettings:
        return _build(PolicySettings, self, model=self.model or os.environ.get("TENTALIS_MODEL") or "embedded",
                      base_url=self.base_url or os.environ.get("OPENAI_BASE_URL") or None)


class TrainerResource(ConfigurableResource):
    """GRPO-family training: :class:`~tentalis_pipelines.training.trainer.GRPOConfig`, field for field
    (TRL's names; see its help), except ``temperature`` and ``max_completion_length``, which come from
    the policy that sampled. Plus when a checkpoint trains and what promotes it."""

    loss_type: str = mirrored(GRPOConfig, "loss_type")
    beta: float = mirrored(GRPOConfig, "beta")
    epsilon: float | None = mirrored(GRPOConfig, "epsilon")
    epsilon_high: float | None = mirrored(GRPOConfig, "epsilon_high")
    importance_sampling_level: str | None = mirrored(GRPOConfig, "importance_sampling_level")
    num_iterations: int = mirrored(GRPOConfig, "num_iterations")
    old_logprobs: str = mirrored(GRPOConfig, "old_logprobs")
    learning_rate: float = mirrored(GRPOConfig, "learning_rate")
    lr_scheduler_type: str = mirrored(GRPOConfig, "lr_scheduler_type")
    warmup_ratio: float = mirrored(GRPOConfig, "warmup_ratio")
    warmup_steps: int = mirrored(GRPOConfig, "warmup_steps")
    max_steps: int = mirrored(GRPOConfig, "max_steps")
    weight_decay: float = mirrored(GRPOConfig, "weight_decay")
    max_grad_norm: float = mirrored(GRPOConfig, "max_grad_norm")
    per_step_rows: int = mirrored(GRPOConfig, "per_step_rows")
    micro_batch_tokens: int = mirrored(GRPOConfig, "micro_batch_tokens")
    shuffle: bool = mirrored(GRPOConfig, "shuffle")
    share_prompt_prefix: bool = mirrored(GRPOConfig, "share_prompt_prefix")
    gradient_checkpointing: bool = mirrored(GRPOConfig, "gradient_checkpointing")
    lora_r: int = mirrored(GRPOConfig, "lora_r")
    lora_alpha: int = mirrored(GRPOConfig, "lora_alpha")
    lora_dropout: float = mirrored(GRPOConfig, "lora_dropout")
    lora_target_modules: list[str] = mirrored(GRPOConfig, "lora_target_modules")
    seed: int = mirrored(GRPOConfig, "seed")
    device: str = mirrored(GRPOConfig, "device")
    dtype: str = mirrored(GRPOConfig, "dtype")
    scale_rewards: str | None = mirrored(GRPOConfig, "scale_rewards")
    dynamic_sampling: bool | None = mirrored(GRPOConfig, "dynamic_sampling")
    overlong_buffer: int | None = mirrored(GRPOConfig, "overlong_buffer")
    advantage_mode: str = mirrored(GRPOConfig, "advantage_mode")
    w_rl: float = mirrored(GRPOConfig, "w_rl")
    w_opd: float = mirrored(GRPOConfig, "w_opd")
    opd_teacher: str = mirrored(GRPOConfig, "opd_teacher")
    opd_teacher_model: str = mirrored(GRPOConfig, "opd_teacher_model")
    opd_clip: float = mirrored(GRPOConfig, "opd_clip")
    opd_min_effect: float = mirrored(GRPOConfig, "opd_min_effect")
    guide: bool = mirrored(GRPOConfig, "guide")
    guide_generations: int = mirrored(GRPOConfig, "guide_generations")
    guide_importance: str = mirrored(GRPOConfig, "guide_importance")
    guide_shaping_gamma: float = mirrored(GRPOConfig, "guide_shaping_gamma")
    guide_with_hint: bool = mirrored(GRPOConfig, "guide_with_hint")
    guide_answer_format: str = mirrored(GRPOConfig, "guide_answer_format")
    guide_rescue: str = mirrored(GRPOConfig, "guide_rescue")
    guide_prefix_max_fraction: float = mirrored(GRPOConfig, "guide_prefix_max_fraction")
    guide_prefix_threshold: float = mirrored(GRPOConfig, "guide_prefix_threshold")
    episode_format_weight: float = mirrored(GRPOConfig, "episode_format_weight")
    max_policy_lag: int = mirrored(GRPOConfig, "max_policy_lag")
    grounding_policy: str = mirrored(GRPOConfig, "grounding_policy")
    grounding_penalty: float = mirrored(GRPOConfig, "grounding_penalty")
    promotion: str = Field(default="gate", description="gate: the benchmarks decide (see the benchmark resource); always: promote on training")
    fresh_trajectory_threshold: int = Field(default=64, description="fresh trajectories of the serving policy that trigger training (sensor fresh_trajectories)")
    launcher: str = Field(default="in_process", description="where training runs (training/launchers.py, docs/launchers.md): in_process, "
                          "subprocess (Dagster Pipes), ray (a Ray job via dagster-ray at ray_address); tinker is refused, see the docs")
    ray_address: str | None = Field(default=None, description="launcher ray: the Ray dashboard's address, e.g. http://head:8265 "
                                    "(unset: $TENTALIS_RAY_ADDRESS)")
    ray_python: str = Field(default="python", description="launcher ray: the interpreter on the cluster that has Tentalis installed")
    ray_num_gpus: float = Field(default=0.0, description="launcher ray: GPUs the training job asks the cluster for")
    # Idle-window training (sensor idle_window, job idle_train_job; docs/training.md#idle-window-training).
    idle_minutes: float = Field(default=10.0, description="minutes the gateway must have served no model request before a window trains")
    idle_hours: str = Field(default="", description="UTC time of day windows may open, 'HH:MM-HH:MM' (may wrap midnight); empty: any time")
    progress_every: int = Field(default=4, description="micro-steps between saves of a window's progress (adapter, optimizer, position, RNG)")

    def config(self, max_completion_length: int | None = None) -> GRPOConfig:
        """The training config (``max_completion_length``: the policy's ``max_new_tokens``)."""
        extra = {} if max_completion_length is None else {"max_completion_length": max_completion_length}
        return _build(GRPOConfig, self, **extra)

    def training_launcher(self, context=None):
        """The launcher the ``checkpoints`` asset hands training to (``context``: its execution context,
        which the Pipes launchers stream logs into)."""
        return launchers.make_launcher(self.launcher, context, ray_address=self.ray_address or os.environ.get("TENTALIS_RAY_ADDRESS"),
                                       python=None if self.launcher != "ray" else self.ray_python, num_gpus=self.ray_num_gpus)

    def trajectory_settings(self, max_completion_length: int) -> dict:
        """How trajectories are built for this algorithm (see ``GRPOConfig.trajectory_settings``)."""
        return self.config(max_completion_length).trajectory_settings()


class ReviewResource(ConfigurableResource):
    """How rollouts are judged: the step scorer (``calculator``, the LLM ``judge`` with ``num_votes``
    votes per step, or ``prm_head``, the newest trained PRM head: ``tentalis prm train``) and the manager (``verifier``, ``llm``, ``human``, or ``hackable``, the reward-hacking
    experiment's length-paying scorer; set it per run to choose per batch). The judge and the llm manager
    use ``judge_model`` (``embedded`` or a local folder). ``reward_weights`` (JSON, empty = the
    per-environment defaults) sets how outcome, format, process and manager add up to the reward."""

    manager: str = "verifier"
    step_scorer: str = "calculator"
    judge_model: str = "embedded"
    num_votes: int = 3
    judge_temperature: float = 0.7
    judge_forced_verdict: bool = True
    manager_max_new_tokens: int = 96
    hint_prefix: str = Field(default="", description="the words every llm manager hint starts with, pre-filled (e.g. 'Compute': "
                             "a small manager then names what to compute); serve a trained manager with the prefix it was "
                             "trained with (`tentalis manager train --hint-prefix`)")
    grounding: bool = Field(default=False, description="write grounding_flags: the claims of agent turns that their session's "
                            "tool outputs do not support (docs/grounding.md); trainer.grounding_policy decides what training does")
    grounding_tagger: str = Field(default="", description="a trained grounding tagger folder joined with the rules "
                                  "(experiments/grounding); empty: the deterministic check alone")
    reward_weights: str = Field(default="", description='JSON weights of the reward components for every environment, e.g. '
                                '{"outcome": 0, "format": 0, "process": 0, "manager": 1}; empty: the per-environment defaults')

    def weights(self):
        """The ``reward_weights`` setting parsed (None: the per-environment defaults)."""
        from tentalis_pipelines.rewards.scoring import parse_weights

        return parse_weights(self.reward_weights)

    def judge(self, models_dir):
        from tentalis_pipelines.inference.factory import make_backend
        from tentalis_pipelines.inference.models import resolve_model
        from tentalis_pipelines.rewards.judge import JudgeConfig, JudgePRM

        backend = make_backend("transformers", model_dir=resolve_model(self.judge_model, models_dir))
        cfg = JudgeConfig(num_votes=self.num_votes, temperature=self.judge_temperature, forced_verdict=self.judge_forced_verdict)
        return JudgePRM(backend, cfg)

    def step_judge(self, paths, scorer: str | None = None):
        """What scores steps for ``scorer`` (default: ``step_scorer``): the LLM judge, the newest PRM head
        (``PRMHeadNotTrained``, naming `tentalis prm train`, when none is stored; ``PRMHeadGameable`` when
        it reads the model's surprise, which a policy learns to game), or None (the calculator)."""
        scorer = scorer or self.step_scorer
        if scorer == "judge":
            return self.judge(paths.models)
        if scorer == "prm_head":
            from tentalis_pipelines.inference.models import resolve_model
            from tentalis_pipelines.reviewers.prm_reviewer import PRMHeadScorer, step_scorer_version

            folder = step_scorer_version(paths.home)  # the clear error first, before a model is loaded
            return PRMHeadScorer(paths.home, resolve_model(self.judge_model, paths.models), version=folder.name)
        return None

    def llm_manager(self, models_dir, rubric: str | None = None, adapter_dir=None, version: str = "base"):
        """The llm manager on ``judge_model``; ``rubric`` replaces its default rubric (a re-score's);
        ``adapter_dir``/``version``: a trained manager's adapter and id (the serving one:
        ``serving.serving_policy(lake, "manager")``), recorded in each review's ``reviewer``; a checkpoint with a
        score adapter (``llm_manager.SCORE_ADAPTER``) writes its scores with it."""
        from tentalis_pipelines.inference.factory import make_backend
        from tentalis_pipelines.inference.models import resolve_model
        from tentalis_pipelines.rewards.llm_manager import RUBRIC, LLMManager, score_adapter_of

        model_dir = resolve_model(self.judge_model, models_dir)
        score_dir = score_adapter_of(adapter_dir)
        return LLMManager(make_backend("transformers", model_dir=model_dir, adapter_dir=adapter_dir),
                          max_new_tokens=self.manager_max_new_tokens, rubric=rubric or RUBRIC, version=version,
                          hint_prefix=self.hint_prefix,
                          score_backend=make_backend("transformers", model_dir=model_dir, adapter_dir=score_dir) if score_dir else None)


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
