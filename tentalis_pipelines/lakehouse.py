"""Delta Lake tables and a DuckDB view over them.

Per-batch tables are partitioned by ``batch_id``; writing a batch replaces that batch's rows with one
atomic Delta commit (overwrite by predicate), so re-running a batch never duplicates anything.
Concurrent writers that lose the optimistic-concurrency race retry with backoff.

Cost model: a batch's read, write and replace touch only that batch's partition (its files are
selected from the Delta log by partition value; no other data file is opened), and building a
DuckDB view lists the files from the log without reading them. What is left that grows with history
is loading the log: the JSON commits since the last checkpoint (bounded by ``TABLE_PROPERTIES``) and
the file list, at least one file per batch and table (cheap per file; ``maintain()`` compacts what
appends and re-runs add beyond that, checkpoints the log and vacuums replaced files).

Object storage: the root may be a URI (``s3://bucket/prefix``; ``$TENTALIS_LAKEHOUSE_URI``), opened with
deltalake ``storage_options`` from the standard environment variables (see ``storage_options_from_env``).
Concurrent writers stay safe there because deltalake 1.x writes each commit file with a conditional put
(``If-None-Match: *``, object_store's ``conditional_put = etag``): of two writers racing for version N
exactly one creates it, the other gets "version already exists", re-reads the log and retries (delta-rs
for compatible operations, ``Lakehouse._commit`` for conflicts). The store must honour conditional
writes (AWS S3 since 2024, MinIO, Cloudflare R2 and moto do); deltalake 1.x no longer has a DynamoDB
locking provider, and ``AWS_S3_ALLOW_UNSAFE_RENAME`` only suits a single writer.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
import pyarrow.fs as pafs
from deltalake import DeltaTable, PostCommitHookProperties, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from tentalis_pipelines.schemas import BATCH_TABLES, SCHEMAS
from tentalis_pipelines.settings import vacuum_retention_hours

log = logging.getLogger(__name__)
_warned: set[str] = set()


def _warn_once(message: str, *args: Any) -> None:
    """Log a configuration warning once per process (a Lakehouse is built for every asset step)."""
    text = message % args
    if text not in _warned:
        _warned.add(text)
        log.warning(text)

_BATCH_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

# Unpartitioned tables whose writes and lookups select rows by these columns (replace_where keys, merge
# keys). Z-ordering clusters those values so per-file min/max statistics let such predicates skip files;
# it pays once a table spans several files (beyond the ~100 MB compaction target) and rewrites every
# file on each run, so maintenance does it only when asked.
ZORDER_COLUMNS: dict[str, tuple[str, ...]] = {
    "benchmark_items": ("checkpoint_id", "benchmark"),
    "benchmark_results": ("checkpoint_id", "benchmark"),
    "quarantine": ("batch_id", "stage"),
    "human_reviews": ("rollout_id",),
}

# Table properties, set when a table is created (and by maintain() on older tables). Every read and
# write loads the table's log, and that load is what grew with history:
# * it replays every JSON commit since the last checkpoint (about 0.4 ms each here) and delta-rs
#   checkpoints every 100 commits by default; Spark's default of 10 bounds the replay;
# * it parses every file's statistics, about 2.5x the load time with stats on all 18 columns. Per-batch
#   tables are read and replaced by partition, so their data-column statistics only serve point lookups
#   by id from other engines: keep them for the first two columns (the ids). Unpartitioned tables keep
#   all statistics: their replace_where and merge predicates skip files with them.
TABLE_PROPERTIES = {"delta.checkpointInterval": "10"}
BATCH_TABLE_PROPERTIES = {**TABLE_PROPERTIES, "delta.dataSkippingNumIndexedCols": "2"}

# Reader features that pyarrow datasets cannot honour; such tables go through deltalake's own reader,
# which refuses them with a clear error instead of returning wrong rows.
_UNSUPPORTED_READER_FEATURES = {"deletionVectors", "columnMapping"}

# Maintenance commits never delete expired log files: only vacuum may cost time travel.
_KEEP_LOG = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)

_INTERVAL = re.compile(r"^\s*interval\s+(\d+)\s+([a-z]+?)s?\s*$", re.IGNORECASE)
_HOURS_PER_UNIT = {"nanosecond": 1 / 3.6e12, "microsecond": 1 / 3.6e9, "millisecond": 1 / 3.6e6, "second": 1 / 3600,
                   "minute": 1 / 60, "hour": 1.0, "day": 24.0, "week": 168.0}


# Environment variables that configure deltalake's S3 store (object_store's AmazonS3 keys plus delta-rs's own).
# Credentials among them are passed to deltalake only: never logged, never written to a table or metadata.
S3_ENV_OPTIONS = (
    "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
    "AWS_PROFILE", "AWS_ALLOW_HTTP", "AWS_S3_ADDRESSING_STYLE", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST",
    "AWS_CONDITIONAL_PUT", "AWS_COPY_IF_NOT_EXISTS", "AWS_S3_ALLOW_UNSAFE_RENAME", "AWS_S3_LOCKING_PROVIDER",
    "AWS_IAM_ROLE_ARN", "AWS_IAM_ROLE_SESSION_NAME", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN",
    "AWS_ROLE_SESSION_NAME", "AWS_EC2_METADATA_DISABLED", "AWS_FORCE_CREDENTIAL_LOAD",
)
_S3_SCHEMES = ("s3", "s3a")


def is_object_store(root: str | Path) -> bool:
    """Whether a lakehouse root is an object-store URI (``s3://...``) rather than a local folder (a path or ``file://``)."""
    text = str(root)
    return "://" in text and text.split("://", 1)[0].lower() != "file"


def storage_options_from_env(root: str, env: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """deltalake ``storage_options`` for ``root`` from the standard environment variables.

    For ``s3://`` roots: the set ``AWS_*`` variables of ``S3_ENV_OPTIONS`` (``AWS_DEFAULT_REGION`` stands in
    for an unset ``AWS_REGION``), and ``AWS_CONDITIONAL_PUT = etag`` unless set: every commit file is
    created with ``If-None-Match: *``, which is what keeps concurrent writers from overwriting each
    other's commits. Other schemes (``gs://``, ``az://``) and local folders: None, deltalake reads
    its own variables (``GOOGLE_*``, ``AZURE_*``). The values may hold secrets: pass them to deltalake only.
    """
    env = os.environ if env is None else env
    if not is_object_store(root) or str(root).split("://", 1)[0].lower() not in _S3_SCHEMES:
        return None
    options = {key: env[key] for key in S3_ENV_OPTIONS if env.get(key)}
    if "AWS_REGION" not in options and env.get("AWS_DEFAULT_REGION"):
        options["AWS_REGION"] = env["AWS_DEFAULT_REGION"]
    options.setdefault("AWS_CONDITIONAL_PUT", "etag")
    if options["AWS_CONDITIONAL_PUT"].strip().lower() != "etag":
        _warn_once("AWS_CONDITIONAL_PUT=%s: deltalake cannot create commit files atomically without conditional "
                    "puts; writes to %s will fail", options["AWS_CONDITIONAL_PUT"], root)
    if options.get("AWS_S3_ALLOW_UNSAFE_RENAME", "").lower() == "true":
        _warn_once("AWS_S3_ALLOW_UNSAFE_RENAME=true for %s: safe only with a single writer per table", root)
    if options.get("AWS_S3_LOCKING_PROVIDER"):
        _warn_once("AWS_S3_LOCKING_PROVIDER is ignored by deltalake 1.x: concurrent commits to %s rely on "
                    "conditional puts (If-None-Match), which the store must support", root)
    return options


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


def repr_sql(value: str) -> str:
    """A SQL string literal."""
    if not isinstance(value, str):
        raise LakehouseError(f"expected a string key, not {type(value).__name__}")
    return f"'{_sql_quote(value)}'"


# Up to this many distinct key values, upsert() adds them to its merge predicate as literals.
_MERGE_LITERALS = 1000


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


def to_table(name: str, rows: Sequence[Mapping[str, Any]] | pa.Table) -> pa.Table:
    """Build an Arrow table with the exact schema of ``name`` as stored (columns reordered, types cast;
    the column descriptions left out, see ``_schema``)."""
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
    """The schema that table ``name`` is written and read with: the contract's names, types and
    nullability without its descriptions. delta-rs would store the descriptions (Arrow field metadata)
    in the table's schema and then refuse every later write whose descriptions differ ("Cannot merge
    metadata with different values for key description"): editing one in ``schemas.py`` would break
    every existing table. So the Delta tables carry none, those written before descriptions existed
    included, and reads of an empty table and of a written one give the same schema."""
    try:
        schema = SCHEMAS[name]
    except KeyError:
        raise LakehouseError(f"unknown table {name!r}; known tables: {sorted(SCHEMAS)}") from None
    return pa.schema([pa.field(f.name, f.type, f.nullable) for f in schema])


def _partition_by(name: str) -> list[str] | None:
    return ["batch_id"] if name in BATCH_TABLES else None


def _add_actions(dt: DeltaTable, batch_id: str | None = None) -> pa.Table:
    """The current snapshot's data files (path, size, row count, partition values) from the log;
    with ``batch_id``, only that partition's (the table must be partitioned by batch_id)."""
    actions = pa.table(dt.get_add_actions(flatten=True))
    if batch_id is None or actions.num_rows == 0:
        return actions
    return actions.filter(pc.equal(actions["partition.batch_id"], batch_id))


def table_properties(name: str) -> dict[str, str]:
    """The Delta table properties Tentalis sets on table ``name``."""
    return dict(BATCH_TABLE_PROPERTIES if name in BATCH_TABLES else TABLE_PROPERTIES)


def _interval_hours(value: str | None, default: float) -> float:
    """Hours of a Delta interval property such as ``interval 7 days`` (``default`` when unset or unreadable)."""
    m = _INTERVAL.match(value or "")
    if not m or m.group(2).lower() not in _HOURS_PER_UNIT:
        return default
    return int(m.group(1)) * _HOURS_PER_UNIT[m.group(2).lower()]


class Lakehouse:
    """The Delta tables under one root: a local folder, or an object-store URI such as ``s3://bucket/prefix``.

    ``storage_options`` go to deltalake for every table (default for a URI: ``storage_options_from_env``);
    they may hold credentials and are never shown (``repr`` names the root only).
    """

    def __init__(self, root: str | Path, *, storage_options: Mapping[str, str] | None = None, max_commit_retries: int = 8):
        text = str(root)
        if is_object_store(text):
            text = text.rstrip("/")
        elif text.lower().startswith("file://"):
            text = unquote(urlsplit(text).path)
        self.root = text
        self.max_commit_retries = max_commit_retries
        if self.is_object_store:
            options = storage_options_from_env(self.root) if storage_options is None else storage_options
            self._storage_options: dict[str, str] | None = dict(options) if options else None
        else:
            self._storage_options = dict(storage_options) if storage_options else None
            Path(self.root).mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"Lakehouse({self.root!r})"

    @property
    def is_object_store(self) -> bool:
        """Whether the tables live on an object store (no local folder, no file locks)."""
        return is_object_store(self.root)

    def uri(self, name: str) -> str:
        _schema(name)
        return f"{self.root.rstrip('/')}/{name}"

    def _open(self, name: str, version: int | None = None) -> DeltaTable:
        """The table's current snapshot, or ``version`` (Delta time travel); raises ``TableNotFoundError``
        before its first write."""
        return DeltaTable(self.uri(name), version=version, storage_options=self._storage_options)

    # ---------------------------------------------------------------- reading
    def exists(self, name: str) -> bool:
        """Whether table ``name`` has been written."""
        try:
            self._open(name)
            return True
        except TableNotFoundError:
            return False

    def table(self, name: str, version: int | None = None) -> DeltaTable | None:
        """The table's current snapshot (or its snapshot at ``version``), or None before its first write."""
        try:
            return self._open(name, version)
        except TableNotFoundError:
            if version is not None and self.exists(name):
                raise  # the table exists but not that version: not the same as "no table yet"
            return None

    def dataset(self, name: str, *, batch_id: str | None = None, version: int | None = None) -> pds.Dataset:
        """A lazy pyarrow dataset of the table (an empty in-memory one before the first write).

        With ``batch_id`` on a per-batch table the dataset holds only that batch's partition files,
        chosen from the Delta log, so scanning it never opens another batch's file. Nothing is read
        until the dataset is scanned. ``version``: the table as it was at that Delta version (time
        travel; its files must not have been vacuumed).
        """
        if batch_id is not None:
            validate_batch_id(batch_id)
        dt = self.table(name, version)
        if dt is None:
            return pds.dataset(_schema(name).empty_table())
        return self._dataset(name, dt, batch_id)

    def _dataset(self, name: str, dt: DeltaTable, batch_id: str | None = None) -> pds.Dataset:
        partitions = list(dt.metadata().partition_columns)
        prune = batch_id is not None and partitions == ["batch_id"]
        features = set(dt.protocol().reader_features or ())
        if self.is_object_store or features & _UNSUPPORTED_READER_FEATURES:
            return dt.to_pyarrow_dataset(file_pruning_predicate=[("batch_id", "=", batch_id)] if prune else None)
        # deltalake's to_pyarrow_dataset() attaches every file's min/max statistics as a pyarrow
        # expression (about 1 ms per file), so a view over N batches cost O(N) ms before any query
        # ran. The file list alone comes from the log in microseconds; parquet footers still prune
        # row groups when a query filters, and partition expressions still prune whole batches.
        schema = pa.schema(dt.schema().to_arrow())
        actions = _add_actions(dt, batch_id if prune else None)
        if actions.num_rows == 0:
            return pds.dataset(schema.empty_table())
        fs = pafs.SubTreeFileSystem(str(Path(self.uri(name)).resolve()), pafs.LocalFileSystem())
        fmt = pds.ParquetFileFormat(default_fragment_scan_options=pds.ParquetFragmentScanOptions(pre_buffer=True))
        values = {c: actions[f"partition.{c}"].to_pylist() for c in partitions}
        fragments = []
        for i, path in enumerate(actions["path"].to_pylist()):
            expr = pc.scalar(True)
            for c in partitions:
                v = values[c][i]
                expr = expr & (pc.field(c).is_null() if v is None else pc.field(c) == pa.scalar(v, type=schema.field(c).type))
            # Log paths are URL-encoded (RFC 2396); the files on disk carry the decoded names.
            fragments.append(fmt.make_fragment(unquote(path), filesystem=fs, partition_expression=expr))
        return pds.FileSystemDataset(fragments, schema, fmt, fs)

    def read(self, name: str, *, batch_id: str | None = None, columns: list[str] | None = None,
             version: int | None = None) -> pa.Table:
        """Read a table, pruned to one batch's partition when ``batch_id`` is given; at Delta ``version``
        when given (time travel)."""
        ds = self.dataset(name, batch_id=batch_id, version=version)
        if batch_id is not None and "batch_id" not in _schema(name).names:
            raise LakehouseError(f"table {name!r} has no batch_id column")
        # The row filter is exact for unpartitioned tables (quarantine, human_reviews) and free for
        # per-batch ones, whose dataset already holds only the batch's files.
        flt = pc.field("batch_id") == batch_id if batch_id is not None else None
        return ds.to_table(columns=columns, filter=flt)

    def count(self, name: str, *, batch_id: str | None = None) -> int:
        """Rows in a table (or in one batch), from the Delta log's per-file statistics where it can."""
        dt = self.table(name)
        if dt is None:
            _schema(name)
            return 0
        if batch_id is not None and list(dt.metadata().partition_columns) != ["batch_id"]:
            return self.read(name, batch_id=batch_id, columns=["batch_id"]).num_rows
        if batch_id is not None:
            validate_batch_id(batch_id)
        return self._rows(name, dt, _add_actions(dt, batch_id), batch_id)

    def _rows(self, name: str, dt: DeltaTable, actions: pa.Table, batch_id: str | None = None) -> int:
        if actions.num_rows == 0:
            return 0
        nums = actions["num_records"]
        features = set(dt.protocol().reader_features or ())
        if nums.null_count == 0 and "deletionVectors" not in features:
            return int(pc.sum(nums).as_py() or 0)
        # A file written without statistics (or rows hidden by deletion vectors): count by scanning.
        return self._dataset(name, dt, batch_id).count_rows()

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
        predicate = " AND ".join(f"{col} = '{_sql_quote(value)}'" for col, value in keys.items())
        self._replace(name, predicate, table, partition_by=partition_by)
        return table.num_rows

    def replace_in(self, name: str, column: str, values: Sequence[str], rows: Sequence[Mapping[str, Any]] | pa.Table,
                   *, where: Mapping[str, str] | None = None) -> int:
        """Replace the rows whose ``column`` is one of ``values`` with ``rows`` (one atomic commit; every
        row written must carry one of ``values``). Unlike ``upsert`` (a Delta merge, whose files store
        strings as ``string_view``, which pyarrow cannot filter beside plain ``string`` files), this
        writes plain Arrow types, so filtered reads and ``tentalis sql ... where`` keep working.
        ``where`` narrows the replaced rows to those whose columns equal the given values too (every row
        written must carry them): ``{"batch_id": "live"}`` touches one partition only."""
        table = to_table(name, rows)
        wanted = set(values)
        if not wanted:
            return 0
        others = set(table.column(column).to_pylist()) - wanted if table.num_rows else set()
        if others:
            raise LakehouseError(f"rows for {column} in {sorted(wanted)[:5]} carry other values {sorted(map(str, others))[:5]}")
        predicate = f"{column} IN ({', '.join(repr_sql(v) for v in sorted(wanted))})"
        for col, value in (where or {}).items():
            if not isinstance(value, str) or not value:
                raise LakehouseError(f"invalid {col} {value!r}")
            stray = set(table.column(col).to_pylist()) - {value} if table.num_rows else set()
            if stray:
                raise LakehouseError(f"rows for {col}={value!r} carry other {col} values {sorted(map(str, stray))[:5]}")
            predicate = f"{col} = {repr_sql(value)} AND {predicate}"
        self._replace(name, predicate, table, partition_by=_partition_by(name))
        return table.num_rows

    def replace_all(self, name: str, rows: Sequence[Mapping[str, Any]] | pa.Table) -> int:
        """Replace every row of a derived table (a summary recomputed whole) in one atomic commit."""
        table = to_table(name, rows)
        self._replace(name, "true", table, partition_by=_partition_by(name))
        return table.num_rows

    def _replace(self, name: str, predicate: str, table: pa.Table, partition_by: list[str] | None = None) -> None:
        """Replace the rows matching ``predicate`` with ``table`` in one commit (create on first write).

        With a predicate on the partition column only, Delta selects the files to drop from the log
        and removes them whole: the cost is that partition's files, not the table's.
        """

        def write() -> None:
            # One log load per attempt, handed to the writer (a URI would make it load the log again).
            dt = self.table(name)
            if dt is None:
                if table.num_rows:
                    write_deltalake(self.uri(name), table, storage_options=self._storage_options, mode="append", partition_by=partition_by,
                                    configuration=table_properties(name))
                return
            if table.num_rows == 0 and not dt.file_uris(file_pruning_predicate=predicate):
                # Nothing to write and no file can hold a matching row (quarantine() clears a batch's
                # rejects on every run): skip the empty commit instead of growing the log.
                return
            write_deltalake(dt, table, mode="overwrite", predicate=predicate, schema_mode="merge", partition_by=partition_by)

        self._commit(write)

    def append(self, name: str, rows: Sequence[Mapping[str, Any]] | pa.Table) -> int:
        table = to_table(name, rows)
        if table.num_rows == 0 and self.exists(name):
            return 0
        # A per-batch table created by an append must be partitioned like one created by write_batch.
        # configuration only applies when this append creates the table.
        self._commit(lambda: write_deltalake(self.uri(name), table, storage_options=self._storage_options, mode="append", schema_mode="merge",
                                             partition_by=_partition_by(name), configuration=table_properties(name)))
        return table.num_rows

    def upsert(
        self, name: str, key: str | Sequence[str], rows: Sequence[Mapping[str, Any]] | pa.Table, compare: Sequence[str],
    ) -> int:
        """Merge rows by ``key`` (a column, or several that together identify a row): insert new keys,
        update a matched row only when a ``compare`` column differs (so importing the same rows again
        changes nothing).

        A per-batch table created by an upsert is partitioned by ``batch_id`` like one created by
        ``write_batch``; put ``batch_id`` in ``key`` there so the merge touches only the partitions
        that the rows name (and an id that recurs in another batch is not matched).
        """
        table = to_table(name, rows)
        if table.num_rows == 0:
            return 0
        keys = [key] if isinstance(key, str) else list(key)
        if not keys:
            raise LakehouseError("upsert needs at least one key column")
        if not self.exists(name):
            # Partitioned like a table created by write_batch (reviews: live reviews share the table).
            self._commit(lambda: write_deltalake(self.uri(name), table, storage_options=self._storage_options, mode="append",
                                                 partition_by=_partition_by(name), configuration=table_properties(name)))
            return table.num_rows
        on = " AND ".join(f"t.{k} = s.{k}" for k in keys)
        # The keys' values as literals too: delta-rs then prunes target files by partition and by file
        # statistics before joining (about half the time of a small merge into a table of many files).
        for k in keys:
            values = pc.unique(table.column(k)).to_pylist()
            if pa.types.is_string(table.schema.field(k).type) and None not in values and len(values) <= _MERGE_LITERALS:
                on += f" AND t.{k} IN ({', '.join(repr_sql(v) for v in values)})"
        changed = " OR ".join(f"(t.{c} IS DISTINCT FROM s.{c})" for c in compare)
        self._commit(
            lambda: self._open(name)
            .merge(table, predicate=on, source_alias="s", target_alias="t")
            .when_matched_update_all(predicate=changed)
            .when_not_matched_insert_all()
            .execute()
        )
        return table.num_rows

    def delete(self, name: str, predicate: str) -> int:
        """Delete the rows matching the SQL ``predicate`` (one Delta commit, retried on conflicts);
        returns how many. The rows stay in older versions' files until ``vacuum`` removes those."""
        if self.table(name) is None:
            return 0
        metrics = self._commit(lambda: self._open(name).delete(predicate))
        return int((metrics or {}).get("num_deleted_rows", 0) or 0)

    def update(self, name: str, predicate: str, updates: Mapping[str, str]) -> None:
        """SQL-expression update (e.g. flip ``promoted``), retried on commit conflicts."""
        dt = self.table(name)
        if dt is None:
            raise LakehouseError(f"table {name!r} does not exist yet")
        self._commit(lambda: self._open(name).update(updates=dict(updates), predicate=predicate))

    def quarantine(self, rows: Iterable[Mapping[str, Any]], *, batch_id: str | None = None, stage: str | None = None) -> int:
        """Keep rejected inputs (never dropped silently).

        With ``batch_id`` and ``stage`` the rows replace that stage's earlier rejects for the batch, so
        re-running a batch does not quarantine the same lines twice.
        """
        rows = [{"seen_at": now_utc(), **r} for r in rows]
        if batch_id is None or stage is None:
            return self.append("quarantine", rows) if rows else 0
        return self.replace_where("quarantine", {"batch_id": batch_id, "stage": stage}, rows)

    def _commit(self, write: Callable[[], Any]) -> Any:
        delay = 0.05
        for attempt in range(self.max_commit_retries + 1):
            try:
                return write()
            except CommitFailedError:
                if attempt == self.max_commit_retries:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    # ---------------------------------------------------------------- maintenance
    def stats(self, name: str) -> dict[str, Any]:
        """Version, files, rows and bytes of the table's current snapshot, from the Delta log alone."""
        dt = self.table(name)
        if dt is None:
            return {"table": name, "exists": False, "version": None, "files": 0, "rows": 0, "bytes": 0}
        actions = _add_actions(dt)
        size = int(pc.sum(actions["size_bytes"]).as_py() or 0) if actions.num_rows else 0
        return {"table": name, "exists": True, "version": dt.version(), "files": actions.num_rows,
                "rows": self._rows(name, dt, actions), "bytes": size}

    def ensure_table_properties(self, name: str) -> bool:
        """Give a table created before ``table_properties()`` existed those properties (one metadata
        commit, only when something differs; files written later, compaction's included, follow them).
        Returns whether it committed."""
        dt = self.table(name)
        if dt is None:
            return False
        wanted, config = table_properties(name), dt.metadata().configuration
        if all(config.get(k) == v for k, v in wanted.items()):
            return False
        self._commit(lambda: self._open(name).alter.set_table_properties(wanted))
        return True

    def optimize(self, name: str, *, zorder_by: Sequence[str] | None = None, target_size: int | None = None) -> dict[str, Any]:
        """Compact small files into ~``target_size`` files (Delta's default 100 MB), per partition.

        With ``zorder_by`` the files are also rewritten in Z-order of those columns. Rows and their
        values do not change; the replaced files stay on disk (time travel keeps working) until
        ``vacuum`` deletes them after the retention period. Returns Delta's optimize metrics
        (``numFilesAdded``, ``numFilesRemoved``, ...), or ``{}`` when the table does not exist.
        """
        for col in zorder_by or ():
            if col not in _schema(name).names:
                raise LakehouseError(f"table {name!r} has no column {col!r} to z-order by")
        if self.table(name) is None:
            return {}

        def run() -> dict[str, Any]:
            # A fresh snapshot per attempt: compaction conflicts with a concurrent overwrite of the
            # same files and must be planned again.
            opt = self._open(name).optimize
            if zorder_by:
                return dict(opt.z_order(list(zorder_by), target_size=target_size, post_commithook_properties=_KEEP_LOG))
            return dict(opt.compact(target_size=target_size, post_commithook_properties=_KEEP_LOG))

        return self._commit(run)

    def min_retention_hours(self, name: str) -> float:
        """Delta's safe minimum for vacuum: the table's ``delta.deletedFileRetentionDuration`` (default one week)."""
        dt = self.table(name)
        config = dt.metadata().configuration if dt is not None else {}
        return _interval_hours(config.get("delta.deletedFileRetentionDuration"), 168.0)

    def vacuum(
        self, name: str, retention_hours: int | None = None, *, allow_unsafe_retention: bool = False, dry_run: bool = False,
        full: bool = True,
    ) -> list[str]:
        """Delete files that no version within ``retention_hours`` needs (default: the setting
        ``$TENTALIS_VACUUM_RETENTION_HOURS``, 168 h), and orphans that no commit references.

        A retention below the table's ``delta.deletedFileRetentionDuration`` could delete files that
        a running reader or writer still uses, so it is refused unless ``allow_unsafe_retention``.
        Time travel to versions older than the retention is lost. Returns the files (to be) deleted.
        ``full=False`` deletes only files that a commit removed (never an uncommitted file, which a
        concurrent writer may be about to commit: what a retention of 0 needs).
        """
        hours = self._retention(name, retention_hours, allow_unsafe_retention)
        if self.table(name) is None:
            return []
        # full: also delete files that no commit references (left by writers that lost a commit race);
        # they are older than the retention too, so an in-flight write's files are safe.
        return self._commit(lambda: self._open(name).vacuum(
            retention_hours=hours, dry_run=dry_run, enforce_retention_duration=not allow_unsafe_retention, full=full,
            post_commithook_properties=_KEEP_LOG))

    def _retention(self, name: str, retention_hours: int | None, allow_unsafe_retention: bool) -> int:
        """The retention to vacuum with; refused below Delta's safe minimum unless explicitly allowed."""
        hours = vacuum_retention_hours() if retention_hours is None else retention_hours
        if hours < 0:
            raise LakehouseError(f"retention_hours must not be negative, not {hours}")
        minimum = self.min_retention_hours(name)
        if hours < minimum and not allow_unsafe_retention:
            raise LakehouseError(
                f"vacuum retention {hours} h for table {name!r} is below Delta's safe minimum of {minimum:g} h "
                "(delta.deletedFileRetentionDuration): files that running readers or writers still need could be "
                "deleted. Use a longer retention, or pass allow_unsafe_retention (--allow-unsafe-retention) if "
                "nothing else uses the table"
            )
        return hours

    def purge_log_history(self, name: str) -> int:
        """Drop the Delta log before the current version: checkpoint the current version, delete every
        older commit file and checkpoint, and keep nothing else. Returns the log files deleted.

        The log's per-file statistics hold min/max values of the indexed columns (for unpartitioned
        tables: every column, e.g. a 64-character prefix of a critique), so after a retraction's delete
        and vacuum the old commits still carry the retracted text. Time travel of this table to any
        earlier version is lost. Local lakehouses only."""
        dt = self.table(name)
        if dt is None:
            return 0
        if self.is_object_store:
            raise LakehouseError(f"purge_log_history({name!r}) needs a local lakehouse")
        log_dir = Path(self.uri(name)) / "_delta_log"
        before = {p.name for p in log_dir.iterdir()}
        key = "delta.logRetentionDuration"
        previous = dt.metadata().configuration.get(key)
        # cleanup_metadata() deletes what is older than the retention and precedes a checkpoint; the
        # retention goes to 0 only for this call and is then set back (its own commit, after the checkpoint).
        self._commit(lambda: self._open(name).alter.set_table_properties({key: "interval 0 seconds"}))
        dt = self._open(name)
        dt.create_checkpoint()
        dt.cleanup_metadata()
        self._commit(lambda: self._open(name).alter.set_table_properties({key: previous or "interval 30 days"}))
        return len(before - {p.name for p in log_dir.iterdir()})

    def create_checkpoint(self, name: str) -> int | None:
        """Write a Delta checkpoint of the current version, so loading the table replays one parquet
        file instead of every JSON commit since the last checkpoint. Returns the version (None: no table)."""
        dt = self.table(name)
        if dt is None:
            return None
        dt.create_checkpoint()
        return dt.version()

    def maintain(
        self, name: str, *, compact: bool = True, zorder: bool = False, vacuum: bool = True, checkpoint: bool = True,
        retention_hours: int | None = None, allow_unsafe_retention: bool = False,
    ) -> dict[str, Any]:
        """Compact (and with ``zorder`` Z-order, for tables in ``ZORDER_COLUMNS``), vacuum, then checkpoint one table.

        Returns files, rows and bytes before and after, and what each step did. Row counts are
        checked to be unchanged; only vacuum can cost time travel (to versions older than the retention).
        """
        t0 = time.perf_counter()
        before = self.stats(name)
        report: dict[str, Any] = {
            "table": name, "exists": before["exists"], "version_before": before["version"], "files_before": before["files"],
            "rows_before": before["rows"], "bytes_before": before["bytes"], "files_compacted": 0, "files_written": 0,
            "zorder_by": None, "vacuumed_files": 0, "checkpoint_version": None, "properties_set": False,
        }
        if before["exists"]:
            if vacuum:
                self._retention(name, retention_hours, allow_unsafe_retention)  # refuse before rewriting anything
            report["properties_set"] = self.ensure_table_properties(name)
            if compact:
                zorder_by = ZORDER_COLUMNS.get(name) if zorder else None
                metrics = self.optimize(name, zorder_by=zorder_by)
                report.update(files_compacted=int(metrics.get("numFilesRemoved", 0)),
                              files_written=int(metrics.get("numFilesAdded", 0)),
                              zorder_by=list(zorder_by) if zorder_by else None)
                rows = self.stats(name)["rows"]
                if rows != before["rows"]:
                    raise LakehouseError(f"compaction of {name!r} changed its row count from {before['rows']} to {rows}")
            if vacuum:
                report["vacuumed_files"] = len(self.vacuum(name, retention_hours, allow_unsafe_retention=allow_unsafe_retention))
            if checkpoint:
                report["checkpoint_version"] = self.create_checkpoint(name)
        after = self.stats(name)
        report.update(version_after=after["version"], files_after=after["files"], rows_after=after["rows"],
                      bytes_after=after["bytes"], seconds=round(time.perf_counter() - t0, 3))
        return report

    def maintain_all(self, tables: Sequence[str] | None = None, **options: Any) -> list[dict[str, Any]]:
        """``maintain()`` every table that exists (or the given ones); ``options`` as for ``maintain``."""
        names = list(tables) if tables else list(SCHEMAS)
        for name in names:
            _schema(name)
        return [self.maintain(name, **options) for name in names if self.exists(name)]

    # ---------------------------------------------------------------- SQL
    def duckdb(self, tables: Iterable[str] | None = None, versions: Mapping[str, int | None] | None = None) -> duckdb.DuckDBPyConnection:
        """An in-memory DuckDB connection with every table (or the given ones) registered as a view.

        Tables are registered as lazy pyarrow datasets (not DuckDB's ``delta_scan``, which downloads an
        extension at run time): registering lists the files from the Delta log and reads nothing, and
        filters on ``batch_id`` prune partitions when the query runs.

        The connection is read-only over the lakehouse: once the views are registered, DuckDB's external
        access is switched off and the configuration locked, so a query cannot read or write files
        (``read_text('/etc/shadow')``, ``COPY ... TO`` into a table's ``_delta_log``), ``ATTACH`` a
        database, ``INSTALL``/``LOAD`` an extension or ``SET`` its way back.

        ``versions`` pins tables to a Delta version (``{"trajectories": 12}``): the view shows the table
        as it was then (what training read, for a lineage replay).
        """
        versions = versions or {}
        con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
        for name in SCHEMAS if tables is None else tables:
            con.register(name, self.dataset(name, version=versions.get(name)))
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        return con

    def sql(self, query: str) -> pa.Table:
        """Run one DuckDB query over the tables it names (only those are registered)."""
        named = [n for n in SCHEMAS if re.search(rf"\b{n}\b", query, re.IGNORECASE)]
        con = self.duckdb(named)
        try:
            return con.execute(query).to_arrow_table()
        finally:
            con.close()


def human_bytes(n: int | None) -> str:
    """1536 -> '1.5 KiB' (for maintenance reports)."""
    value = float(n or 0)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def dumps(obj: Any) -> str:
    """Stable JSON for config/metadata columns."""
    return json.dumps(obj, sort_keys=True, default=str)
