"""The PRM head benchmark: label GSM8K train (consensus), train the head, evaluate on ProcessBench, timed.

Every phase in one process, on the CPU, with its wall time: the contamination guard and consensus labels,
the trunk's features (train labels and ProcessBench), the head's training and threshold (chosen on a
held-out slice of our own labels), and ProcessBench's official metric per split. It reports the head
alone, the head with the calculator's verdict (a step the calculator flags is an error too), and the
calculator alone, and writes one CSV row per (split, scorer).

    TENTALIS_DATA_DIR=../shared/data OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python -m experiments.prm_head.run \\
        --train-problems 1500 --splits gsm8k,math,olympiadbench,omnimath --split-limit 0,200,200,200
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

from tentalis_pipelines import contamination
from tentalis_pipelines.evaluation.processbench import SPLITS, load_processbench, processbench_metrics
from tentalis_pipelines.hardware import host_cpu
from tentalis_pipelines.inference.models import resolve_model
from tentalis_pipelines.reviewers.prm_head import (
    HeadConfig,
    calculator_flags,
    choose_threshold,
    first_error,
    first_error_with_flags,
    load_trunk,
    score_steps,
    step_features,
    train_head,
)
from tentalis_pipelines.reviewers.prm_labels import (
    build_label_set,
    load_gsm8k_train,
    processbench_items,
    screen_problems,
)
from tentalis_pipelines.settings import Paths, data_dir

HERE = Path(__file__).resolve().parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train-problems", type=int, default=1500, help="GSM8K train problems sampled (seeded)")
    p.add_argument("--corruptions", type=int, default=2, help="corrupted copies tried per problem")
    p.add_argument("--held-out", type=float, default=0.2, help="share of problems kept for the threshold")
    p.add_argument("--layer", type=int, default=16)
    p.add_argument("--hidden", type=int, default=0, help="0: a linear head; else one hidden layer of this width")
    p.add_argument("--epochs", type=int, default=300)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--weight-decay", type=float, default=1e-2)
    p.add_argument("--max-tokens", type=int, default=1024, help="a solution's tokens read (later steps unscored)")
    p.add_argument("--splits", default="gsm8k,math,olympiadbench,omnimath")
    p.add_argument("--split-limit", default="0,200,200,200", help="items per split (0 = all), seeded sample")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-embeddings", action="store_true", help="contamination guard: exact and 13-gram tiers only")
    p.add_argument("--model", default="embedded")
    p.add_argument("--csv", type=Path, default=HERE / "results.csv")
    p.add_argument("--json", type=Path, default=None, help="also write the summary as JSON here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    splits = [s.strip() for s in args.splits.split(",") if s.strip()]
    limits = [int(x) for x in args.split_limit.split(",")]
    limits = (limits + [limits[-1]] * len(splits))[: len(splits)]
    root = data_dir()
    if root is None:
        print("set TENTALIS_DATA_DIR to the folder holding gsm8k/train.jsonl and processbench/", file=sys.stderr)
        return 2
    paths = Paths.from_env()
    times: dict[str, float] = {}
    load = os.getloadavg()[0]

    # 1. labels: the guard, then consensus labels
    t = time.perf_counter()
    problems = load_gsm8k_train(root / "gsm8k" / "train.jsonl", limit=args.train_problems, seed=args.seed)
    items, _, _ = contamination.static_items(("gsm8k", "math500"), root, required=("gsm8k",))
    items += processbench_items(root, SPLITS)
    index = contamination.ContaminationIndex(items, contamination.default_cache_dir(paths.home))
    screened = screen_problems(problems, index, use_embeddings=not args.no_embeddings)
    labelled = build_label_set(screened.clean, seed=args.seed, corruptions=args.corruptions)
    pids = sorted({s.problem_id for s in labelled})
    random.Random(args.seed).shuffle(pids)
    held = set(pids[: int(len(pids) * args.held_out)])
    train = [s for s in labelled if s.problem_id not in held]
    val = [s for s in labelled if s.problem_id in held]
    times["labels"] = time.perf_counter() - t
    kinds: dict[str, int] = {}
    for s in labelled:
        kinds[s.kind] = kinds.get(s.kind, 0) + 1
    print(f"labels: {len(problems)} problems, {len(screened.refused)} refused by the guard, {len(labelled)} solutions "
          f"kept by consensus {kinds}; train {len(train)}, held-out {len(val)}; {times['labels']:.0f} s", flush=True)

    # 2. features of our labels
    t = time.perf_counter()
    trunk = load_trunk(resolve_model(args.model, paths.models), args.layer)
    f_train = step_features(trunk, [(s.problem, s.steps) for s in train], max_tokens=args.max_tokens)
    f_val = step_features(trunk, [(s.problem, s.steps) for s in val], max_tokens=args.max_tokens)
    times["features_train"] = time.perf_counter() - t
    print(f"features of our labels: {sum(len(f) for f in f_train + f_val)} steps, {times['features_train']:.0f} s "
          f"({trunk.dtype}, layer {args.layer})", flush=True)

    # 3. the head and its threshold
    t = time.perf_counter()
    cfg = HeadConfig(layer=args.layer, hidden=args.hidden, epochs=args.epochs, lr=args.lr, weight_decay=args.weight_decay,
                     seed=args.seed, max_tokens=args.max_tokens)
    x = np.concatenate([f for f in f_train if len(f)])
    y = np.concatenate([np.asarray(s.labels[: len(f)]) for s, f in zip(train, f_train) if len(f)])
    head = train_head(x, y, cfg)
    val_scores = score_steps(head, f_val)
    val_labels = [s.first_error for s in val]
    threshold, val_f1 = choose_threshold(val_scores, val_labels)
    val_flags = [calculator_flags(s.problem, s.steps) for s in val]
    threshold_calc, val_f1_calc = choose_threshold(val_scores, val_labels, flags=val_flags)
    times["train"] = time.perf_counter() - t
    print(f"head: {len(y)} steps ({int(y.sum())} correct), threshold {threshold:.3f} (held-out F1 {100 * val_f1:.1f}); "
          f"with the calculator {threshold_calc:.3f} ({100 * val_f1_calc:.1f}); {times['train']:.0f} s", flush=True)

    # 4. ProcessBench
    rows = []
    t = time.perf_counter()
    for split, limit in zip(splits, limits):
        ts = time.perf_counter()
        samples = load_processbench(split, data_dir=root, limit=limit or None, seed=args.seed)
        feats = step_features(trunk, [(s.problem, s.steps) for s in samples], max_tokens=args.max_tokens)
        scores = score_steps(head, feats)
        flags = [calculator_flags(s.problem, s.steps) for s in samples]
        labels = [s.label for s in samples]
        preds = {
            "head": [first_error(sc, threshold) for sc in scores],
            "head+calculator": [first_error_with_flags(sc, threshold_calc, fl) for sc, fl in zip(scores, flags)],
            "calculator": [first_error_with_flags([], 0.0, fl) for fl in flags],
        }
        cut = sum(len(f) < len(s.steps) for f, s in zip(feats, samples))
        for scorer, pr in preds.items():
            m = processbench_metrics(labels, pr)
            rows.append({"split": split, "scorer": scorer, "n": m.n, "n_error": m.n_error, "n_correct": m.n_correct,
                         "acc_error": round(100 * m.error_accuracy, 1), "acc_correct": round(100 * m.correct_accuracy, 1),
                         "f1": round(100 * m.f1, 1), "truncated_items": cut, "seconds": round(time.perf_counter() - ts, 1)})
            print(f"{split:14s} {scorer:16s} n={m.n:4d} err {100 * m.error_accuracy:5.1f} cor {100 * m.correct_accuracy:5.1f} "
                  f"F1 {100 * m.f1:5.1f}", flush=True)
    times["processbench"] = time.perf_counter() - t
    total = sum(times.values())
    summary = {"times_s": {k: round(v, 1) for k, v in times.items()}, "total_s": round(total, 1), "load_at_start": load,
               "load_at_end": os.getloadavg()[0], "cpu": host_cpu(), "threads": torch.get_num_threads(),
               "dtype": str(trunk.dtype), "config": vars(args) | {"csv": str(args.csv), "json": str(args.json)},
               "labels": {"problems": len(problems), "refused": len(screened.refused), "solutions": len(labelled),
                          "kinds": kinds, "train_steps": int(len(y)), "threshold": threshold, "threshold_calc": threshold_calc,
                          "held_out_f1": val_f1, "held_out_f1_calc": val_f1_calc}}
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with args.csv.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary))
    print(f"total {total:.0f} s (labels {times['labels']:.0f}, features {times['features_train']:.0f}, train {times['train']:.0f}, "
          f"ProcessBench {times['processbench']:.0f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
