"""A learning run's held-out curve as rows: one per evaluated checkpoint (the base first), with its
accuracy, interval, paired difference against the base and the code commit that trained it.

``tentalis export-curve`` appends them to a CSV, so runs made at different times (seeds, machines,
commits) are kept side by side; the experiments in ``experiments/`` summarise those CSVs.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from tentalis_pipelines.evaluation.benchmarks import gate_decision
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.promotion import item_correctness

FIELDS = ["label", "seed", "commit", "checkpoint", "checkpoint_id", "minutes", "accuracy", "ci_low", "ci_high",
          "lenient_accuracy", "format_rate", "vs_base", "vs_base_ci_low", "vs_base_ci_high", "promoted"]


def checkpoint_commits(lake: Lakehouse) -> dict[str, str]:
    """checkpoint_id -> the short git commit of the code that trained it (``+dirty`` when that tree had
    uncommitted changes), from the checkpoint's lineage manifest. Empty for a home without lineage."""
    if not lake.exists("lineage"):
        return {}
    out = {}
    for r in lake.read("lineage", columns=["checkpoint_id", "kind", "detail"]).to_pylist():
        if r["kind"] != "manifest" or not r["detail"]:
            continue
        code = json.loads(r["detail"]).get("code_version") or {}
        if code.get("git_commit"):
            out[r["checkpoint_id"]] = code["git_commit"][:7] + ("+dirty" if code.get("git_dirty") else "")
    return out


def rows_for(home: Path, seed: int, label: str, commit: str | None = None, benchmark: str = "arithmetic") -> list[dict]:
    """One row per evaluated checkpoint (the base first) of the home's held-out curve on ``benchmark``.

    ``commit`` is each row's code commit as its checkpoint's lineage records it; the base row takes the
    first checkpoint's (the run that measured the base trained it). ``commit`` is only the fallback for a
    checkpoint without a lineage commit; with neither, the row's checkpoint is named in a ValueError.
    """
    lake = Lakehouse(home / "lakehouse")
    commits = checkpoint_commits(lake)
    start = min(t["created_at"] for t in lake.read("tasks", columns=["created_at"]).to_pylist())
    results = {r["checkpoint_id"]: r for r in lake.read("benchmark_results").to_pylist() if r["benchmark"] == benchmark}
    ckpts = sorted(lake.read("checkpoints").to_pylist(), key=lambda r: r["created_at"])
    base = item_correctness(lake, "base", benchmark)
    # The cycle a checkpoint closes: its place among the evaluated checkpoints. A checkpoint left behind by
    # a killed run (trained, never evaluated) is not a cycle; one the gate rejected is (the cycle ran, and
    # the next one samples from the policy still serving).
    evaluated = [cid for cid in ["base"] + [c["checkpoint_id"] for c in ckpts] if cid in results]
    cycle_of = {cid: k for k, cid in enumerate(evaluated)}
    out = []
    for i, cid in enumerate(["base"] + [c["checkpoint_id"] for c in ckpts]):
        r = results.get(cid)
        if r is None:
            continue
        ran = commits.get(ckpts[0]["checkpoint_id"] if cid == "base" and ckpts else cid) or commit
        if not ran:
            raise ValueError(f"{home}: checkpoint {cid} records no code commit in its lineage; name the commit "
                             "whose code ran this home (--commit / --code-commit)")
        d = gate_decision(item_correctness(lake, cid, benchmark), base) if cid != "base" else None
        out.append({
            "label": label, "seed": seed, "commit": ran, "checkpoint": i, "cycle": cycle_of[cid], "checkpoint_id": cid,
            "minutes": round((r["created_at"] - start).total_seconds() / 60, 1), "accuracy": round(r["accuracy"], 4),
            "ci_low": round(r["ci_low"], 4), "ci_high": round(r["ci_high"], 4), "lenient_accuracy": round(r["lenient_accuracy"], 4),
            "format_rate": round(r["format_rate"], 4), "vs_base": "" if d is None else round(d.diff, 4),
            "vs_base_ci_low": "" if d is None else round(d.diff_ci_low, 4), "vs_base_ci_high": "" if d is None else round(d.diff_ci_high, 4),
            "promoted": "" if cid == "base" else bool(next(c for c in ckpts if c["checkpoint_id"] == cid)["promoted"]),
        })
    return out



def append_csv(rows: list[dict], out: Path, fields: list[str] = FIELDS) -> None:
    """Append ``rows`` to the CSV ``out`` (its header first when the file is new)."""
    new = not out.exists()
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerows(rows)
