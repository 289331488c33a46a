"""Grounding benchmark: the deterministic check, the MiniLM token tagger, and both, on synthetic corruptions.

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python -m experiments.grounding.grounding_bench \
        --sessions 500 --epochs 1 --save $TENTALIS_HOME/reviewers/grounding-tagger

Data: ``grounding_data.make_sessions`` (6 tool kinds, 2 faithful + 2 corrupted answers per session), split
by session (``split_by_session``, 25 % test, seeded). The tagger trains on the train split only.

Metrics (test split):
* response-level: an answer is predicted hallucinated when any span is flagged; P/R/F1 against "has a
  gold span";
* span-level, **exact**: a predicted span counts only when its (start, end) equals a gold span's exactly
  (each gold span matched once); also reported, looser: **overlap** (any shared character);
* latency: wall time per pair of the whole check (rules, tokenizer, MiniLM forward, span decoding), one
  pair at a time, p50/p95 over the test split, with the thread count and the load average printed.

Writes ``results.csv`` (one row per detector) beside this file, or ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import os
import time
from pathlib import Path

from tentalis_pipelines.hardware import host_cpu
from tentalis_pipelines.reviewers.grounding import Flag, check_answer
from tentalis_pipelines.reviewers.grounding_data import Pair, make_sessions, split_by_session
from tentalis_pipelines.reviewers.grounding_tagger import GroundingTagger, TaggerConfig, combine, train_tagger
from tentalis_pipelines.skills.embedder import model_dir

HERE = Path(__file__).parent


def f1(tp: int, fp: int, fn: int) -> tuple[float, float, float]:
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def score(pairs: list[Pair], predictions: list[list[Flag]]) -> dict[str, float]:
    """Response-level and span-level (exact and overlap) precision, recall, F1."""
    rtp = rfp = rfn = 0
    etp = efp = efn = 0
    otp = ofp = ofn = 0
    for pair, flags in zip(pairs, predictions):
        pred, gold = bool(flags), pair.hallucinated
        rtp, rfp, rfn = rtp + (pred and gold), rfp + (pred and not gold), rfn + (gold and not pred)
        golds = [(s, e) for s, e, _ in pair.spans]
        exact = {(f.start, f.end) for f in flags}
        hit = sum(g in exact for g in golds)
        etp, efp, efn = etp + hit, efp + len(exact) - hit, efn + len(golds) - hit
        o_hit = sum(any(f.start < e and f.end > s for f in flags) for s, e in golds)
        o_pred = sum(any(f.start < e and f.end > s for s, e in golds) for f in flags)
        otp, ofp, ofn = otp + o_hit, ofp + len(flags) - o_pred, ofn + len(golds) - o_hit
    out = {}
    for name, (tp, fp, fn) in {"response": (rtp, rfp, rfn), "span_exact": (etp, efp, efn), "span_overlap": (otp, ofp, ofn)}.items():
        p, r, f = f1(tp, fp, fn)
        out.update({f"{name}_precision": round(p, 4), f"{name}_recall": round(r, 4), f"{name}_f1": round(f, 4)})
    return out


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def run(sessions: int, epochs: int, lr: float, seed: int, save: Path | None, out: Path, tagger_dir: Path | None,
        rules_only: bool = False) -> list[dict]:
    import torch

    threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0)
    if threads:
        torch.set_num_threads(threads)
    pairs = make_sessions(sessions, seed=seed)
    train, test = split_by_session(pairs, seed=seed)
    assert not {p.session_id for p in train} & {p.session_id for p in test}
    print(f"{len(pairs)} pairs in {sessions} sessions: train {len(train)}, test {len(test)} "
          f"({sum(p.hallucinated for p in test)} hallucinated)")
    started = time.time()
    tagger: GroundingTagger | None
    if rules_only:
        tagger, train_s = None, 0.0
    elif tagger_dir is not None:
        tagger = GroundingTagger.load(tagger_dir)
        train_s = 0.0
    else:
        tagger = train_tagger(train, model_dir(), TaggerConfig(epochs=epochs, seed=seed, learning_rate=lr),
                              on_step=lambda s, n, loss: print(f"  step {s}/{n} loss {loss:.4f}", flush=True) if s % 20 == 0 or s == n else None)
        train_s = time.time() - started
        print(f"trained in {train_s:.0f} s; unsupported-token weight {tagger.positive_weight:.2f}, threshold {tagger.threshold} "
              f"(exact-span F1 {tagger.held_out_f1} on held-out training sessions)")
        if save is not None:
            tagger.save(save)
    rows = []
    preds: dict[str, list[list[Flag]]] = {"rules": [], "tagger": [], "combined": []}
    lat: dict[str, list[float]] = {k: [] for k in preds}
    load_before = os.getloadavg()
    for p in test:
        t0 = time.perf_counter()
        rules = check_answer(p.answer, p.context)
        t1 = time.perf_counter()
        tagged = tagger.predict(p.answer, p.context) if tagger is not None else []
        t2 = time.perf_counter()
        both = combine(rules, tagged)
        t3 = time.perf_counter()
        preds["rules"].append(rules)
        preds["tagger"].append(tagged)
        preds["combined"].append(both)
        lat["rules"].append(t1 - t0)
        lat["tagger"].append(t2 - t1)
        lat["combined"].append(t3 - t0)
    load_after = os.getloadavg()
    cpu = host_cpu()
    for name in (["rules"] if tagger is None else preds):
        ms = [x * 1000 for x in lat[name]]
        rows.append({"detector": name, "test_pairs": len(test), "train_pairs": len(train), **score(test, preds[name]),
                     "p50_ms": round(percentile(ms, 0.5), 2), "p95_ms": round(percentile(ms, 0.95), 2),
                     "omp_threads": threads or torch.get_num_threads(), "load_1m_before": round(load_before[0], 2),
                     "load_1m_after": round(load_after[0], 2), "train_seconds": round(train_s, 1), "cpu": cpu.get("model", ""),
                     "tagger_threshold": None if tagger is None else tagger.threshold,
                     "tagger_positive_weight": None if tagger is None or tagger.positive_weight is None else round(tagger.positive_weight, 2)})
    for r in rows:
        print({k: r[k] for k in ("detector", "response_f1", "span_exact_f1", "span_overlap_f1", "p50_ms", "p95_ms")})
    with out.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {out}; load average {load_before[0]:.2f} -> {load_after[0]:.2f}; CPU {cpu.get('model')}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=500)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", type=Path, default=None, help="save the trained tagger here (review.grounding_tagger)")
    ap.add_argument("--tagger", type=Path, default=None, help="evaluate this saved tagger instead of training one")
    ap.add_argument("--rules-only", action="store_true", help="the deterministic check alone (no tagger trained)")
    ap.add_argument("--out", type=Path, default=HERE / "results.csv")
    a = ap.parse_args()
    run(a.sessions, a.epochs, a.lr, a.seed, a.save, a.out, a.tagger, a.rules_only)


if __name__ == "__main__":
    main()
