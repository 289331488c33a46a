"""The checkpoint store: LoRA adapters written atomically, with lineage rows in ``checkpoints``.

An adapter is saved into a hidden temporary folder, fsynced, given a ``COMPLETE`` marker listing its
files, and only then renamed into place (one atomic rename) and recorded in the table. A crash at any
point leaves either nothing visible or a complete, loadable adapter; temporary leftovers are removed
by the next save.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tentalis_pipelines.lakehouse import Lakehouse, dumps, now_utc

MARKER = "COMPLETE"


class CheckpointError(RuntimeError):
    pass


def new_checkpoint_id() -> str:
    return f"ckpt-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"


def _fsync_tree(folder: Path) -> None:
    for p in folder.rglob("*"):
        if p.is_file():
            with p.open("rb") as fh:
                os.fsync(fh.fileno())


def save_adapter(model, root: Path, checkpoint_id: str) -> Path:
    """Save a peft model's adapter atomically under ``root/checkpoint_id``."""
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    final = root / checkpoint_id
    if final.exists():
        raise CheckpointError(f"checkpoint {checkpoint_id} already exists at {final}")
    tmp = root / f".tmp-{checkpoint_id}-{os.getpid()}"
    model.save_pretrained(str(tmp), safe_serialization=True)
    files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
    (tmp / MARKER).write_text(json.dumps({"files": files}))
    _fsync_tree(tmp)
    os.replace(tmp, final)
    return final


def verify_adapter(path: str | Path) -> Path:
    """Raise unless ``path`` is a complete adapter folder."""
    path = Path(path)
    marker = path / MARKER
    if not marker.exists():
        raise CheckpointError(f"{path} is not a complete checkpoint (no {MARKER} marker)")
    missing = [f for f in json.loads(marker.read_text())["files"] if not (path / f).exists()]
    if missing:
        raise CheckpointError(f"checkpoint {path} is missing files {missing}")
    return path


def record_checkpoint(lake: Lakehouse, row: dict[str, Any]) -> None:
    verify_adapter(row["adapter_uri"])
    row = {"created_at": now_utc(), **row}
    for key in ("config", "metrics"):
        if not isinstance(row[key], str):
            row[key] = dumps(row[key])
    lake.append("checkpoints", [row])


def promote(lake: Lakehouse, checkpoint_id: str) -> None:
    lake.update("checkpoints", f"checkpoint_id = '{checkpoint_id}'", {"promoted": "true"})


def latest_promoted(lake: Lakehouse) -> dict[str, Any] | None:
    """The newest promoted checkpoint whose adapter is complete, or None (serve the base model)."""
    rows = lake.read("checkpoints").to_pylist()
    for row in sorted((r for r in rows if r["promoted"]), key=lambda r: r["created_at"], reverse=True):
        try:
            verify_adapter(row["adapter_uri"])
            return row
        except CheckpointError:
            continue
    return None
