"""Lakehouse benchmarks: a DuckDB aggregate over a large ``trajectories`` table, and the cost of one
batch's writes and reads as the history grows.

Both write synthetic rows with the real schemas (``schemas.py``) through the same ``Lakehouse`` code
the pipeline uses, into a folder of their own: they refuse a folder whose tables already exist, so
they can never overwrite a real lakehouse. No Dagster here; ``tentalis bench`` prints the dicts.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tentalis_pipelines.lakehouse import Lakehouse, to_table

AGGREGATE_QUERY = "select policy_version, batch_id, avg(reward), count(*) from trajectories group by all"
AGGREGATE_TARGET_SECONDS = 2.0
SCALING_TARGET_RATIO = 1.3
# The per-batch tables of rollout_job, in pipeline order.
SCALING_TABLES = ("tasks", "rollouts", "step_scores", "reviews", "trajectories")

_WEIGHTS = json.dumps({"format": 0.2, "manager": 0.5, "outcome": 1.0, "process": 0.2}, sort_keys=True)
_SYSTEM = ("You are a careful worker. Solve the task step by step. Put each step in <step>...</step> and the final "
           "answer in <answer>...</answer>. Example: <step>3 + 4 = 7</step><answer>7</answer>\n")


def _fresh_lakehouse(root: str | Path, tables: tuple[str, ...]) -> Lakehouse:
    lake = Lakehouse(root)
    existing = [t for t in tables if lake.exists(t)]
    if existing:
        raise ValueError(f"{root} already holds tables {existing}: benchmarks write synthetic rows, give them an empty folder")
    return lake


def _lists(values: np.ndarray, per_row: int, rows: int, value_type: pa.DataType) -> pa.ListArray:
    offsets = pa.array(np.arange(0, per_row * rows + 1, per_row, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(values, type=value_type))


def synthetic_trajectories(
    rows: int, batches: int, *, seed: int = 0, steps: int = 3, group_size: int = 4, policy_versions: int = 4,
    batch_prefix: str = "bench",
) -> pa.Table:
    """``rows`` trajectory rows over ``batches`` equal batches, built column-wise with numpy (about a
    second per million rows). Later batches were sampled by later policy versions, as in a real run."""
    if rows < 1 or batches < 1 or batches > rows:
        raise ValueError(f"need 1 <= batches <= rows, got rows={rows}, batches={batches}")
    rng = np.random.default_rng(seed)
    idx = np.arange(rows)
    batch_idx = idx * batches // rows
    batch = pa.array([f"{batch_prefix}-{b:05d}" for b in range(batches)]).take(pa.array(batch_idx))
    versions = pa.array(["base"] + [f"ckpt-{v}" for v in range(1, policy_versions)])
    outcome = rng.integers(0, 2, rows).astype(np.float64)
    fmt = rng.integers(0, 2, rows).astype(np.float64)
    process = rng.random(rows)
    manager = rng.random(rows)
    reward = outcome + 0.2 * fmt + 0.2 * process + 0.5 * manager
    const = np.zeros(rows, dtype=np.int32)
    columns = {
        "batch_id": batch,
        "rollout_id": pc.binary_join_element_wise("r", pa.array(idx).cast(pa.string()), "-"),
        "task_id": pc.binary_join_element_wise(batch, pa.array(idx // group_size).cast(pa.string()), "-t"),
        "group_index": pa.array((idx % group_size).astype(np.int32)),
        "policy_version": versions.take(pa.array(batch_idx * policy_versions // batches)),
        "outcome_reward": pa.array(outcome),
        "format_reward": pa.array(fmt),
        "process_reward": pa.array(process),
        "step_rewards": _lists(rng.random(rows * steps), steps, rows, pa.float64()),
        "manager_score": pa.array(manager),
        "overlong_penalty": pa.array(np.zeros(rows)),
        "reward": pa.array(reward),
        "reward_weights": pa.array([_WEIGHTS]).take(pa.array(const)),
        "advantage": pa.array(rng.standard_normal(rows)),
        "step_advantages": _lists(rng.standard_normal(rows * steps), steps, rows, pa.float64()),
        "advantage_mode": pa.array(["outcome"]).take(pa.array(const)),
        "kept": pa.array(rng.random(rows) < 0.9),
        "created_at": pa.array(np.full(rows, int(time.time() * 1e6), dtype=np.int64)).cast(pa.timestamp("us", tz="UTC")),
        # single-turn rows: the multi-turn columns (live sessions) stay empty
        "kind": pa.array(["single"]).take(pa.array(const)),
        "loss_mask": pa.nulls(rows, pa.list_(pa.int8())),
        "token_advantages": pa.nulls(rows, pa.list_(pa.float64())),
        "turn_rewards": pa.nulls(rows, pa.list_(pa.float64())),
        "turn_advantages": pa.nulls(rows, pa.list_(pa.float64())),
        "reward_version": pa.array(["v0"]).take(pa.array(const)),  # the pipeline's own rewards (tentalis rescore)
        "opd_signal": pa.nulls(rows, pa.list_(pa.float64())),  # no hinted OPD term
        "guide_hint_id": pa.nulls(rows, pa.string()),  # no hint-guided samples
        "policy_lag": pa.array([0], pa.int32()).take(pa.array(const)),  # sampled by the serving policy
        "w_rl": pa.array([1.0]).take(pa.array(const)),
        "w_opd": pa.array([0.0]).take(pa.array(const)),
    }
    return to_table("trajectories", pa.table(columns))


def aggregate_benchmark(
    root: str | Path, rows: int = 1_000_000, batches: int = 100, *, commits: int = 10, compact: bool = False,
    repeats: int = 3, seed: int = 0,
) -> dict[str, Any]:
    """Write ``rows`` synthetic trajectories in ``batches`` batch partitions (``commits`` appends), then
    time ``AGGREGATE_QUERY`` through ``Lakehouse.sql``: the first run (cold: new DuckDB connection and
    views, the OS page cache already warm from the write) and the best of ``repeats`` more.

    Every timed run includes what a ``tentalis sql`` call pays: loading the Delta log, building the
    view and the query. With ``compact`` the table is compacted first (timed apart); each batch lands
    in one commit, so there is one file per batch partition and compaction, which never merges across
    partitions, finds nothing to do: the figure shows that the layout is already compact.
    """
    lake = _fresh_lakehouse(root, ("trajectories",))
    commits = max(1, min(commits, batches))
    t0 = time.perf_counter()
    table = synthetic_trajectories(rows, batches, seed=seed)
    build_seconds = time.perf_counter() - t0
    # Whole batches per commit, as the pipeline writes them (one file per batch partition and commit).
    bounds = [rows * (batches * c // commits) // batches for c in range(commits + 1)]
    t0 = time.perf_counter()
    for lo, hi in zip(bounds, bounds[1:]):
        lake.append("trajectories", table.slice(lo, hi - lo))
    write_seconds = time.perf_counter() - t0
    del table
    written = lake.stats("trajectories")
    compaction = None
    if compact:
        t0 = time.perf_counter()
        metrics = lake.optimize("trajectories")
        compaction = {"seconds": round(time.perf_counter() - t0, 3), "files_before": written["files"],
                      "files_after": lake.stats("trajectories")["files"], "files_removed": metrics.get("numFilesRemoved", 0)}
    runs = []
    result = None
    for _ in range(1 + max(1, repeats)):
        t0 = time.perf_counter()
        result = lake.sql(AGGREGATE_QUERY)
        runs.append(time.perf_counter() - t0)
    counted = int(pc.sum(result.column(result.num_columns - 1)).as_py())
    best = min(runs[1:])
    return {
        "benchmark": "aggregate",
        "query": AGGREGATE_QUERY,
        "rows": rows,
        "batches": batches,
        "commits": commits,
        "files": written["files"],
        "bytes": written["bytes"],
        "build_seconds": round(build_seconds, 3),
        "write_seconds": round(write_seconds, 3),
        "write_rows_per_second": round(rows / write_seconds) if write_seconds else None,
        "compaction": compaction,
        "result_rows": result.num_rows,
        "rows_counted": counted,
        "cold_seconds": round(runs[0], 4),
        "best_seconds": round(best, 4),
        "runs_seconds": [round(r, 4) for r in runs],
        "target_seconds": AGGREGATE_TARGET_SECONDS,
        "within_target": best < AGGREGATE_TARGET_SECONDS,
    }


def synthetic_batch(
    batch_id: str, rollouts: int, *, seed: int = 0, steps: int = 3, group_size: int = 4, completion_tokens: int = 96,
) -> dict[str, list[dict[str, Any]]]:
    """Rows for one batch of every per-batch table of rollout_job, shaped like the pipeline's rows
    (``rollouts`` answers to ``rollouts / group_size`` tasks, ``steps`` scored steps each)."""
    rng = random.Random(f"{seed}:{batch_id}")
    now = datetime.now(timezone.utc)
    n_tasks = max(1, rollouts // group_size)
    tasks, rows_r, rows_s, rows_v, rows_t = [], [], [], [], []
    for i in range(n_tasks):
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 9)
        prompt = f"A shop has {a} boxes with {c} apples each and sells {b} apples. How many apples are left?"
        tasks.append({"batch_id": batch_id, "task_id": f"t{i:05d}", "source": "generator:arithmetic", "environment": "math",
                      "prompt": prompt, "reference": str(a * c - b), "difficulty": 2,
                      "metadata": json.dumps({"seed": seed, "level": 2}), "created_at": now})
    for j in range(rollouts):
        task = tasks[j // group_size % n_tasks]
        rid = f"r-{batch_id}-{j:06d}"
        step_texts = [f"{rng.randint(2, 99)} * {rng.randint(2, 9)} = {rng.randint(4, 900)}" for _ in range(steps)]
        answer = task["reference"] if rng.random() < 0.5 else str(rng.randint(0, 900))
        completion = "".join(f"<step>{s}</step>\n" for s in step_texts) + f"<answer>{answer}</answer>"
        correct = float(answer == task["reference"])
        step_scores = [float(rng.random() < 0.7) for _ in range(steps)]
        manager = rng.random()
        rows_r.append({
            "batch_id": batch_id, "rollout_id": rid, "task_id": task["task_id"], "group_index": j % group_size,
            "policy_version": "base", "backend": "transformers", "model": "SmolLM2-135M-Instruct",
            "prompt_text": _SYSTEM + task["prompt"], "completion": completion, "steps": step_texts, "answer": answer,
            "parse_mode": "tagged", "prompt_tokens": 180, "completion_tokens": completion_tokens,
            "completion_token_ids": [rng.randrange(49152) for _ in range(completion_tokens)],
            "sampling_logprobs": [-rng.random() * 3 for _ in range(completion_tokens)],
            "finish_reason": "stop", "temperature": 0.8, "seconds": rng.random() * 5, "created_at": now,
        })
        rows_s.extend({"batch_id": batch_id, "rollout_id": rid, "step_index": k, "step_text": s, "scorer": "calculator",
                       "score": sc, "votes": [sc], "rationale": "equation holds" if sc else "equation is wrong"}
                      for k, (s, sc) in enumerate(zip(step_texts, step_scores)))
        rows_v.append({"batch_id": batch_id, "rollout_id": rid, "manager": "verifier", "score": manager,
                       "critique": "The final answer is right." if correct else "Check the subtraction.",
                       "hint": "Write every equation.", "created_at": now})
        process = sum(step_scores) / steps
        reward = correct + 0.2 + 0.2 * process + 0.5 * manager
        rows_t.append({
            "batch_id": batch_id, "rollout_id": rid, "task_id": task["task_id"], "group_index": j % group_size,
            "policy_version": "base", "outcome_reward": correct, "format_reward": 1.0, "process_reward": process,
            "step_rewards": step_scores, "manager_score": manager, "overlong_penalty": 0.0, "reward": reward,
            "reward_weights": _WEIGHTS, "advantage": rng.gauss(0, 1), "step_advantages": [rng.gauss(0, 1) for _ in range(steps)],
            "advantage_mode": "outcome", "kept": True, "created_at": now, "kind": "single",
        })
    return {"tasks": tasks, "rollouts": rows_r, "step_scores": rows_s, "reviews": rows_v, "trajectories": rows_t}


def _materialise(lake: Lakehouse, batch_id: str, rows: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    """One batch through the five stages' lakehouse calls, with the reads each stage makes in
    ``tentalis_pipelines/stages/`` (the model and scoring work itself is left out). Returns seconds per stage."""
    out = {}
    t0 = time.perf_counter()
    lake.quarantine([], batch_id=batch_id, stage="tasks")
    lake.write_batch("tasks", batch_id, rows["tasks"])
    out["tasks"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    lake.read("tasks", batch_id=batch_id)
    lake.write_batch("rollouts", batch_id, rows["rollouts"])
    out["rollouts"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    lake.read("rollouts", batch_id=batch_id, columns=["rollout_id", "task_id", "steps"])
    lake.write_batch("step_scores", batch_id, rows["step_scores"])
    out["step_scores"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    lake.read("tasks", batch_id=batch_id)
    lake.read("step_scores", batch_id=batch_id)
    lake.read("rollouts", batch_id=batch_id)
    lake.write_batch("reviews", batch_id, rows["reviews"])
    out["reviews"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    lake.read("tasks", batch_id=batch_id)
    lake.read("reviews", batch_id=batch_id)
    lake.write_batch("trajectories", batch_id, rows["trajectories"])
    out["trajectories"] = time.perf_counter() - t0
    return out


def batch_scaling_benchmark(
    root: str | Path, batch_rows: int = 256, batches: int = 20, *, repeats: int = 7, seed: int = 0,
) -> dict[str, Any]:
    """Does one batch cost the same with 1 and with ``batches`` batches of history?

    Materialises batches 1..N of ``batch_rows`` rollouts each (tasks, rollouts, step_scores, reviews,
    trajectories, with the reads each stage makes) through ``Lakehouse.write_batch``/``read`` into
    ``root/history-N``, and batch 1 alone into ``root/history-1``. The compared figures are medians of
    ``repeats`` re-materialisations (replace, as on a re-run) of batch 1 in ``history-1`` and of batch
    N in ``history-N``, alternated so that both see the same background load: the same operation at
    two history sizes. The first-write time of every batch is returned too (``first_write_ratio``:
    median of the last three over batches 2-4; batch 1's first write also creates the tables).
    """
    if batches < 2 or batch_rows < 1 or repeats < 1:
        raise ValueError("need batches >= 2, batch_rows >= 1 and repeats >= 1")
    one = _fresh_lakehouse(Path(root) / "history-1", SCALING_TABLES)
    many = _fresh_lakehouse(Path(root) / f"history-{batches}", SCALING_TABLES)
    ids = [f"scale-{k:04d}" for k in range(1, batches + 1)]

    def rows_for(batch_id: str) -> dict[str, list[dict[str, Any]]]:
        # Built outside the timer: the pipeline's own Python work is not what is measured.
        return synthetic_batch(batch_id, batch_rows, seed=seed)

    first = []
    for batch_id in ids:
        rows = rows_for(batch_id)
        first.append(sum(_materialise(many, batch_id, rows).values()))
    _materialise(one, ids[0], rows_for(ids[0]))
    runs_1, runs_n, stages_1, stages_n = [], [], [], []
    for _ in range(repeats):
        for lake, batch_id, runs, stages in ((one, ids[0], runs_1, stages_1), (many, ids[-1], runs_n, stages_n)):
            rows = rows_for(batch_id)
            s = _materialise(lake, batch_id, rows)
            stages.append(s)
            runs.append(sum(s.values()))
    t1, tn = statistics.median(runs_1), statistics.median(runs_n)
    first_ratio = statistics.median(first[-3:]) / statistics.median(first[1:4]) if batches >= 5 else None
    sample = rows_for(ids[0])
    return {
        "benchmark": "batch_scaling",
        "batch_rows": batch_rows,
        "batches": batches,
        "repeats": repeats,
        "rows_per_batch": {t: len(sample[t]) for t in SCALING_TABLES},
        "method": f"median of {repeats} re-materialisations of batch 1 in a lakehouse holding only it and of batch "
                  f"{batches} in one holding {batches} batches, alternated; each covers write_batch of "
                  f"{', '.join(SCALING_TABLES)} and the batch reads the stages make",
        "batch_1_seconds": round(t1, 4),
        "batch_n": batches,
        "batch_n_seconds": round(tn, 4),
        "ratio": round(tn / t1, 3),
        "target_ratio": SCALING_TARGET_RATIO,
        "within_target": tn / t1 <= SCALING_TARGET_RATIO,
        "batch_1_runs": [round(r, 4) for r in runs_1],
        "batch_n_runs": [round(r, 4) for r in runs_n],
        "stage_seconds_batch_1": {t: round(statistics.median(x[t] for x in stages_1), 4) for t in SCALING_TABLES},
        "stage_seconds_batch_n": {t: round(statistics.median(x[t] for x in stages_n), 4) for t in SCALING_TABLES},
        "first_write_seconds": [round(r, 4) for r in first],
        "first_write_ratio": round(first_ratio, 3) if first_ratio is not None else None,
        "table_versions": {t: many.stats(t)["version"] for t in SCALING_TABLES},
        "rows": {t: many.count(t) for t in SCALING_TABLES},
    }
