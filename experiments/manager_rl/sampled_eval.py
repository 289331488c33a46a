"""The held-out arithmetic set under sampling: each checkpoint's per-item accuracy over several samples at
the training temperature, beside the greedy accuracy the learning curve records.

Why: a 135M worker's greedy answer can latch onto one template (round 9b's seed 2 answers
``<step>N things: N * M``) while the policy it samples from is no worse than another arm's. Replaying
that seed's cycle-2 update under four advantage rules (``replay.py``) collapsed the greedy accuracy
every time, so the question is what the greedy number measures. The mean over samples is the policy's
expected accuracy; it has less variance per item than one greedy answer.

Writes one JSONL row per (home, cycle, item): samples, strict correct (``<answer>`` tag and the
reference), lenient correct. ``--compare A B`` then prints B - A per seed and over the seeds (paired by
item; two-level bootstrap: seeds, then items), at the given cycle.

Usage: python -m experiments.manager_rl.sampled_eval run --home /work/runs/mgr9b-cotrain-s2 --cycles 2,4 --out sampled.jsonl
       python -m experiments.manager_rl.sampled_eval compare --file sampled.jsonl --cycle 4 --seeds 0,1,2,3 mgr5-base mgr9b-cotrain
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from experiments.manager_rl.round2_workers import two_level_bootstrap
from tentalis_pipelines.evaluation.benchmarks import MAX_NEW_TOKENS, load_benchmark
from tentalis_pipelines.inference.base import SamplingParams
from tentalis_pipelines.inference.models import resolve_model
from tentalis_pipelines.inference.prompts import render_prompt
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.rewards.math_answers import answers_match
from tentalis_pipelines.rewards.steps import last_number, parse_completion
from tentalis_pipelines.settings import Paths


def run(home: Path, cycles: list[int], samples: int, temperature: float, out: Path) -> None:
    lake = Lakehouse(home / "lakehouse")
    chain = sorted(lake.read("checkpoints").to_pylist(), key=lambda r: r["created_at"])
    _, items = load_benchmark("arithmetic")
    paths = Paths(home)
    model_dir = resolve_model("embedded", paths.models)
    for k in cycles:
        adapter = None if k == 0 else chain[k - 1]["adapter_uri"]
        backend = PolicySettings(model="embedded").make_backend(model_dir, adapter)
        prompts = [render_prompt(backend.tokenizer, it.prompt) for it in items]
        t0 = time.perf_counter()
        gens = backend.generate(prompts, SamplingParams(num_generations=samples, max_new_tokens=MAX_NEW_TOKENS.get("arithmetic", 256),
                                                        temperature=temperature, seed=1000 + k))
        lines = []
        for it, g in zip(items, gens):
            strict = lenient = 0
            for s in g:
                p = parse_completion(s.text)
                ok = p.has_answer_tag and answers_match(p.answer, it.reference)
                strict += ok
                lenient += ok or answers_match(last_number(s.text), it.reference) or answers_match(p.answer, it.reference)
            lines.append(json.dumps({"home": home.name, "cycle": k, "checkpoint_id": "base" if k == 0 else chain[k - 1]["checkpoint_id"],
                                     "item_id": it.item_id, "samples": len(g), "strict": strict, "lenient": lenient,
                                     "temperature": temperature}) + "\n")
        with out.open("a") as f:  # one write: several seeds' processes append to one file
            f.write("".join(lines))
        print(f"{home.name} cycle {k}: {time.perf_counter() - t0:.0f}s", flush=True)


def load(file: Path) -> dict[tuple[str, int], dict[str, float]]:
    """(home, cycle) -> item -> strict accuracy over the samples."""
    out: dict[tuple[str, int], dict[str, float]] = {}
    for line in file.read_text().splitlines():
        r = json.loads(line)
        out.setdefault((r["home"], r["cycle"]), {})[r["item_id"]] = r["strict"] / r["samples"]
    return out


def compare(file: Path, cycle: int, seeds: list[int], a: str, b: str) -> None:
    acc = load(file)
    pairs = {}
    for s in seeds:
        ha, hb = acc.get((f"{a}-s{s}", cycle)), acc.get((f"{b}-s{s}", cycle))
        if ha is None or hb is None:
            print(f"seed {s}: missing ({a}: {ha is not None}, {b}: {hb is not None})")
            continue
        items = sorted(set(ha) & set(hb))
        pairs[s] = ([hb[i] for i in items], [ha[i] for i in items])
        print(f"seed {s}: {a} {100 * np.mean(pairs[s][1]):.1f}%  {b} {100 * np.mean(pairs[s][0]):.1f}%  "
              f"diff {100 * (np.mean(pairs[s][0]) - np.mean(pairs[s][1])):+.1f}")
    if pairs:
        d, lo, hi = two_level_bootstrap(pairs)
        print(f"{b} - {a}, cycle {cycle}, seeds {sorted(pairs)}: {100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] (seeds and items drawn)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--home", required=True)
    r.add_argument("--cycles", default="4")
    r.add_argument("--samples", type=int, default=8)
    r.add_argument("--temperature", type=float, default=0.8)
    r.add_argument("--out", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--file", required=True)
    c.add_argument("--cycle", type=int, default=4)
    c.add_argument("--seeds", default="0,1,2,3")
    c.add_argument("a")
    c.add_argument("b")
    args = ap.parse_args()
    if args.cmd == "run":
        run(Path(args.home), [int(k) for k in args.cycles.split(",")], args.samples, args.temperature, Path(args.out))
    else:
        compare(Path(args.file), args.cycle, [int(s) for s in args.seeds.split(",")], args.a, args.b)


if __name__ == "__main__":
    main()
