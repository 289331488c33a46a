"""Would a cooler manager sample plans? The share of the untrained manager's sampled hints that name the task's
solution expression, at several sampling temperatures, on the same training-side failures.

Round 4's manager, sampled at temperature 1.0 (the manager's training temperature), named the expression in 1 of 201 usable hints, so
GRPO had nothing to reinforce. This samples the untrained (base) manager's reviews with the solution prompt, as
``tentalis manager train`` does (``sample_reviews``, the hint pass included), at each temperature.

Usage: python -m experiments.manager_rl.temperature --home /work/runs/mgr4-exp [--failures 32] [--n 4] [--temps 0.3,0.8]
"""

from __future__ import annotations

import argparse

from experiments.manager_rl.plans import expressions, names_expression
from tentalis_pipelines.inference.models import resolve_model
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages.manager_training import collect_failures, manager_prompts, sample_reviews
from tentalis_pipelines.training import manager_rl, opd
from tentalis_pipelines.training.manager_rl import ManagerRLConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", required=True)
    ap.add_argument("--failures", type=int, default=32)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--temps", default="0.3,0.8")
    a = ap.parse_args()
    paths = Paths.from_env(a.home)
    lake = Lakehouse(paths.lakehouse)
    failures = collect_failures(lake, heldout=False, config=ManagerRLConfig(), limit=a.failures)
    expr = expressions(lake)
    backend = PolicySettings().make_backend(resolve_model("embedded", paths.models))
    prompts = manager_prompts(backend, failures)
    print("| temperature | sampled reviews | usable hints | name the expression |\n|---|---|---|---|")
    for t in (float(x) for x in a.temps.split(",")):
        groups = sample_reviews(backend, prompts, n=a.n, temperature=t, max_new_tokens=96, seed=0)
        usable = [(f, r.hint) for f, g in zip(failures, groups) for r in g
                  if manager_rl.hint_decision(r.hint, f.reference) == opd.USED]
        plans = sum(names_expression(h, expr.get(f.task_id)) for f, h in usable)
        print(f"| {t} | {sum(len(g) for g in groups)} | {len(usable)} | {plans} |", flush=True)


if __name__ == "__main__":
    main()
