"""Dagster assets: thin wrappers that read tables, call ``tentalis_pipelines.pipeline`` and write tables."""
