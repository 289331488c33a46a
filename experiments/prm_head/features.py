"""Extract once, sweep cheaply: the trunk's step features for our labels (plain and ProcessBench-shaped) and
ProcessBench's GSM8K split, several layers, last-token and mean-pooled, saved to one pickle for ``sweep.py``.

    TENTALIS_DATA_DIR=../shared/data OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python -m experiments.prm_head.features \\
        --train-problems 600 --layers 4,6,8,10,12,14 --out /tmp/prm_sweep.pkl
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import time
from pathlib import Path

import numpy as np
import torch

from tentalis_pipelines.evaluation.processbench import SPLITS, load_processbench
from tentalis_pipelines.hardware import host_cpu
from tentalis_pipelines.inference.models import resolve_model
from tentalis_pipelines.reviewers.prm_head import calculator_flags, load_trunk, step_features_and_surprise
from tentalis_pipelines.reviewers.prm_labels import (
    build_label_set,
    load_gsm8k_train,
    processbench_items,
    processbench_style,
    screen_problems,
)
from tentalis_pipelines.settings import Paths, data_dir


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train-problems", type=int, default=600)
    p.add_argument("--layers", default="4,6,8,10,12,14")
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", default="gsm8k", choices=SPLITS)
    p.add_argument("--out", type=Path, default=Path("/tmp/prm_sweep.pkl"))
    p.add_argument("--surprise", action="store_true", help="also each step's surprise under the whole model (step_surprise)")
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    root, paths = data_dir(), Paths.from_env()
    times, load = {}, os.getloadavg()
    t = time.perf_counter()
    from tentalis_pipelines import contamination

    problems = load_gsm8k_train(root / "gsm8k" / "train.jsonl", limit=args.train_problems, seed=args.seed)
    items, _, _ = contamination.static_items(("gsm8k", "math500"), root, required=("gsm8k",))
    items += processbench_items(root, SPLITS)
    index = contamination.ContaminationIndex(items, contamination.default_cache_dir(paths.home))
    screened = screen_problems(problems, index, use_embeddings=False)
    labelled = build_label_set(screened.clean, seed=args.seed)
    rng = random.Random(args.seed)
    styled = [processbench_style(s, rng) for s in labelled]
    times["labels"] = time.perf_counter() - t
    print(f"labels: {len(labelled)} solutions, {len(screened.refused)} problems refused; {times['labels']:.0f} s", flush=True)
    layers = [int(x) for x in args.layers.split(",")]
    trunk = load_trunk(resolve_model("embedded", paths.models), max(layers), full=args.surprise)

    def feats(sols):
        f, u = step_features_and_surprise(trunk, [(s.problem, s.steps) for s in sols], max_tokens=args.max_tokens, layers=layers,
                                          pooling="last+mean", surprise=args.surprise)
        return [(x.astype(np.float16), None if u is None else u[i]) for i, x in enumerate(f)]

    out = {"layers": layers, "pooling": "last+mean", "hidden": trunk.model.config.hidden_size}
    for name, sols in (("ours", labelled), ("ours_pbstyle", styled)):
        t = time.perf_counter()
        out[name] = [{"problem_id": s.problem_id, "kind": s.kind, "first_error": s.first_error, "labels": s.labels,
                      "flags": calculator_flags(s.problem, s.steps), "features": f, "surprise": u} for s, (f, u) in zip(sols, feats(sols))]
        times[name] = time.perf_counter() - t
        print(f"{name}: {sum(len(r['features']) for r in out[name])} steps, {times[name]:.0f} s", flush=True)
    t = time.perf_counter()
    samples = load_processbench(args.split, data_dir=root)
    out["processbench"] = [{"label": s.label, "flags": calculator_flags(s.problem, s.steps), "n_steps": len(s.steps),
                            "features": f, "surprise": u} for s, (f, u) in zip(samples, feats(samples))]
    times["processbench"] = time.perf_counter() - t
    out["meta"] = {"times_s": times, "load_start": load, "load_end": os.getloadavg(), "cpu": host_cpu(),
                   "threads": torch.get_num_threads(), "dtype": str(trunk.dtype), "args": {k: str(v) for k, v in vars(args).items()}}
    with args.out.open("wb") as fh:
        pickle.dump(out, fh)
    print(json.dumps(out["meta"], default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
