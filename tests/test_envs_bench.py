"""The environment overhead benchmark runs and reports what it says (the figure itself is not asserted)."""

from __future__ import annotations

import os
import sys

import pytest

from bench.env_bench import bench, percentile

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                reason="the sandbox needs Linux namespaces and root (CI runs as root)")


def test_percentile():
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([0.0, 10.0], 0.95) == pytest.approx(9.5)


def test_bench_runs_full_episodes_and_names_the_host():
    r = bench(3)
    assert r["episodes"] == 3 and r["turns_per_episode"] == 8
    assert 0 < r["episode_p50_s"] <= r["episode_p95_s"] <= r["episode_max_s"]
    assert r["host_cpu"]["model"] is not None and "flags" in r["host_cpu"]


def test_bench_runs_swe_episodes():
    r = bench(2, env_name="swe")
    assert r["what"].startswith("swe episode overhead") and r["episodes"] == 2
    assert 0 < r["episode_p50_s"] <= r["episode_max_s"]
