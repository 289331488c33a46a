"""Evaluate an LLM judge on ProcessBench and print a markdown table plus one JSON line of results.

Example (the embedded SmolLM2 on 100 seeded gsm8k samples, ProcessBench's critic protocol):

    TENTALIS_DATA_DIR=../shared/data .venv/bin/python -m experiments.processbench_judge.run \\
        --split gsm8k --limit 100 --num-votes 1 --mode first_error --model embedded
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tentalis_pipelines.evaluation.processbench import (
    MODES,
    SPLITS,
    evaluate_processbench,
    load_processbench,
    markdown_table,
)
from tentalis_pipelines.inference.models import resolve_model
from tentalis_pipelines.inference.transformers_backend import TransformersBackend
from tentalis_pipelines.rewards.judge import JudgeConfig, JudgePRM
from tentalis_pipelines.settings import Paths


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--split", default="gsm8k", help=f"comma-separated splits from {', '.join(SPLITS)}, or 'all'")
    p.add_argument("--limit", type=int, default=100, help="seeded sample size per split (0 = the whole split)")
    p.add_argument("--num-votes", type=int, default=1, help="judge samples per prompt, majority-aggregated")
    p.add_argument("--mode", choices=MODES, default="first_error")
    p.add_argument("--model", default="embedded", help="'embedded' (SmolLM2-135M-Instruct) or a local model folder")
    p.add_argument("--seed", type=int, default=0, help="seeds both the sample and the judge's sampling")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=None,
                   help="default: 0 (greedy) with one vote, 0.7 with several")
    p.add_argument("--forced-verdict", action="store_true",
                   help="pre-fill the reply up to '\\boxed{' so the judge writes only the index (no critique)")
    p.add_argument("--data-dir", default=None, help="default: $TENTALIS_DATA_DIR")
    p.add_argument("--output", type=Path, default=None, help="also write the full result (per-item predictions) as JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    splits = list(SPLITS) if args.split == "all" else [s.strip() for s in args.split.split(",") if s.strip()]
    data = {s: load_processbench(s, data_dir=args.data_dir, limit=args.limit or None, seed=args.seed) for s in splits}
    # Several votes only differ when sampling; a single vote is best taken greedily.
    temperature = args.temperature if args.temperature is not None else (0.0 if args.num_votes == 1 else 0.7)

    t0 = time.perf_counter()
    model_dir = resolve_model(args.model, Paths.from_env().models)
    backend = TransformersBackend(model_dir=model_dir)
    load_seconds = time.perf_counter() - t0
    config = JudgeConfig(num_votes=args.num_votes, max_new_tokens=args.max_new_tokens, temperature=temperature, seed=args.seed,
                         forced_verdict=args.forced_verdict)
    judge = JudgePRM(backend, config)
    settings = {
        "splits": splits,
        "limit": args.limit,
        "seed": args.seed,
        "max_new_tokens": args.max_new_tokens,
        "temperature": temperature,
        "forced_verdict": args.forced_verdict,
        "model_dir": str(model_dir),
        "load_seconds": round(load_seconds, 1),
    }
    result = evaluate_processbench(data, judge, args.mode, settings=settings)

    print(markdown_table(result))
    print(json.dumps(result.summary()))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result.to_dict(), indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
