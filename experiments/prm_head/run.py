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
    Screened,
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
    p.add_argument("--layers", default="6,10,14", help="trunk blocks tried (one pass); the one with the best held-out "
                   "F1 on our own labels is used")
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
    p.add_argument("--screened", type=Path, default=None,
                   help="the guard's verdicts (JSON): read when the file exists (the guard is not run again), else written")
    p.add_argument("--csv", type=Path, default=HERE / "results.csv")
    p.add_argument("--json", type=Path, default=None, help="also write the summary as JSON here")
    p.add_argument("--features", type=Path, default=None, help="also save every feature and score here (pickle), for diagnosis")
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
    if args.screened is not None and args.screened.is_file():
        # The guard ran before (on another machine): the same problems, the same verdicts.
        verdicts = json.loads(args.screened.read_text())
        clean_ids = set(verdicts["clean"])
        screened = Screened([p for p in problems if p.problem_id in clean_ids],
                            [(p, verdicts["refused"][p.problem_id]) for p in problems if p.problem_id in verdicts["refused"]])
    else:
        from tentalis_pipelines import contamination

        items, _, _ = contamination.static_items(("gsm8k", "math500"), root, required=("gsm8k",))
        items += processbench_items(root, SPLITS)
        index = contamination.ContaminationIndex(items, contamination.default_cache_dir(paths.home))
        screened = screen_problems(problems, index, use_embeddings=not args.no_embeddings)
        if args.screened is not None:
            args.screened.write_text(json.dumps({"clean": [p.problem_id for p in screened.clean],
                                                 "refused": {p.problem_id: m.as_dict() for p, m in screened.refused}}))
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

    # 2. features of our labels, every layer tried from one pass
    t = time.perf_counter()
    layers = [int(x) for x in args.layers.split(",")]
    trunk = load_trunk(resolve_model(args.model, paths.models), max(layers))
    f_train = step_features(trunk, [(s.problem, s.steps) for s in train], max_tokens=args.max_tokens, layers=layers)
    f_val = step_features(trunk, [(s.problem, s.steps) for s in val], max_tokens=args.max_tokens, layers=layers)
    times["features_train"] = time.perf_counter() - t
    print(f"features of our labels: {sum(len(f) for f in f_train + f_val)} steps, {times['features_train']:.0f} s "
          f"({trunk.dtype}, layers {layers})", flush=True)

    # 3. a head per layer; the layer and threshold are chosen on the held-out slice of OUR labels
    t = time.perf_counter()
    val_labels = [s.first_error for s in val]
    val_flags = [calculator_flags(s.problem, s.steps) for s in val]
    y = np.concatenate([np.asarray(s.labels[: len(f)]) for s, f in zip(train, f_train) if len(f)])
    heads = {}
    for li, layer in enumerate(layers):
        cfg = HeadConfig(layer=layer, hidden=args.hidden, epochs=args.epochs, lr=args.lr, weight_decay=args.weight_decay,
                         seed=args.seed, max_tokens=args.max_tokens)
        x = np.concatenate([f[:, li] for f in f_train if len(f)])
        head = train_head(x, y, cfg)
        val_scores = score_steps(head, [f[:, li] for f in f_val])
        thr, vf1 = choose_threshold(val_scores, val_labels)
        thr_c, vf1_c = choose_threshold(val_scores, val_labels, flags=val_flags)
        heads[layer] = (li, head, thr, vf1, thr_c, vf1_c)
        print(f"head on layer {layer}: threshold {thr:.3f} (held-out F1 {100 * vf1:.1f}); with the calculator "
              f"{thr_c:.3f} ({100 * vf1_c:.1f})", flush=True)
    best = max(layers, key=lambda layer: (heads[layer][3], -layer))
    li, head, threshold, val_f1, threshold_calc, val_f1_calc = heads[best]
    times["train"] = time.perf_counter() - t
    print(f"chosen: layer {best} (held-out F1 {100 * val_f1:.1f}); {len(y)} training steps ({int(y.sum())} correct); "
          f"{times['train']:.0f} s", flush=True)

    # 4. ProcessBench
    rows = []
    dump = None
    if args.features:
        dump = {"layers": layers, "train": [(s.first_error, s.labels, f.astype(np.float16)) for s, f in zip(train, f_train)],
                "val": [(s.first_error, s.labels, f.astype(np.float16)) for s, f in zip(val, f_val)], "processbench": {}}
    t = time.perf_counter()
    for split, limit in zip(splits, limits):
        ts = time.perf_counter()
        samples = load_processbench(split, data_dir=root, limit=limit or None, seed=args.seed)
        feats = step_features(trunk, [(s.problem, s.steps) for s in samples], max_tokens=args.max_tokens, layers=layers)
        scores = score_steps(head, [f[:, li] for f in feats])
        flags = [calculator_flags(s.problem, s.steps) for s in samples]
        labels = [s.label for s in samples]
        preds = {
            "head": [first_error(sc, threshold) for sc in scores],
            "head+calculator": [first_error_with_flags(sc, threshold_calc, fl) for sc, fl in zip(scores, flags)],
            "calculator": [first_error_with_flags([], 0.0, fl) for fl in flags],
        }
        cut = sum(len(f) < len(s.steps) for f, s in zip(feats, samples))
        for layer in layers:  # diagnosis only: the layers not chosen, at their own held-out thresholds
            if layer != best:
                lj, h2, t2, _, _, _ = heads[layer]
                preds[f"head@layer{layer} (not chosen)"] = [first_error(sc, t2) for sc in score_steps(h2, [f[:, lj] for f in feats])]
        if dump is not None:
            dump["processbench"][split] = {"labels": [s.label for s in samples], "features": [f.astype(np.float16) for f in feats],
                                           "flags": flags}
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
               "load_at_end": os.getloadavg()[0], "layer": best, "cpu": host_cpu(), "threads": torch.get_num_threads(),
               "dtype": str(trunk.dtype), "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
               "labels": {"problems": len(problems), "refused": len(screened.refused), "solutions": len(labelled),
                          "kinds": kinds, "train_steps": int(len(y)), "threshold": threshold, "threshold_calc": threshold_calc,
                          "held_out_f1": val_f1, "held_out_f1_calc": val_f1_calc}}
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with args.csv.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    if dump is not None:
        import pickle

        with args.features.open("wb") as fh:
            pickle.dump(dump, fh)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary))
    print(f"total {total:.0f} s (labels {times['labels']:.0f}, features {times['features_train']:.0f}, train {times['train']:.0f}, "
          f"ProcessBench {times['processbench']:.0f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
