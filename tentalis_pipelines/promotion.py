"""The promotion gate: which checkpoint a candidate is compared with, the paired decision, and its record.

A candidate checkpoint is compared with the incumbent (what serves now; its parent, else the base
model, when the candidate itself serves) on the same items of the gate benchmark, by a paired
bootstrap of the per-item difference (``evaluation.benchmarks.gate_decision``). Like is compared with
like: when the two were measured with different injected skills on a paired item (an agent with
``skills_top_k`` whose verified skill set changed between the two evaluations), the incumbent is
measured again first, so the difference is the checkpoint's and not the skill set's. Every decision is a
row of ``gate_decisions`` (one per checkpoint and benchmark; a re-decision replaces it), and a pass
moves the serving pointer (``training.serving``). Nothing here runs a model: the benchmark results
must be in the lakehouse first.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tentalis_pipelines import audit
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.training import serving


class GateNotReady(ValueError):
    """The gate cannot decide yet: a benchmark result it compares is missing."""


def item_correctness(lake: Lakehouse, checkpoint_id: str, benchmark: str) -> dict[str, bool]:
    """``{item_id: correct}`` of one checkpoint on one benchmark (empty when it was not evaluated)."""
    if not lake.exists("benchmark_items"):
        return {}
    rows = lake.read("benchmark_items", columns=["checkpoint_id", "benchmark", "item_id", "correct"]).to_pylist()
    return {r["item_id"]: r["correct"] for r in rows if r["checkpoint_id"] == checkpoint_id and r["benchmark"] == benchmark}


def item_skills(lake: Lakehouse, checkpoint_id: str, benchmark: str) -> dict[str, tuple[str, ...]]:
    """``{item_id: skill ids injected into its prompt}`` of one checkpoint on one benchmark (sorted; empty
    tuples when no skills were injected or the rows predate the ``skill_ids`` column)."""
    if not lake.exists("benchmark_items"):
        return {}
    rows = lake.read("benchmark_items").select(["checkpoint_id", "benchmark", "item_id", "skill_ids"]).to_pylist()
    return {r["item_id"]: tuple(sorted(r["skill_ids"] or ())) for r in rows if r["checkpoint_id"] == checkpoint_id and r["benchmark"] == benchmark}


def skill_mismatches(lake: Lakehouse, checkpoint_id: str, incumbent: str, benchmark: str) -> list[str]:
    """The paired items whose injected skills differ between the candidate's and the incumbent's results:
    a paired difference over them would mix the checkpoint's effect with the skill set's."""
    cand, inc = item_skills(lake, checkpoint_id, benchmark), item_skills(lake, incumbent, benchmark)
    return sorted(i for i in cand.keys() & inc.keys() if cand[i] != inc[i])


def incumbent_for(lake: Lakehouse, checkpoint_id: str) -> str:
    """What a candidate is compared with: the serving policy (the serving pointer), or, when the
    candidate itself serves already, its parent (else the base model)."""
    current = serving.serving_checkpoint(lake)
    if current == checkpoint_id:
        parent = next((r["parent_id"] for r in lake.read("checkpoints").to_pylist() if r["checkpoint_id"] == checkpoint_id), None)
        return parent or "base"
    return current


def decisions(lake: Lakehouse, benchmark: str | None = None) -> list[dict[str, Any]]:
    """Every recorded gate decision (optionally of one benchmark), oldest first."""
    if not lake.exists("gate_decisions"):
        return []
    rows = lake.read("gate_decisions").to_pylist()
    return sorted((r for r in rows if benchmark is None or r["benchmark"] == benchmark), key=lambda r: r["created_at"])


def undecided_checkpoints(lake: Lakehouse, benchmark: str) -> list[str]:
    """Checkpoints without a gate decision on ``benchmark``, oldest first."""
    if not lake.exists("checkpoints"):
        return []
    decided = {r["checkpoint_id"] for r in decisions(lake, benchmark)}
    rows = sorted(lake.read("checkpoints", columns=["checkpoint_id", "created_at"]).to_pylist(), key=lambda r: r["created_at"])
    return [r["checkpoint_id"] for r in rows if r["checkpoint_id"] not in decided]


def missing_results(lake: Lakehouse, checkpoint_id: str, benchmark: str) -> list[str]:
    """The checkpoints (candidate and incumbent) whose ``benchmark`` results the gate still needs: absent
    ones, and the incumbent's when they were measured with other skills than the candidate's (known once
    the candidate's results are in, so a caller asks again after benchmarking the candidate)."""
    incumbent = incumbent_for(lake, checkpoint_id)
    missing = [c for c in dict.fromkeys([checkpoint_id, incumbent]) if not item_correctness(lake, c, benchmark)]
    if not missing and incumbent != checkpoint_id and skill_mismatches(lake, checkpoint_id, incumbent, benchmark):
        missing = [incumbent]
    return missing


def decide_promotion(lake: Lakehouse, checkpoint_id: str, benchmark: str, *, margin: float = 0.0, apply: bool = True):
    """The promotion gate for ``checkpoint_id``: paired comparison with its incumbent on the same items.

    With ``apply``, the decision is recorded in ``gate_decisions`` (replacing an earlier one for the
    same checkpoint and benchmark) and a pass moves the serving pointer (actor ``gate``). Returns
    ``(incumbent, GateDecision)``. Raises :class:`GateNotReady` naming the missing (or stale) benchmark partition.
    """
    from tentalis_pipelines.evaluation.benchmarks import gate_decision

    incumbent = incumbent_for(lake, checkpoint_id)
    cand = item_correctness(lake, checkpoint_id, benchmark)
    inc = item_correctness(lake, incumbent, benchmark)
    if not cand or not inc:
        missing = checkpoint_id if not cand else incumbent
        raise GateNotReady(f"no {benchmark!r} results for {missing!r}: benchmark it before deciding promotion "
                           f"(benchmark_results partition {benchmark}|{missing}, or `tentalis benchmark --checkpoint {missing} --tasks {benchmark}`)")
    mismatched = skill_mismatches(lake, checkpoint_id, incumbent, benchmark)
    if mismatched:
        raise GateNotReady(f"{incumbent!r} was measured on {benchmark!r} with other skills than {checkpoint_id!r} on {len(mismatched)} "
                           f"of {len(cand)} items (e.g. {mismatched[0]}): benchmark {incumbent!r} again with today's skills "
                           f"(benchmark_results partition {benchmark}|{incumbent}, or `tentalis benchmark --checkpoint {incumbent} "
                           f"--tasks {benchmark}`) so the gate compares like with like")
    decision = gate_decision(cand, inc, margin=margin)
    taint = audit.tainted(lake, checkpoint_id)
    if taint is not None and decision.promote:  # trained on retracted data: never served, whatever it scores
        decision = dataclasses.replace(decision, promote=False, reason=f"trained on retracted data ({taint['from_state']}: "
                                       f"{taint['reason']}); the benchmark alone would have promoted it: {decision.reason}")
    if apply:
        row = {"checkpoint_id": checkpoint_id, "benchmark": benchmark, "incumbent": incumbent, **decision.as_dict(),
               "margin": float(margin), "created_at": now_utc()}
        lake.replace_where("gate_decisions", {"checkpoint_id": checkpoint_id, "benchmark": benchmark}, [row])
        audit.record(lake, actor="gate", action="gate_decision", subject=checkpoint_id, from_state=incumbent,
                     to_state="promote" if decision.promote else "reject", reason=f"{benchmark}: {decision.reason}",
                     detail={k: v for k, v in row.items() if k != "created_at"})
        if decision.promote:
            serving.promote(lake, checkpoint_id, actor="gate", action="gate", reason=f"{benchmark} vs {incumbent}: {decision.reason}")
    return incumbent, decision


def benchmark_history(lake: Lakehouse, benchmark: str) -> dict[str, Any]:
    """Every checkpoint's result on one benchmark, base first, as a markdown table and a PNG plot, each
    checkpoint with its paired difference against the base model (the bootstrap the gate uses); with the
    result rows themselves (``results``, for the inline plot) and their count (``rows``)."""
    from tentalis_pipelines.evaluation.benchmarks import gate_decision
    from tentalis_pipelines.evaluation.plots import accuracy_plot_png, markdown_image
    from tentalis_pipelines.previews import markdown_table

    rows = [r for r in lake.read("benchmark_results").to_pylist() if r["benchmark"] == benchmark]
    order = {"base": 0}
    if lake.exists("checkpoints"):
        for i, c in enumerate(sorted(lake.read("checkpoints").to_pylist(), key=lambda r: r["created_at"]), start=1):
            order[c["checkpoint_id"]] = i
    rows.sort(key=lambda r: order.get(r["checkpoint_id"], len(order)))
    base = item_correctness(lake, "base", benchmark)
    table_rows = []
    for r in rows:
        row = {k: r[k] for k in ("checkpoint_id", "n", "accuracy", "lenient_accuracy", "format_rate", "ci_low", "ci_high")}
        if base and r["checkpoint_id"] != "base":
            d = gate_decision(item_correctness(lake, r["checkpoint_id"], benchmark), base)
            row.update({"vs_base": round(d.diff, 4), "vs_base_ci_low": round(d.diff_ci_low, 4), "vs_base_ci_high": round(d.diff_ci_high, 4)})
        table_rows.append(row)
    return {"history": markdown_table(table_rows, limit=50),
            "plot": markdown_image(accuracy_plot_png(rows, f"{benchmark}: accuracy per checkpoint"), benchmark),
            "rows": len(rows), "results": rows}
