"""Content hashes of every Delta table under a lakehouse root: "no stored row changed" as an assertion.

    before = table_hashes(root)
    ...hostile input...
    assert_unchanged(root, before)                       # every table byte-for-byte equal
    assert_unchanged(root, before, allow={"quarantine"})  # ...except the quarantine, which may grow

A table's hash covers its rows (sorted, so file layout and write order do not matter) and its schema,
not its Delta version: a rejected write that commits nothing leaves the hash unchanged, a write that
commits the same rows again does too, and any changed, lost or added row changes it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.schemas import SCHEMAS


def table_hashes(root: str | Path) -> dict[str, str]:
    """``{table: sha256}`` for every table that exists under ``root`` (absent tables are left out)."""
    lake = Lakehouse(root)
    out: dict[str, str] = {}
    for name in sorted(SCHEMAS):
        if not lake.exists(name):
            continue
        table = lake.read(name)
        rows = sorted(json.dumps(r, sort_keys=True, default=str) for r in table.to_pylist())
        digest = hashlib.sha256(str(table.schema).encode())
        for row in rows:
            digest.update(row.encode())
            digest.update(b"\n")
        out[name] = digest.hexdigest()
    return out


def assert_unchanged(root: str | Path, before: dict[str, str], *, allow: set[str] | frozenset[str] = frozenset()) -> None:
    """Fail naming every table (outside ``allow``) whose rows differ from ``before``."""
    after = table_hashes(root)
    changed = sorted(
        name for name in set(before) | set(after) if name not in allow and before.get(name) != after.get(name)
    )
    assert not changed, f"stored rows changed in: {changed}"
