"""fp32 vs bf16 side by side on the same inputs: rollout tokens/s and one GRPO update.

bf16 is what ``dtype="auto"`` picks on a CPU with AVX512-BF16/AMX-BF16 (and on CUDA); this measures
whether that pays here. The two dtypes alternate (fp32, bf16, fp32, bf16, ...) so a busy machine
slows both alike, and the medians are compared. Imports only torch/transformers/peft (runs on a bare
GPU machine too).
"""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path


def _questions(n: int, seed: int) -> list[str]:
    # Plain questions rather than tentalis_pipelines.tasks, which imports the data stack.
    rng = random.Random(seed)
    return [f"Sam has {rng.randrange(2, 60)} apples and buys {rng.randrange(2, 40)} more. How many apples does Sam have now?"
            for _ in range(n)]


def dtype_benchmark(model_dir: Path, *, prompts: int = 8, num_generations: int = 8, max_new_tokens: int = 96,
                    update_rows: int = 32, repeats: int = 2, device: str = "auto", seed: int = 3) -> dict:
    """Median rollout tokens/s and seconds per GRPO update (``update_rows`` rows, one optimizer step)
    for float32 and bfloat16, with the bf16/fp32 ratios."""
    from transformers import AutoTokenizer

    from tentalis_pipelines.inference.base import SamplingParams
    from tentalis_pipelines.inference.prompts import render_prompt
    from tentalis_pipelines.inference.transformers_backend import TransformersBackend
    from tentalis_pipelines.training.trainer import GRPOConfig, TrainSample, build_policy, train_grpo

    tok = AutoTokenizer.from_pretrained(model_dir)
    texts = [render_prompt(tok, q) for q in _questions(prompts, seed)]
    rng = random.Random(seed)
    rows = []
    for t in texts:
        ids = tok(t, add_special_tokens=False)["input_ids"]
        for _ in range(num_generations):
            length = rng.randrange(max_new_tokens // 2, max_new_tokens)
            rows.append(TrainSample(ids, [rng.randrange(100, 20000) for _ in range(length)], rng.uniform(-1, 1), temperature=0.8))
    rows = rows[:update_rows]
    params = SamplingParams(num_generations=num_generations, max_new_tokens=max_new_tokens, temperature=0.8, seed=0)
    out: dict = {"float32": {"tokens_per_s": [], "update_s": []}, "bfloat16": {"tokens_per_s": [], "update_s": []}}
    for _ in range(repeats):
        for dtype in ("float32", "bfloat16"):
            backend = TransformersBackend(model_dir, device=device, dtype=dtype)
            t0 = time.perf_counter()
            gens = backend.generate(texts, params)
            tokens = sum(len(g.token_ids) for group in gens for g in group)
            out[dtype]["tokens_per_s"].append(tokens / (time.perf_counter() - t0))
            del backend
            cfg = GRPOConfig(loss_type="dapo", beta=0.0, per_step_rows=len(rows), device=device, dtype=dtype)
            policy = build_policy(model_dir, None, cfg)
            t0 = time.perf_counter()
            train_grpo(policy, tok, rows, cfg)
            out[dtype]["update_s"].append(time.perf_counter() - t0)
            del policy
    summary = {d: {"tokens_per_s": round(statistics.median(v["tokens_per_s"]), 1), "update_s": round(statistics.median(v["update_s"]), 3),
                   "runs": {k: [round(x, 3) for x in xs] for k, xs in v.items()}} for d, v in out.items()}
    summary["bf16_over_fp32_tokens_per_s"] = round(summary["bfloat16"]["tokens_per_s"] / summary["float32"]["tokens_per_s"], 2)
    summary["fp32_over_bf16_update_time"] = round(summary["float32"]["update_s"] / summary["bfloat16"]["update_s"], 2)
    summary["config"] = {"prompts": prompts, "num_generations": num_generations, "max_new_tokens": max_new_tokens,
                         "update_rows": len(rows), "repeats": repeats, "device": device}
    return summary
