"""Demonstrations through the real sandbox, and the warm start as a Dagster asset on the tiny random model.

* the oracle's demonstration of a generated terminal task passes when replayed in the sandbox, and a
  wrong or short one does not;
* a person's file is replayed too: the solving line lands verified with its conversation, the others are
  quarantined with file and line;
* demonstration_job (tasks, oracle demonstrations) then warm_start_job: a checkpoint like any other
  (algorithm sft_warm_start, parent, trained_on, lineage per demonstration), not promoted (the gate decides)."""

from __future__ import annotations

import json
import os
import sys

import pytest
from dagster import DagsterInstance

import jobs.runner as runner
from assets.partitions import checkpoint_ids
from tentalis_pipelines import demonstrations as demos
from tentalis_pipelines.definitions import defs
from tentalis_pipelines.envs.terminal_tasks import TerminalTask
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.tasks.batches import terminal_task_rows, terminal_training_tasks
from tentalis_pipelines.training import serving

needs_sandbox = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                   reason="the sandbox needs Linux namespaces and root (CI runs as root)")


@needs_sandbox
def test_the_oracle_demonstration_of_a_generated_terminal_task_passes_in_the_sandbox():
    task = terminal_training_tasks(5, 1, (1,))[0]
    actions = demos.oracle_actions("terminal", task)
    assert actions == [f"```bash\n{c}\n```" for c in task.solution] and task.solution[-1].startswith("submit")
    ep = demos.replay("terminal", task, actions, max_turns=8)
    assert ep.passed and demos.policy_actions(ep) == actions
    row = demos.demonstration_row("b1", {**task.task_row(), "batch_id": "b1"}, demos.ORACLE, ep)
    assert row["verified"] and row["actions"] == actions and row["source"] == "oracle"
    msgs = json.loads(row["messages"])
    assert [m["content"] for m in msgs if m["kind"] == "assistant"] == actions and msgs[0]["role"] == "system"
    # A wrong answer fails the check; a demonstration that stops before submitting fails the episode.
    wrong = demos.replay("terminal", task, [*actions[:-1], "```bash\nsubmit not-the-answer\n```"], max_turns=8)
    assert not wrong.passed
    short = demos.replay("terminal", task, actions[:-1], max_turns=8)
    assert not short.passed and "DemonstrationExhausted" in short.end_reason


@needs_sandbox
def test_an_imported_demonstration_is_replayed_and_only_a_solving_one_lands(tmp_path):
    lake = Lakehouse(tmp_path / "lake")
    task = terminal_training_tasks(5, 1, (1,))[0]
    lake.write_batch("tasks", "b1", terminal_task_rows("b1", [task], now_utc()))
    good = {"batch_id": "b1", "task_id": task.task_id, "actions": demos.oracle_actions("terminal", task)}
    path = tmp_path / "people.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "actions": ["```bash\nsubmit 12345\n```"]}) + "\n")
    out = demos.import_demonstrations(lake, path)
    assert out["imported"] == 1 and out["quarantined"] == 1
    (row,) = demos.read_demonstrations(lake)
    assert row["verified"] and row["source"] == "human:people.jsonl" and row["source_line"] == 1
    (bad,) = lake.read("quarantine").to_pylist()
    assert bad["error"].startswith(f"{path}:2: the actions do not solve task {task.task_id}")


@needs_sandbox
def test_demonstration_job_then_warm_start_job_write_a_gated_checkpoint(home, tiny_model_dir, monkeypatch):
    monkeypatch.delenv("TENTALIS_MODEL", raising=False)
    monkeypatch.setenv("TENTALIS_CONTAMINATION_BENCHMARKS", "terminal")  # exact-only: no embedding pass in this test
    paths = Paths.from_env(str(home)).ensure()
    lake = Lakehouse(paths.lakehouse)
    config = {"resources": {"policy": {"config": {"model": str(tiny_model_dir)}},
                            "trainer": {"config": {"lora_r": 4, "dtype": "float32"}}},
              "loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
    with DagsterInstance.ephemeral() as instance:
        batch_id = runner.register_batch(instance, paths, num_tasks=2, seed=None, levels=(1,), task_source="terminal", max_turns=8)
        runner.run_job(defs, instance, "demonstration_job", partition_key=batch_id, run_config=config)
        rows = demos.read_demonstrations(lake)
        tasks = {t["task_id"]: t for t in lake.read("tasks", batch_id=batch_id).to_pylist()}
        assert len(rows) == 2 and {r["task_id"] for r in rows} == set(tasks)
        for r in rows:
            task = TerminalTask.from_task_row(tasks[r["task_id"]])
            assert r["verified"] and r["source"] == "oracle" and r["actions"] == demos.oracle_actions("terminal", task)
        warm = {**config, "ops": {"warm_start": {"config": {"epochs": 2, "learning_rate": 0.01}}}}
        runner.run_job(defs, instance, "warm_start_job", run_config=warm)
        (ck,) = lake.read("checkpoints").to_pylist()
        assert instance.has_dynamic_partition(checkpoint_ids.name, ck["checkpoint_id"])
    assert ck["algorithm"] == "sft_warm_start" and ck["parent_id"] is None and ck["trained_on"] == [batch_id]
    assert ck["promoted"] is False and serving.serving_policy(lake)[0] == "base"  # the gate decides, not the trainer
    cfg, metrics = json.loads(ck["config"]), json.loads(ck["metrics"])
    assert sorted(cfg["demonstration_ids"]) == sorted(r["demonstration_id"] for r in rows)
    assert metrics["nll_after"] < metrics["nll_before"] and metrics["demonstrations"] == 2
    lineage = [r for r in lake.read("lineage").to_pylist() if r["checkpoint_id"] == ck["checkpoint_id"]]
    assert sorted(r["row_id"] for r in lineage if r["kind"] == "demonstration") == sorted(cfg["demonstration_ids"])
    # `tentalis lineage --verify`: the training set rebuilt from the demonstrations at their pinned version.
    from tentalis_pipelines.lineage import verify_replay

    same, detail = verify_replay(lake, ck["checkpoint_id"])
    assert same and detail["samples"] == 2, detail


@needs_sandbox
def test_run_warm_start_benchmarks_the_checkpoint_and_the_gate_decides(home, tiny_model_dir, monkeypatch):
    """`tentalis warmstart`'s jobs: the warm-start checkpoint goes through benchmark_job and promotion_job
    like an RL checkpoint; only the gate's decision moves the serving pointer."""
    from jobs.warm_start import WarmStartOptions, run_warm_start
    from tentalis_pipelines import promotion

    monkeypatch.delenv("TENTALIS_MODEL", raising=False)
    monkeypatch.setenv("TENTALIS_CONTAMINATION_BENCHMARKS", "terminal")
    paths = Paths.from_env(str(home)).ensure()
    lake = Lakehouse(paths.lakehouse)
    resources = {"policy": {"config": {"model": str(tiny_model_dir)}}, "trainer": {"config": {"lora_r": 4, "dtype": "float32"}},
                 "benchmark": {"config": {"benchmarks": ["terminal-l1"], "gate_benchmark": "terminal-l1", "limit": 2,
                                          "max_new_tokens": 8}}}
    opts = WarmStartOptions(task_source="terminal", num_tasks=1, levels=(1,), max_turns=2, epochs=1, learning_rate=0.01,
                            resources=resources)
    jobs = []
    with DagsterInstance.ephemeral() as instance:
        out = run_warm_start(defs, instance, paths, opts, on_run=lambda r: jobs.append((r.job, r.partition)))
    assert [j for j, _ in jobs] == ["demonstration_job", "warm_start_job", "benchmark_job", "benchmark_job", "promotion_job"]
    cid = out["checkpoint_id"]
    assert {p for j, p in jobs if j == "benchmark_job"} == {f"terminal-l1|{cid}", "terminal-l1|base"}
    decision = out["decision"]
    assert decision["checkpoint_id"] == cid and decision in promotion.decisions(lake, "terminal-l1")
    # Serving moved only by the gate's decision (actor "gate"), never by the warm start itself.
    moves = [r for r in lake.read("serving").to_pylist() if r["to_checkpoint"] == cid] if lake.exists("serving") else []
    assert serving.serving_policy(lake)[0] == (cid if decision["promote"] else "base")
    assert [m["actor"] for m in moves] == (["gate"] if decision["promote"] else [])


@needs_sandbox
def test_a_stronger_models_passing_episode_lands_in_the_action_format(tmp_path, tiny_model_dir):
    """The `openai` source end to end over HTTP: a scripted OpenAI-compatible server stands for the stronger
    model (it writes the oracle's commands with words around them); the real backend renders each turn with
    the chat template, the episode runs in the sandbox, and the demonstration lands as the bare bash blocks,
    replayed and verified. A model that never solves the task lands nothing."""
    from tentalis_pipelines.inference.openai_backend import OpenAIBackend
    from tests.test_openai_backend_integration import ScriptedServer, ok

    lake = Lakehouse(tmp_path / "lake")
    task = terminal_training_tasks(5, 1, (1,))[0]
    lake.write_batch("tasks", "b1", terminal_task_rows("b1", [task], now_utc()))

    def solver(attempt: int, path: str, body: dict):
        # The assistant turns already in the prompt, less the worked example's two and the open header.
        turn = body["prompt"].count("<|im_start|>assistant") - 3
        return ok([f"Let me do that.\n```bash\n{task.solution[turn]}\n```\nThis should work."])

    with ScriptedServer(solver) as srv:
        backend = OpenAIBackend(tiny_model_dir, base_url=srv.url, served_model="big-model", logprobs=False, backoff_base=0.01)
        rows, summary = demos.model_demonstrations(lake, "b1", backend)
    assert summary == {"source": "openai:big-model", "episodes": 1, "passed": 1, "verified": 1}
    (row,) = rows
    assert row["source"] == "openai:big-model" and row["verified"]
    assert row["actions"] == [f"```bash\n{c}\n```" for c in task.solution]  # the words around the block are gone

    with ScriptedServer(lambda a, p, b: ok(["```bash\nsubmit 0\n```"])) as srv:
        backend = OpenAIBackend(tiny_model_dir, base_url=srv.url, served_model="small", logprobs=False, backoff_base=0.01)
        rows, summary = demos.model_demonstrations(lake, "b1", backend, attempts=2)
    assert rows == [] and summary["episodes"] == 2 and summary["passed"] == 0


@needs_sandbox
def test_bfcl_and_mini_swe_oracles_are_verified_in_their_environments(tmp_path):
    from tentalis_pipelines.envs import swe_tasks
    from tentalis_pipelines.tasks.batches import bfcl_task_rows, bfcl_training_tasks, swe_task_rows

    lake = Lakehouse(tmp_path / "lake")
    lake.write_batch("tasks", "bfcl-b", bfcl_task_rows("bfcl-b", bfcl_training_tasks(2, 2, (1, 2)), now_utc()))
    lake.write_batch("tasks", "swe-b", swe_task_rows("swe-b", swe_tasks.training_tasks(2, 1, (1,)), now_utc()))
    for batch, env in (("bfcl-b", "bfcl"), ("swe-b", "swe")):
        rows, summary = demos.oracle_demonstrations(lake, batch)
        tasks = lake.read("tasks", batch_id=batch).to_pylist()
        assert summary["failed"] == 0 and len(rows) == len(tasks), summary
        for r in rows:
            assert r["verified"] and r["environment"] == env and r["source"] == "oracle" and "passed" in r["verify_detail"]
    bfcl_row = demos.oracle_demonstrations(lake, "bfcl-b")[0][0]
    # A task whose check its own solution does not pass: the oracle's replay fails, nothing lands for it.
    good, broken = terminal_training_tasks(5, 2, (1,))
    rows = terminal_task_rows("t-b", [good, broken], now_utc())
    rows[1]["reference"] = json.dumps({**broken.check, "expected": "not what the solution submits"})
    lake.write_batch("tasks", "t-b", rows)
    landed, summary = demos.oracle_demonstrations(lake, "t-b")
    assert [r["task_id"] for r in landed] == [good.task_id] and summary["failed"] == 1 and broken.task_id in summary["failures"]
    assert bfcl_row["actions"][-1] == "Done." and bfcl_row["actions"][0].startswith("[")
