"""The stages of the learning loop, one module per stage, as plain functions over the lakehouse.

Each reads its input tables, calls the library and replaces its own output for one batch; the Dagster
assets (``assets/``) import the stage they run, so the logic is tested without Dagster and runs the same
way from the UI, the CLI and CI. The promotion gate lives in ``promotion.py``; live sessions in ``sessions.py``.
"""
