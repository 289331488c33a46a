"""Round 5: does a pre-filled hint prefix make the untrained manager write plans, and does it leak?

Round 4's manager, shown the solution expression, named it in 1 of 201 usable sampled hints, so GRPO had no
plan to reinforce. ``review.hint_prefix`` pre-fills the first words of every hint (``"hint": "Compute``); the
manager completes it. This samples the untrained manager's reviews (``sample_reviews``, as ``tentalis manager
train`` does, at the training temperature) on the same training-side failures with each prefix, screens each
hint as guidance does (usable, leaks the answer, trivial), counts the usable hints that name the expression,
and scores the usable ones with the dense reward (``hint_reward``, v3) under the serving worker.

``--checkpoint m-…`` samples a trained manager (its adapter in the home's ``manager_checkpoints``) instead; the
worker that scores the hints stays the base model.

Usage: python -m experiments.manager_rl.prefix --home /work/runs/mgr4-exp [--failures 32] [--n 4]
       [--prefixes ',Compute,First compute'] [--temperature 0.8] [--examples 4] [--checkpoint base]
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np

from experiments.manager_rl.plans import expressions, names_expression
from tentalis_pipelines.inference.models import resolve_model
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages.manager_training import (
    collect_failures,
    manager_prompts,
    outcomes_for,
    sample_reviews,
)
from tentalis_pipelines.training import checkpoints as ckpt
from tentalis_pipelines.training import opd
from tentalis_pipelines.training.manager_rl import ManagerRLConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", required=True)
    ap.add_argument("--failures", type=int, default=32)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--prefixes", default=",Compute,First compute")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--examples", type=int, default=4)
    ap.add_argument("--checkpoint", default="base", help="the manager sampled: base or a manager checkpoint id")
    a = ap.parse_args()
    paths = Paths.from_env(a.home)
    lake = Lakehouse(paths.lakehouse)
    config = ManagerRLConfig(reward="dense")
    failures = collect_failures(lake, heldout=False, config=config, limit=a.failures)
    expr = expressions(lake)
    policy = PolicySettings()
    worker = policy.make_backend(resolve_model("embedded", paths.models))
    backend = worker
    if a.checkpoint != "base":
        row = ckpt.checkpoint_row(lake, a.checkpoint, table="manager_checkpoints")
        backend = policy.make_backend(resolve_model("embedded", paths.models), ckpt.verify_adapter(row["adapter_uri"]))
    prompts = manager_prompts(backend, failures)
    print(f"manager {a.checkpoint}: {len(failures)} training-side failures, {a.n} reviews each, temperature {a.temperature}\n")
    print("| hint prefix | reviews | usable | leak the answer | trivial or none | usable naming the expression "
          "| dense reward, plans | dense reward, other usable |\n|---|---|---|---|---|---|---|---|")
    examples = []
    for prefix in a.prefixes.split(","):
        groups = sample_reviews(backend, prompts, n=a.n, temperature=a.temperature, max_new_tokens=96, seed=0, hint_prefix=prefix)
        reviews = [[(r.score, r.hint) for r in g] for g in groups]
        outs = outcomes_for(worker, policy, config, failures, reviews, k=1, seed=1)
        flat = [(f, o) for f, g in zip(failures, outs) for o in g]
        decisions = Counter(o.hint_decision for _, o in flat)
        used = [(f, o) for f, o in flat if o.hint_decision == opd.USED]
        plans = [o.dense_reward for f, o in used if names_expression(o.hint, expr.get(f.task_id))]
        other = [o.dense_reward for f, o in used if not names_expression(o.hint, expr.get(f.task_id))]

        def mean(v):
            return f"{np.mean(v):+.2f} (n {len(v)})" if v else "-"
        print(f"| {prefix or '(none)'} | {len(flat)} | {len(used)} | {decisions.get(opd.LEAKS_ANSWER, 0)} "
              f"| {len(flat) - len(used) - decisions.get(opd.LEAKS_ANSWER, 0)} | {len(plans)} | {mean(plans)} | {mean(other)} |", flush=True)
        examples += [(prefix, f.reference, expr.get(f.task_id), o.hint, o.hint_decision, o.dense_reward) for f, o in flat[:a.examples * a.n]]
    print("\n| prefix | reference | expression | hint | decision | dense |\n|---|---|---|---|---|---|")
    for prefix, ref, e, hint, decision, dense in examples:
        print(f"| {prefix or '(none)'} | {ref} | {e} | {hint[:90]!r} | {decision} | {'-' if dense is None else f'{dense:+.2f}'} |")


if __name__ == "__main__":
    main()
