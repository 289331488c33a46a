"""Benchmarks, the paired promotion gate, and re-runs that replace rather than append."""

import json
import os
from datetime import datetime, timezone
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tentalis_pipelines import promotion
from tentalis_pipelines.cli import app
from tentalis_pipelines.evaluation.benchmarks import (
    BenchmarkDataMissing,
    gate_decision,
    load_benchmark,
)
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.training import checkpoints as ckpt
from tentalis_pipelines.training.serving import serving_checkpoint

NOW = datetime.now(timezone.utc)


def test_gate_promotes_when_not_worse_and_rejects_when_worse():
    incumbent = {f"i{k}": k % 2 == 0 for k in range(60)}  # 50%
    same = gate_decision(dict(incumbent), incumbent)
    assert same.promote and same.diff == 0.0
    better = gate_decision({k: True for k in incumbent}, incumbent)
    assert better.promote and better.diff_ci_low > 0
    worse = gate_decision({k: False for k in incumbent}, incumbent)
    assert not worse.promote and worse.diff_ci_high < 0 and "rejected" in worse.reason
    assert not gate_decision({"x": True}, {"y": True}).promote  # nothing paired


def _items(checkpoint_id: str, correct: list[bool]) -> list[dict]:
    return [{"checkpoint_id": checkpoint_id, "benchmark": "arithmetic", "item_id": f"i{k}", "prompt": "p", "completion": "c",
             "extracted_answer": "1", "reference": "1", "correct": c, "lenient_correct": c, "formatted": True, "created_at": NOW}
            for k, c in enumerate(correct)]


@pytest.mark.parametrize("candidate_correct,expect_promoted", [(40, True), (5, False)])
def test_decide_promotion_with_scripted_results(tmp_path, tiny_model_dir, candidate_correct, expect_promoted):
    from tentalis_pipelines.training.trainer import GRPOConfig, build_policy

    lake = Lakehouse(tmp_path / "lh")
    path = ckpt.save_adapter(build_policy(tiny_model_dir, None, GRPOConfig()), tmp_path / "ck", "ckpt-new")
    ckpt.record_checkpoint(lake, {"checkpoint_id": "ckpt-new", "parent_id": None, "base_model": "tiny", "adapter_uri": str(path),
                                  "algorithm": "grpo", "config": {}, "trained_on": [], "trajectory_ids": [], "trajectory_count": 0,
                                  "metrics": {}, "promoted": False})
    lake.replace_where("benchmark_items", {"checkpoint_id": "base", "benchmark": "arithmetic"}, _items("base", [k < 30 for k in range(60)]))
    lake.replace_where("benchmark_items", {"checkpoint_id": "ckpt-new", "benchmark": "arithmetic"},
                       _items("ckpt-new", [k < candidate_correct for k in range(60)]))
    incumbent, decision = promotion.decide_promotion(lake, "ckpt-new", "arithmetic")
    assert incumbent == "base"
    assert decision.promote is expect_promoted
    promoted = {r["checkpoint_id"]: r["promoted"] for r in lake.read("checkpoints").to_pylist()}
    assert promoted["ckpt-new"] is expect_promoted


def test_loaders_for_user_files_and_missing_data(tmp_path, monkeypatch):
    gsm = tmp_path / "mine.jsonl"
    gsm.write_text(json.dumps({"question": "1+1?", "answer": "1+1=2\n#### 2"}) + "\n")
    name, items = load_benchmark(str(gsm))
    assert name == "file:mine" and items[0].reference == "2"
    monkeypatch.delenv("TENTALIS_DATA_DIR", raising=False)
    with pytest.raises(BenchmarkDataMissing, match="TENTALIS_DATA_DIR"):
        load_benchmark("gsm8k")
    monkeypatch.setenv("TENTALIS_DATA_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(BenchmarkDataMissing, match="missing"):
        load_benchmark("math500")


@pytest.mark.skipif(not os.environ.get("TENTALIS_DATA_DIR") or not Path(os.environ["TENTALIS_DATA_DIR"], "gsm8k").exists(),
                    reason="TENTALIS_DATA_DIR with the shared GSM8K/MATH-500 copies is not set")
def test_shared_benchmarks_load_a_fixed_subset():
    a = load_benchmark("gsm8k", limit=100)[1]
    assert len(a) == 100 and [x.item_id for x in a] == [x.item_id for x in load_benchmark("gsm8k", limit=100)[1]]
    m = load_benchmark("math500", limit=100)[1]
    assert len(m) == 100 and all(x.reference for x in m)


runner = CliRunner()


def test_cli_benchmark_on_user_files_and_rerun_replaces_rows(home, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("TENTALIS_MODEL", str(tiny_model_dir))
    gsm = tmp_path / "gsm.jsonl"
    gsm.write_text("\n".join(json.dumps({"question": f"What is {k}+1?", "answer": f"{k}+1={k + 1}\n#### {k + 1}"}) for k in range(3)) + "\n")
    generic = tmp_path / "generic.jsonl"
    generic.write_text("\n".join(json.dumps({"prompt": f"What is {k}*2?", "reference": str(2 * k)}) for k in range(2)) + "\n")
    for path, n in ((gsm, 3), (generic, 2)):
        out = runner.invoke(app, ["benchmark", "--checkpoint", "base", "--tasks", str(path), "--format", "json", "--max-new-tokens", "12"])
        assert out.exit_code == 0, out.output
        res = json.loads(out.stdout.strip().splitlines()[-1])
        assert res["n"] == n and res["benchmark"] == f"file:{path.stem}" and 0.0 <= res["accuracy"] <= 1.0
        assert res["ci_low"] <= res["accuracy"] <= res["ci_high"]
    lake = Lakehouse(Paths.from_env().lakehouse)
    before = (lake.count("benchmark_results"), lake.count("benchmark_items"))
    assert before == (2, 5)
    assert runner.invoke(app, ["benchmark", "--checkpoint", "base", "--tasks", str(gsm), "--format", "json", "--max-new-tokens", "12"]).exit_code == 0
    assert (lake.count("benchmark_results"), lake.count("benchmark_items")) == before
    bad = runner.invoke(app, ["benchmark", "--checkpoint", "nope", "--tasks", str(gsm)])
    assert bad.exit_code == 2 and "unknown checkpoint" in bad.output


def test_benchmarks_measure_then_the_serving_asset_gates_through_its_check(home, tiny_model_dir):
    from dagster import AssetKey, DagsterInstance, SkipReason, build_sensor_context, materialize

    from assets.benchmark_assets import benchmark_results
    from assets.resources import BenchmarkResource, LakehouseResource, PolicyResource
    from assets.serving_assets import serving
    from jobs.sensors import new_checkpoints
    from tentalis_pipelines.training.trainer import GRPOConfig, build_policy

    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    path = ckpt.save_adapter(build_policy(tiny_model_dir, None, GRPOConfig()), paths.checkpoints, "ckpt-a")
    ckpt.record_checkpoint(lake, {"checkpoint_id": "ckpt-a", "parent_id": None, "base_model": "tiny", "adapter_uri": str(path),
                                  "algorithm": "grpo", "config": {}, "trajectory_ids": [], "trained_on": [], "trajectory_count": 0,
                                  "metrics": {}, "promoted": False})
    resources = {"lakehouse": LakehouseResource(home=str(home)), "benchmark": BenchmarkResource(limit=4, max_new_tokens=8),
                 "policy": PolicyResource(model=str(tiny_model_dir), max_new_tokens=8)}
    with DagsterInstance.ephemeral() as instance:
        result = new_checkpoints(build_sensor_context(instance=instance, resources=resources))
        assert sorted(r.run_key for r in result.run_requests) == ["base|arithmetic", "ckpt-a|arithmetic"]
        instance.add_dynamic_partitions("checkpoint_ids", ["base", "ckpt-a"])
        for part in ("arithmetic|ckpt-a", "arithmetic|base"):
            res = materialize([benchmark_results], partition_key=part, instance=instance, resources=resources)
            assert res.success and not res.get_asset_check_evaluations()  # benchmarks measure; they decide nothing
        assert serving_checkpoint(lake) == "base" and lake.count("benchmark_results") == 2
        assert isinstance(new_checkpoints(build_sensor_context(instance=instance, resources=resources)), SkipReason)
        gate = materialize([serving], instance=instance, resources=resources)
        (check,) = gate.get_asset_check_evaluations()
        assert (check.asset_key, check.check_name) == (AssetKey("serving"), "promotion_gate")
        # The tiny random model is equally wrong with and without its (zero-initialised) adapter: not worse -> promoted.
        assert check.passed and check.metadata["candidate"].value == "ckpt-a" and check.metadata["incumbent"].value == "base"
        assert serving_checkpoint(lake) == "ckpt-a" and [d["promote"] for d in promotion.decisions(lake)] == [True]


def test_a_rejection_is_a_failed_check_not_a_failed_run(home, tiny_model_dir):
    from dagster import DagsterInstance, materialize

    from assets.resources import BenchmarkResource, LakehouseResource
    from assets.serving_assets import serving
    from tentalis_pipelines.training.trainer import GRPOConfig, build_policy

    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    path = ckpt.save_adapter(build_policy(tiny_model_dir, None, GRPOConfig()), paths.checkpoints, "ckpt-bad")
    ckpt.record_checkpoint(lake, {"checkpoint_id": "ckpt-bad", "parent_id": None, "base_model": "tiny", "adapter_uri": str(path),
                                  "algorithm": "grpo", "config": {}, "trajectory_ids": [], "trained_on": [], "trajectory_count": 0,
                                  "metrics": {}, "promoted": False})
    lake.replace_where("benchmark_items", {"checkpoint_id": "base", "benchmark": "arithmetic"}, _items("base", [k < 30 for k in range(60)]))
    lake.replace_where("benchmark_items", {"checkpoint_id": "ckpt-bad", "benchmark": "arithmetic"}, _items("ckpt-bad", [k < 5 for k in range(60)]))
    resources = {"lakehouse": LakehouseResource(home=str(home)), "benchmark": BenchmarkResource()}
    with DagsterInstance.ephemeral() as instance:
        res = materialize([serving], instance=instance, resources=resources, run_config={"ops": {"serving": {"config": {"checkpoint_id": "ckpt-bad"}}}})
        assert res.success  # the run succeeds: the rejection is the check's verdict
        (check,) = res.get_asset_check_evaluations()
        assert not check.passed and check.description.startswith("rejected: worse than the incumbent")
        assert serving_checkpoint(lake) == "base"
        again = materialize([serving], instance=instance, resources=resources)  # nothing awaits a decision now
        assert again.get_asset_check_evaluations()[0].metadata["decision"].value == "nothing to decide"


def test_code_program_takes_the_models_function_and_keeps_the_prompts_imports():
    from tentalis_pipelines.evaluation.benchmarks import code_program
    from tentalis_pipelines.sandbox import run_humaneval_check

    prompt = "from typing import List\n\n\ndef add(xs: List[int]) -> int:\n    \"\"\"Sum.\"\"\"\n"
    reply = "```python\ndef add(xs: List[int]) -> int:\n    return sum(xs)\n```\nThis sums the list."
    header, code = code_program(prompt, reply, "add")
    assert header.startswith("from typing import List") and "def add" not in header and code.startswith("def add")
    test = "def check(candidate):\n    assert candidate([1, 2, 3]) == 6\n"
    assert run_humaneval_check(header, code, test, "add").passed
    body_only = code_program(prompt, "    return sum(xs) + 1\n", "add")
    assert body_only[0] == prompt and not run_humaneval_check(*body_only, test, "add").passed
