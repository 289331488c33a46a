"""Round 4: does the manager learn to write plans? Its hints that name the task's solution expression.

With the solution expression in its prompt (``Reference solution: 12 + 7``), a hint can say what to compute
without the result, as the verifier's plan hints do (they rescue this worker most). The dense reward scores
the solution's step ``12 + 7 = 19`` under the hint, so a hint that names the expression should earn more of
it. This reads every review a manager home holds and splits its usable hints into those that contain the
expression (spaces ignored) and the rest:

* per training update (``manager_samples``, drawn by the update's parent): share of plan hints, and the
  mean dense reward (or rescue rate) of each kind;
* per evaluated checkpoint (``manager_evals``, greedy, on the held-out failures): share of plan hints and
  the rescue rate of each kind.

Usage: python -m experiments.manager_rl.plans --home /work/runs/mgr4-exp
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np

from tentalis_pipelines.lakehouse import Lakehouse


def names_expression(hint: str, expression: str | None) -> bool:
    """Whether the hint contains the task's solution expression, spaces ignored ("12+7" names "12 + 7")."""
    if not expression:
        return False
    return "".join(expression.split()) in "".join((hint or "").split())


def expressions(lake: Lakehouse) -> dict[str, str | None]:
    """{task_id: the solution expression its metadata records, or None}."""
    out = {}
    for t in lake.read("tasks", columns=["task_id", "metadata"]).to_pylist():
        try:
            out[t["task_id"]] = json.loads(t["metadata"] or "{}").get("expression")
        except (json.JSONDecodeError, AttributeError):
            out[t["task_id"]] = None
    return out


def _row(label: str, rows: list[dict], value) -> str:
    plan = [r for r in rows if r["plan"]]
    other = [r for r in rows if not r["plan"]]

    def mean(rs):
        vals = [value(r) for r in rs if value(r) is not None]
        return f"{np.mean(vals):+.3f} (n={len(vals)})" if vals else "-"
    share = len(plan) / len(rows) if rows else 0.0
    return f"| {label} | {len(rows)} | {len(plan)} ({100 * share:.0f}%) | {mean(plan)} | {mean(other)} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", required=True)
    a = ap.parse_args()
    lake = Lakehouse(f"{a.home}/lakehouse")
    expr = expressions(lake)
    order = {r["checkpoint_id"]: r["created_at"].isoformat() for r in lake.read("manager_checkpoints").to_pylist()}

    def rescue(r):
        return r["rescued"] / r["rescue_k"] if r.get("rescue_k") else None

    def value(r):  # a training sample's hint value: its dense reward where it was trained for it
        return r["dense_reward"] if r.get("dense_reward") is not None else rescue(r)

    for table, title, head, val in (
            ("manager_samples", "training samples (usable hints of failures), by the update that learned from them:",
             "| update | usable hints | name the expression | their mean value | the others' mean value |", value),
            ("manager_evals", "\nheld-out evaluations (greedy; value = rescue rate of the hint):",
             "| checkpoint | usable hints | name the expression | their rescue | the others' rescue |", rescue)):
        print(title)
        print(head + "\n|---|---|---|---|---|")
        groups = defaultdict(list)
        for r in lake.read(table).to_pylist():
            if r["hint_decision"] == "used" and not r["worker_correct"]:
                groups[r["checkpoint_id"]].append({**r, "plan": names_expression(r["hint"], expr.get(r["task_id"]))})
        for cid in sorted(groups, key=lambda c: order.get(c, "")):
            print(_row(cid, groups[cid], val))

if __name__ == "__main__":
    main()
