"""Lakehouse maintenance: compaction, vacuum and checkpoints of every Delta table, weekly.

Small files pile up (one per batch and table, more for appended tables and re-runs), every replaced
file stays on disk until vacuum, and each read replays the log since the last checkpoint. The job
undoes all three without changing a row; only vacuum costs time travel, to versions older than the
retention (default one week, never less than Delta's safe minimum unless explicitly allowed).
"""


from dagster import (
    Config,
    DefaultScheduleStatus,
    Failure,
    MetadataValue,
    OpExecutionContext,
    Output,
    RunRequest,
    ScheduleEvaluationContext,
    job,
    op,
    schedule,
)

from assets.resources import LakehouseResource
from tentalis_pipelines.lakehouse import LakehouseError, human_bytes
from tentalis_pipelines.schemas import SCHEMAS


class MaintenanceConfig(Config):
    """What to maintain and how. ``vacuum_retention_hours`` defaults to ``$TENTALIS_VACUUM_RETENTION_HOURS``
    (168 h); a retention below a table's ``delta.deletedFileRetentionDuration`` needs ``allow_unsafe_retention``."""

    tables: list[str] = []  # empty: every table that exists
    compact: bool = True
    zorder: bool = False  # Z-order the unpartitioned tables in lakehouse.ZORDER_COLUMNS (rewrites them whole)
    vacuum: bool = True
    vacuum_retention_hours: int | None = None
    allow_unsafe_retention: bool = False
    checkpoint: bool = True


def maintenance_markdown(reports: list[dict]) -> str:
    """One row per table: files, rows and bytes before → after, and what vacuum and checkpoint did."""
    lines = ["| table | files | rows | bytes | compacted → written | vacuumed files | checkpoint | seconds |",
             "|---|---|---|---|---|---|---|---|"]
    for r in reports:
        lines.append(
            f"| {r['table']} | {r['files_before']} → {r['files_after']} | {r['rows_before']} → {r['rows_after']} "
            f"| {human_bytes(r['bytes_before'])} → {human_bytes(r['bytes_after'])} "
            f"| {r['files_compacted']} → {r['files_written']}{' (z-order)' if r['zorder_by'] else ''} | {r['vacuumed_files']} "
            f"| {'v' + str(r['checkpoint_version']) if r['checkpoint_version'] is not None else '-'} | {r['seconds']:.2f} |"
        )
    return "\n".join(lines)


def maintenance_metadata(reports: list[dict]) -> dict:
    """Dagster metadata: totals, a markdown table, and each table's full report (JSON, keyed by table name)."""
    meta = {
        "tables": MetadataValue.int(len(reports)),
        "files_before": MetadataValue.int(sum(r["files_before"] for r in reports)),
        "files_after": MetadataValue.int(sum(r["files_after"] for r in reports)),
        "bytes_before": MetadataValue.int(sum(r["bytes_before"] for r in reports)),
        "bytes_after": MetadataValue.int(sum(r["bytes_after"] for r in reports)),
        "vacuumed_files": MetadataValue.int(sum(r["vacuumed_files"] for r in reports)),
        "summary": MetadataValue.md(maintenance_markdown(reports) if reports else "_no tables yet_"),
    }
    for r in reports:
        meta[r["table"]] = MetadataValue.json(r)
    return meta


@op(description="Compact, vacuum and checkpoint every Delta table (row counts unchanged).")
def maintain_lakehouse(context: OpExecutionContext, config: MaintenanceConfig, lakehouse: LakehouseResource) -> Output:
    unknown = sorted(set(config.tables) - set(SCHEMAS))
    if unknown:
        raise Failure(description=f"unknown tables {unknown}; known tables: {sorted(SCHEMAS)}")
    lake = lakehouse.lakehouse()
    reports = []
    for name in config.tables or list(SCHEMAS):
        if not lake.exists(name):
            continue
        try:
            report = lake.maintain(
                name, compact=config.compact, zorder=config.zorder, vacuum=config.vacuum, checkpoint=config.checkpoint,
                retention_hours=config.vacuum_retention_hours, allow_unsafe_retention=config.allow_unsafe_retention,
            )
        except LakehouseError as exc:
            # A refused retention or a changed row count: stop before touching more tables.
            raise Failure(description=str(exc)) from exc
        context.log.info(
            f"{name}: files {report['files_before']} -> {report['files_after']}, rows {report['rows_after']}, "
            f"bytes {report['bytes_before']} -> {report['bytes_after']}, vacuumed {report['vacuumed_files']} file(s)"
        )
        reports.append(report)
    return Output(reports, metadata=maintenance_metadata(reports))


@job(description="Lakehouse maintenance: compact small files, vacuum unreferenced ones past the retention, checkpoint the logs.")
def maintain_lakehouse_job():
    maintain_lakehouse()


@schedule(job=maintain_lakehouse_job, cron_schedule="0 3 * * 0", execution_timezone="UTC",
          default_status=DefaultScheduleStatus.RUNNING)
def weekly_lakehouse_maintenance(context: ScheduleEvaluationContext):
    """Sundays at 03:00 UTC (after the nightly cycle's 02:00 start): maintain every table."""
    return RunRequest(run_key=f"maintenance-{context.scheduled_execution_time:%Y-%m-%d}", tags={"tentalis/trigger": "weekly"})
