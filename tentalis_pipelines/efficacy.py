"""Hint efficacy: did a hint change what the worker does next?

For every checkpoint that trained on hinted failures (a rollout whose outcome failed and whose review
carried a hint), compare the success rate of the same **task family** before and after it: before =
the rollouts sampled by the policy the checkpoint trained from (its parent, the policy that failed),
after = the rollouts sampled by the checkpoint itself in later batches. Grouped per checkpoint, per
manager (who wrote the hint), per hint kind (what the hint said) and per family, with a 95% interval
on the difference (Newcombe's hybrid Wilson score), so "the verifier's wrong-step hints helped on
subtraction" is a row one can check.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable

from tentalis_pipelines.statistics import newcombe_interval

FAMILY_OPS = {"+": "add", "-": "subtract", "*": "multiply", "/": "divide"}


def task_family(task: dict) -> str:
    """The family of a task: its metadata's ``family`` (live sessions), the arithmetic generator's
    operation pattern ("add", "multiply+add"), else its environment and source."""
    try:
        meta = json.loads(task.get("metadata") or "{}")
    except ValueError:
        meta = {}
    if isinstance(meta, dict):
        if isinstance(meta.get("family"), str):
            return meta["family"]
        expr = meta.get("expression")
        if isinstance(expr, str) and expr:
            ops = [FAMILY_OPS[o] for o in re.findall(r"[-+*/]", expr)]
            return "+".join(ops) or "number"
    return f"{task.get('environment') or 'task'}:{(task.get('source') or '').split(':')[0] or 'file'}"


def hint_kind(hint: str) -> str:
    """What a hint asks for, from its wording (the verifier's templates; anything else is free text)."""
    h = (hint or "").strip().lower()
    if not h:
        return "none"
    if re.match(r"step \d+ is wrong", h):
        return "wrong_step"
    if h.startswith("the question asks you to") or h.startswith("the question needs"):
        return "plan"
    if "<answer>" in h and ("finish" in h or "final number" in h):
        return "finish_with_answer" if h.startswith("finish") else "format"
    if h.startswith("write each step"):
        return "format"
    return "free_text"


def hint_efficacy(checkpoints: Iterable[dict], trajectories: Iterable[dict], reviews: Iterable[dict], tasks: Iterable[dict],
                  teacher: Iterable[dict] = ()) -> list[dict]:
    """One row per (checkpoint, manager, hint kind, family) that trained on at least one hinted failure.

    ``checkpoints``: rows with checkpoint_id, parent_id and trajectory_ids (what it trained on);
    ``trajectories``: rollout_id, task_id, batch_id, policy_version, outcome_reward, opd_signal;
    ``reviews``: batch_id, rollout_id, manager, hint; ``tasks``: batch_id, task_id, metadata, environment,
    source; ``teacher``: teacher_logprobs rows (to say whether the hint was distilled)."""
    fam = {(t["batch_id"], t["task_id"]): task_family(t) for t in tasks}
    traj = list(trajectories)
    by_id = {t["rollout_id"]: t for t in traj}
    rev = {(r["batch_id"], r["rollout_id"]): r for r in reviews}
    distilled = {r["rollout_id"] for r in teacher if r.get("decision") == "used"}
    # success per (policy version, family): every sampled rollout of that policy
    outcomes: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for t in traj:
        f = fam.get((t["batch_id"], t["task_id"]))
        if f is None:
            continue
        o = outcomes[(t["policy_version"], f)]
        o[0] += int((t["outcome_reward"] or 0) >= 1.0)
        o[1] += 1
    rows = []
    for c in checkpoints:
        groups: dict[tuple[str, str, str], dict] = {}
        for rid in c.get("trajectory_ids") or []:
            t = by_id.get(rid)
            if t is None or (t["outcome_reward"] or 0) >= 1.0:
                continue
            r = rev.get((t["batch_id"], rid))
            if r is None or not (r.get("hint") or "").strip():
                continue
            f = fam.get((t["batch_id"], t["task_id"]))
            if f is None:
                continue
            g = groups.setdefault((r["manager"], hint_kind(r["hint"]), f), {"n": 0, "distilled": 0, "before": t["policy_version"]})
            g["n"] += 1
            g["distilled"] += int(rid in distilled)
        for (manager, kind, f), g in sorted(groups.items()):
            k1, n1 = outcomes.get((g["before"], f), [0, 0])
            k2, n2 = outcomes.get((c["checkpoint_id"], f), [0, 0])
            lo, hi = newcombe_interval(k1, n1, k2, n2) if n1 and n2 else (None, None)
            rows.append({
                "checkpoint_id": c["checkpoint_id"], "before_policy": g["before"], "manager": manager, "hint_kind": kind,
                "family": f, "hinted_failures": g["n"], "distilled": g["distilled"],
                "before_n": n1, "before_success": k1 / n1 if n1 else None,
                "after_n": n2, "after_success": k2 / n2 if n2 else None,
                "delta": (k2 / n2 - k1 / n1) if n1 and n2 else None, "delta_ci_low": lo, "delta_ci_high": hi,
            })
    return rows
