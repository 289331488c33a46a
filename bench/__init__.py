"""Benchmarks of Tentalis' own machinery (no model involved): plain functions that return dicts."""
