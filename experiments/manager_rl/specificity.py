"""Round 14: does the dense reward pay a hint for being specific, or for being a hint?

The best-of-n update keeps, per failure, the sampled hint with the highest dense reward when it clears a bar
(``log p(solution | prompt + hint) - log p(solution | prompt)`` above 2 nats). Round 14's second update kept
14 hints, 12 of them generic (``First compute the answer.`` at +2.45 nats), and its greedy hint became that
sentence. A generic hint can raise the solution's log-probability on its own: any hint in the context moves
this worker toward computing. This script scores one fixed generic hint on every failure an update trained
on, under the same worker (the base model: the updates here learned on the base worker's failures), and
re-runs the best-of-n choice with the reward measured *against that hint* (``dense - dense(generic)``): how
many demonstrations each rule keeps, and how many of them name the task's expression (``plans.py``).

Usage: python -m experiments.manager_rl.specificity --home /work/runs/mgr14-exp --checkpoint m-d6ed014e733e
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import torch

from experiments.manager_rl.plans import expressions, names_expression
from tentalis_pipelines.inference.models import resolve_model
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.rewards.hint_reward import HintQuery, hint_rewards, solution_steps
from tentalis_pipelines.settings import Paths

GENERIC = "First compute the answer."


def baseline_rewards(home: Path, rollout_ids: set[str], hint: str) -> dict[str, float]:
    """{rollout_id: the dense reward of ``hint`` on that failure, under the base worker}."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    lake = Lakehouse(home / "lakehouse")
    rollouts = {r["rollout_id"]: r for r in lake.read("rollouts", columns=["rollout_id", "task_id", "prompt_text"]).to_pylist()
                if r["rollout_id"] in rollout_ids}
    tasks = {t["task_id"]: t for t in lake.read("tasks").to_pylist()}
    model_dir = resolve_model("embedded", Paths.from_env(home).models)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = sorted(rollouts)
    queries = [HintQuery(rollouts[i]["prompt_text"], tasks[rollouts[i]["task_id"]]["prompt"], hint,
                         str(tasks[rollouts[i]["task_id"]]["reference"]), solution_steps(tasks[rollouts[i]["task_id"]]))
               for i in ids]
    return {i: r.reward for i, r in zip(ids, hint_rewards(model, tok, queries, dtype="float32"))}


def choose(groups: dict[str, list[dict]], value, bar: float) -> list[dict]:
    """Best of n: per failure, the usable hint of highest value when it clears ``bar``."""
    out = []
    for rows in groups.values():
        best = max(rows, key=value)
        if value(best) > bar:
            out.append(best)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path, required=True)
    ap.add_argument("--checkpoint", required=True, help="the update whose sampled reviews to re-choose from")
    ap.add_argument("--generic", default=GENERIC)
    a = ap.parse_args()
    lake = Lakehouse(a.home / "lakehouse")
    expr = expressions(lake)
    rows = [r for r in lake.read("manager_samples").to_pylist()
            if r["checkpoint_id"] == a.checkpoint and not r["worker_correct"] and r["dense_reward"] is not None]
    base = baseline_rewards(a.home, {r["rollout_id"] for r in rows}, a.generic)
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[r["rollout_id"]].append({**r, "plan": names_expression(r["hint"], expr.get(r["task_id"])),
                                        "relative": r["dense_reward"] - base[r["rollout_id"]]})
    n_plan = sum(r["plan"] for g in groups.values() for r in g)
    print(f"{a.checkpoint}: {len(rows)} usable hints on {len(groups)} failures, {n_plan} name the expression; "
          f"the generic hint {a.generic!r} scores {sum(base.values()) / len(base):+.2f} nats on average "
          f"({sum(v > 2 for v in base.values())} of {len(base)} failures above 2 nats)")
    print("| rule | bar (nats) | demonstrations | naming the expression |")
    print("|---|---|---|---|")
    for label, value in (("dense (as trained)", lambda r: r["dense_reward"]), ("dense - dense(generic)", lambda r: r["relative"])):
        for bar in (0.0, 1.0, 2.0):
            chosen = choose(groups, value, bar)
            print(f"| {label} | {bar:.0f} | {len(chosen)} | {sum(r['plan'] for r in chosen)} |")


if __name__ == "__main__":
    main()
