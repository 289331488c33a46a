"""The OpenRLHF hand-off: export training prompts with labels, import the LoRA adapter that comes back.

OpenRLHF (pinned to v0.11.0, the version ``docs/launchers.md``'s ``ray job submit`` command was written
for) trains on a JSONL prompt dataset and scores samples through a remote reward URL. Tentalis gives
it both ends, with lineage across the external run:

* :func:`export_prompts` writes ``prompts.jsonl`` (one task per line: ``input`` = the chat messages the
  policy sees, ``label`` = the task's reference answer; read with ``--data.input_key input
  --data.label_key label --data.apply_chat_template``) and ``manifest.json`` naming the export, the
  Delta version of ``tasks`` it was read at, the batches and the file's SHA-256.
* ``tentalis reward-server`` (``rewards/reward_server.py``) answers ``--reward.remote_url``.
* :func:`import_adapter` copies the returned adapter into the checkpoint store (atomically, as a
  trained one) and records a ``checkpoints`` row and a lineage manifest that names the export (its id,
  digest and Delta versions). It is not promoted: the benchmarks gate it like any checkpoint.

:func:`verify_export` checks an export against the lakehouse: every row equals the task it came from,
read at the pinned version.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tentalis_pipelines import lineage
from tentalis_pipelines.inference.prompts import chat_messages
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.rewards.math_answers import reference_answer
from tentalis_pipelines.training import checkpoints as ckpt

OPENRLHF_VERSION = "0.11.0"
PROMPTS_FILE = "prompts.jsonl"
MANIFEST_FILE = "manifest.json"
INPUT_KEY, LABEL_KEY = "input", "label"
# The files a PEFT LoRA adapter folder must hold (OpenRLHF's DeepspeedStrategy.save_model writes them).
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


class HandoffError(ValueError):
    """An export or import that cannot be done as asked; the message names the input and the fix."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def export_row(task: dict[str, Any], *, worked_example: bool = True) -> dict[str, Any]:
    """One dataset line for a task: the policy's chat messages, the reference answer, the task's ids."""
    return {INPUT_KEY: chat_messages(task["prompt"], worked_example=worked_example), LABEL_KEY: reference_answer(task["reference"]),
            "batch_id": task["batch_id"], "task_id": task["task_id"]}


def _tasks(lake: Lakehouse, version: int | None, batches: list[str] | None) -> list[dict[str, Any]]:
    if version is None:
        raise HandoffError("the lakehouse has no tasks yet: run `tentalis batch` (or `tentalis run`) first")
    rows = lake.read("tasks", columns=["batch_id", "task_id", "environment", "prompt", "reference"], version=version).to_pylist()
    if batches:
        unknown = sorted(set(batches) - {r["batch_id"] for r in rows})
        if unknown:
            raise HandoffError(f"no tasks in batches {unknown} (tasks@{version}): see `tentalis sql \"select distinct batch_id from tasks\"`")
        rows = [r for r in rows if r["batch_id"] in set(batches)]
    return sorted(rows, key=lambda r: (r["batch_id"], r["task_id"]))


def export_prompts(lake: Lakehouse, out_dir: str | Path, *, batches: list[str] | None = None, worked_example: bool = True) -> dict[str, Any]:
    """Write ``out_dir/prompts.jsonl`` and ``out_dir/manifest.json`` from the ``math`` tasks with a
    reference (the ones a verifier can score), read at the current Delta version of ``tasks`` (pinned
    first). Returns the manifest. ``out_dir`` must not hold an export already."""
    out = Path(out_dir)
    if (out / MANIFEST_FILE).exists() or (out / PROMPTS_FILE).exists():
        raise HandoffError(f"{out} already holds an export: pick a new folder (exports are never overwritten)")
    version = lineage.table_versions(lake).get("tasks")
    tasks = [t for t in _tasks(lake, version, batches) if (t["environment"] or "math") == "math" and (t["reference"] or "").strip()]
    if not tasks:
        raise HandoffError(f"no math tasks with a reference in tasks@{version}"
                           + (f" for batches {batches}" if batches else "") + ": nothing a verifier could score")
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{PROMPTS_FILE}.tmp"
    with open(tmp, "w") as fh:
        for t in tasks:
            fh.write(json.dumps(export_row(t, worked_example=worked_example), ensure_ascii=False) + "\n")
    tmp.replace(out / PROMPTS_FILE)
    manifest = {
        "export_id": f"export-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{secrets.token_hex(3)}",
        "created_at": now_utc().isoformat(),
        "lakehouse": str(lake.root),
        "tables": {"tasks": version},
        "batches": sorted({t["batch_id"] for t in tasks}),
        "rows": len(tasks),
        "worked_example": worked_example,
        "input_key": INPUT_KEY,
        "label_key": LABEL_KEY,
        "prompts_sha256": sha256_file(out / PROMPTS_FILE),
        "openrlhf_version": OPENRLHF_VERSION,
        "code_version": lineage.code_version(),
    }
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


def load_export(folder: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """An export's manifest and rows, checked against the manifest's digest."""
    folder = Path(folder)
    for name in (MANIFEST_FILE, PROMPTS_FILE):
        if not (folder / name).exists():
            raise HandoffError(f"{folder} is not an export (no {name}): make one with `tentalis openrlhf export`")
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    digest = sha256_file(folder / PROMPTS_FILE)
    if digest != manifest.get("prompts_sha256"):
        raise HandoffError(f"{folder / PROMPTS_FILE} changed after export (sha256 {digest[:12]}, manifest says "
                           f"{str(manifest.get('prompts_sha256'))[:12]}): export again instead of editing it")
    rows = [json.loads(line) for line in (folder / PROMPTS_FILE).read_text().splitlines() if line.strip()]
    return manifest, rows


def verify_export(lake: Lakehouse, folder: str | Path) -> list[str]:
    """The differences between an export and the tasks it names, read at its pinned version (empty: it
    round-trips)."""
    manifest, rows = load_export(folder)
    tasks = {(t["batch_id"], t["task_id"]): t for t in _tasks(lake, manifest["tables"]["tasks"], manifest["batches"])}
    problems = []
    if len(rows) != manifest["rows"]:
        problems.append(f"{len(rows)} rows, manifest says {manifest['rows']}")
    for i, row in enumerate(rows):
        task = tasks.get((row.get("batch_id"), row.get("task_id")))
        if task is None:
            problems.append(f"row {i}: no task {row.get('batch_id')}/{row.get('task_id')} in tasks@{manifest['tables']['tasks']}")
        elif row != export_row(task, worked_example=manifest["worked_example"]):
            problems.append(f"row {i}: differs from task {task['batch_id']}/{task['task_id']}")
    return problems


class AdapterFiles:
    """A finished adapter folder posing as a model for ``checkpoints.save_adapter``: its files are copied
    into the temporary folder, so the import lands by the same single rename as a trained adapter."""

    def __init__(self, folder: Path):
        self.folder = folder

    def save_pretrained(self, target: str, safe_serialization: bool = True) -> None:
        shutil.copytree(self.folder, target, dirs_exist_ok=True)


def check_adapter_folder(folder: str | Path) -> Path:
    """Raise unless ``folder`` holds a PEFT LoRA adapter (config and weights)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise HandoffError(f"{folder} is not a folder: give OpenRLHF's --ckpt.output_dir (it holds adapter_config.json)")
    if not (folder / ADAPTER_CONFIG).exists() or not any((folder / w).exists() for w in ADAPTER_WEIGHTS):
        raise HandoffError(f"{folder} holds no LoRA adapter ({ADAPTER_CONFIG} and one of {', '.join(ADAPTER_WEIGHTS)}): "
                           "train with --ds.lora.rank > 0 and give the --ckpt.output_dir folder")
    config = json.loads((folder / ADAPTER_CONFIG).read_text())
    if str(config.get("peft_type", "")).upper() != "LORA":
        raise HandoffError(f"{folder / ADAPTER_CONFIG} says peft_type {config.get('peft_type')!r}; only LoRA adapters import")
    return folder


def import_adapter(lake: Lakehouse, checkpoints_root: str | Path, adapter_dir: str | Path, export_dir: str | Path, *,
                   base_model: str, algorithm: str = "openrlhf:group_norm", metrics: dict[str, Any] | None = None) -> dict[str, Any]:
    """Import an adapter trained by OpenRLHF on the export at ``export_dir`` as a new checkpoint (not
    promoted). Lineage first, then the row, as for a trained checkpoint. Returns the checkpoint row."""
    source = check_adapter_folder(adapter_dir)
    export, rows = load_export(export_dir)
    checkpoint_id = ckpt.new_checkpoint_id()
    manifest = {
        "manifest_version": lineage.MANIFEST_VERSION, "checkpoint_id": checkpoint_id, "parent_id": None, "ancestors": [],
        "policy_version": None, "base_model": base_model, "model": base_model, "created_at": now_utc().isoformat(),
        "code_version": lineage.code_version(), "config": {"trainer": f"openrlhf=={export['openrlhf_version']}", "algorithm": algorithm},
        "tables": dict(export["tables"]), "batches": export["batches"], "trajectories": [], "reviews": [], "hints": [], "skills": [],
        "opd_hints": [], "samples": len(rows), "samples_digest": export["prompts_sha256"],
        "export": {k: export[k] for k in ("export_id", "prompts_sha256", "rows", "tables", "batches", "openrlhf_version")},
        "source_adapter": str(source.resolve()),
    }
    path = ckpt.save_adapter(AdapterFiles(source), Path(checkpoints_root), checkpoint_id,
                             extra=lambda folder: lineage.write_manifest_file(folder, manifest))
    try:
        lineage.record(lake, manifest)
        row = {"checkpoint_id": checkpoint_id, "parent_id": None, "base_model": base_model, "adapter_uri": str(path),
               "algorithm": algorithm, "config": manifest["config"], "trained_on": export["batches"], "trajectory_ids": [],
               "trajectory_count": 0, "metrics": {"export_rows": len(rows), **(metrics or {})}, "promoted": False}
        ckpt.record_checkpoint(lake, row)
    except BaseException:
        orphan = not lake.exists("checkpoints") or ckpt.checkpoint_row(lake, checkpoint_id) is None
        if orphan:  # no row points at it: an orphan adapter never stays
            shutil.rmtree(path, ignore_errors=True)
        raise
    return {**row, "export_id": export["export_id"]}
