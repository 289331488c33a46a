"""`bench/gateway_bench.py` on the tiny random model: a real `tentalis serve` next to the direct backend."""

from __future__ import annotations

from bench.gateway_bench import gateway_benchmark, percentile
from tentalis_pipelines.lakehouse import Lakehouse


def test_percentile_nearest_rank():
    xs = [float(i) for i in range(1, 101)]
    assert percentile(xs, 50) == 50.0 and percentile(xs, 99) == 99.0 and percentile(xs, 100) == 100.0
    assert percentile([3.0], 99) == 3.0 and percentile([2.0, 1.0], 50) == 1.0


def test_gateway_bench_invariants(tmp_path, tiny_model_dir):
    home = tmp_path / "gw-home"
    r = gateway_benchmark(tiny_model_dir, requests=4, sessions=3, turns_per_session=2, max_tokens=4, warmup=1,
                          device="cpu", dtype="float32", flush_interval=0.2, home=home)
    lat, thr = r["latency"], r["throughput"]
    for side in ("direct", "gateway"):
        assert lat[side]["n"] == 4
        assert 0 < lat[side]["p50_ms"] <= lat[side]["p99_ms"]
    assert lat["added_p50_ms"] == round(lat["gateway"]["p50_ms"] - lat["direct"]["p50_ms"], 1)
    assert lat["added_p99_ms"] == round(lat["gateway"]["p99_ms"] - lat["direct"]["p99_ms"], 1)
    assert isinstance(lat["added_paired_median_ms"], float)
    # every request sent was acknowledged and landed, exactly once
    assert thr["error_count"] == 0
    assert thr["turns_sent"] == thr["turns_acknowledged"] == thr["turns_landed"] == 3 * 2
    assert thr["sequential_turns_landed"] == 1 + 4
    assert thr["turns_table_rows"] == 1 + 4 + 6
    assert thr["landed_seconds"] >= thr["acknowledged_seconds"] > 0
    assert abs(thr["landed_turns_per_s"] - 6 / thr["landed_seconds"]) <= 0.02 * thr["landed_turns_per_s"] + 0.01
    # the rows are really in Delta: one per call, grouped by the session header
    turns = Lakehouse(home / "lakehouse").read("turns", columns=["session_id", "turn_index"]).to_pylist()
    assert len(turns) == 11 and len({(t["session_id"], t["turn_index"]) for t in turns}) == 11
    conc = sorted((t["session_id"], t["turn_index"]) for t in turns if t["session_id"].startswith("bench-conc-"))
    assert [s for s, _ in conc] == sorted(f"bench-conc-{k}" for k in range(3) for _ in range(2))
    assert thr["sessions_table_rows"] == 1 + 4 + 3
    assert thr["batching"]["max_rows"] == 64 and thr["batching"]["peak_rows"] >= 1
    # the one-at-a-time gateway beside it: the same calls, its own lakehouse, one row per step at most
    serial, b = r["throughput_one_at_a_time"], r["batching"]
    assert lat["gateway_one_at_a_time"]["n"] == 4
    assert serial["batching"] == {**serial["batching"], "max_rows": 1, "peak_rows": 1}
    assert serial["error_count"] == 0 and serial["turns_sent"] == serial["turns_acknowledged"] == serial["turns_landed"] == 6
    assert Lakehouse(home / "serial" / "lakehouse").count("turns") == 1 + 4 + 6
    assert b["turns_per_s_ratio"] == round(thr["landed_turns_per_s"] / serial["landed_turns_per_s"], 2)
    assert b["single_call_p50_ratio"] == round(lat["gateway"]["p50_ms"] / lat["gateway_one_at_a_time"]["p50_ms"], 3)
