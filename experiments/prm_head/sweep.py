"""Sweep the PRM head's recipe on saved features (``features.py``): features, training data, decision rule,
loss. Every choice is made on the held-out slice of OUR labels; ProcessBench GSM8K is only reported.

The held-out metric: ProcessBench's F1 (first error) on the held-out problems' solutions, both renderings
(plain GSM8K steps and the same solutions in ProcessBench's shape) as one set. Greedy, stage by stage:
each stage keeps the variant with the best held-out F1 (ties: the earlier, simpler one).

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python -m experiments.prm_head.sweep /tmp/prm_sweep.pkl --csv experiments/prm_head/sweep.csv
"""

from __future__ import annotations

import argparse
import csv
import pickle
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from tentalis_pipelines.evaluation.processbench import processbench_metrics
from tentalis_pipelines.reviewers.prm_head import HeadConfig, choose_rule, score_steps, train_head


@dataclass(frozen=True)
class Variant:
    layers: tuple[int, ...] = (6,)
    pooling: str = "last"  # last | mean | last+mean
    center: bool = False  # subtract the solution's mean step feature
    data: str = "ours"  # ours | pbstyle | both
    rule: str = "threshold"
    hidden: int = 0
    dropout: float = 0.0
    weight_decay: float = 1e-2
    balance: bool = True

    def name(self) -> str:
        return (f"L{'+'.join(map(str, self.layers))} {self.pooling}{' centred' if self.center else ''} data={self.data} "
                f"rule={self.rule} {'linear' if not self.hidden else f'mlp{self.hidden} do{self.dropout}'} wd={self.weight_decay}"
                f"{'' if self.balance else ' unbalanced'}")


def transform(f: np.ndarray, v: Variant, layers: list[int], hidden: int) -> np.ndarray:
    """[steps, len(layers), 2*hidden] float16 -> the variant's [steps, dim] float32."""
    part = {"last": slice(0, hidden), "mean": slice(hidden, 2 * hidden), "last+mean": slice(0, 2 * hidden)}[v.pooling]
    x = f[:, [layers.index(layer) for layer in v.layers], part].astype(np.float32).reshape(len(f), -1)
    if v.center and len(x):
        x = x - x.mean(0, keepdims=True)
    return x


def auc(scores, labels) -> float:
    s, y = np.asarray(scores), np.asarray(labels)
    pos, neg = s[y == 1], s[y == 0]
    return float((pos[:, None] > neg[None, :]).mean()) if len(pos) and len(neg) else float("nan")


def pb_step_labels(scores, first_errors):
    xs, ys = [], []
    for s, lab in zip(scores, first_errors):
        for i, x in enumerate(s):
            if lab == -1 or i <= lab:
                xs.append(x)
                ys.append(int(lab == -1 or i < lab))
    return xs, ys


def evaluate(d, v: Variant, held: set[str]) -> dict:
    layers, hidden = d["layers"], d["hidden"]
    sources = {"ours": ["ours"], "pbstyle": ["ours_pbstyle"], "both": ["ours", "ours_pbstyle"]}[v.data]
    train = [r for src in sources for r in d[src] if r["problem_id"] not in held and len(r["features"])]
    val = [r for src in ("ours", "ours_pbstyle") for r in d[src] if r["problem_id"] in held]
    x = np.concatenate([transform(r["features"], v, layers, hidden) for r in train])
    y = np.concatenate([np.asarray(r["labels"][: len(r["features"])]) for r in train])
    cfg = HeadConfig(layer=max(v.layers), hidden=v.hidden, dropout=v.dropout, weight_decay=v.weight_decay, balance=v.balance,
                     lr=1e-2 if not v.hidden else 3e-3)
    t = time.perf_counter()
    head = train_head(x, y, cfg)
    train_s = time.perf_counter() - t
    val_scores = score_steps(head, [transform(r["features"], v, layers, hidden) for r in val])
    rule, val_f1 = choose_rule(val_scores, [r["first_error"] for r in val], v.rule)
    val_auc = auc(np.concatenate([np.asarray(s) for s in val_scores if s]),
                  np.concatenate([np.asarray(r["labels"][: len(s)]) for s, r in zip(val_scores, val) if s]))
    pb = d["processbench"]
    pb_scores = score_steps(head, [transform(r["features"], v, layers, hidden) for r in pb])
    labels = [r["label"] for r in pb]
    m = processbench_metrics(labels, [rule.predict(s) for s in pb_scores])
    return {"variant": v.name(), "held_out_f1": round(100 * val_f1, 1), "held_out_auc": round(val_auc, 3),
            "rule": f"{rule.kind} t={rule.threshold:.3f}" + (f" d={rule.drop}" if rule.kind == "drop" else ""),
            "pb_err": round(100 * m.error_accuracy, 1), "pb_cor": round(100 * m.correct_accuracy, 1), "pb_f1": round(100 * m.f1, 1),
            "pb_step_auc": round(auc(*pb_step_labels(pb_scores, labels)), 3), "train_steps": len(y), "train_s": round(train_s, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("features", type=Path)
    p.add_argument("--csv", type=Path, default=Path(__file__).resolve().parent / "sweep.csv")
    p.add_argument("--held-out", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    with args.features.open("rb") as fh:
        d = pickle.load(fh)
    pids = sorted({r["problem_id"] for r in d["ours"]})
    random.Random(args.seed).shuffle(pids)
    held = set(pids[: int(len(pids) * args.held_out)])
    rows = []

    def stage(name: str, variants: list[Variant]) -> Variant:
        results = []
        for v in variants:
            r = {"stage": name, **evaluate(d, v, held)}
            results.append((r["held_out_f1"], -len(results), v, r))
            rows.append(r)
            print(f"[{name}] {r}", flush=True)
        best = max(results, key=lambda t: (t[0], t[1]))
        for _, _, v, r in results:
            r["chosen"] = v == best[2]
        print(f"[{name}] chosen: {best[2].name()} (held-out F1 {best[0]})", flush=True)
        return best[2]

    layers = d["layers"]
    v = Variant(layers=(6,))
    v = stage("layer", [replace(v, layers=(layer,)) for layer in layers])
    v = stage("pooling", [replace(v, pooling=pl, center=c) for pl in ("last", "mean", "last+mean") for c in (False, True)])
    multi = [tuple(layers[i:i + 3]) for i in range(0, len(layers) - 2, 2)] + [tuple(layers)]
    v = stage("layers concatenated", [v] + [replace(v, layers=m) for m in multi])
    v = stage("training data", [replace(v, data=x) for x in ("ours", "pbstyle", "both")])
    v = stage("decision rule", [replace(v, rule=x) for x in ("threshold", "drop", "argmin")])
    v = stage("loss", [replace(v, weight_decay=w) for w in (1e-2, 1e-1, 1.0)] + [replace(v, balance=False)]
              + [replace(v, hidden=32, dropout=dp) for dp in (0.0, 0.3)])
    print(f"final: {v.name()}")
    with args.csv.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
