"""The warm-start stage: a LoRA checkpoint trained on verified demonstrations (``training/warm_start.py``).

It continues the serving policy (the base model or the serving checkpoint's adapter) and records a
checkpoint like any other: a row in ``checkpoints`` (parent, ``trained_on`` = the demonstrations'
batches, algorithm ``sft_warm_start``, the config with the demonstration ids, the metrics) and its
lineage (a manifest, one ``demonstration`` row per demonstration trained on). It is **not** promoted
here: the ``new_checkpoints`` sensor benchmarks it and the promotion gate decides, as for an RL
checkpoint, so a warm start can run before the first RL cycle or between two.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tentalis_pipelines import lineage
from tentalis_pipelines.contamination import held_out_reason
from tentalis_pipelines.demonstrations import read_demonstrations
from tentalis_pipelines.inference.models import resolve_model
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages.common import StageResult, markdown_table
from tentalis_pipelines.stages.rollouts import current_policy
from tentalis_pipelines.training import checkpoints as ckpt
from tentalis_pipelines.training import launchers
from tentalis_pipelines.training.trainer import GRPOConfig, build_policy
from tentalis_pipelines.training.warm_start import (
    ALGORITHM,
    WarmStartConfig,
    demonstration_samples,
    train_sft,
)


def warm_start_manifest(lake: Lakehouse, *, checkpoint_id: str, parent_id: str | None, policy_version: str,
                        versions: dict[str, int | None], demonstrations: list[dict], samples: list, config: dict[str, Any],
                        base_model: str, model: str) -> dict[str, Any]:
    """The lineage manifest of a warm-start checkpoint: the usual fields (no trajectory, review or hint)
    and the demonstrations trained on (batch, id, source)."""
    return {
        "manifest_version": lineage.MANIFEST_VERSION, "checkpoint_id": checkpoint_id, "parent_id": parent_id,
        "ancestors": lineage.ancestors(lake, parent_id), "policy_version": policy_version, "base_model": base_model, "model": model,
        "created_at": now_utc().isoformat(), "code_version": lineage.code_version(), "config": config, "tables": dict(versions),
        "batches": sorted({d["batch_id"] for d in demonstrations}), "trajectories": [], "reviews": [], "hints": [], "skills": [],
        "opd_hints": [], "guide_hints": [],
        "demonstrations": [{"batch_id": d["batch_id"], "demonstration_id": d["demonstration_id"], "source": d["source"]}
                           for d in demonstrations],
        "samples": len(samples), "samples_digest": lineage.samples_digest(samples),
    }


def train_warm_start(lake: Lakehouse, paths: Paths, policy: PolicySettings, config: GRPOConfig, warm: WarmStartConfig, *,
                     batches: list[str] | None = None, on_step=None) -> StageResult:
    """Train a warm-start checkpoint on the verified demonstrations (of ``batches``; all when None) and
    record it (module doc). Refuses any demonstration of a held-out task; raises when there is none."""
    from transformers import AutoTokenizer

    version, adapter = current_policy(lake, paths)
    versions = lineage.table_versions(lake)
    demos = read_demonstrations(lake, batches=batches, version=versions.get("demonstrations"))
    refused = [(d["task_id"], why) for d in demos if (why := held_out_reason(d))]
    if refused:
        raise ValueError(f"refused: {len(refused)} demonstration(s) of held-out tasks ({refused[:3]}); a held-out task never "
                         "gets a demonstration: delete those rows")
    if not demos:
        raise ValueError("no verified demonstrations" + (f" in batches {batches}" if batches else "") +
                         ": make some first (`tentalis demos oracle --batch ID`, `tentalis demos import FILE`)")
    model_dir = resolve_model(policy.model, paths.models)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    samples = []
    for d in demos:
        samples += demonstration_samples(tokenizer, json.loads(d["messages"]), d["demonstration_id"])
    checkpoint_id = ckpt.new_checkpoint_id()
    cfg = {**config.to_dict(), "algorithm": ALGORITHM, "warm_start": warm.to_dict(),
           "demonstration_ids": [d["demonstration_id"] for d in demos]}
    parent = None if version == "base" else version
    manifest = warm_start_manifest(lake, checkpoint_id=checkpoint_id, parent_id=parent, policy_version=version, versions=versions,
                                   demonstrations=demos, samples=samples, config=cfg, base_model=policy.model_name, model=str(model_dir))
    model = build_policy(model_dir, None if adapter is None else Path(adapter), config)
    result = train_sft(model, tokenizer, samples, warm, on_step=on_step)

    def extra(folder):  # inside the atomic save: the adapter never lands without them
        lineage.write_manifest_file(folder, manifest)
        launchers.write_output_file(folder, result.metrics, result.history)

    try:
        path = ckpt.save_adapter(model, paths.checkpoints, checkpoint_id, extra=extra)
    except BaseException:
        launchers.discard_partial(paths.checkpoints, checkpoint_id)
        raise
    lineage.record(lake, manifest)  # before the checkpoint row: a recorded checkpoint always has its lineage
    batch_ids = sorted({d["batch_id"] for d in demos})
    sources = sorted({d["source"] for d in demos})
    metrics = {**result.metrics, "demonstrations": len(demos), "sources": sources}
    ckpt.record_checkpoint(lake, {
        "checkpoint_id": checkpoint_id, "parent_id": parent, "base_model": policy.model_name, "adapter_uri": str(path),
        "algorithm": ALGORITHM, "config": cfg, "trained_on": batch_ids, "trajectory_ids": [], "trajectory_count": 0,
        "metrics": metrics, "promoted": False,
    })
    return StageResult(1, {"checkpoint_id": checkpoint_id, "parent_id": version, "algorithm": ALGORITHM, "promoted": False,
                           "trained_on": ", ".join(batch_ids), "demonstrations": len(demos), "sources": ", ".join(sources),
                           "history": markdown_table(result.history, limit=50),
                           **{k: round(v, 5) if isinstance(v, float) else v for k, v in result.metrics.items()}})


def check_warm_start(lake: Lakehouse, checkpoint_id: str) -> tuple[bool, str, dict[str, Any]]:
    """A warm-start checkpoint's row is whole (algorithm, trained_on, demonstration ids in its config, a
    lineage row per demonstration) and its training lowered the NLL of the demonstrated tokens."""
    import json

    row = ckpt.checkpoint_row(lake, checkpoint_id)
    if row is None:
        return False, f"no checkpoints row for {checkpoint_id}", {}
    cfg, metrics = json.loads(row["config"] or "{}"), json.loads(row["metrics"] or "{}")
    ids = cfg.get("demonstration_ids") or []
    problems = []
    if row["algorithm"] != ALGORITHM:
        problems.append(f"algorithm {row['algorithm']!r}, not {ALGORITHM}")
    if not ids or not row["trained_on"]:
        problems.append("no demonstration ids or batches recorded")
    recorded = set()
    if lake.exists("lineage"):
        recorded = {r["row_id"] for r in lake.read("lineage", columns=["checkpoint_id", "kind", "row_id"]).to_pylist()
                    if r["checkpoint_id"] == checkpoint_id and r["kind"] == "demonstration"}
    if set(ids) - recorded:
        problems.append(f"{len(set(ids) - recorded)} demonstration(s) without a lineage row")
    before, after = metrics.get("nll_before"), metrics.get("nll_after")
    if before is None or after is None or not after < before:
        problems.append(f"the demonstrated tokens' NLL did not fall ({before} -> {after})")
    meta = {"demonstrations": len(ids), "nll_before": before, "nll_after": after}
    return (not problems), ("; ".join(problems) or f"{len(ids)} demonstrations, NLL {before:.3f} -> {after:.3f}"), meta
