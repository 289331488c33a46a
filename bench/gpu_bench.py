"""Rollout tokens/s and one GRPO update on one GPU, against Hugging Face's batched ``generate`` and TRL's
GRPOTrainer on the same GPU.

A lent GPU machine has torch, transformers and peft but no internet and no Dagster: the model is
built **from a config with random weights** (default: the shape of Qwen2.5-0.5B, 24 layers, hidden
896, with the tokenizer of the folder given by ``--tokenizer``), so speed is measured on a realistic
size without downloading weights. Both sides get the same model, prompts, ``num_generations``,
completion length, LoRA shape, loss (DAPO, beta 0) and bf16; TRL runs without vLLM.

    python -m bench.gpu_bench --tokenizer path/to/SmolLM2-135M-Instruct --out gpu_bench.json
    python -m bench.gpu_bench --tiny          # the same path on a CPU in seconds (tests use this)

Only torch, transformers and peft are needed (TRL optional, for the comparison).
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class GpuBenchConfig:
    hidden_size: int = 896
    intermediate_size: int = 4864
    num_hidden_layers: int = 24
    num_attention_heads: int = 14
    num_key_value_heads: int = 2
    prompts: int = 16
    num_generations: int = 8
    max_new_tokens: int = 256
    updates: int = 2
    lora_r: int = 16
    device: str = "auto"
    dtype: str = "auto"
    seed: int = 0

    @classmethod
    def tiny(cls) -> GpuBenchConfig:
        return cls(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   prompts=2, num_generations=2, max_new_tokens=8, updates=1, lora_r=4)


def build_random_model(tokenizer_dir: Path, target: Path, config: GpuBenchConfig) -> Path:
    """A Llama of the configured shape with random weights and the given tokenizer, saved to ``target``."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
                      num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
                      num_key_value_heads=config.num_key_value_heads, max_position_embeddings=4096,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=True)
    torch.manual_seed(config.seed)
    LlamaForCausalLM(cfg).save_pretrained(target)
    tok.save_pretrained(target)
    return target


def _prompts(tok, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randrange(2, 99), rng.randrange(2, 99)
        messages = [{"role": "user", "content": f"What is {a} + {b}? Show your steps, then the answer."}]
        out.append(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
                   if getattr(tok, "chat_template", None) else messages[0]["content"])
    return out


def run_tentalis(model_dir: Path, config: GpuBenchConfig) -> dict:
    """Generate with the transformers backend, then one GRPO update on the samples (random rewards:
    this measures speed, not learning); ``updates`` times."""
    import torch

    from tentalis_pipelines.inference.base import SamplingParams
    from tentalis_pipelines.inference.transformers_backend import TransformersBackend
    from tentalis_pipelines.rewards.advantages import group_advantages
    from tentalis_pipelines.training.trainer import GRPOConfig, TrainSample, build_policy, train_grpo

    gcfg = GRPOConfig(loss_type="dapo", beta=0.0, per_step_rows=config.prompts * config.num_generations, lora_r=config.lora_r,
                      max_completion_length=config.max_new_tokens, device=config.device, dtype=config.dtype, seed=config.seed)
    backend = TransformersBackend(model_dir, device=config.device, dtype=config.dtype)
    tok = backend.tokenizer
    policy = build_policy(model_dir, None, gcfg)
    rng = random.Random(config.seed)
    records = []
    for u in range(config.updates):
        prompts = _prompts(tok, config.prompts, config.seed + u)
        sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
        sync()
        t0 = time.perf_counter()
        gens = backend.generate(prompts, SamplingParams(num_generations=config.num_generations, max_new_tokens=config.max_new_tokens,
                                                        temperature=1.0, seed=config.seed + u))
        sync()
        t_gen = time.perf_counter() - t0
        keys, rewards, samples = [], [], []
        for i, group in enumerate(gens):
            for _g in group:
                keys.append(str(i))
                rewards.append(rng.random())
        adv, _ = group_advantages(keys, rewards)
        flat = [(i, g) for i, group in enumerate(gens) for g in group]
        for (i, g), a in zip(flat, adv):
            if g.token_ids:
                samples.append(TrainSample(tok(prompts[i], add_special_tokens=False)["input_ids"], list(g.token_ids), a,
                                           temperature=1.0))
        t1 = time.perf_counter()
        res = train_grpo(policy, tok, samples, gcfg)
        sync()
        t_train = time.perf_counter() - t1
        tokens = sum(len(g.token_ids) for _, g in flat)
        records.append({"update": u + 1, "generation_s": round(t_gen, 3), "train_s": round(t_train, 3),
                        "update_s": round(t_gen + t_train, 3), "completion_tokens": tokens,
                        "tokens_per_s": round(tokens / t_gen, 1), "dtype": res.metrics["dtype"], "device": res.metrics["device"]})
    # The first update includes CUDA/kernel warm-up: left out of the medians, as run_trl leaves out its first step.
    steady = records[1:] if len(records) > 1 else records
    return {"trainer": "tentalis", "updates": records,
            "median_update_s": statistics.median(r["update_s"] for r in steady),
            "median_tokens_per_s": statistics.median(r["tokens_per_s"] for r in steady)}


def run_hf_generate(model_dir: Path, config: GpuBenchConfig, *, repeats: int = 2) -> dict:
    """The same rollout workload through Hugging Face's batched ``generate`` alone (what TRL calls without
    vLLM): every prompt left-padded in one call, ``num_return_sequences`` samples each, the same
    precision and length. Tokens count up to and including EOS, as the Tentalis side counts them. The
    first repeat includes warm-up and is left out of the median."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tentalis_pipelines.hardware import resolve_device, resolve_dtype

    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    eos = model.generation_config.eos_token_id
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    records = []
    for r in range(repeats):
        prompts = _prompts(tok, config.prompts, config.seed + r)
        enc = tok(prompts, add_special_tokens=False, return_tensors="pt", padding=True).to(device)
        torch.manual_seed(config.seed + r)
        sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=config.max_new_tokens, do_sample=True, temperature=1.0, top_p=None,
                                 top_k=None, num_return_sequences=config.num_generations, pad_token_id=tok.pad_token_id,
                                 eos_token_id=eos)
        sync()
        dt = time.perf_counter() - t0
        new = out[:, enc["input_ids"].shape[1]:].tolist()
        tokens = 0
        for row in new:
            tokens += next((i + 1 for i, t in enumerate(row) if t == eos), len(row))
        records.append({"repeat": r + 1, "generation_s": round(dt, 3), "completion_tokens": tokens,
                        "tokens_per_s": round(tokens / dt, 1)})
    steady = records[1:] if len(records) > 1 else records
    return {"generator": "hf_generate", "repeats": records,
            "median_tokens_per_s": statistics.median(r["tokens_per_s"] for r in steady)}


def run_trl(model_dir: Path, config: GpuBenchConfig) -> dict:
    """The same updates with TRL's GRPOTrainer (peft LoRA, bf16 where the device has it, no vLLM)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer

    from tentalis_pipelines.hardware import resolve_device, resolve_dtype
    from tentalis_pipelines.training.trainer import DEFAULT_LORA_TARGETS

    device = resolve_device(config.device)
    bf16 = resolve_dtype(config.dtype, device) == torch.bfloat16
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts = [p for u in range(config.updates + 1) for p in _prompts(tok, config.prompts, config.seed + u)]
    rng = random.Random(config.seed)
    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t)

    with tempfile.TemporaryDirectory() as tmp:
        args = TRLConfig(output_dir=tmp, per_device_train_batch_size=config.prompts * config.num_generations,
                         num_generations=config.num_generations, max_completion_length=config.max_new_tokens, temperature=1.0,
                         learning_rate=1e-5, loss_type="dapo", beta=0.0, max_steps=config.updates + 1, logging_steps=1,
                         save_strategy="no", report_to=[], bf16=bf16, use_cpu=device.type == "cpu", seed=config.seed,
                         shuffle_dataset=False)
        trainer = GRPOTrainer(model=str(model_dir), reward_funcs=[lambda completions, **_: [rng.random() for _ in completions]],
                              args=args, train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]), processing_class=tok,
                              peft_config=LoraConfig(r=config.lora_r, lora_alpha=2 * config.lora_r, target_modules=list(DEFAULT_LORA_TARGETS),
                                                     task_type="CAUSAL_LM"), callbacks=[Timer()])
        trainer.train()
    steady = times[1:] if len(times) > 1 else times  # the first step includes compilation and warm-up
    return {"trainer": "trl", "step_s": [round(t, 3) for t in times], "median_update_s": statistics.median(steady)}


def gpu_bench(tokenizer_dir: Path, config: GpuBenchConfig, *, with_trl: bool = True) -> dict:
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_random_model(tokenizer_dir, Path(tmp) / "model", config)
        report: dict = {"config": asdict(config), "torch": torch.__version__,
                        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                        "tentalis": run_tentalis(model_dir, config)}
        report["hf_generate"] = run_hf_generate(model_dir, config)
        report["generation_ratio_tentalis_over_hf"] = round(
            report["tentalis"]["median_tokens_per_s"] / report["hf_generate"]["median_tokens_per_s"], 3)
        if with_trl:
            try:
                report["trl"] = run_trl(model_dir, config)
                report["update_time_ratio_tentalis_over_trl"] = round(
                    report["tentalis"]["median_update_s"] / report["trl"]["median_update_s"], 3)
            except ImportError as exc:
                report["trl"] = {"skipped": f"TRL not importable ({exc}): pip install trl datasets"}
    return report


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", type=Path, required=False, help="folder with a tokenizer (e.g. the embedded SmolLM2 folder)")
    ap.add_argument("--tiny", action="store_true", help="a tiny model and batch: the same code path on a CPU in seconds")
    ap.add_argument("--no-trl", action="store_true")
    ap.add_argument("--out", type=Path)
    for f in ("prompts", "num_generations", "max_new_tokens", "updates", "num_hidden_layers", "hidden_size"):
        ap.add_argument(f"--{f.replace('_', '-')}", type=int)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    args = ap.parse_args(argv)
    config = GpuBenchConfig.tiny() if args.tiny else GpuBenchConfig()
    for f in ("prompts", "num_generations", "max_new_tokens", "updates", "num_hidden_layers", "hidden_size", "device", "dtype"):
        if getattr(args, f) is not None:
            setattr(config, f, getattr(args, f))
    tokenizer = args.tokenizer
    if tokenizer is None:
        from tentalis_pipelines.inference.models import EMBEDDED, resolve_model
        from tentalis_pipelines.settings import Paths

        tokenizer = resolve_model(EMBEDDED, Paths.from_env().models)
    report = gpu_bench(tokenizer, config, with_trl=not args.no_trl)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
