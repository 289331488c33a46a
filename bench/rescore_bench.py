"""Time re-scoring on a lakehouse of arithmetic rollouts whose outcomes are known (README, "Re-scoring
without re-rolling"). Rollouts are written directly (right tagged, wrong tagged, right untagged, or
steps without an answer, drawn at random); steps, reviews and trajectories come from the real stages.

    .venv/bin/python -m bench.rescore_bench --batches 8 --tasks 16 --generations 4
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from datetime import datetime, timezone

from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.rewards.rescore import RescoreSpec
from tentalis_pipelines.rewards.scoring import parse_weight_overrides
from tentalis_pipelines.stages.rescore import activate_reward_version, rescore
from tentalis_pipelines.stages.reviews import build_reviews
from tentalis_pipelines.stages.step_scores import build_step_scores
from tentalis_pipelines.stages.trajectories import build_trajectories


def build(lake: Lakehouse, batches: int, tasks: int, generations: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    now = datetime.now(timezone.utc)
    for b in range(batches):
        bid = f"b{b}"
        task_rows, rollouts = [], []
        for t in range(tasks):
            x, y = rng.randint(2, 50), rng.randint(2, 50)
            task_rows.append({"batch_id": bid, "task_id": f"{bid}-t{t}", "source": "bench", "environment": "math",
                              "prompt": f"Ann has {x} pens and buys {y} more. How many pens?", "reference": str(x + y),
                              "difficulty": 1, "metadata": "{}", "created_at": now})
            for g in range(generations):
                kind = rng.randint(0, 3)
                z = x + y + (0 if kind in (0, 2) else rng.randint(1, 5))
                completion = {0: f"<step>{x} + {y} = {z}</step><answer>{z}</answer>", 1: f"<step>{x} + {y} = {z}</step><answer>{z}</answer>",
                              2: f"She has {z} pens.", 3: f"<step>{x} + {y} = {z}</step>"}[kind]
                steps = [f"She has {z} pens."] if kind == 2 else [f"{x} + {y} = {z}"]
                rollouts.append({"batch_id": bid, "rollout_id": f"{bid}-t{t}-g{g}", "task_id": f"{bid}-t{t}", "group_index": g,
                                 "policy_version": "base", "backend": "bench", "model": "none", "prompt_text": "p", "completion": completion,
                                 "steps": steps, "answer": None, "parse_mode": "tagged", "prompt_tokens": 1, "completion_tokens": 1,
                                 "completion_token_ids": [1], "sampling_logprobs": None, "finish_reason": "stop", "temperature": 0.8,
                                 "seconds": 0.0, "created_at": now})
        lake.write_batch("tasks", bid, task_rows)
        lake.write_batch("rollouts", bid, rollouts)
        build_step_scores(lake, bid)
        build_reviews(lake, bid)
        build_trajectories(lake, bid)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--generations", type=int, default=4)
    args = ap.parse_args()
    lake = Lakehouse(tempfile.mkdtemp(prefix="rescore-bench-"))
    build(lake, args.batches, args.tasks, args.generations)
    n = lake.count("trajectories")
    t0 = time.perf_counter()
    weights = rescore(lake, RescoreSpec("manager-heavy", weights=parse_weight_overrides('{"manager": 1.0, "format": 0.0}')))
    t1 = time.perf_counter()
    again = rescore(lake, RescoreSpec("verifier-again", manager="verifier", step_scorer="calculator"))
    t2 = time.perf_counter()
    activate_reward_version(lake, "manager-heavy", actor="bench", reason="timing")
    t3 = time.perf_counter()
    print(f"{n} trajectories in {args.batches} batches: weights-only re-score {t1 - t0:.2f} s, "
          f"verifier + calculator re-score {t2 - t1:.2f} s, activation {t3 - t2:.2f} s")
    for name, res in (("manager-heavy", weights), ("verifier-again", again)):
        print(name, {k: res.metadata[k] for k in ("changed", "mean_delta", "max_abs_delta", "rank_changes", "sign_flips")})


if __name__ == "__main__":
    main()
