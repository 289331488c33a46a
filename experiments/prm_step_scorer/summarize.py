"""The PRM head as the step scorer of a learning run, against the calculator (issue 31, must-hold 2).

    experiments/prm_step_scorer/run.sh SEED            # both arms of one seed, side by side
    .venv/bin/python -m experiments.prm_step_scorer.summarize --runs /work/runs   # summary.txt, curves.csv, steps.csv, figure

Homes: ``$RUNS/prm_s{seed}`` (``--step-scorer prm_head``) and ``$RUNS/calculator_s{seed}`` (``--step-scorer
calculator``), both ``tentalis learn --advantage-mode process --cycles 8 --seed S``. The lab, not the product.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARMS = {"prm_head": "prm_s{seed}", "calculator": "calculator_s{seed}"}
# Round 2: the surprise head (`tentalis prm train` defaults at commit cafac3f), both arms rerun at one commit.
ROUNDS = {1: ARMS, 2: {"prm_head": "prm2_s{seed}", "calculator": "calculator2_s{seed}"},
          3: {"prm_head": "prm3_s{seed}", "calculator": "calculator2_s{seed}"},  # 3: the hidden-state head of commit c69bda6
          # 4 and 5: round 2's and round 3's heads again, a model judging only completions in the step format (fd9ddef)
          4: {"prm_head": "prm4_s{seed}", "calculator": "calculator2_s{seed}"},
          5: {"prm_head": "prm5_s{seed}", "calculator": "calculator2_s{seed}"},
          6: {"prm_head": "prm6_s{seed}", "calculator": "calculator6_s{seed}"},  # 6: as 4, both arms --scale-rewards none
          7: {"prm_head": "prm7_s{seed}", "calculator": "calculator2_s{seed}"},  # 7: a head that also learned from rollouts
          8: {"prm_head": "prm8_s{seed}", "calculator": "calculator2_s{seed}"},  # 8: the rollouts weighted (rollout_weight 10)
          9: {"prm_head": "prm9_s{seed}", "calculator": "calculator2_s{seed}"}}  # 9: and right rollouts labelled
SUFFIX = {1: "", 2: "_round2", 3: "_round3", 4: "_round4", 5: "_round5", 6: "_round6", 7: "_round7", 8: "_round8", 9: "_round9"}


def homes(runs: Path, round_: int = 1) -> dict[tuple[str, int], Path]:
    out = {}
    for arm, pattern in ROUNDS[round_].items():
        for seed in range(10):
            h = runs / pattern.format(seed=seed)
            if (h / "lakehouse" / "checkpoints").exists():
                out[(arm, seed)] = h
    return out


def curves(runs: Path, benchmark: str = "arithmetic", round_: int = 1) -> dict[tuple[str, int], list[dict[str, bool]]]:
    """Per (arm, seed): item correctness of base and each checkpoint, in order."""
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.promotion import item_correctness

    out = {}
    for key, h in homes(runs, round_).items():
        lake = Lakehouse(h / "lakehouse")
        have = {r["checkpoint_id"] for r in lake.read("benchmark_results").to_pylist() if r["benchmark"] == benchmark}
        ckpts = [c["checkpoint_id"] for c in sorted(lake.read("checkpoints").to_pylist(), key=lambda r: r["created_at"])]
        out[key] = [item_correctness(lake, c, benchmark) for c in ["base", *ckpts] if c in have]
    return out


def seeds_of(c: dict) -> list[int]:
    """Seeds with both arms."""
    return sorted({s for (_, s) in c} & {s for (a, s) in c if a == "prm_head"} & {s for (a, s) in c if a == "calculator"})


def pooled(c: dict, arm: str, k: int, seeds: list[int]) -> tuple[int, int] | None:
    if any(k >= len(c[(arm, s)]) for s in seeds):
        return None
    return sum(sum(c[(arm, s)][k].values()) for s in seeds), sum(len(c[(arm, s)][k]) for s in seeds)


def paired(c: dict, k: int, seeds: list[int]) -> tuple[float, float, float, int] | None:
    """prm_head - calculator at cycle k over (seed, item) pairs, 95% paired bootstrap."""
    from tentalis_pipelines.statistics import paired_bootstrap

    xs, ys = [], []
    for s in seeds:
        a, b = c[("prm_head", s)], c[("calculator", s)]
        if k >= len(a) or k >= len(b):
            return None
        for item in sorted(a[k]):
            xs.append(float(a[k][item]))
            ys.append(float(b[k][item]))
    d, lo, hi = paired_bootstrap(xs, ys)
    return d, lo, hi, len(xs)


def step_stats(runs: Path, round_: int = 1) -> list[dict]:
    """Per run: how its step scorer scored the policy's own steps, and whether the process reward agrees
    with the verifier (Spearman of process reward with outcome over rollouts that have one)."""
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.rewards.agreement import spearman

    rows = []
    for (arm, seed), h in sorted(homes(runs, round_).items()):
        lake = Lakehouse(h / "lakehouse")
        scores = [r["score"] for r in lake.read("step_scores", columns=["score"]).to_pylist()]
        scored = [s for s in scores if s is not None]
        traj = lake.read("trajectories", columns=["process_reward", "outcome_reward"]).to_pylist()
        both = [(t["process_reward"], t["outcome_reward"]) for t in traj if t["process_reward"] is not None]
        rho = spearman([p for p, _ in both], [o for _, o in both]) if len(both) > 2 else None
        right = [p for p, o in both if o > 0]
        wrong = [p for p, o in both if o == 0]
        rows.append({"arm": arm, "seed": seed, "steps": len(scores), "scored": len(scored),
                     "mean_step_score": round(sum(scored) / len(scored), 4) if scored else None,
                     "rollouts_with_process_reward": len(both), "spearman_process_vs_outcome": None if rho is None else round(rho, 4),
                     "process_reward_right": round(sum(right) / len(right), 4) if right else None,
                     "process_reward_wrong": round(sum(wrong) / len(wrong), 4) if wrong else None})
    return rows


def figure(c: dict, seeds: list[int], cycles: int, suffix: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tentalis_pipelines.statistics import wilson_interval

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for arm in ARMS:
        xs, ys, lo, hi = [], [], [], []
        for k in range(cycles):
            kn = pooled(c, arm, k, seeds)
            if kn is None:
                continue
            a, b = wilson_interval(*kn)
            xs.append(k)
            ys.append(100 * kn[0] / kn[1])
            lo.append(100 * a)
            hi.append(100 * b)
        ax.plot(xs, ys, marker="o", label=f"--step-scorer {arm}")
        ax.fill_between(xs, lo, hi, alpha=0.15)
    ax.set_xlabel("cycle (0 = base model)")
    ax.set_ylabel("held-out arithmetic accuracy (%)")
    ax.set_title(f"--advantage-mode process, {len(seeds)} seeds pooled")
    ax.legend()
    fig.tight_layout()
    fig.savefig(HERE / f"prm_step_scorer{suffix}.png", dpi=120)


def main() -> None:
    from tentalis_pipelines.statistics import wilson_interval

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="/work/runs")
    ap.add_argument("--round", type=int, default=1, choices=sorted(ROUNDS), help="1: the layer-6 head; 2: the surprise head; 3: the block-10 hidden-state head; "
                    "4, 5: the heads of 2 and 3 judging only completions in the step format; 6: as 4, rewards only centred; "
                    "7: a hidden-state head that also learned from reviewed rollouts; 8: the same, the rollouts weighted; 9: and right rollouts labelled")
    args = ap.parse_args()
    sfx = SUFFIX[args.round]
    c = curves(Path(args.runs), round_=args.round)
    seeds = seeds_of(c)
    cycles = max(len(v) for v in c.values())
    cell = lambda kn: "-" if kn is None else f"{100 * kn[0] / kn[1]:.1f}% [{100 * wilson_interval(*kn)[0]:.1f}, {100 * wilson_interval(*kn)[1]:.1f}]"  # noqa: E731
    lines = [f"Held-out arithmetic (64 items per seed), seeds {seeds} pooled, Wilson 95%; prm_head - calculator paired bootstrap 95%\n",
             "| cycle | calculator | prm_head | prm_head - calculator (paired) |", "|---|---|---|---|"]
    rows = []
    for k in range(cycles):
        p = paired(c, k, seeds)
        diff = "-" if p is None else f"{100 * p[0]:+.1f} [{100 * p[1]:+.1f}, {100 * p[2]:+.1f}] (n={p[3]})"
        lines.append(f"| {'base' if k == 0 else k} | {cell(pooled(c, 'calculator', k, seeds))} | {cell(pooled(c, 'prm_head', k, seeds))} | {diff} |")
        for (arm, seed), items in sorted(c.items()):
            if k < len(items):
                rows.append({"arm": arm, "seed": seed, "cycle": k, "n": len(items[k]), "correct": sum(items[k].values())})
    with open(HERE / f"curves{sfx}.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["arm", "seed", "cycle", "n", "correct"])
        w.writeheader()
        w.writerows(rows)
    stats = step_stats(Path(args.runs), args.round)
    with open(HERE / f"steps{sfx}.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(stats[0]))
        w.writeheader()
        w.writerows(stats)
    lines += ["\nStep scores of the policy's own rollouts, per run:\n", "| " + " | ".join(stats[0]) + " |", "|" + "---|" * len(stats[0])]
    lines += ["| " + " | ".join(str(v) for v in r.values()) + " |" for r in stats]
    figure(c, seeds, cycles, sfx)
    text = "\n".join(lines) + "\n"
    (HERE / f"summary{sfx}.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
