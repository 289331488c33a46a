"""The `benchmark_results` stage: a checkpoint on a held-out benchmark."""

from __future__ import annotations

import json
from typing import Any

from tentalis_pipelines.inference.models import resolve_model
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages.common import StageResult, markdown_table
from tentalis_pipelines.stages.skills import skill_retriever
from tentalis_pipelines.training import checkpoints as ckpt
from tentalis_pipelines.training import serving


def resolve_checkpoint(lake: Lakehouse, ref: str) -> tuple[str, str | None]:
    """``base``, ``promoted`` or a checkpoint id -> (checkpoint_id, adapter_dir or None)."""
    if ref == "base":
        return "base", None
    if ref == "promoted":  # what serves now (the serving pointer)
        return serving.serving_policy(lake)
    rows = [r for r in lake.read("checkpoints").to_pylist() if r["checkpoint_id"] == ref]
    if not rows:
        known = [r["checkpoint_id"] for r in lake.read("checkpoints", columns=["checkpoint_id"]).to_pylist()]
        raise ValueError(f"unknown checkpoint {ref!r}: use 'base', 'promoted' or one of {known[-5:]}")
    return ref, ckpt.verify_adapter(rows[0]["adapter_uri"]).as_posix()


def benchmark_checkpoint(
    lake: Lakehouse, paths: Paths, policy: PolicySettings, checkpoint_ref: str, benchmark: str, *,
    limit: int | None = None, seed: int = 0, record: bool = True, backend=None, max_new_tokens: int | None = None,
) -> tuple[StageResult, Any]:
    """Evaluate a checkpoint on a benchmark; with ``record`` replace its rows in ``benchmark_results``
    and ``benchmark_items`` (keyed by checkpoint and benchmark: a re-run never duplicates)."""
    from tentalis_pipelines.evaluation.benchmarks import (
        is_environment_benchmark,
        level_success,
        run_benchmark,
    )

    checkpoint_id, adapter = resolve_checkpoint(lake, checkpoint_ref)
    if backend is None:
        model_dir = resolve_model(policy.model, paths.models)
        backend = policy.make_backend(model_dir, adapter)
    # With policy.skills_top_k the agent is measured with its verified skills, as its rollouts see them.
    retrieve = skill_retriever(lake, policy.skills_top_k)
    summary, results = run_benchmark(backend, benchmark, limit=limit, seed=seed, max_new_tokens=max_new_tokens, retrieve_skills=retrieve)
    created = now_utc()
    config = {"limit": limit, "seed": seed, "decoding": "greedy", "model": policy.model_name, "max_new_tokens": max_new_tokens,
              "skills_top_k": policy.skills_top_k, "skill_ids": sorted({i for r in results for i in r.skill_ids})}
    result_row = {**summary.__dict__, "checkpoint_id": checkpoint_id, "backend": backend.name, "model": backend.model_name,
                  "config": json.dumps(config), "created_at": created}
    item_rows = [
        {"checkpoint_id": checkpoint_id, "benchmark": summary.benchmark, "item_id": r.item.item_id, "prompt": r.item.prompt,
         "completion": r.completion, "extracted_answer": r.extracted_answer,
         "reference": r.item.reference if r.item.environment != "code" else r.item.extra["entry_point"],
         "correct": r.correct, "lenient_correct": r.lenient_correct, "formatted": r.formatted, "created_at": created,
         "skill_ids": r.skill_ids}
        for r in results
    ]
    if record:
        keys = {"checkpoint_id": checkpoint_id, "benchmark": summary.benchmark}
        lake.replace_where("benchmark_items", keys, item_rows)
        lake.replace_where("benchmark_results", keys, [result_row])
    meta = {
        "checkpoint_id": checkpoint_id,
        "benchmark": summary.benchmark,
        "n": summary.n,
        "accuracy": round(summary.accuracy, 4),
        "lenient_accuracy": round(summary.lenient_accuracy, 4),
        "format_rate": round(summary.format_rate, 4),
        "ci_low": round(summary.ci_low, 4),
        "ci_high": round(summary.ci_high, 4),
        "seconds": round(summary.seconds, 1),
        **({"success_per_level": level_success(results)} if is_environment_benchmark(summary.benchmark) else {}),
        "items": markdown_table([{"item_id": r["item_id"], "answer": r["extracted_answer"], "reference": r["reference"],
                                  "correct": r["correct"]} for r in item_rows]),
    }
    return StageResult(len(item_rows), meta), summary
