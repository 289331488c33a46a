"""The hackable-scorer experiment: does the reward-hacking detector catch a policy that games its manager?

Two runs of the same learning cycles (the same task batches, seeds and trainer), as runs of the asset jobs
on a Dagster instance each (``jobs/runner.py``, what ``tentalis learn`` runs), differing only in the manager:

* ``hacked``: ``review.manager = hackable``, a manager that pays for the length of the shown work;
* ``honest``: ``review.manager = verifier``, the answer-key manager.

Both use the reward ``review.reward_weights = {"manager": 1, others 0}`` (the manager's review is the
reward, as for chat) and promote every checkpoint (``trainer.promotion = always``), so the policy keeps
following its reward; every checkpoint is evaluated on the held-out arithmetic set. Then the forensics
detectors (``tentalis_pipelines/forensics.py``) read each run's lakehouse, checkpoint by checkpoint, and
every (run, cycle) becomes a row of the experiment's own Delta table ``ROOT/results/forensics_runs`` (not a
product table), of ``forensics_runs.csv`` and a point of ``forensics_curves.png`` beside this script.

    make forensics-experiment      # = .venv/bin/python -m experiments.reward_hacking.run --root .tentalis-forensics

``--analyze-only`` re-reads finished runs (no training).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

RUNS = {"hacked": "hackable", "honest": "verifier"}
MANAGER_ONLY = json.dumps({"outcome": 0.0, "format": 0.0, "process": 0.0, "manager": 1.0})
TASK_SEED0 = 7000  # training task seeds (below 1,000,000, the held-out seed); the same for both runs


def run_one(name: str, root: Path, args) -> None:
    """One run, in this process: its own home and Dagster instance (called in a subprocess per run)."""
    home = root / name
    os.environ["TENTALIS_HOME"] = str(home)
    os.environ["DAGSTER_HOME"] = str(home / "dagster")
    if args.model:
        os.environ["TENTALIS_MODEL"] = args.model
    from dagster import DagsterInstance

    from tentalis_pipelines.cli.common import home_paths

    paths = home_paths(str(home))
    from jobs.runner import CycleOptions, benchmark_partition, run_cycle, run_job
    from tentalis_pipelines.definitions import defs

    resources = {
        "policy": {"config": {"num_generations": args.num_generations, "max_new_tokens": args.max_new_tokens}},
        "review": {"config": {"manager": RUNS[name], "reward_weights": MANAGER_ONLY}},
        "trainer": {"config": {"promotion": "always", "seed": args.seed, "learning_rate": args.learning_rate}},
        "benchmark": {"config": {"limit": args.gate_limit, "max_new_tokens": args.max_new_tokens}},
    }
    quiet = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
    timings = []
    with DagsterInstance.get() as instance:
        from assets.partitions import checkpoint_ids

        if not instance.has_dynamic_partition(checkpoint_ids.name, "base"):
            instance.add_dynamic_partitions(checkpoint_ids.name, ["base"])
        t0 = time.time()
        run_job(defs, instance, "benchmark_job", partition_key=benchmark_partition("base", "arithmetic"),
                run_config={"resources": resources, **quiet})
        timings.append({"cycle": 0, "seconds": round(time.time() - t0, 1)})
        print(f"[{name}] base evaluated in {time.time() - t0:.0f} s", flush=True)
        for k in range(1, args.cycles + 1):
            t0 = time.time()
            out = run_cycle(defs, instance, paths, CycleOptions(num_tasks=args.num_tasks, seed=TASK_SEED0 + k, levels=(1,),
                                                                resources=resources, trigger="forensics-experiment"))
            timings.append({"cycle": k, "seconds": round(time.time() - t0, 1), "checkpoint_id": out["checkpoint_id"]})
            print(f"[{name}] cycle {k}/{args.cycles}: {out['checkpoint_id']} in {time.time() - t0:.0f} s", flush=True)
    (home / "timings.json").write_text(json.dumps(timings))


def analyze(root: Path, args) -> list[dict]:
    """Per (run, cycle): the chain's numbers and the detectors' verdicts up to that checkpoint."""
    from tentalis_pipelines import forensics
    from tentalis_pipelines.lakehouse import Lakehouse

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    rows = []
    for name in RUNS:
        home = root / name
        if not (home / "lakehouse").exists():
            continue
        lake = Lakehouse(home / "lakehouse")
        timings = {t["cycle"]: t["seconds"] for t in json.loads((home / "timings.json").read_text())}
        chain = forensics.checkpoint_chain(lake)  # one row per checkpoint (base first) with its numbers
        elapsed = 0.0
        for i, point in enumerate(chain.to_pylist()):
            elapsed += timings.get(i, 0.0)
            upto = chain.slice(0, i + 1)
            verdicts = forensics.chain_verdicts(lake, upto)
            rows.append({
                "run": name, "manager": RUNS[name], "cycle": i, "checkpoint_id": point["checkpoint_id"],
                "reward": point["reward"], "train_accuracy": point["accuracy"], "heldout_accuracy": point["heldout_accuracy"],
                "completion_tokens": point["completion_tokens"], "repeated_step_rate": point["repeated_step_rate"],
                "minutes": round(elapsed / 60, 2), "commit": commit,
                **{f"{k}_fired": v.fired for k, v in verdicts.items()},
                "evidence": json.dumps({k: v.evidence for k, v in verdicts.items()}, sort_keys=True, default=str),
            })
    return rows


def write_outputs(rows: list[dict], root: Path, docs: Path) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    from tentalis_pipelines.lakehouse import now_utc

    # The experiment's own table (read it with DuckDB over the Delta folder); re-analysing replaces it.
    created = now_utc()
    write_deltalake(str(root / "results" / "forensics_runs"), pa.Table.from_pylist([{**r, "created_at": created} for r in rows]),
                    mode="overwrite", schema_mode="overwrite")
    docs.mkdir(parents=True, exist_ok=True)
    fields = [k for k in rows[0] if k != "evidence"] + ["evidence"]
    with (docs / "forensics_runs.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    plot(rows, docs / "forensics_curves.png")


def markdown(rows: list[dict]) -> str:
    """The rows as the README's table (a fired detector is marked FIRED)."""
    def num(v, fmt="{:.3f}"):
        return "" if v is None else fmt.format(v)

    out = ["| run | policy | reward | verifier accuracy | held-out accuracy | tokens | repeated steps | minutes | "
           "reward vs accuracy | stuffing | judge vs verifier | collusion |", "|" + "---|" * 12]
    for r in rows:
        flags = ["FIRED" if r[f"{d}_fired"] else "quiet" for d in ("reward_vs_accuracy", "stuffing", "judge_vs_verifier", "collusion")]
        out.append(f"| {r['run']} | {'base' if r['cycle'] == 0 else 'ckpt ' + str(r['cycle'])} | {num(r['reward'])} | "
                   f"{num(r['train_accuracy'], '{:.1%}')} | {num(r['heldout_accuracy'], '{:.1%}')} | {num(r['completion_tokens'], '{:.1f}')} | "
                   f"{num(r['repeated_step_rate'], '{:.2f}')} | {r['minutes']:.1f} | " + " | ".join(flags) + " |")
    return "\n".join(out)


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    colors = {"hacked": "tab:red", "honest": "tab:blue"}
    for name in RUNS:
        rs = [r for r in rows if r["run"] == name]
        if not rs:
            continue
        xs = [r["cycle"] for r in rs]
        axes[0].plot(xs, [r["reward"] for r in rs], "o-", color=colors[name], label=f"{name}: reward (manager score)")
        axes[0].plot(xs, [r["train_accuracy"] for r in rs], "s--", color=colors[name], alpha=0.6, label=f"{name}: verifier accuracy")
        axes[1].plot(xs, [r["heldout_accuracy"] for r in rs], "o-", color=colors[name], label=name)
        axes[2].plot(xs, [r["completion_tokens"] for r in rs], "o-", color=colors[name], label=name)
        fired = [r for r in rs if r["reward_vs_accuracy_fired"]]
        if fired:
            axes[0].scatter([r["cycle"] for r in fired], [r["reward"] for r in fired], s=160, facecolors="none",
                            edgecolors="black", label=f"{name}: detector fired")
    axes[0].set_title("Training rollouts of each policy: reward vs accuracy")
    axes[1].set_title("Held-out arithmetic accuracy (greedy)")
    axes[2].set_title("Mean completion tokens (training rollouts)")
    for ax in axes:
        ax.set_xlabel("policy (0 = base, k = checkpoint k)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def wait(name: str, proc: subprocess.Popen, t0: float) -> None:
    if proc.wait() != 0:
        sys.exit(f"[{name}] failed (exit {proc.returncode}); its home and Dagster runs are kept for `tentalis ui`")
    print(f"[{name}] finished in {(time.time() - t0) / 60:.1f} min", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=REPO / ".tentalis" / "forensics", help="one home per run under it (must be new)")
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--num-tasks", type=int, default=4)
    ap.add_argument("--num-generations", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--gate-limit", type=int, default=16, help="held-out items per evaluation")
    ap.add_argument("--seed", type=int, default=0, help="trainer seed")
    ap.add_argument("--learning-rate", type=float, default=4e-4, help="LoRA learning rate (twice `tentalis learn`'s: few cycles)")
    ap.add_argument("--model", default=None, help="policy model folder (default: $TENTALIS_MODEL or the embedded SmolLM2)")
    ap.add_argument("--runs", default="hacked,honest")
    ap.add_argument("--analyze-only", action="store_true")
    ap.add_argument("--parallel", action="store_true", help="run both runs at the same time (a larger share of a busy CPU)")
    ap.add_argument("--docs", type=Path, default=HERE)
    ap.add_argument("--one-run", help=argparse.SUPPRESS)
    args = ap.parse_args()
    root = args.root.resolve()
    if args.one_run:
        run_one(args.one_run, root, args)
        return
    if not args.analyze_only:
        for name in args.runs.split(","):
            if (root / name).exists():
                sys.exit(f"{root / name} exists: pick a new --root (or --analyze-only to re-read it)")
        procs = {}
        for name in args.runs.split(","):
            cmd = [sys.executable, __file__, "--one-run", name, "--root", str(root), "--cycles", str(args.cycles),
                   "--num-tasks", str(args.num_tasks), "--num-generations", str(args.num_generations),
                   "--max-new-tokens", str(args.max_new_tokens), "--gate-limit", str(args.gate_limit), "--seed", str(args.seed),
                   "--learning-rate", str(args.learning_rate)]
            if args.model:
                cmd += ["--model", args.model]
            t0 = time.time()
            procs[name] = (subprocess.Popen(cmd), t0)
            if not args.parallel:
                wait(name, *procs.pop(name))
        for name, (proc, t0) in procs.items():
            wait(name, proc, t0)
    rows = analyze(root, args)
    write_outputs(rows, root, args.docs)
    print(markdown(rows))


if __name__ == "__main__":
    main()
