"""A GRPO-family trainer on a LoRA adapter (peft), on per-completion-token log-probs.

* log-probs are computed only for completion tokens (``logits_to_keep``), each row at the temperature
  it was sampled with (``TrainSample.temperature``), in fp32 on top of bf16/fp32 logits;
* the reference policy for the KL is the base model: the adapter disabled (no second model in memory),
  and no reference pass at all when ``beta == 0``;
* old (behaviour-policy) log-probs, as TRL: when a generation batch takes exactly one optimizer step
  (one step, ``num_iterations == 1``) the ratio is 1 and old = the detached current log-probs; whenever
  it takes more (``per_step_rows`` smaller than the batch, or ``num_iterations > 1``) one no-grad pass
  *before the first update* fixes them, so later steps see a real importance ratio and the clip binds.
  ``old_logprobs='sampling'`` uses the per-token log-probs stored at sampling time instead (always,
  also for a single step: it corrects any generation/training mismatch); ``old_logprobs='current'`` takes the
  policy's own at every step (ratio 1, nothing clipped or capped): for demonstrations that were never sampled
  (the manager's score targets), where a ratio against the pre-update policy shrinks the weight of every
  demonstration the model moves away from, so over many steps the class that gains first takes all
  (experiments/manager_rl, round 17);
* the optimizer (AdamW moments and step counts) and the global step of the LR schedule are returned
  in ``TrainResult.state`` and saved with each checkpoint (``trainer_state.pt``), so a chain of
  learning cycles trains like one long run instead of restarting Adam from zero every cycle;
* rows are split into ``ceil(n / per_step_rows)`` optimizer steps of equal size (within one row:
  :func:`step_sizes`), never a full step and a remainder: AdamW's step is about the learning rate
  whatever the batch, so a remainder of a few rows (64 rollouts plus 3 guided samples: 64 + 3) would move
  the adapter as far on those rows' gradient alone as the full step did on all of them. Each step is cut
  into micro-batches by a token budget, with gradient accumulation and step-level loss normalisers.
"""

from __future__ import annotations

import math
import random
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from tentalis_pipelines.config_fields import config_field
from tentalis_pipelines.hardware import autocast, dtype_name, resolve_device, resolve_dtype
from tentalis_pipelines.training.losses import (
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_TYPES,
    aggregate,
    per_token_loss,
    shaped_guided_loss,
)
from tentalis_pipelines.training.progress import Checkpointing, Progress, StaleProgress, fingerprint

# peft asks transformers 5 for the deprecated `is_gradient_checkpointing` on every adapter load.
warnings.filterwarnings("ignore", message=r".*is_gradient_checkpointing.*", category=FutureWarning)

DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TRAINER_STATE_FILE = "trainer_state.pt"
OLD_LOGPROBS = ("recompute", "sampling", "current")
SCALE_REWARDS = ("group", "none")
ADVANTAGE_MODES = ("outcome", "process")
GUIDE_IMPORTANCE = ("clip", "shaping")
GUIDE_ANSWER_FORMATS = ("lenient", "tagged")
GUIDE_RESCUES = ("hint", "prefix", "both")  # environment batches: training/episode_guide.py
GROUNDING_POLICIES = ("off", "penalize", "block")  # training/grounding_policy.py


@dataclass
class GRPOConfig:
    """Training settings, named as in TRL's GRPOConfig where the idea is the same. One config for the
    training concern: the ``trainer`` Dagster resource mirrors these fields with the same names,
    defaults and help (``assets/resources.py``), ``tentalis learn`` sets some of them, and
    :meth:`trajectory_settings` turns the reward-shaping ones into how trajectories are built.

    The defaults are the recipe measured in the README's learning curve (DAPO, ``beta = 0``, lr 2e-4 on
    a rank-16 LoRA). ``epsilon``/``epsilon_high`` default by algorithm: 0.2 (token level), DAPO's
    clip-higher 0.28, and GSPO's 3e-4/4e-4 when ``importance_sampling_level == 'sequence'`` (a
    sequence-level ratio moves far less than a token's, so 0.2 would never bind).
    """

    loss_type: str = config_field("dapo", "grpo | dr_grpo | dapo | cispo | gspo (TRL's names and definitions)")
    beta: float = config_field(0.0, "k3 KL coefficient against the base model (adapter disabled); 0 skips the reference pass")
    epsilon: float | None = config_field(None, "lower clip of the importance ratio (default: 0.2, GSPO's 3e-4 at sequence level)")
    epsilon_high: float | None = config_field(None, "upper clip (default: epsilon, DAPO's 0.28, GSPO's 4e-4)")
    importance_sampling_level: str | None = config_field(None, "token | sequence (default: sequence for gspo, else token)")
    num_iterations: int = config_field(1, "updates per batch of rollouts (TRL's mu)")
    old_logprobs: str = config_field("recompute", "recompute (one pre-update pass) | sampling (the per-token log-probs stored at "
                                     "sampling time) | current (the policy's own at each step: ratio 1, for demonstrations)")
    learning_rate: float = config_field(2e-4, "AdamW learning rate of the LoRA parameters")
    lr_scheduler_type: str = config_field("constant", "constant | linear | cosine")
    warmup_ratio: float = config_field(0.0, "warm-up as a fraction of max_steps")
    warmup_steps: int = config_field(0, "warm-up steps (overrides warmup_ratio when > 0)")
    max_steps: int = config_field(0, "horizon of linear/cosine schedules across the whole chain of cycles (0: this call's steps)")
    weight_decay: float = config_field(0.0, "AdamW weight decay")
    max_grad_norm: float = config_field(1.0, "gradient clipping norm")
    per_step_rows: int = config_field(64, "most rows per optimizer step (a batch of n rows takes ceil(n / per_step_rows) steps of "
                                      "equal size, within one row)")
    micro_batch_tokens: int = config_field(4096, "token budget of one forward/backward micro-batch (gradient accumulation)")
    shuffle: bool = config_field(True, "shuffle rows (by seed) before cutting them into steps")
    # Rows that share a prompt (a group's samples) run the prompt once and branch from its KV cache:
    # the prompt (system message + worked example) is most of each row's tokens. Gradient checkpointing
    # cannot keep a KV cache, so it switches this off (a documented trade: memory for prefix reuse).
    share_prompt_prefix: bool = config_field(True, "run a group's common prompt once and branch from its KV cache")
    gradient_checkpointing: bool = config_field(False, "recompute activations in the backward pass (less memory, no prefix sharing)")
    temperature: float = config_field(0.8, "sampling temperature of rows that do not carry their own")
    max_completion_length: int = config_field(128, "completion length limit (set from the policy's max_new_tokens)")
    lora_r: int = config_field(16, "LoRA rank")
    lora_alpha: int = config_field(32, "LoRA alpha")
    lora_dropout: float = config_field(0.0, "LoRA dropout")
    lora_target_modules: tuple[str, ...] = config_field(DEFAULT_LORA_TARGETS, "modules that get a LoRA adapter")
    seed: int = config_field(0, "LoRA init and row shuffling")
    device: str = config_field("auto", "auto (CUDA when present) | cpu | cuda[:N]")
    dtype: str = config_field("auto", "auto (bf16 where the hardware computes it natively) | float32 | bfloat16 | float16")
    # How trajectories are built for training (used by the `trajectories` stage, not by train_grpo).
    scale_rewards: str | None = config_field(None, "group | none: how advantages are scaled (default: none for dr_grpo, else group)")
    dynamic_sampling: bool | None = config_field(None, "drop groups whose rewards are all equal (default: on for dapo)")
    overlong_buffer: int | None = config_field(None, "DAPO soft overlong punishment window in tokens (default: 1/4 of max for dapo, else 0)")
    advantage_mode: str = config_field("outcome", "outcome (one advantage per sample) | process (DeepSeekMath, per step and token)")
    # Hinted on-policy distillation (training/opd.py): per token, A = w_rl * A_rl + w_opd * opd.
    w_rl: float = config_field(1.0, "weight of the RL (group-relative) advantage; 0 = OPD only")
    w_opd: float = config_field(0.0, "weight of the hinted on-policy distillation signal per token; 0 = RL only (OpenClaw-RL's combine: 1)")
    opd_teacher: str = config_field("self", "self (the policy that sampled, given the hint) | a local model folder sharing the policy's tokenizer "
                          "| an OpenAI-compatible server's URL with prompt log-probs (vLLM, `tentalis serve`; log-probs at temperature 1)")
    opd_teacher_model: str = config_field("", "the model name to request from an opd_teacher server (its key: $TENTALIS_OPD_TEACHER_API_KEY)")
    opd_clip: float = config_field(1.0, "clip of log pi_teacher - log pi_student per token (OpenClaw-RL's adv_diff_clip)")
    opd_min_effect: float = config_field(0.01, "a hint whose mean |signal| per token is below this gets no OPD term (decision no_effect)")
    # Hint-guided resampling (training/guide.py): a group whose every sample failed is resampled with its
    # manager's hint in the context; the hinted successes train the student without the hint, weighted
    # by the importance ratio pi(a|s) / pi_behaviour(a|s+hint).
    guide: bool = config_field(False, "resample groups where every sample failed with the manager's hint in context and train "
                               "on the hinted successes without the hint (`tentalis learn --method guide`)")
    guide_generations: int = config_field(8, "hinted samples drawn per all-fail group (guide on)")
    guide_importance: str = config_field("clip", "guided rows' ratio pi(a|s) / pi_b(a|s+hint): clip (the loss type's clipped surrogate, "
                                         "Guide-GRPO) | shaping (LUFFY's unclipped r / (r + guide_shaping_gamma))")
    guide_shaping_gamma: float = config_field(0.1, "gamma of LUFFY's policy shaping r / (r + gamma) (guide_importance = shaping)")
    guide_with_hint: bool = config_field(True, "false: resample all-fail groups without the hint (the ablation that tells the "
                                         "hint's words from more samples for the hard tasks)")
    guide_answer_format: str = config_field("lenient", "which hinted successes join their group: lenient (every one the verifier "
                                            "accepts, a tagged answer or an ended completion's last number) | tagged (only those "
                                            "with the answer in <answer> tags, the format the held-out benchmark grades)")
    # Environment batches (training/episode_guide.py): how an all-fail group of episodes is rescued.
    guide_rescue: str = config_field("hint", "environment batches, guide on: how an all-fail group is resampled: hint (the manager's "
                                     "hint after the instruction) | prefix (BREAD: the first k turns of the task's scripted "
                                     "demonstration, k annealed by the level's success) | both")
    guide_prefix_max_fraction: float = config_field(0.5, "the share of the demonstration given as an expert prefix at 0% success "
                                                    "on the level (guide_rescue prefix | both)")
    guide_prefix_threshold: float = config_field(0.5, "the level's success rate at and above which no expert prefix is given; "
                                                 "the prefix shrinks linearly to 0 between 0% and it")
    episode_format_weight: float = config_field(0.0, "environment batches: weight of the format reward (the share of an "
                                                "episode's turns with a well-formed action or tool call) added to the "
                                                "verifier's score; the gate reads the outcome only")
    # Which fresh rows a run may train on (used by the checkpoints stage, not by train_grpo).
    max_policy_lag: int = config_field(0, "train on rows sampled at most this many policy versions behind the serving one "
                                       "(0: only the serving policy's own; older rows are refused and counted)")
    # The grounding check's flags in training (training/grounding_policy.py; used by the checkpoints stage).
    grounding_policy: str = config_field("off", "off | penalize (each token of a claim the session's tool outputs do not support "
                                         "gets advantage -grounding_penalty) | block (a turn with a flag is not trained on)")
    grounding_penalty: float = config_field(1.0, "the negative advantage of a flagged token (grounding_policy = penalize)")

    def __post_init__(self):
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {self.loss_type!r}")
        if self.importance_sampling_level is None:
            self.importance_sampling_level = "sequence" if self.loss_type == "gspo" else "token"
        if self.importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
            raise ValueError(f"importance_sampling_level must be one of {IMPORTANCE_SAMPLING_LEVELS}, "
                             f"got {self.importance_sampling_level!r}")
        sequence = self.importance_sampling_level == "sequence"
        if self.epsilon is None:
            self.epsilon = 3e-4 if sequence else 0.2
        if self.epsilon_high is None:
            # DAPO's clip-higher: a wider upper clip keeps low-probability tokens explorable.
            self.epsilon_high = 4e-4 if sequence else 0.28 if self.loss_type == "dapo" else self.epsilon
        if self.num_iterations < 1:
            raise ValueError("num_iterations must be >= 1")
        if self.old_logprobs not in OLD_LOGPROBS:
            raise ValueError(f"old_logprobs must be one of {OLD_LOGPROBS}, got {self.old_logprobs!r}")
        if self.lr_scheduler_type not in ("constant", "linear", "cosine"):
            raise ValueError("lr_scheduler_type must be constant, linear or cosine")
        if self.per_step_rows < 1:
            raise ValueError("per_step_rows must be >= 1")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be above 0, got {self.learning_rate}")
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")
        if self.scale_rewards is not None and self.scale_rewards not in SCALE_REWARDS:
            raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {self.scale_rewards!r}")
        if self.advantage_mode not in ADVANTAGE_MODES:
            raise ValueError(f"advantage_mode must be one of {ADVANTAGE_MODES}, got {self.advantage_mode!r}")
        if self.w_rl < 0 or self.w_opd < 0 or self.w_rl + self.w_opd == 0:
            raise ValueError(f"w_rl and w_opd must be >= 0 and not both 0, got w_rl={self.w_rl}, w_opd={self.w_opd}")
        if self.opd_teacher.startswith(("http://", "https://")) and not self.opd_teacher_model:
            raise ValueError(f"opd_teacher_model must name the model to request from the teacher server {self.opd_teacher!r}")
        if not self.opd_clip > 0:
            raise ValueError(f"opd_clip must be above 0, got {self.opd_clip}")
        if self.max_policy_lag < 0:
            raise ValueError(f"max_policy_lag must be 0 or more policy versions, got {self.max_policy_lag}")
        if self.opd_min_effect < 0:
            raise ValueError(f"opd_min_effect must be >= 0, got {self.opd_min_effect}")
        if self.guide_generations < 1:
            raise ValueError(f"guide_generations must be >= 1, got {self.guide_generations}")
        if self.guide_importance not in GUIDE_IMPORTANCE:
            raise ValueError(f"guide_importance must be one of {GUIDE_IMPORTANCE}, got {self.guide_importance!r}")
        if self.guide_answer_format not in GUIDE_ANSWER_FORMATS:
            raise ValueError(f"guide_answer_format must be one of {GUIDE_ANSWER_FORMATS}, got {self.guide_answer_format!r}")
        if self.guide_rescue not in GUIDE_RESCUES:
            raise ValueError(f"guide_rescue must be one of {GUIDE_RESCUES}, got {self.guide_rescue!r}")
        if not 0.0 <= self.guide_prefix_max_fraction <= 1.0:
            raise ValueError(f"guide_prefix_max_fraction must be in [0, 1], got {self.guide_prefix_max_fraction}")
        if not 0.0 < self.guide_prefix_threshold <= 1.0:
            raise ValueError(f"guide_prefix_threshold must be in (0, 1], got {self.guide_prefix_threshold}")
        if self.episode_format_weight < 0:
            raise ValueError(f"episode_format_weight must be >= 0, got {self.episode_format_weight}")
        if not self.guide_shaping_gamma > 0:
            raise ValueError(f"guide_shaping_gamma must be above 0, got {self.guide_shaping_gamma}")
        if self.grounding_policy not in GROUNDING_POLICIES:
            raise ValueError(f"grounding_policy must be one of {GROUNDING_POLICIES}, got {self.grounding_policy!r}")
        if self.grounding_penalty < 0:
            raise ValueError(f"grounding_penalty is the size of a negative advantage: it must be >= 0, got {self.grounding_penalty}")
        self.lora_target_modules = tuple(self.lora_target_modules)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["lora_target_modules"] = list(self.lora_target_modules)
        return d

    def trajectory_settings(self, max_completion_length: int | None = None) -> dict:
        """Keyword arguments of the trajectories stage for this algorithm (DAPO defaults unless set)."""
        dapo = self.loss_type == "dapo"
        length = self.max_completion_length if max_completion_length is None else max_completion_length
        return {
            "scale_rewards": self.scale_rewards or ("none" if self.loss_type == "dr_grpo" else "group"),
            "dynamic_sampling": dapo if self.dynamic_sampling is None else self.dynamic_sampling,
            "overlong_buffer": (length // 4 if dapo else 0) if self.overlong_buffer is None else self.overlong_buffer,
            "max_completion_length": length,
            "advantage_mode": self.advantage_mode,
            "w_rl": self.w_rl,
            "w_opd": self.w_opd,
            "guide_answer_format": self.guide_answer_format,
            "episode_format_weight": self.episode_format_weight,
        }


@dataclass
class TrainSample:
    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float
    token_advantages: list[float] | None = None  # process supervision: one advantage per completion token
    old_logps: list[float] | None = None  # per-token log-probs under the sampling policy, at ``temperature``
    temperature: float | None = None  # the temperature this completion was sampled at
    # Per completion token, 1 = trained on, 0 = context only (a multi-turn session's user, system and
    # tool-output tokens between its assistant turns). None = every completion token (single-turn rows).
    loss_mask: list[int] | None = None
    # A hint-guided sample (training/guide.py): sampled with the hint in the context, trained without it.
    # Its ``old_logps`` are the hinted behaviour policy's, and its ratio is always taken against them.
    guided: bool = False


@dataclass
class TrainerState:
    """What continues across learning cycles: AdamW's state and the schedule's global step."""

    optimizer: dict
    global_step: int
    param_names: list[str]


@dataclass
class TrainResult:
    metrics: dict
    history: list[dict] = field(default_factory=list)
    state: TrainerState | None = None


def build_policy(model_dir: Path, parent_adapter: Path | None, config: GRPOConfig):
    """Base model (frozen, on ``config.device`` in ``config.dtype``) with a trainable LoRA adapter in
    fp32 (master weights): a fresh one, or the parent checkpoint's to continue."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
    if parent_adapter is not None:
        model = PeftModel.from_pretrained(base, str(parent_adapter), is_trainable=True)
    else:
        lora = LoraConfig(
            r=config.lora_r,
            lora_alpha=config.lora_alpha,
            lora_dropout=config.lora_dropout,
            target_modules=list(config.lora_target_modules),
            task_type="CAUSAL_LM",
        )
        # A fresh adapter's lora_A is random: seed it, so the same config gives the same run.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            model = get_peft_model(base, lora)
    for p in model.parameters():
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.float()
    return model


def _trainable(model) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def save_trainer_state(folder: str | Path, state: TrainerState) -> Path:
    """Write ``state`` into a checkpoint folder (called inside the atomic save, before the marker)."""
    path = Path(folder) / TRAINER_STATE_FILE
    torch.save({"format": 1, "optimizer": state.optimizer, "global_step": state.global_step,
                "param_names": state.param_names}, path)
    return path


def load_trainer_state(folder: str | Path | None, device: str | torch.device = "cpu") -> TrainerState | None:
    """The state saved with a checkpoint, or None (base model, or a checkpoint from before states were kept)."""
    if folder is None:
        return None
    path = Path(folder) / TRAINER_STATE_FILE
    if not path.exists():
        return None
    raw = torch.load(path, map_location=device, weights_only=True)
    return TrainerState(raw["optimizer"], int(raw["global_step"]), list(raw["param_names"]))


def _row_temperature(s: TrainSample, default: float) -> float:
    return float(s.temperature) if s.temperature is not None else default


def _row_advantages(s: TrainSample) -> list[float]:
    if s.token_advantages is None:
        return [s.advantage] * len(s.completion_ids)
    if len(s.token_advantages) != len(s.completion_ids):
        raise ValueError(f"token_advantages has {len(s.token_advantages)} entries for {len(s.completion_ids)} completion tokens")
    return list(s.token_advantages)


def _row_loss_mask(s: TrainSample) -> list[float]:
    if s.loss_mask is None:
        return [1.0] * len(s.completion_ids)
    if len(s.loss_mask) != len(s.completion_ids):
        raise ValueError(f"loss_mask has {len(s.loss_mask)} entries for {len(s.completion_ids)} completion tokens")
    return [1.0 if m else 0.0 for m in s.loss_mask]


def trained_tokens(s: TrainSample) -> int:
    """How many of a row's completion tokens the loss sees (the length normalisers count these only)."""
    return len(s.completion_ids) if s.loss_mask is None else int(sum(_row_loss_mask(s)))


def pack_samples(samples: list[TrainSample], pad_id: int, device, default_temperature: float = 1.0) -> dict[str, torch.Tensor]:
    """Left-pad prompts and right-pad completions so every completion occupies the last C positions."""
    P = max(len(s.prompt_ids) for s in samples)
    C = max(len(s.completion_ids) for s in samples)
    ids, attn, cmask, lmask, adv = [], [], [], [], []
    for s in samples:
        p, c = s.prompt_ids, s.completion_ids
        ids.append([pad_id] * (P - len(p)) + p + c + [pad_id] * (C - len(c)))
        attn.append([0] * (P - len(p)) + [1] * (len(p) + len(c)) + [0] * (C - len(c)))
        cmask.append([1] * len(c) + [0] * (C - len(c)))
        lmask.append(_row_loss_mask(s) + [0.0] * (C - len(c)))
        adv.append(_row_advantages(s) + [0.0] * (C - len(c)))
    attn_t = torch.tensor(attn, device=device)
    return {
        "input_ids": torch.tensor(ids, device=device),
        "attention_mask": attn_t,
        # Left padding: positions count real tokens only, so a padded row sees the same positions as alone.
        "position_ids": (attn_t.cumsum(-1) - 1).clamp(min=0),
        "completion_mask": torch.tensor(cmask, dtype=torch.float32, device=device),
        # The tokens the loss sees: the completion minus padding and minus each row's loss_mask zeros.
        "loss_mask": torch.tensor(lmask, dtype=torch.float32, device=device),
        "advantages": torch.tensor(adv, dtype=torch.float32, device=device),
        "temperature": torch.tensor([_row_temperature(s, default_temperature) for s in samples], dtype=torch.float32, device=device),
        "completion_len": C,
    }


def pack_samples_shared(samples: list[TrainSample], pad_id: int, device, default_temperature: float = 1.0) -> dict[str, torch.Tensor]:
    """Rows with one common prompt: the prompt once, completions right-padded."""
    C = max(len(s.completion_ids) for s in samples)
    comp, cmask, lmask, adv = [], [], [], []
    for s in samples:
        c = s.completion_ids
        comp.append(list(c) + [pad_id] * (C - len(c)))
        cmask.append([1] * len(c) + [0] * (C - len(c)))
        lmask.append(_row_loss_mask(s) + [0.0] * (C - len(c)))
        adv.append(_row_advantages(s) + [0.0] * (C - len(c)))
    return {
        "shared": True,
        "prompt_ids": torch.tensor([samples[0].prompt_ids], device=device),
        "completion_ids": torch.tensor(comp, device=device),
        # completion_mask is also the attention mask of the completions (every real token is context);
        # loss_mask is what the loss sees.
        "completion_mask": torch.tensor(cmask, dtype=torch.float32, device=device),
        "loss_mask": torch.tensor(lmask, dtype=torch.float32, device=device),
        "advantages": torch.tensor(adv, dtype=torch.float32, device=device),
        "temperature": torch.tensor([_row_temperature(s, default_temperature) for s in samples], dtype=torch.float32, device=device),
        "completion_len": C,
    }


def pack(samples: list[TrainSample], pad_id: int, device, default_temperature: float = 1.0, *, shared: bool = True) -> dict:
    """A micro-batch as tensors: the shared-prefix layout when every row has the same prompt (and
    ``shared``)."""
    first = samples[0].prompt_ids
    if shared and len(samples) > 1 and all(s.prompt_ids == first for s in samples):
        return pack_samples_shared(samples, pad_id, device, default_temperature)
    return pack_samples(samples, pad_id, device, default_temperature)


def _token_logps(logits: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor | float | None) -> torch.Tensor:
    """log softmax(logits / T) at the targets, in fp32; ``temperature`` per row ([rows]) or one float."""
    logits = logits.float()
    if isinstance(temperature, torch.Tensor):
        logits = logits / temperature.clamp(min=1e-6).view(-1, 1, 1)
    elif temperature is not None:
        logits = logits / max(float(temperature), 1e-6)
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def _shared_prefix_logits(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """One prompt pass, its KV cache repeated per row, then the completions on top. Gradients flow
    through the repeated cache into the prompt pass, so this equals the full-sequence computation."""
    prompt, comp, cmask = batch["prompt_ids"], batch["completion_ids"], batch["completion_mask"]
    rows, C = comp.shape
    P = prompt.shape[1]
    out = model(input_ids=prompt, use_cache=True, logits_to_keep=1)
    logits = out.logits[:, -1:, :].expand(rows, 1, -1)  # predicts each row's first completion token
    if C > 1:
        cache = out.past_key_values
        cache.batch_repeat_interleave(rows)
        fed = comp[:, :-1]
        attention = torch.cat([torch.ones(rows, P, dtype=torch.long, device=comp.device), cmask[:, :-1].long()], dim=1)
        positions = torch.arange(P, P + C - 1, device=comp.device).expand(rows, -1)
        rest = model(input_ids=fed, attention_mask=attention, position_ids=positions, past_key_values=cache, use_cache=True).logits
        logits = torch.cat([logits, rest], dim=1)
    return logits


def completion_logps(model, batch: dict[str, torch.Tensor], temperature: float | None = None) -> torch.Tensor:
    """Per-token log-probs of the completion tokens, [rows, C], each row at its own sampling
    temperature (``batch['temperature']``) unless one ``temperature`` is given for all rows."""
    temp = batch.get("temperature") if temperature is None else temperature
    if batch.get("shared"):
        return _token_logps(_shared_prefix_logits(model, batch), batch["completion_ids"], temp)
    C = batch["completion_len"]
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        logits_to_keep=C + 1,
        use_cache=False,
    )
    return _token_logps(out.logits[:, :-1, :], batch["input_ids"][:, -C:], temp)


def prefix_micro_batches(samples: list[TrainSample], token_budget: int) -> list[list[TrainSample]]:
    """One micro-batch per prompt (its group's rows), split when prompt + rows x longest completion
    exceeds ``token_budget``; rows whose prompt is unique fall back to ``micro_batches``."""
    by_prompt: dict[tuple[int, ...], list[TrainSample]] = {}
    for s in samples:
        by_prompt.setdefault(tuple(s.prompt_ids), []).append(s)
    out, singles = [], []
    for prompt, rows in by_prompt.items():
        if len(rows) == 1:
            singles.extend(rows)
            continue
        rows = sorted(rows, key=lambda s: len(s.completion_ids))
        cur, longest = [], 0
        for s in rows:
            c = len(s.completion_ids)
            if cur and len(prompt) + max(longest, c) * (len(cur) + 1) > token_budget:
                out.append(cur)
                cur, longest = [], 0
            cur.append(s)
            longest = max(longest, c)
        out.append(cur)
    return out + (micro_batches(singles, token_budget) if singles else [])


def micro_batches(samples: list[TrainSample], token_budget: int) -> list[list[TrainSample]]:
    """Group rows (sorted by length) so that rows x padded length stays within ``token_budget``."""
    order = sorted(samples, key=lambda s: len(s.prompt_ids) + len(s.completion_ids))
    out, cur, longest = [], [], 0
    for s in order:
        length = len(s.prompt_ids) + len(s.completion_ids)
        if cur and max(longest, length) * (len(cur) + 1) > token_budget:
            out.append(cur)
            cur, longest = [], 0
        cur.append(s)
        longest = max(longest, length)
    if cur:
        out.append(cur)
    return out


def _has_old_logps(s: TrainSample) -> bool:
    """Whether a row carries a sampling log-prob for every token the loss sees (masked tokens need none)."""
    if s.old_logps is None or len(s.old_logps) != len(s.completion_ids):
        return False
    return all(x is not None and math.isfinite(x) for x, m in zip(s.old_logps, _row_loss_mask(s)) if m)


def _stored_old_logps(mb: list[TrainSample], C: int, device) -> torch.Tensor | None:
    """The sampling-time log-probs of a micro-batch, right-padded, or None when any row lacks them.
    Masked tokens (None allowed) get 0.0: finite, and multiplied by a zero mask."""
    if not all(_has_old_logps(s) for s in mb):
        return None
    return torch.tensor([[x if m and x is not None else 0.0 for x, m in zip(s.old_logps, _row_loss_mask(s))] + [0.0] * (C - len(s.old_logps))
                         for s in mb], dtype=torch.float32, device=device)


def guided_behaviour_logps(mb: list[TrainSample], C: int, device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The guided rows of a micro-batch and their hinted behaviour log-probs: ``(rows [R, 1] bool,
    log-probs [R, C])`` right-padded to ``C`` (0.0 on unguided rows and padding), or None when no row is
    guided. A guided row's ratio is always ``pi(a|s) / pi_b(a|s+hint)``: whatever ``old_logprobs`` says,
    a recomputation without the hint would measure the wrong policy."""
    if not any(s.guided for s in mb):
        return None
    for s in mb:
        if s.guided and not _has_old_logps(s):
            raise ValueError("a guided sample has no behaviour log-probs for its completion tokens: re-run its batch's "
                             "guided_rollouts (they are recorded at sampling time and cannot be recomputed without the hint)")
    rows = torch.tensor([[s.guided] for s in mb], dtype=torch.bool, device=device)
    logps = torch.tensor([([float(x) if m else 0.0 for x, m in zip(s.old_logps, _row_loss_mask(s))] if s.guided else [0.0] * len(s.completion_ids))
                          + [0.0] * (C - len(s.completion_ids)) for s in mb], dtype=torch.float32, device=device)
    return rows, logps


def _fixed_logps(model, mb: list[TrainSample], config: GRPOConfig, pad_id: int, device, *, needs_old: bool, shared: bool) -> dict:
    """Reference log-probs (adapter disabled; skipped when beta == 0) and old log-probs (stored
    sampling log-probs with ``old_logprobs='sampling'``; else, when ``needs_old``, one no-grad pass
    now, before any update)."""
    batch = pack(mb, pad_id, device, config.temperature, shared=shared)
    out: dict = {"ref": None, "old": None, "behaviour": guided_behaviour_logps(mb, batch["completion_len"], device)}
    if config.old_logprobs == "sampling":
        out["old"] = _stored_old_logps(mb, batch["completion_len"], device)
    needs_old = needs_old and config.old_logprobs != "current"  # current: the loop's own detached log-probs
    if config.beta == 0.0 and (out["old"] is not None or not needs_old):
        return out
    dtype = resolve_dtype(config.dtype, device)
    with torch.inference_mode(), autocast(device, dtype):
        if config.beta != 0.0:
            with model.disable_adapter():
                out["ref"] = completion_logps(model, batch).clone()
        if out["old"] is None and needs_old:
            out["old"] = completion_logps(model, batch).clone()
    return out


def lr_factor(config: GRPOConfig, step: int, horizon: int) -> float:
    """The LR multiplier at global optimizer step ``step`` (0-based) of a run of ``horizon`` steps."""
    warmup = config.warmup_steps or int(config.warmup_ratio * horizon)
    if warmup and step < warmup:
        return (step + 1) / warmup
    if config.lr_scheduler_type == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, horizon - warmup))
    if config.lr_scheduler_type == "linear":
        return max(0.0, 1.0 - progress)
    return 0.5 * (1 + math.cos(math.pi * progress))


def _make_optimizer(params: list[tuple[str, torch.nn.Parameter]], config: GRPOConfig, state: TrainerState | None):
    optimizer = torch.optim.AdamW([p for _, p in params], lr=config.learning_rate, weight_decay=config.weight_decay)
    if state is not None:
        names = [n for n, _ in params]
        if names != state.param_names:
            raise ValueError(
                "the parent checkpoint's optimizer state does not match this adapter's parameters "
                f"({len(state.param_names)} saved vs {len(names)} now, e.g. a different lora_r or target modules): "
                "train from the base model (promote 'base') to start a new chain"
            )
        optimizer.load_state_dict(state.optimizer)
        for group in optimizer.param_groups:  # today's settings win over the saved ones
            group["weight_decay"] = config.weight_decay
    return optimizer


def step_sizes(n: int, per_step_rows: int) -> list[int]:
    """The rows of each optimizer step for a batch of ``n`` rows: ``ceil(n / per_step_rows)`` steps whose
    sizes differ by at most one, the larger first (70 rows at 64: 35 + 35; 65: 33 + 32; 128: 64 + 64)."""
    if per_step_rows < 1:
        raise ValueError("per_step_rows must be >= 1")
    if n <= 0:
        return []
    k = -(-n // per_step_rows)
    base, extra = divmod(n, k)
    return [base + 1] * extra + [base] * (k - extra)


def train_grpo(
    model, tokenizer, samples: list[TrainSample], config: GRPOConfig, *, state: TrainerState | None = None, on_step=None,
    progress: Checkpointing | None = None,
) -> TrainResult:
    """Run ``num_iterations`` passes of GRPO-family updates over ``samples`` (in place on ``model``).

    ``state`` continues a chain (the parent checkpoint's ``TrainerState``); the returned
    ``TrainResult.state`` is what the next cycle continues from. ``progress`` saves the run's progress
    every few micro-steps, yields (raises ``Preempted``) when asked and resumes a saved progress
    (``training/progress.py``)."""
    if not samples:
        raise ValueError("no training samples: every group had equal rewards or the batch was empty")
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    device = next(model.parameters()).device
    dtype = resolve_dtype(config.dtype, device)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    t0 = time.perf_counter()

    params = _trainable(model)
    optimizer = _make_optimizer(params, config, state)
    start_step = state.global_step if state is not None else 0
    order = list(range(len(samples)))
    if config.shuffle:
        rng.shuffle(order)
    sizes = step_sizes(len(order), config.per_step_rows)
    bounds = [0]
    for size in sizes:
        bounds.append(bounds[-1] + size)
    steps = [[samples[i] for i in order[a:b]] for a, b in zip(bounds, bounds[1:])]
    total_steps = len(steps) * config.num_iterations
    horizon = config.max_steps or (start_step + total_steps)
    shared = config.share_prompt_prefix and not config.gradient_checkpointing
    if config.gradient_checkpointing:
        # (transformers 5's activation_checkpointing_enable drops LoRA gradients under peft here: measured
        # a 4x smaller grad norm than without checkpointing; the older entry point matches exactly.)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    split = prefix_micro_batches if shared else micro_batches
    # Fixed micro-batch split per step across iterations, so cached old/ref log-probs line up.
    plan = [split(step, config.micro_batch_tokens) for step in steps]
    # More than one optimizer step per generation batch: every step after the first is off-policy, so
    # the behaviour policy's log-probs are fixed now, before any update (TRL does the same).
    needs_old = total_steps > 1
    run = _ProgressRun(progress, model, optimizer, params, fingerprint(samples, config.to_dict(), start_step, [n for n, _ in params], sizes))
    try:
        resume = run.start()
        if resume is not None:
            fixed, history, position = resume.fixed, list(resume.history), resume.position
        else:
            fixed = {(si, mi): _fixed_logps(model, mb, config, pad_id, device, needs_old=needs_old, shared=shared)
                     for si, mbs in enumerate(plan) for mi, mb in enumerate(mbs)}
            history, position = [], (0, 0, 0)
            run.after_fixed(fixed)
        _train_loop(model, config, optimizer, params, steps, plan, fixed, history, position, resume, run,
                    start_step=start_step, horizon=horizon, pad_id=pad_id, device=device, dtype=dtype, shared=shared, on_step=on_step)
    finally:
        run.finish()
        if config.gradient_checkpointing:
            model.gradient_checkpointing_disable()
    model.eval()
    new_state = TrainerState(optimizer.state_dict(), start_step + len(history), [n for n, _ in params])
    metrics = {
        "loss": sum(h["loss"] for h in history) / len(history),
        "kl": sum(h["kl"] for h in history) / len(history),
        "clip_fraction": sum(h["clip_fraction"] for h in history) / len(history),
        "policy_drift": max(h["policy_drift"] for h in history),
        "grad_norm": history[-1]["grad_norm"],
        "optimizer_steps": len(history),
        "global_step": new_state.global_step,
        "samples": len(samples),
        "guided_samples": sum(s.guided for s in samples),
        # The first pass's mean log-ratio of guided tokens: how far the hint moved the behaviour policy.
        "guided_log_ratio": next((h["guided_log_ratio"] for h in history if h.get("guided_log_ratio") is not None), None),
        "completion_tokens": sum(len(s.completion_ids) for s in samples),
        "trained_tokens": sum(trained_tokens(s) for s in samples),
        "seconds": time.perf_counter() - t0,
        "device": str(device),
        "dtype": dtype_name(dtype),
    }
    return TrainResult(metrics, history, new_state)


class _ProgressRun:
    """``train_grpo``'s side of a :class:`Checkpointing`: resume, poll, count and save (a no-op without one)."""

    def __init__(self, cp: Checkpointing | None, model, optimizer, params, fp: str):
        self.cp, self.model, self.optimizer, self.params, self.fp = cp, model, optimizer, params, fp
        self.hooks: list = []
        self.total_micro = 0
        self.fixed: dict = {}

    def start(self) -> Progress | None:
        if self.cp is None:
            return None
        resume = self.cp.resume
        if resume is not None:
            if resume.fingerprint != self.fp:
                raise StaleProgress("the saved training progress was made for other rows, another config, another split into steps or another parent "
                                 "checkpoint: delete it (or let the idle window discard it) and train again")
            with torch.no_grad():
                for n, p in self.params:
                    p.copy_(resume.params[n].to(p.device))
            self.optimizer.load_state_dict(resume.optimizer)
            torch.set_rng_state(resume.rng)
            self.total_micro = resume.micro_steps
            self.fixed = resume.fixed
        self.hooks = self.cp.install_hooks(self.model)
        self.cp.check()
        return resume

    def after_fixed(self, fixed: dict) -> None:
        """The pre-update pass is done: save it (a resumed run must not recompute it on updated weights)."""
        self.fixed = fixed
        if self.cp is not None and self.cp.every and any(v is not None for ex in fixed.values() for v in ex.values()):
            self.save((0, 0, 0), [], None, None)

    def check(self) -> None:
        if self.cp is not None:
            self.cp.check()

    def micro_done(self) -> bool:
        """Count a micro-step; True when a save is due."""
        if self.cp is None:
            return False
        self.cp.micro_steps += 1
        self.total_micro += 1
        return bool(self.cp.every) and self.cp.micro_steps % self.cp.every == 0

    def save(self, position: tuple[int, int, int], history: list[dict], grads: dict | None, totals: dict | None) -> None:
        it, si, mi = position
        self.cp.store.save(Progress(
            fingerprint=self.fp, iteration=it, step=si, micro=mi,
            params={n: p.detach().cpu().clone() for n, p in self.params},
            optimizer=self.optimizer.state_dict(), grads=grads, totals=dict(totals or {}), history=list(history),
            fixed=self.fixed, rng=torch.get_rng_state(), micro_steps=self.total_micro, meta=self.cp.meta))
        self.cp.saves += 1
        self.cp.saved = position

    def finish(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []


def _train_loop(model, config: GRPOConfig, optimizer, params, steps, plan, fixed, history, position, resume, run: _ProgressRun, *,
                start_step: int, horizon: int, pad_id: int, device, dtype, shared: bool, on_step) -> None:
    """The optimizer steps of ``train_grpo`` from ``position`` (iteration, step, micro-batch) on."""
    model.train()
    for it in range(config.num_iterations):
        for si, (step_rows, mbs) in enumerate(zip(steps, plan)):
            if (it, si) < position[:2]:
                continue  # done before the run was preempted
            global_step = start_step + len(history)
            lr = config.learning_rate * lr_factor(config, global_step, horizon)
            for group in optimizer.param_groups:
                group["lr"] = lr
            tokens_in_step = sum(trained_tokens(s) for s in step_rows)
            totals = {"loss": 0.0, "kl": 0.0, "clipped": 0.0, "tokens": 0.0, "drift": 0.0, "guided_tokens": 0.0, "guided_log_ratio": 0.0}
            optimizer.zero_grad(set_to_none=True)
            first = 0
            if (it, si) == position[:2] and position[2] > 0:  # resuming inside this step: its gradients so far
                first, totals = position[2], dict(resume.totals)
                for n, p in params:
                    g = resume.grads[n]
                    p.grad = None if g is None else g.to(p.device).clone()
            save_due = False
            for mi, mb in enumerate(mbs):
                if mi < first:
                    continue
                run.check()
                batch = pack(mb, pad_id, device, config.temperature, shared=shared)
                ex = fixed[(si, mi)]
                with autocast(device, dtype):
                    logps = completion_logps(model, batch)
                old = ex["old"] if ex["old"] is not None else logps.detach()
                mask = batch["loss_mask"]
                if ex["behaviour"] is not None:  # guided rows: the ratio against the hinted behaviour policy
                    guided_rows, behaviour = ex["behaviour"]
                    old = torch.where(guided_rows, behaviour, old)
                parts = per_token_loss(
                    config.loss_type, logps, old, batch["advantages"], mask,
                    epsilon=config.epsilon, epsilon_high=config.epsilon_high, beta=config.beta, ref_logps=ex["ref"],
                    importance_sampling_level=config.importance_sampling_level,
                )
                per_token = parts.per_token
                if ex["behaviour"] is not None:
                    if config.guide_importance == "shaping":
                        shaped = shaped_guided_loss(logps, behaviour, batch["advantages"], gamma=config.guide_shaping_gamma)
                        if parts.kl is not None:
                            shaped = shaped + config.beta * parts.kl
                        per_token = torch.where(guided_rows, shaped, per_token)
                    guided_mask = mask * guided_rows
                    totals["guided_tokens"] += float(guided_mask.sum())
                    totals["guided_log_ratio"] += float(((logps.detach() - behaviour) * guided_mask).sum())
                loss = aggregate(
                    config.loss_type, per_token, mask, rows_in_step=len(step_rows),
                    tokens_in_step=tokens_in_step, max_completion_length=config.max_completion_length,
                )
                loss.backward()
                n_tok = float(mask.sum())
                totals["loss"] += float(loss.detach())
                totals["tokens"] += n_tok
                totals["clipped"] += float((parts.clipped.float() * mask).sum())
                totals["drift"] += float(((logps.detach() - old).abs() * mask).sum())
                if parts.kl is not None:
                    totals["kl"] += float((parts.kl.detach() * mask).sum())
                save_due = run.micro_done() or save_due
                if save_due and mi + 1 < len(mbs):  # mid-step: the gradients so far travel with the progress
                    grads = {n: None if p.grad is None else p.grad.detach().cpu().clone() for n, p in params}
                    run.save((it, si, mi + 1), history, grads, totals)
                    save_due = False
            grad_norm = torch.nn.utils.clip_grad_norm_([p for _, p in params], config.max_grad_norm)
            optimizer.step()
            rec = {
                "iteration": it,
                "step": len(history),
                "global_step": global_step,
                "loss": totals["loss"],
                "kl": totals["kl"] / max(totals["tokens"], 1),
                "clip_fraction": totals["clipped"] / max(totals["tokens"], 1),
                # Mean |log pi - log pi_old| per token: how off-policy this step was (0 on the first step).
                "policy_drift": totals["drift"] / max(totals["tokens"], 1),
                "grad_norm": float(grad_norm),
                "lr": lr,
                "rows": len(step_rows),
                # Guided rows (training/guide.py): their tokens and mean log pi(a|s) - log pi_b(a|s+hint).
                "guided_tokens": int(totals["guided_tokens"]),
                "guided_log_ratio": totals["guided_log_ratio"] / totals["guided_tokens"] if totals["guided_tokens"] else None,
            }
            history.append(rec)
            if run.cp is not None:
                run.cp.steps += 1
            if on_step:
                on_step(rec)
            last = it == config.num_iterations - 1 and si == len(steps) - 1
            if save_due and not last:  # at a step boundary: no gradients in flight
                nxt = (it, si + 1, 0) if si + 1 < len(steps) else (it + 1, 0, 0)
                run.save(nxt, history, None, None)
