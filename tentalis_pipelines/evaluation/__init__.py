"""Benchmarks (answer checking; code is run in :mod:`tentalis_pipelines.sandbox`) and PRM evaluation."""
