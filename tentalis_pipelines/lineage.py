"""Lineage manifests: what taught each checkpoint, recorded so that it can be replayed.

``train_checkpoint`` pins the Delta version of every table it reads *before* reading (``table_versions``),
reads the fresh trajectories and their rollouts at exactly those versions, and records a manifest:

* the versions of ``tasks``, ``rollouts``, ``step_scores``, ``reviews``, ``trajectories`` (and of
  ``teacher_logprobs``, ``guided_rollouts`` and ``skills`` when those tables exist);
* the row ids of every trajectory (rollout ids), review (``review_key``), hint (a review with a
  non-empty hint), guided sample (``guide_hint``: a hint-guided sample and the hint it was drawn with)
  and skill (``rollouts.skill_ids``, when the column exists) it trained on;
* the config, the code version (git commit, else the package version), the model, the parent
  checkpoint and its ancestors (a LoRA chain starts each cycle from the parent's adapter);
* the number of samples and a SHA-256 of the training set (``samples_digest``).

It lands twice: ``lineage.json`` inside the checkpoint folder (written with the adapter, atomically)
and rows of the ``lineage`` table, one per (checkpoint, kind, row id), so that "which reviews or hints
taught checkpoint X" is one query::

    select row_id, batch_id from lineage where checkpoint_id = 'X' and kind = 'hint'

``replay`` rebuilds the training set from a manifest with Delta time travel: the same ``TrainSample``
list (prompt ids, completion ids, advantages, old log-probs, temperatures, masks) as was trained, on
any copy of the tables, whatever was written since, as long as the pinned versions' files have not
been vacuumed (Delta's ``delta.deletedFileRetentionDuration``, 7 days by default; a retraction
vacuums at once, see ``retraction``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from tentalis_pipelines.lakehouse import Lakehouse, dumps, now_utc

# Tables every training run reads (directly, or through the stages that made its trajectories).
TABLES = ("tasks", "rollouts", "step_scores", "reviews", "trajectories")
# Tables other features add; their version is recorded when they exist.
OPTIONAL_TABLES = ("teacher_logprobs", "guided_rollouts", "skills", "grounding_flags", "demonstrations")
MANIFEST_FILE = "lineage.json"
MANIFEST_VERSION = 1


class LineageError(RuntimeError):
    """A manifest is missing, or the data it names cannot be read back any more."""


# --------------------------------------------------------------------------- ids and versions
def review_key(row: dict[str, Any]) -> str:
    """The id of a review row: its ``review_id`` (live reviews), else ``batch_id/rollout_id/manager``
    (a pipeline review: one per rollout and manager in a batch)."""
    return row.get("review_id") or f"{row['batch_id']}/{row['rollout_id']}/{row['manager']}"


def _delta_version(lake: Lakehouse, name: str) -> int | None:
    try:
        return DeltaTable(f"{lake.root.rstrip('/')}/{name}", storage_options=lake._storage_options).version()
    except TableNotFoundError:
        return None


def table_versions(lake: Lakehouse) -> dict[str, int | None]:
    """The current Delta version of every table training reads (None: not written yet); optional
    tables only when they exist."""
    out: dict[str, int | None] = {name: _delta_version(lake, name) for name in TABLES}
    for name in OPTIONAL_TABLES:
        v = _delta_version(lake, name)
        if v is not None:
            out[name] = v
    return out


@functools.lru_cache(maxsize=1)
def code_version() -> dict[str, Any]:
    """The code that trained: the git commit of the source tree (and whether it had uncommitted
    changes) when it is a git checkout, and the installed package version."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, Any] = {"git_commit": None, "git_dirty": None, "package_version": None}
    with contextlib.suppress(PackageNotFoundError):
        out["package_version"] = version("tentalis")
    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if commit.returncode == 0:
            out["git_commit"] = commit.stdout.strip()
            dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", "tentalis_pipelines"],
                                   capture_output=True, text=True, timeout=30)
            out["git_dirty"] = bool(dirty.stdout.strip()) if dirty.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def samples_digest(samples: Sequence[Any]) -> str:
    """SHA-256 of a training set: every field of every ``TrainSample``, in order (floats by repr)."""
    h = hashlib.sha256()
    for s in samples:
        h.update(json.dumps([s.prompt_ids, s.completion_ids, repr(float(s.advantage)),
                             None if s.token_advantages is None else [repr(float(a)) for a in s.token_advantages],
                             None if s.old_logps is None else [None if x is None else repr(float(x)) for x in s.old_logps],
                             None if s.temperature is None else repr(float(s.temperature)), s.loss_mask]
                            # a guided sample's ratio is against its old_logps: the flag is part of the set
                            # (appended only when set, so the digests of earlier manifests stay as recorded)
                            + (["guided"] if getattr(s, "guided", False) else [])).encode())
        h.update(b"\n")
    return h.hexdigest()


def ancestors(lake: Lakehouse, parent_id: str | None) -> list[str]:
    """The parent, its parent, ... (newest first): every adapter this checkpoint's weights descend from."""
    if parent_id is None or not lake.exists("checkpoints"):
        return [] if parent_id is None else [parent_id]
    parents = {r["checkpoint_id"]: r["parent_id"] for r in lake.read("checkpoints", columns=["checkpoint_id", "parent_id"]).to_pylist()}
    chain, seen = [], set()
    while parent_id is not None and parent_id not in seen:
        chain.append(parent_id)
        seen.add(parent_id)
        parent_id = parents.get(parent_id)
    return chain


# --------------------------------------------------------------------------- what a training set used
def used_reviews(lake: Lakehouse, trajectories: Iterable[dict], rollouts: dict[str, dict], version: int | None) -> list[dict]:
    """The review rows (at ``version``) behind ``trajectories``: a single-turn trajectory's reviews of
    its rollout, a multi-turn one's reviews of its session (turn- and session-level)."""
    if version is None:
        return []
    by_batch: dict[str, set[str]] = {}
    sessions: dict[str, set[str]] = {}
    for t in trajectories:
        by_batch.setdefault(t["batch_id"], set()).add(t["rollout_id"])
        sid = (rollouts.get(t["rollout_id"]) or {}).get("session_id")
        if sid:
            sessions.setdefault(t["batch_id"], set()).add(sid)
    out = []
    for batch, ids in sorted(by_batch.items()):
        for r in lake.read("reviews", batch_id=batch, version=version).to_pylist():
            if r["rollout_id"] in ids or (r.get("session_id") and r["session_id"] in sessions.get(batch, set())):
                out.append(r)
    return sorted(out, key=review_key)


def distilled_hints(lake: Lakehouse, trajectories: Sequence[dict], version: int | None) -> list[dict[str, str]]:
    """The hints whose OPD signal the checkpoint trained on: a trajectory carries ``opd_signal`` exactly
    when the teacher used its rollout's hint (``teacher_logprobs.decision = 'used'``)."""
    with_signal = {(t["batch_id"], t["rollout_id"]) for t in trajectories if t.get("opd_signal") is not None}
    if not with_signal or not lake.exists("teacher_logprobs"):
        return []
    out = []
    for batch in sorted({b for b, _ in with_signal}):
        for r in lake.read("teacher_logprobs", batch_id=batch, columns=["batch_id", "rollout_id", "hint_id", "decision"],
                           version=version).to_pylist():
            if (batch, r["rollout_id"]) in with_signal and r["decision"] == "used" and r["hint_id"]:
                out.append({"batch_id": batch, "hint_id": r["hint_id"], "rollout_id": r["rollout_id"]})
    return sorted(out, key=lambda h: (h["batch_id"], h["hint_id"]))


def build_manifest(lake: Lakehouse, *, checkpoint_id: str, parent_id: str | None, policy_version: str, versions: dict[str, int | None],
                   trajectories: Sequence[dict], rollouts: dict[str, dict], samples: Sequence[Any], config: dict[str, Any],
                   base_model: str, model: str) -> dict[str, Any]:
    """The manifest of a checkpoint about to be trained on ``samples`` (built from ``trajectories`` and
    their ``rollouts``, read at ``versions``). Ids only: no review text, prompt or completion."""
    reviews = used_reviews(lake, trajectories, rollouts, versions.get("reviews"))
    skills = sorted({s for r in rollouts.values() for s in (r.get("skill_ids") or [])})
    distilled = distilled_hints(lake, trajectories, versions.get("teacher_logprobs"))
    return {
        "manifest_version": MANIFEST_VERSION,
        "checkpoint_id": checkpoint_id,
        "parent_id": parent_id,
        "ancestors": ancestors(lake, parent_id),
        "policy_version": policy_version,
        "base_model": base_model,
        "model": model,
        "created_at": now_utc().isoformat(),
        "code_version": code_version(),
        "config": config,
        "tables": dict(versions),
        "batches": sorted({t["batch_id"] for t in trajectories}),
        "trajectories": [{"batch_id": t["batch_id"], "rollout_id": t["rollout_id"]} for t in trajectories],
        "reviews": [{"batch_id": r["batch_id"], "review_key": review_key(r)} for r in reviews],
        "hints": [{"batch_id": r["batch_id"], "review_key": review_key(r)} for r in reviews if (r.get("hint") or "").strip()],
        "skills": skills,
        "opd_hints": distilled,
        # Hint-guided samples (training/guide.py): each trained sample and the hint it was drawn with.
        "guide_hints": [{"batch_id": t["batch_id"], "hint_id": t["guide_hint_id"], "rollout_id": t["rollout_id"]}
                        for t in trajectories if t.get("guide_hint_id")],
        "samples": len(samples),
        "samples_digest": samples_digest(samples),
    }


def write_manifest_file(folder: Path, manifest: dict[str, Any]) -> Path:
    path = Path(folder) / MANIFEST_FILE
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True, default=str))
    return path


def lineage_rows(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``lineage`` table's rows for one manifest (the first, kind ``manifest``, holds all of it)."""
    cid, now = manifest["checkpoint_id"], now_utc()
    versions = manifest["tables"]
    base = {"checkpoint_id": cid, "created_at": now, "detail": None, "batch_id": None, "row_id": None}
    rows = [{**base, "kind": "manifest", "table_name": None, "table_version": None, "detail": dumps(manifest)}]
    rows += [{**base, "kind": "table", "table_name": name, "table_version": v} for name, v in sorted(versions.items())]
    rows += [{**base, "kind": "trajectory", "table_name": "trajectories", "table_version": versions.get("trajectories"),
              "row_id": t["rollout_id"], "batch_id": t["batch_id"]} for t in manifest["trajectories"]]
    for kind in ("review", "hint"):
        rows += [{**base, "kind": kind, "table_name": "reviews", "table_version": versions.get("reviews"), "row_id": r["review_key"],
                  "batch_id": r["batch_id"]} for r in manifest[kind + "s"]]
    rows += [{**base, "kind": "opd_hint", "table_name": "teacher_logprobs", "table_version": versions.get("teacher_logprobs"),
              "row_id": h["hint_id"], "batch_id": h["batch_id"]} for h in manifest.get("opd_hints", [])]
    rows += [{**base, "kind": "guide_hint", "table_name": "guided_rollouts", "table_version": versions.get("guided_rollouts"),
              "row_id": h["rollout_id"], "batch_id": h["batch_id"], "detail": h["hint_id"]} for h in manifest.get("guide_hints", [])]
    rows += [{**base, "kind": "skill", "table_name": "skills", "table_version": versions.get("skills"), "row_id": s}
             for s in manifest["skills"]]
    # A warm start (stages/warm_start.py): each demonstration it trained on.
    rows += [{**base, "kind": "demonstration", "table_name": "demonstrations", "table_version": versions.get("demonstrations"),
              "row_id": d["demonstration_id"], "batch_id": d["batch_id"], "detail": d.get("source")}
             for d in manifest.get("demonstrations", [])]
    return rows


def manager_lineage_rows(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``lineage`` rows of a manager checkpoint (``stages/manager_training.py``): its manifest, the
    table versions it read, each failed rollout it learned to review (kind ``manager_failure``) and each
    sampled review that taught it (kind ``manager_sample``, a ``manager_samples`` row)."""
    cid, now = manifest["checkpoint_id"], now_utc()
    versions = manifest["tables"]
    base = {"checkpoint_id": cid, "created_at": now, "detail": None, "batch_id": None, "row_id": None}
    rows = [{**base, "kind": "manifest", "table_name": None, "table_version": None, "detail": dumps(manifest)}]
    rows += [{**base, "kind": "table", "table_name": name, "table_version": v} for name, v in sorted(versions.items())]
    rows += [{**base, "kind": "manager_failure", "table_name": "rollouts", "table_version": versions.get("rollouts"),
              "row_id": f["rollout_id"], "batch_id": f["batch_id"]} for f in manifest["failures"]]
    rows += [{**base, "kind": "manager_sample", "table_name": "manager_samples", "table_version": versions.get("manager_samples"),
              "row_id": sid} for sid in manifest["manager_samples"]]
    return rows


def record(lake: Lakehouse, manifest: dict[str, Any]) -> int:
    """Append the manifest's rows to ``lineage`` (written before the checkpoint row, so no recorded
    checkpoint is ever without its lineage). Returns the rows written."""
    return lake.append("lineage", lineage_rows(manifest))


# --------------------------------------------------------------------------- reading back
def load_manifest(lake: Lakehouse, checkpoint_id: str) -> dict[str, Any]:
    """A checkpoint's manifest: from the ``lineage`` table, else ``lineage.json`` in its folder."""
    if lake.exists("lineage"):
        found = lake.read("lineage", columns=["checkpoint_id", "kind", "detail", "created_at"]).to_pylist()
        found = [r for r in found if r["checkpoint_id"] == checkpoint_id and r["kind"] == "manifest"]
        if found:
            return json.loads(max(found, key=lambda r: r["created_at"])["detail"])
    from tentalis_pipelines.training.checkpoints import checkpoint_row

    row = checkpoint_row(lake, checkpoint_id) if lake.exists("checkpoints") else None
    if row is None:
        raise LineageError(f"no checkpoint {checkpoint_id!r}: see `tentalis status` for the checkpoint ids")
    path = Path(row["adapter_uri"]) / MANIFEST_FILE
    if not path.exists():
        raise LineageError(f"checkpoint {checkpoint_id!r} has no lineage manifest (no `lineage` rows, no {path}): "
                           "it was trained before lineage was recorded")
    return json.loads(path.read_text())


def checkpoints_using(lake: Lakehouse, *, trajectories: Iterable[str] = (), reviews: Iterable[str] = ()) -> dict[str, str]:
    """``{checkpoint_id: how}`` for every recorded checkpoint whose manifest lists one of the
    trajectory (rollout) ids or review keys (``how`` = 'direct'), and every checkpoint descending from
    one of those (its adapter started from theirs: ``how`` = 'inherited from <id>')."""
    traj, revs = set(trajectories), set(reviews)
    if not lake.exists("lineage") or not lake.exists("checkpoints") or not (traj or revs):
        return {}
    ckpts = lake.read("checkpoints", columns=["checkpoint_id", "parent_id", "created_at"]).to_pylist()
    known = {r["checkpoint_id"] for r in ckpts}
    direct = set()
    for r in lake.read("lineage", columns=["checkpoint_id", "kind", "row_id"]).to_pylist():
        if r["checkpoint_id"] in known and ((r["kind"] == "trajectory" and r["row_id"] in traj)
                                            or (r["kind"] in ("review", "hint") and r["row_id"] in revs)):
            direct.add(r["checkpoint_id"])
    out = {c: "direct" for c in direct}
    for r in sorted(ckpts, key=lambda r: r["created_at"]):
        if r["checkpoint_id"] in out:
            continue
        hit = next((a for a in ancestors(lake, r["parent_id"]) if a in direct), None)
        if hit is not None:
            out[r["checkpoint_id"]] = f"inherited from {hit}"
    return out


def replay(lake: Lakehouse, checkpoint_id: str | dict[str, Any], tokenizer=None) -> list[Any]:
    """Rebuild the training set of a checkpoint from its manifest with Delta time travel: the same
    ``TrainSample`` list, in the same order, as was trained. ``tokenizer`` defaults to the one of the
    manifest's model folder. Raises ``LineageError`` when a pinned version or a row is gone."""
    from tentalis_pipelines.training.samples import build_training_samples

    manifest = checkpoint_id if isinstance(checkpoint_id, dict) else load_manifest(lake, checkpoint_id)
    versions = manifest["tables"]
    if manifest.get("demonstrations"):  # a warm start (stages/warm_start.py): its demonstrations, in training order
        return _replay_demonstrations(lake, manifest, tokenizer)
    wanted = {(t["batch_id"], t["rollout_id"]) for t in manifest["trajectories"]}
    rows = []
    try:
        for batch in manifest["batches"]:
            rows += [r for r in lake.read("trajectories", batch_id=batch, version=versions["trajectories"]).to_pylist()
                     if (r["batch_id"], r["rollout_id"]) in wanted]
    except Exception as exc:  # a vacuumed version or file: deltalake and pyarrow raise their own types
        raise LineageError(f"cannot read the tables of {manifest['checkpoint_id']} at their recorded versions {versions}: {exc}. "
                           "Their files were vacuumed (a retraction, or `tentalis maintain` past the retention)") from exc
    missing = wanted - {(r["batch_id"], r["rollout_id"]) for r in rows}
    if missing:
        raise LineageError(f"{len(missing)} trajectories of {manifest['checkpoint_id']} are not in trajectories@{versions['trajectories']}: "
                           f"{sorted(missing)[:5]}")
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(manifest["model"])
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
    config = manifest.get("config") or {}
    samples, _ = build_training_samples(lake, tokenizer, order_trajectories(rows), versions,
                                        grounding_policy=config.get("grounding_policy", "off"), grounding_penalty=config.get("grounding_penalty", 1.0))
    return samples


def _replay_demonstrations(lake: Lakehouse, manifest: dict[str, Any], tokenizer=None) -> list[Any]:
    from tentalis_pipelines.training.warm_start import demonstration_samples

    version = manifest["tables"].get("demonstrations")
    try:
        rows = {r["demonstration_id"]: r for r in lake.read("demonstrations", version=version).to_pylist()}
    except Exception as exc:  # noqa: BLE001 - a vacuumed version or file
        raise LineageError(f"cannot read demonstrations@{version} of {manifest['checkpoint_id']}: {exc}") from exc
    missing = [d["demonstration_id"] for d in manifest["demonstrations"] if d["demonstration_id"] not in rows]
    if missing:
        raise LineageError(f"{len(missing)} demonstrations of {manifest['checkpoint_id']} are not in demonstrations@{version}: {missing[:5]}")
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(manifest["model"])
    samples = []
    for d in manifest["demonstrations"]:
        samples += demonstration_samples(tokenizer, json.loads(rows[d["demonstration_id"]]["messages"]), d["demonstration_id"])
    return samples


def verify_replay(lake: Lakehouse, checkpoint_id: str, tokenizer=None) -> tuple[bool, dict[str, Any]]:
    """Replay a checkpoint's training set and compare its digest with the manifest's."""
    manifest = load_manifest(lake, checkpoint_id)
    samples = replay(lake, manifest, tokenizer)
    digest = samples_digest(samples)
    return digest == manifest["samples_digest"], {"samples": len(samples), "digest": digest, "recorded": manifest["samples_digest"]}


def order_trajectories(rows: Iterable[dict]) -> list[dict]:
    """The training order of trajectories: by batch, task, group index, rollout id (groups stay
    together, and a replay sees the rows in the order training did)."""
    return sorted(rows, key=lambda r: (r["batch_id"], r["task_id"] or "", r["group_index"] if r["group_index"] is not None else -1,
                                       r["rollout_id"]))
