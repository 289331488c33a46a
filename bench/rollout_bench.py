"""Rollout throughput: the pipeline's generation backend vs. Hugging Face's batched ``generate`` and a
plain per-sample ``generate`` loop.

All run on the same model in the same precision, prompts (Tentalis' chat prompt for seeded arithmetic
tasks), sampling temperature, completion limit and stop string; tokens/s counts only the tokens each
one keeps (up to and including EOS or the stop string). The batched ``generate`` gets the whole
workload in one call (every prompt, ``num_return_sequences`` samples each, left-padded): what one
writes with transformers alone.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from tentalis_pipelines.inference.base import SamplingParams
from tentalis_pipelines.inference.prompts import render_prompt
from tentalis_pipelines.tasks.arithmetic import generate_arithmetic


def plain_generate_loop(model, tokenizer, prompts: list[str], params: SamplingParams) -> list[list[int]]:
    """What one writes without a rollout engine: one ``model.generate`` call per sample."""
    out_tokens = []
    eos = model.generation_config.eos_token_id
    for p in prompts:
        ids = tokenizer(p, add_special_tokens=False, return_tensors="pt")["input_ids"]
        for k in range(params.num_generations):
            torch.manual_seed(params.seed + k)
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=params.max_new_tokens, do_sample=params.temperature > 0,
                temperature=params.temperature if params.temperature > 0 else None, top_p=None, top_k=None,
                stop_strings=list(params.stop) or None, tokenizer=tokenizer, pad_token_id=tokenizer.pad_token_id, eos_token_id=eos,
            )
            # A single row stops where it ends: no padding to strip.
            out_tokens.append(out[0, ids.shape[1]:].tolist())
    return out_tokens


def hf_batched_generate(model, tokenizer, prompts: list[str], params: SamplingParams) -> list[list[int]]:
    """Hugging Face's batched ``generate`` on the whole workload at once; the tokens each row keeps (up to
    and including its EOS or the token that completes a stop string: what follows is padding)."""
    eos = model.generation_config.eos_token_id
    eos_set = set(eos if isinstance(eos, list) else [eos])
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        batch = tokenizer(prompts, add_special_tokens=False, return_tensors="pt", padding=True)
    finally:
        tokenizer.padding_side = side
    torch.manual_seed(params.seed)
    out = model.generate(
        **batch, max_new_tokens=params.max_new_tokens, do_sample=params.temperature > 0, num_return_sequences=params.num_generations,
        temperature=params.temperature if params.temperature > 0 else None, top_p=None, top_k=None,
        stop_strings=list(params.stop) or None, tokenizer=tokenizer, pad_token_id=tokenizer.pad_token_id, eos_token_id=eos,
    )
    stops = [s for s in params.stop if s]
    tail = max((len(tokenizer(s, add_special_tokens=False)["input_ids"]) for s in stops), default=0) + 2
    kept = []
    for row in out[:, batch["input_ids"].shape[1]:].tolist():
        n = len(row)
        for i, t in enumerate(row):
            if t in eos_set or (stops and any(s in tokenizer.decode(row[max(0, i + 1 - tail): i + 1]) for s in stops)):
                n = i + 1
                break
        kept.append(row[:n])
    return kept


def rollout_benchmark(model_dir: Path, *, prompts: int = 16, num_generations: int = 8, max_new_tokens: int = 96,
                      temperature: float = 0.8, plain_prompts: int = 4, seed: int = 0, hf_batched: bool = True,
                      repeats: int = 1, dtype: str = "float32") -> dict:
    """Tokens/s of the pipeline's backend on ``prompts`` × ``num_generations`` samples, of Hugging Face's
    batched ``generate`` on the same workload (``hf_batched``), and of the plain loop on the first
    ``plain_prompts`` of the same prompts (the loop is slow, so it gets a subset; a rate is comparable
    across them); ``plain_prompts=0`` leaves the loop out. With ``repeats`` > 1 the backend and the batched
    ``generate`` run alternately that many times and each side's fastest run is reported (load on a shared
    machine then hits both alike). ``dtype``: the precision both run in (``auto`` as the pipeline picks it)."""
    from tentalis_pipelines.inference.transformers_backend import TransformersBackend, load_policy

    model, tok = load_policy(model_dir, dtype=dtype)
    tasks = generate_arithmetic(prompts, seed=seed, levels=(1, 2))
    texts = [render_prompt(tok, t.prompt) for t in tasks]
    params = SamplingParams(num_generations=num_generations, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    backend = TransformersBackend(model_dir, model=model, tokenizer=tok)
    backend.generate(texts[:1], SamplingParams(num_generations=1, max_new_tokens=4, temperature=temperature))  # warm-up

    runs: dict[str, list[tuple[float, int]]] = {"pipeline": [], "hf": []}
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        gens = backend.generate(texts, params)
        runs["pipeline"].append((time.perf_counter() - t0, sum(len(g.token_ids) for group in gens for g in group)))
        if hf_batched:
            t0 = time.perf_counter()
            hf = hf_batched_generate(model, tok, texts, params)
            runs["hf"].append((time.perf_counter() - t0, sum(len(t) for t in hf)))
    pipe_s, pipe_tokens = min(runs["pipeline"], key=lambda r: r[0] / max(1, r[1]))
    pipe_rate = pipe_tokens / pipe_s
    out = {
        "config": {"prompts": prompts, "num_generations": num_generations, "max_new_tokens": max_new_tokens, "temperature": temperature,
                   "dtype": str(model.dtype).replace("torch.", ""), "stop": list(params.stop), "repeats": max(1, repeats)},
        "pipeline": {"samples": prompts * num_generations, "tokens": pipe_tokens, "seconds": round(pipe_s, 2), "tokens_per_s": round(pipe_rate, 1),
                     "all_tokens_per_s": [round(n / t, 1) for t, n in runs["pipeline"]]},
        "threads": torch.get_num_threads(),
    }
    if hf_batched:
        hf_s, hf_tokens = min(runs["hf"], key=lambda r: r[0] / max(1, r[1]))
        out["hf_batched_generate"] = {"samples": prompts * num_generations, "tokens": hf_tokens, "seconds": round(hf_s, 2),
                                      "tokens_per_s": round(hf_tokens / hf_s, 1), "all_tokens_per_s": [round(n / t, 1) for t, n in runs["hf"]]}
        out["speedup_vs_hf_batched"] = round(pipe_rate / (hf_tokens / hf_s), 2)
    if plain_prompts > 0:
        t0 = time.perf_counter()
        plain = plain_generate_loop(model, tok, texts[:plain_prompts], params)
        plain_s = time.perf_counter() - t0
        plain_tokens = sum(len(t) for t in plain)
        out["plain_loop"] = {"samples": plain_prompts * num_generations, "tokens": plain_tokens, "seconds": round(plain_s, 2),
                             "tokens_per_s": round(plain_tokens / plain_s, 1)}
        out["speedup"] = round(pipe_rate / (plain_tokens / plain_s), 2)
    return out
