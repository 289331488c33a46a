"""Replay one learning cycle's update under another advantage rule, on the same rows, and measure it.

A worker that collapses (round 9b's seed 2: 12.5% -> 3.1% held-out after cycle 2) was trained on exactly
the rows its checkpoint's lineage names. This script rebuilds that training set (``lineage.replay``'s
rows, at the pinned table versions), recomputes the advantages under a rule, trains the same config from
the parent checkpoint (its adapter and optimizer state), and evaluates the result greedily on the held-out
arithmetic set, without writing to the home. Rules:

* ``asis``: the stored advantages (a determinism check: it reproduces the recorded accuracy);
* ``outcome``: DAPO's dynamic-sampling filter on the verifier's accuracy: a group whose samples are all
  wrong (or all right) trains nothing, whatever its shaping terms (format, process, manager score) say;
* ``none``: Dr. GRPO's centred advantages (``scale_rewards='none'``): no division by the group's std;
* ``verifier``: the outcome reward alone, standardised per group (no shaping at all);
* ``noguide``: the guided samples left out (advantages recomputed from the stored rewards without them);
* ``tagged``: only the guided samples in the worker's answer format (an ``<answer>`` tag) kept, the rest
  left out as in ``noguide``: a rescue counts only when the student is shown the format it is graded on.

A row a rule leaves out (an advantage of exactly 0 from ``outcome``'s filter, ``verifier``'s equal groups,
``noguide``/``tagged``'s guided rows) is dropped from the training set, as the pipeline's ``kept = False``
or absent row would be: it would otherwise still count in the loss's token normalisation and the step split.
``--even-steps`` splits the rows into optimizer steps of equal size (70 rows: 35 + 35) instead of the
trainer's ``per_step_rows`` chunks (64 + 6).

Each rule also prints where the stored update put its weight: the positive advantage on wrong samples
against that on right ones.

Usage: python -m experiments.manager_rl.replay --home /work/runs/mgr9b-cotrain-s2 --cycle 2 --rules asis,outcome
       [--out replay.csv]
"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
import time
from pathlib import Path

from tentalis_pipelines.evaluation.benchmarks import run_benchmark
from tentalis_pipelines.inference.models import resolve_model
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.lineage import load_manifest, order_trajectories
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.rewards.advantages import group_advantages
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.training import checkpoints as ckpt
from tentalis_pipelines.training.samples import build_training_samples
from tentalis_pipelines.training.trainer import GRPOConfig, build_policy, load_trainer_state, train_grpo

RULES = ("asis", "outcome", "none", "verifier", "noguide", "tagged")


def key(r: dict) -> str:
    return f"{r['task_id']}|{r['policy_version']}"


def advantages(rows: list[dict], rule: str, untagged: frozenset[str] = frozenset()) -> list[float]:
    """The advantage of each row under ``rule`` (see the module docstring); ``untagged``: the guided
    samples without an ``<answer>`` tag."""
    keys = [key(r) for r in rows]
    if rule == "asis":
        return [float(r["advantage"]) for r in rows]
    if rule == "none":
        return group_advantages(keys, [r["reward"] for r in rows], scale_rewards="none")[0]
    if rule == "verifier":
        return group_advantages(keys, [r["outcome_reward"] for r in rows], scale_rewards="group")[0]
    if rule in ("noguide", "tagged"):
        left_out = (lambda r: r.get("guide_hint_id")) if rule == "noguide" else (lambda r: r["rollout_id"] in untagged)
        on_policy = [i for i, r in enumerate(rows) if not left_out(r)]
        adv, _ = group_advantages([keys[i] for i in on_policy], [rows[i]["reward"] for i in on_policy], scale_rewards="group")
        out = [0.0] * len(rows)
        for i, a in zip(on_policy, adv):
            out[i] = a
        return out
    if rule == "outcome":
        _, mixed = group_advantages(keys, [r["outcome_reward"] for r in rows], scale_rewards="group")
        return [float(r["advantage"]) if m else 0.0 for r, m in zip(rows, mixed)]
    raise ValueError(f"rule must be one of {RULES}, got {rule!r}")


def weight_split(rows: list[dict], adv: list[float]) -> dict[str, float]:
    """The positive advantage mass on wrong samples and on right ones, and the groups that train."""
    return {"pos_wrong": round(sum(a for r, a in zip(rows, adv) if a > 0 and r["outcome_reward"] <= 0), 2),
            "pos_right": round(sum(a for r, a in zip(rows, adv) if a > 0 and r["outcome_reward"] > 0), 2),
            "groups_training": len({key(r) for r, a in zip(rows, adv) if abs(a) > 1e-8})}


def cycle_rows(lake: Lakehouse, checkpoint_id: str) -> tuple[dict, list[dict]]:
    """The manifest of a checkpoint and its trajectories rows at the pinned version, in training order."""
    manifest = load_manifest(lake, checkpoint_id)
    wanted = {(t["batch_id"], t["rollout_id"]) for t in manifest["trajectories"]}
    rows = []
    for batch in manifest["batches"]:
        rows += [r for r in lake.read("trajectories", batch_id=batch, version=manifest["tables"]["trajectories"]).to_pylist()
                 if (r["batch_id"], r["rollout_id"]) in wanted]
    return manifest, order_trajectories(rows)


def replay(home: Path, cycle: int, rule: str, scratch: Path, even_steps: bool = False) -> dict:
    from transformers import AutoTokenizer

    lake = Lakehouse(home / "lakehouse")
    chain = sorted(lake.read("checkpoints").to_pylist(), key=lambda r: r["created_at"])
    target = chain[cycle - 1]
    parent = None if cycle == 1 else Path(chain[cycle - 2]["adapter_uri"])
    manifest, rows = cycle_rows(lake, target["checkpoint_id"])
    untagged = frozenset(g["rollout_id"] for g in lake.read("guided_rollouts", columns=["rollout_id", "completion"]).to_pylist()
                         if "<answer>" not in g["completion"]) if lake.exists("guided_rollouts") else frozenset()
    adv = advantages(rows, rule, untagged)
    split = weight_split(rows, adv)
    rows = [{**r, "advantage": a, "advantage_mode": "outcome"} for r, a in zip(rows, adv) if rule == "asis" or a != 0.0]
    paths = Paths(home)
    model_dir = resolve_model("embedded", paths.models)
    tok = AutoTokenizer.from_pretrained(model_dir)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    samples, _ = build_training_samples(lake, tok, rows, manifest["tables"])
    config = GRPOConfig(**manifest["config"])
    if even_steps:  # ceil(n / per_step_rows) steps of (nearly) equal size
        n_steps = -(-len(samples) // config.per_step_rows)
        config = GRPOConfig(**{**config.to_dict(), "per_step_rows": -(-len(samples) // n_steps)})
    model = build_policy(model_dir, parent, config)
    state = load_trainer_state(parent, next(model.parameters()).device)
    t0 = time.perf_counter()
    result = train_grpo(model, tok, samples, config, state=state)
    adapter = ckpt.save_adapter(model, scratch, f"{home.name}-c{cycle}-{rule}{'-even' if even_steps else ''}")
    del model
    backend = PolicySettings(model="embedded").make_backend(model_dir, str(adapter))
    summary, _ = run_benchmark(backend, "arithmetic")
    recorded = [r for r in lake.read("benchmark_results").to_pylist()
                if r["checkpoint_id"] == target["checkpoint_id"] and r["benchmark"] == "arithmetic"]
    return {"home": home.name, "cycle": cycle, "rule": rule, "even_steps": even_steps, "rows": len(samples),
            "per_step_rows": config.per_step_rows, "checkpoint_id": target["checkpoint_id"],
            "recorded_accuracy": recorded[0]["accuracy"] if recorded else None,
            "accuracy": summary.accuracy, "lenient_accuracy": summary.lenient_accuracy, "format_rate": summary.format_rate,
            **split, "optimizer_steps": result.metrics.get("optimizer_steps"),
            "seconds": round(time.perf_counter() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", required=True)
    ap.add_argument("--cycle", type=int, required=True)
    ap.add_argument("--rules", default="asis,outcome")
    ap.add_argument("--out", default=None, help="append one CSV row per rule")
    ap.add_argument("--even-steps", action="store_true", help="optimizer steps of equal size")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        for rule in args.rules.split(","):
            row = replay(Path(args.home), args.cycle, rule, Path(scratch), args.even_steps)
            print(json.dumps(row), flush=True)
            if args.out:
                new = not Path(args.out).exists()
                with open(args.out, "a", newline="") as f:
                    w = csv.DictWriter(f, fieldnames=list(row))
                    if new:
                        w.writeheader()
                    w.writerow(row)


if __name__ == "__main__":
    main()
