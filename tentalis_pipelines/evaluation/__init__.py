"""Benchmarks (answer checking, sandboxed code execution) and PRM evaluation."""
