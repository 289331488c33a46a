"""Standard Dagster table metadata for the Delta tables: column schema, table name and URI."""

from __future__ import annotations

import pyarrow as pa
from dagster import MetadataValue, TableColumn, TableSchema

from tentalis_pipelines.schemas import SCHEMAS, column_descriptions
from tentalis_pipelines.settings import Paths


def column_schema(table: str) -> TableSchema:
    """The table's columns as Dagster shows them (name, Arrow type, nullability, description)."""
    schema: pa.Schema = SCHEMAS[table]
    descriptions = column_descriptions(table)
    return TableSchema(columns=[
        TableColumn(name=f.name, type=str(f.type), description=descriptions[f.name] or None,
                    constraints=None if f.nullable else _not_null())
        for f in schema
    ])


def _not_null():
    from dagster import TableColumnConstraints

    return TableColumnConstraints(nullable=False)


def table_definition_metadata(table: str) -> dict:
    """Definition-time metadata: visible on the asset page before anything is materialised. The asset
    page's "Storage" shows `dagster/uri` only from here (as text or a URL; a path value renders empty),
    so the Delta URI comes from $TENTALIS_LAKEHOUSE_URI or $TENTALIS_HOME as the code location sees them
    when it loads (a local folder or an object-store URI such as s3://bucket/prefix)."""
    root = str(Paths.from_env().lakehouse).rstrip("/")
    return {"dagster/column_schema": column_schema(table), "dagster/table_name": f"lakehouse.{table}",
            "dagster/uri": MetadataValue.text(f"{root}/{table}")}


def table_uri_metadata(lake, table: str) -> dict:
    """Materialisation-time metadata: where the Delta table lives."""
    return {"dagster/uri": MetadataValue.path(lake.uri(table))}
