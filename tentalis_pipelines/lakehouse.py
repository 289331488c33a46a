"""Delta Lake tables and a DuckDB view over them.

Per-batch tables are partitioned by ``batch_id``; writing a batch replaces that batch's rows with one
atomic Delta commit (overwrite by predicate), so re-running a batch never duplicates anything.
Concurrent writers that lose the optimistic-concurrency race retry with backoff.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from tentalis_pipelines.schemas import BATCH_TABLES, SCHEMAS

_BATCH_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class LakehouseError(ValueError):
    """Bad input to the lakehouse (unknown table, bad batch id, rows that do not fit the schema)."""


def validate_batch_id(batch_id: str) -> str:
    """Batch ids go into Delta predicates and partition paths, so only a safe alphabet is allowed."""
    if not isinstance(batch_id, str) or not _BATCH_ID.match(batch_id):
        raise LakehouseError(
            f"invalid batch_id {batch_id!r}: use 1-128 characters from [A-Za-z0-9._-], starting with a "
            "letter or digit (rename the inbox file or pass another --batch-id)"
        )
    return batch_id


def _sql_quote(value: str) -> str:
    return value.replace("'", "''")


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


def to_table(name: str, rows: Sequence[Mapping[str, Any]] | pa.Table) -> pa.Table:
    """Build an Arrow table with the exact schema of ``name`` (columns reordered, types cast)."""
    schema = _schema(name)
    if isinstance(rows, pa.Table):
        missing = [f.name for f in schema if f.name not in rows.column_names]
        if missing:
            raise LakehouseError(f"rows for table {name!r} lack columns {missing}")
        try:
            return rows.select(schema.names).cast(schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise LakehouseError(f"rows for table {name!r} do not fit its schema: {exc}") from exc
    try:
        return pa.Table.from_pylist(list(rows), schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as exc:
        raise LakehouseError(f"rows for table {name!r} do not fit its schema: {exc}") from exc


def _schema(name: str) -> pa.Schema:
    try:
        return SCHEMAS[name]
    except KeyError:
        raise LakehouseError(f"unknown table {name!r}; known tables: {sorted(SCHEMAS)}") from None


class Lakehouse:
    """The Delta tables under one root folder (a local path; object-store URIs work the same way)."""

    def __init__(self, root: str | Path, *, max_commit_retries: int = 8):
        self.root = str(root)
        self.max_commit_retries = max_commit_retries
        if "://" not in self.root:
            Path(self.root).mkdir(parents=True, exist_ok=True)

    def uri(self, name: str) -> str:
        _schema(name)
        return f"{self.root.rstrip('/')}/{name}"

    # ---------------------------------------------------------------- reading
    def exists(self, name: str) -> bool:
        try:
            DeltaTable(self.uri(name))
            return True
        except TableNotFoundError:
            return False

    def table(self, name: str) -> DeltaTable | None:
        try:
            return DeltaTable(self.uri(name))
        except TableNotFoundError:
            return None

    def dataset(self, name: str):
        """A pyarrow dataset of the table (or an empty in-memory table before the first write)."""
        dt = self.table(name)
        if dt is None:
            return _schema(name).empty_table()
        return dt.to_pyarrow_dataset()

    def read(self, name: str, *, batch_id: str | None = None, columns: list[str] | None = None) -> pa.Table:
        """Read a table, pruned to one batch's partition when ``batch_id`` is given."""
        dt = self.table(name)
        if dt is None:
            empty = _schema(name).empty_table()
            return empty.select(columns) if columns else empty
        if batch_id is not None:
            validate_batch_id(batch_id)
            return dt.to_pyarrow_table(partitions=[("batch_id", "=", batch_id)], columns=columns)
        return dt.to_pyarrow_table(columns=columns)

    def count(self, name: str, *, batch_id: str | None = None) -> int:
        return self.read(name, batch_id=batch_id, columns=["batch_id"] if name in BATCH_TABLES else None).num_rows

    # ---------------------------------------------------------------- writing
    def write_batch(self, name: str, batch_id: str, rows: Sequence[Mapping[str, Any]] | pa.Table) -> int:
        """Replace one batch's rows in a per-batch table (one atomic commit). Returns rows written."""
        if name not in BATCH_TABLES:
            raise LakehouseError(f"table {name!r} is not partitioned by batch_id; use append() or replace_where()")
        return self.replace_where(name, {"batch_id": batch_id}, rows, partition_by=["batch_id"])

    def replace_where(
        self, name: str, keys: Mapping[str, str], rows: Sequence[Mapping[str, Any]] | pa.Table,
        partition_by: list[str] | None = None,
    ) -> int:
        """Replace the rows whose ``keys`` columns equal the given values (one atomic commit).

        Every row written must carry exactly those key values, so a re-run replaces and never duplicates.
        """
        for col, value in keys.items():
            if col == "batch_id":
                validate_batch_id(value)
            elif not isinstance(value, str) or not value:
                raise LakehouseError(f"invalid {col} {value!r}")
        table = to_table(name, rows)
        for col, value in keys.items():
            others = set(table.column(col).to_pylist()) - {value} if table.num_rows else set()
            if others:
                raise LakehouseError(f"rows for {col}={value!r} carry other {col} values {sorted(map(str, others))}")
        if table.num_rows == 0 and not self.exists(name):
            return 0
        predicate = " AND ".join(f"{col} = '{_sql_quote(value)}'" for col, value in keys.items())
        self._replace(name, predicate, table, partition_by=partition_by)
        return table.num_rows

    def _replace(self, name: str, predicate: str, table: pa.Table, partition_by: list[str] | None = None) -> None:
        """Replace the rows matching ``predicate`` with ``table`` in one commit (create on first write)."""
        if not self.exists(name):
            self._commit(lambda: write_deltalake(self.uri(name), table, mode="append", partition_by=partition_by))
            return
        self._commit(
            lambda: write_deltalake(
                self.uri(name), table, mode="overwrite", predicate=predicate, schema_mode="merge", partition_by=partition_by
            )
        )

    def append(self, name: str, rows: Sequence[Mapping[str, Any]] | pa.Table) -> int:
        table = to_table(name, rows)
        if table.num_rows == 0 and self.exists(name):
            return 0
        self._commit(lambda: write_deltalake(self.uri(name), table, mode="append", schema_mode="merge"))
        return table.num_rows

    def upsert(self, name: str, key: str, rows: Sequence[Mapping[str, Any]] | pa.Table, compare: Sequence[str]) -> int:
        """Merge rows by ``key``: insert new keys, update a matched row only when a ``compare`` column
        differs (so importing the same rows again changes nothing)."""
        table = to_table(name, rows)
        if table.num_rows == 0:
            return 0
        if not self.exists(name):
            self._commit(lambda: write_deltalake(self.uri(name), table, mode="append"))
            return table.num_rows
        changed = " OR ".join(f"(t.{c} IS DISTINCT FROM s.{c})" for c in compare)
        self._commit(
            lambda: DeltaTable(self.uri(name))
            .merge(table, predicate=f"t.{key} = s.{key}", source_alias="s", target_alias="t")
            .when_matched_update_all(predicate=changed)
            .when_not_matched_insert_all()
            .execute()
        )
        return table.num_rows

    def update(self, name: str, predicate: str, updates: Mapping[str, str]) -> None:
        """SQL-expression update (e.g. flip ``promoted``), retried on commit conflicts."""
        dt = self.table(name)
        if dt is None:
            raise LakehouseError(f"table {name!r} does not exist yet")
        self._commit(lambda: DeltaTable(self.uri(name)).update(updates=dict(updates), predicate=predicate))

    def quarantine(self, rows: Iterable[Mapping[str, Any]], *, batch_id: str | None = None, stage: str | None = None) -> int:
        """Keep rejected inputs (never dropped silently).

        With ``batch_id`` and ``stage`` the rows replace that stage's earlier rejects for the batch, so
        re-running a batch does not quarantine the same lines twice.
        """
        rows = [{"seen_at": now_utc(), **r} for r in rows]
        if batch_id is None or stage is None:
            return self.append("quarantine", rows) if rows else 0
        return self.replace_where("quarantine", {"batch_id": batch_id, "stage": stage}, rows)

    def _commit(self, write) -> None:
        delay = 0.05
        for attempt in range(self.max_commit_retries + 1):
            try:
                write()
                return
            except CommitFailedError:
                if attempt == self.max_commit_retries:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    # ---------------------------------------------------------------- maintenance
    def optimize(self, name: str) -> dict[str, Any]:
        dt = self.table(name)
        return {} if dt is None else dict(dt.optimize.compact())

    def vacuum(self, name: str, retention_hours: int = 168) -> list[str]:
        dt = self.table(name)
        if dt is None:
            return []
        return dt.vacuum(retention_hours=retention_hours, enforce_retention_duration=False, dry_run=False)

    # ---------------------------------------------------------------- SQL
    def duckdb(self) -> duckdb.DuckDBPyConnection:
        """An in-memory DuckDB connection with every table registered as a view.

        Tables are registered from ``DeltaTable.to_pyarrow_dataset()`` (not DuckDB's ``delta_scan``,
        which downloads an extension at run time), so filters on ``batch_id`` prune partitions.
        """
        con = duckdb.connect()
        for name in SCHEMAS:
            con.register(name, self.dataset(name))
        return con

    def sql(self, query: str) -> pa.Table:
        con = self.duckdb()
        try:
            return con.execute(query).fetch_arrow_table()
        finally:
            con.close()


def dumps(obj: Any) -> str:
    """Stable JSON for config/metadata columns."""
    return json.dumps(obj, sort_keys=True, default=str)
