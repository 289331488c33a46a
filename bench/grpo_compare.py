"""Tentalis' GRPO loop side by side with TRL's GRPOTrainer on the same problem.

Both sides get the same model, prompts (rendered with Tentalis' chat prompt and worked example), reward
function, samples per prompt, completion length, loss (``loss_type``, ``beta``, ``epsilon``,
``epsilon_high``), LoRA adapter shape, learning rate and number of updates. One *update* is what TRL
calls a step: generate ``num_generations`` completions for each of ``prompts_per_update`` prompts, score
them, and take one optimizer step on all of them. Wall time per update covers all of that.

TRL is a benchmark dependency only (``pip install 'tentalis[bench]'``); nothing else imports this module.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from tentalis_pipelines.inference.base import SamplingParams
from tentalis_pipelines.inference.prompts import render_prompt
from tentalis_pipelines.rewards.advantages import group_advantages
from tentalis_pipelines.rewards.math_answers import answers_match
from tentalis_pipelines.rewards.scoring import format_score
from tentalis_pipelines.rewards.steps import parse_completion
from tentalis_pipelines.tasks.arithmetic import generate_arithmetic


@dataclass(frozen=True)
class CompareConfig:
    updates: int = 3
    prompts_per_update: int = 16
    num_generations: int = 8
    max_completion_length: int = 96
    temperature: float = 0.8
    learning_rate: float = 2e-4
    loss_type: str = "dapo"
    beta: float = 0.0
    epsilon: float = 0.2
    epsilon_high: float = 0.28
    lora_r: int = 16
    lora_alpha: int = 32
    levels: tuple[int, ...] = (1,)
    seed: int = 0


def comparison_reward(completion: str, reference: str) -> float:
    """The reward both trainers optimise: 1 for the right number (lenient: tagged answer, else the last
    number) plus 0.2 × Tentalis' format score (answer tag 0.6, step tags 0.4)."""
    parsed = parse_completion(completion)
    return float(answers_match(parsed.answer, reference)) + 0.2 * format_score(parsed, "stop")


def _problems(config: CompareConfig) -> list[tuple[str, str]]:
    tasks = generate_arithmetic(config.updates * config.prompts_per_update, seed=config.seed, levels=config.levels)
    return [(t.prompt, str(t.answer)) for t in tasks]


def run_tentalis(model_dir: Path, config: CompareConfig, *, on_update=None) -> dict:
    """Updates with Tentalis' own pieces: the batched transformers backend on the merged policy, group
    advantages, ``train_grpo`` on the LoRA adapter, then the adapter saved and re-merged for the next
    rollouts (exactly what a learning cycle does)."""
    from tentalis_pipelines.inference.transformers_backend import TransformersBackend, load_policy
    from tentalis_pipelines.training.trainer import GRPOConfig, TrainSample, build_policy, train_grpo

    gcfg = GRPOConfig(
        loss_type=config.loss_type, beta=config.beta, epsilon=config.epsilon, epsilon_high=config.epsilon_high,
        learning_rate=config.learning_rate, per_step_rows=config.prompts_per_update * config.num_generations,
        temperature=config.temperature, max_completion_length=config.max_completion_length,
        lora_r=config.lora_r, lora_alpha=config.lora_alpha, seed=config.seed,
    )
    problems = _problems(config)
    policy = build_policy(model_dir, None, gcfg)
    gen_model, tok = load_policy(model_dir)
    params = SamplingParams(num_generations=config.num_generations, max_new_tokens=config.max_completion_length,
                            temperature=config.temperature)
    updates = []
    with tempfile.TemporaryDirectory() as tmp:
        for u in range(config.updates):
            t0 = time.perf_counter()
            chunk = problems[u * config.prompts_per_update : (u + 1) * config.prompts_per_update]
            prompts = [render_prompt(tok, q) for q, _ in chunk]
            backend = TransformersBackend(model_dir, model=gen_model, tokenizer=tok)
            gens = backend.generate(prompts, SamplingParams(**{**asdict(params), "seed": config.seed + u}))
            t_gen = time.perf_counter() - t0
            rewards, keys, samples = [], [], []
            for i, ((_, ref), group) in enumerate(zip(chunk, gens)):
                for g in group:
                    rewards.append(comparison_reward(g.text, ref))
                    keys.append(str(i))
            advantages, signal = group_advantages(keys, rewards)
            flat = [(i, g) for i, group in enumerate(gens) for g in group]
            for (i, g), adv, keep in zip(flat, advantages, signal):
                # DAPO's dynamic sampling, as the pipeline does it: groups with equal rewards are skipped.
                if keep or config.loss_type != "dapo":
                    pids = tok(prompts[i], add_special_tokens=False)["input_ids"]
                    samples.append(TrainSample(pids, list(g.token_ids), float(adv)))
            t_train = time.perf_counter()
            if samples and any(abs(s.advantage) > 1e-8 for s in samples):
                train_grpo(policy, tok, samples, gcfg)
            t_train = time.perf_counter() - t_train
            # Next rollouts use the updated policy, merged (as the pipeline does from a checkpoint).
            policy.save_pretrained(tmp)
            gen_model, tok = load_policy(model_dir, Path(tmp))
            seconds = time.perf_counter() - t0
            rec = {"update": u + 1, "seconds": seconds, "generation_seconds": t_gen, "train_seconds": t_train,
                   "trained_samples": len(samples), "reward_mean": statistics.fmean(rewards),
                   "completion_tokens": sum(len(g.token_ids) for _, g in flat)}
            updates.append(rec)
            if on_update:
                on_update("tentalis", rec)
    return {"trainer": "tentalis", "updates": updates}


def run_trl(model_dir: Path, config: CompareConfig, *, on_update=None) -> dict:
    """The same updates with TRL's GRPOTrainer (CPU, float32, peft LoRA, no vLLM)."""
    try:
        from datasets import Dataset
        from peft import LoraConfig
        from transformers import AutoTokenizer, TrainerCallback
        from trl import GRPOConfig as TRLConfig
        from trl import GRPOTrainer
    except ImportError as exc:
        raise RuntimeError(f"TRL is a benchmark dependency: pip install 'tentalis[bench]' ({exc})") from None
    from tentalis_pipelines.training.trainer import DEFAULT_LORA_TARGETS

    tok = AutoTokenizer.from_pretrained(model_dir)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    problems = _problems(config)
    data = Dataset.from_list([{"prompt": render_prompt(tok, q), "reference": ref} for q, ref in problems])

    def reward(completions, reference, **_):
        return [comparison_reward(c, r) for c, r in zip(completions, reference)]

    updates: list[dict] = []

    class Timer(TrainerCallback):
        # TRL generates inside the step, so an update is timed from the end of the previous one.
        def on_train_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            now = time.perf_counter()
            updates.append({"update": state.global_step, "seconds": now - self.t})
            self.t = now

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs and updates:
                updates[-1]["reward_mean"] = float(logs["reward"])
                updates[-1]["completion_tokens"] = logs.get("completions/mean_length", 0.0) * config.prompts_per_update * config.num_generations
                if on_update:
                    on_update("trl", updates[-1])

    rows = config.prompts_per_update * config.num_generations
    with tempfile.TemporaryDirectory() as tmp:
        args = TRLConfig(
            output_dir=tmp, per_device_train_batch_size=rows, gradient_accumulation_steps=1, num_generations=config.num_generations,
            max_completion_length=config.max_completion_length, temperature=config.temperature, top_p=1.0,
            learning_rate=config.learning_rate, lr_scheduler_type="constant", loss_type=config.loss_type, beta=config.beta,
            epsilon=config.epsilon, epsilon_high=config.epsilon_high, num_iterations=1, max_steps=config.updates,
            shuffle_dataset=False, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, bf16=False,
            seed=config.seed, disable_dropout=True, dataloader_num_workers=0,
        )
        lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=0.0,
                          target_modules=list(DEFAULT_LORA_TARGETS), task_type="CAUSAL_LM")
        trainer = GRPOTrainer(model=str(model_dir), reward_funcs=[reward], args=args, train_dataset=data,
                              processing_class=tok, peft_config=lora, callbacks=[Timer()])
        trainer.train()
    return {"trainer": "trl", "updates": updates}


def summarize(ours: dict, trl: dict) -> dict:
    """Median seconds per update (the first one excluded when there are more than two: warm-up) and the
    reward curve of both, plus their wall-time ratio."""

    def median_seconds(run: dict) -> float:
        s = [u["seconds"] for u in run["updates"]]
        return statistics.median(s[1:] if len(s) > 2 else s)

    a, b = median_seconds(ours), median_seconds(trl)
    return {
        "tentalis_seconds_per_update": round(a, 1),
        "trl_seconds_per_update": round(b, 1),
        "ratio": round(a / b, 3),
        "tentalis_rewards": [round(u.get("reward_mean", float("nan")), 3) for u in ours["updates"]],
        "trl_rewards": [round(u.get("reward_mean", float("nan")), 3) for u in trl["updates"]],
        "threads": torch.get_num_threads(),
    }
