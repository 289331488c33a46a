"""A manager's scores by form of answer (tagged or not) on the held-out rollouts ``tentalis manager evaluate`` scored.

Round 22's check: a score adapter trained where most untagged rollouts were accepted wrote 7 for every untagged
answer, failures too, and its class-balanced error over all rollouts (0.205) hid it, as the untagged failures
(error 0.70) were averaged with the tagged ones. Per manager checkpoint of the home's ``manager_evals``, per form and
class: rollouts, the mean score, the verifier's mean score; per form, the class-balanced error and the score gap
(accepted − failed), where a form has both classes.

With ``--own ARM ...`` instead: the same on the worker's own rollouts that the arm's llm manager reviewed during
guided learning (``scores.reviewed``; homes ``$RUNS/ARM-sS``), per cycle, with each cycle's share of tagged rollouts:
whether the worker drifts toward the form the scores favour.

Usage: python -m experiments.manager_rl.forms --home /work/runs/mgr22c-exp [--checkpoints m-… base]
       python -m experiments.manager_rl.forms --own mgr22c-trained mgr21-trained [--runs /work/runs] [--seeds 0,…,7]
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from experiments.manager_rl.guided import cycle_of
from experiments.manager_rl.scores import reviewed
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.stages.reviews import review_inputs


def form_table(lake: Lakehouse, checkpoints: list[str] | None = None) -> list[dict]:
    """One row per (checkpoint, form, class) of the evaluated rollouts: n, mean score (unparseable left out), mean
    verifier score, and mean absolute error (unparseable counts 1, as the gate counts it)."""
    forms = {}
    for b in sorted({r["batch_id"] for r in lake.read("reviews", columns=["batch_id"]).to_pylist()}):
        for r, x in review_inputs(lake, b):
            forms[r["rollout_id"]] = "tagged" if x.answer_tagged else "untagged"
    groups: dict[tuple, list] = defaultdict(list)
    for r in lake.read("manager_evals").to_pylist():
        if checkpoints and r["checkpoint_id"] not in checkpoints:
            continue
        groups[(r["checkpoint_id"], forms.get(r["rollout_id"], "?"), bool(r["worker_correct"]))].append(r)
    out = []
    for (ck, form, accepted), rows in sorted(groups.items()):
        scored = [r["score"] for r in rows if r["score"] is not None]
        out.append({"checkpoint": ck, "form": form, "accepted": accepted, "n": len(rows),
                    "score": sum(scored) / len(scored) if scored else None,
                    "verifier": sum(r["verifier_score"] for r in rows) / len(rows),
                    "error": sum(1.0 if r["score"] is None else abs(r["score"] - r["verifier_score"]) for r in rows) / len(rows)})
    return out


def own_table(runs: Path, arm: str, seeds, cycles=(1, 2, 3, 4)) -> list[dict]:
    """Per cycle of the arm's homes: the share of reviewed rollouts with a tagged answer, and per form and class the
    count, the manager's mean score (unparseable left out) and the verifier's."""
    from tentalis_pipelines.rewards.managers import VerifierManager

    verifier = VerifierManager()
    groups: dict[tuple, list] = defaultdict(list)
    for _, _, x, rev in reviewed(runs, arm, seeds, set(cycles)):
        groups[(cycle_of(rev["batch_id"]), "tagged" if x.answer_tagged else "untagged", bool(x.correct))].append(
            (rev["score"], verifier.review(x).score))
    out = []
    for c in cycles:
        total = sum(len(v) for (cc, _, _), v in groups.items() if cc == c)
        tagged = sum(len(v) for (cc, f, _), v in groups.items() if cc == c and f == "tagged")
        for (cc, form, accepted), v in sorted(groups.items()):
            if cc != c:
                continue
            scored = [a for a, _ in v if a is not None]
            out.append({"arm": arm, "cycle": c, "tagged_share": tagged / total if total else None, "form": form,
                        "accepted": accepted, "n": len(v), "score": sum(scored) / len(scored) if scored else None,
                        "verifier": sum(b for _, b in v) / len(v)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path)
    ap.add_argument("--checkpoints", nargs="*", help="only these manager checkpoints (default: every one evaluated)")
    ap.add_argument("--own", nargs="*", help="arms (home prefixes): the worker's own rollouts instead")
    ap.add_argument("--runs", type=Path, default=Path("/work/runs"))
    ap.add_argument("--seeds", default="0,1,2,3,4,5,6,7")
    args = ap.parse_args()
    if args.own:
        print("| arm | cycle | tagged share | form | class | n | mean score | verifier |")
        print("|---|---|---|---|---|---|---|---|")
        for arm in args.own:
            for r in own_table(args.runs, arm, [int(s) for s in args.seeds.split(",")]):
                score = "-" if r["score"] is None else f"{r['score']:.2f}"
                print(f"| {arm} | {r['cycle']} | {r['tagged_share']:.2f} | {r['form']} | "
                      f"{'accepted' if r['accepted'] else 'failed'} | {r['n']} | {score} | {r['verifier']:.2f} |")
        return
    if args.home is None:
        ap.error("--home (a manager home) or --own (worker arms)")
    rows = form_table(Lakehouse(args.home / "lakehouse"), args.checkpoints)
    print("| checkpoint | form | class | n | mean score | verifier | error |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        score = "-" if r["score"] is None else f"{r['score']:.2f}"
        print(f"| {r['checkpoint']} | {r['form']} | {'accepted' if r['accepted'] else 'failed'} | {r['n']} | {score} | "
              f"{r['verifier']:.2f} | {r['error']:.3f} |")
    print()
    print("| checkpoint | form | class-balanced error | score gap (accepted − failed) |")
    print("|---|---|---|---|")
    by = defaultdict(dict)
    for r in rows:
        by[(r["checkpoint"], r["form"])][r["accepted"]] = r
    for (ck, form), cls in sorted(by.items()):
        if len(cls) < 2:
            print(f"| {ck} | {form} | one class only | - |")
            continue
        gap = (None if cls[True]["score"] is None or cls[False]["score"] is None
               else cls[True]["score"] - cls[False]["score"])
        print(f"| {ck} | {form} | {(cls[True]['error'] + cls[False]['error']) / 2:.3f} | "
              f"{'-' if gap is None else f'{gap:+.3f}'} |")


if __name__ == "__main__":
    main()
