"""The score pass alone, on the held-out rollouts ``tentalis manager evaluate`` reviews: what a manager checkpoint's
score adapter (or, without one, its review adapter) writes after the pre-filled ``{"score": ``, greedily, per class.
No hint is written and no worker is asked, so it takes a minute where the evaluation takes six: a check of a score
update before the full evaluation.

Each checkpoint's scores are also split by form of answer (tagged or not), with the gap within each form and the
failures' mean score as written and as served (``bound_by_ground_truth``'s cap; round 23's rule (b) compares the
untagged failures' mean with the tagged ones').

Usage: python -m experiments.manager_rl.score_pass --home /work/runs/mgr17-exp m-… [base …]
"""

from __future__ import annotations

import argparse
import os
import re
from collections import Counter

from tentalis_pipelines.inference.base import SamplingParams
from tentalis_pipelines.inference.models import resolve_model
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.rewards.llm_manager import (
    SCORE_MAX_NEW_TOKENS,
    SCORE_STOPS,
    bound_by_ground_truth,
    score_adapter_of,
    through_stop,
)
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages import manager_training as mt
from tentalis_pipelines.training import checkpoints as ckpt
from tentalis_pipelines.training import manager_rl, serving
from tentalis_pipelines.training.manager_rl import ManagerRLConfig

_NUM = re.compile(r"\s*(\d+(?:\.\d+)?)")


def mean(xs: list[float]) -> str:
    return f"{sum(xs) / len(xs):.3f}" if xs else "n/a"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", required=True)
    ap.add_argument("--limit", type=int, default=48)
    ap.add_argument("--eval-accepted", type=int, default=30)
    ap.add_argument("--training-side", action="store_true", help="the training side's rollouts instead (what a score "
                    "update learned from: memorised or learned?)")
    ap.add_argument("checkpoints", nargs="+")
    args = ap.parse_args()
    paths = Paths.from_env(args.home)
    lake = Lakehouse(paths.lakehouse)
    config = ManagerRLConfig(eval_accepted=args.eval_accepted)
    held = not args.training_side
    seen = mt.trained_tasks(lake) if held else set()
    rows = mt.collect_failures(lake, heldout=held, config=config, limit=args.limit, exclude_tasks=seen)
    rows += mt.collect_accepted(lake, heldout=held, config=config, limit=config.eval_accepted, exclude_tasks=seen)
    policy = PolicySettings(model=os.environ.get("TENTALIS_MODEL", "embedded"))
    model_dir = resolve_model("embedded", paths.models)
    for cid in args.checkpoints:
        adapter = None
        if cid != serving.BASE:
            adapter = ckpt.verify_adapter(ckpt.checkpoint_row(lake, cid, table="manager_checkpoints")["adapter_uri"])
        backend = policy.make_backend(model_dir, score_adapter_of(adapter) or adapter)
        prompts = mt.manager_prompts(backend, rows)
        gens = backend.generate(prompts, SamplingParams(num_generations=1, max_new_tokens=SCORE_MAX_NEW_TOKENS, temperature=0.0,
                                                        stop=SCORE_STOPS))
        scores = []
        for g in gens:
            m = _NUM.match(through_stop(g[0].text, SCORE_STOPS))
            scores.append(float(m.group(1)) / 10 if m and float(m.group(1)) <= 10 else None)
        triples = [(s, f.verifier_score, f.correct) for s, f in zip(scores, rows)]
        by = {flag: Counter("unparseable" if s is None else f"{s:g}" for s, _, ok in triples if ok == flag) for flag in (True, False)}
        gap = manager_rl.score_separation(triples)
        print(f"{cid} ({'score adapter' if score_adapter_of(adapter) else 'review adapter'}): "
              f"{sum(f.correct for f in rows)} accepted {dict(by[True].most_common())}; "
              f"{sum(not f.correct for f in rows)} failures {dict(by[False].most_common())}; "
              f"raw gap {'n/a' if gap is None else f'{gap:+.3f}'}, class-balanced error {manager_rl.balanced_score_error(triples):.3f}")
        # by form of answer (round 22: a score adapter wrote 7 for every untagged answer, right or wrong)
        for form in ("tagged", "untagged"):
            part = [(s, v, ok) for (s, v, ok), f in zip(triples, rows) if mt.answer_form(f) == form]
            cls = {flag: dict(Counter("unparseable" if s is None else f"{s:g}" for s, _, ok in part if ok == flag).most_common())
                   for flag in (True, False)}
            gap = manager_rl.score_separation(part) if part else None
            fails = [(s, f) for s, f in zip(scores, rows) if mt.answer_form(f) == form and not f.correct and s is not None]
            print(f"  {form}: accepted {cls[True]}; failures {cls[False]}; gap {'n/a' if gap is None else f'{gap:+.3f}'}; "
                  f"failures' mean score {mean([s for s, _ in fails])} as written, "
                  f"{mean([bound_by_ground_truth(s, f.review_input) for s, f in fails])} as served")


if __name__ == "__main__":
    main()
