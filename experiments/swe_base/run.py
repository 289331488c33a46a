"""Base success of the embedded model in the mini-SWE environment, per level, on the held-out split.

Every held-out bug (``swe_tasks.held_out_tasks()``: 10 per level, 30 in all) is run once as an episode in
the real sandbox (``envs/swe.py``): SmolLM2-135M-Instruct (``resolve_model("embedded")``), greedy, at most
``--max-turns`` turns of at most ``--max-new-tokens`` tokens, the environment's default prompt (the
terminal environment's system prompt and worked example, then the issue). Success = every FAIL_TO_PASS
and PASS_TO_PASS test passes in a fresh sandbox with pristine tests. Per level: the success rate with its
Wilson 95% interval, the mean fraction of required tests passing, and what the episodes did. The host
CPU, the dtype, the commit and the wall time are in every row.

    PYTHONPATH=. OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python -m experiments.swe_base.run --models-dir <dir>

``--limit N`` runs a seeded subset of N held-out bugs (``--seed``), as the ``swe`` benchmark's ``--limit``.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import time
from collections import Counter
from pathlib import Path

from experiments.terminal_base.run import commit

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--models-dir", type=Path, default=None)
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=10, help="episodes in lock step")
    ap.add_argument("--limit", type=int, default=None, help="a seeded subset of the held-out bugs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()

    import torch

    from tentalis_pipelines.envs.base import end_kind
    from tentalis_pipelines.envs.policies import ChatPolicy
    from tentalis_pipelines.envs.runner import run_episodes
    from tentalis_pipelines.envs.swe import SweConfig, SweEnv, swe_terminal_config
    from tentalis_pipelines.envs.swe_tasks import LEVELS, held_out_tasks
    from tentalis_pipelines.hardware import host_cpu
    from tentalis_pipelines.inference.models import resolve_model
    from tentalis_pipelines.settings import Paths
    from tentalis_pipelines.statistics import wilson_interval as wilson

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    model_dir = resolve_model(args.model, args.models_dir or Paths.from_env().models)
    policy = ChatPolicy.load(model_dir, device=args.device, dtype=args.dtype, max_new_tokens=args.max_new_tokens, temperature=0.0)
    dtype = str(policy.model.dtype).replace("torch.", "")
    cpu = host_cpu()
    tasks = held_out_tasks()
    if args.limit is not None and args.limit < len(tasks):
        keep = sorted(random.Random(args.seed).sample(range(len(tasks)), args.limit))
        tasks = [tasks[i] for i in keep]
    config = SweConfig(terminal=swe_terminal_config(args.max_turns))
    meta = {"model": model_dir.name, "dtype": dtype, "device": args.device, "max_turns": args.max_turns,
            "max_new_tokens": args.max_new_tokens, "items": len(tasks), "commit": commit(), "cpu": cpu["model"],
            "cpu_flags": " ".join(cpu["flags"]), "threads": torch.get_num_threads()}
    start = time.perf_counter()
    episodes = []
    for i in range(0, len(tasks), args.batch):
        chunk = tasks[i:i + args.batch]
        eps = run_episodes(lambda: SweEnv(config), chunk, policy.generate_batch)
        episodes += list(zip(chunk, eps))
        print(f"[{len(episodes)}/{len(tasks)}] {sum(ep.passed for ep in eps)}/{len(eps)} passed "
              f"{time.perf_counter() - start:7.1f}s", flush=True)
    wall = time.perf_counter() - start

    def fraction(ep) -> float:
        info = ep.turns[-1].info if ep.turns else {}
        return info.get("tests_passed", 0) / max(1, info.get("tests_total", 1))

    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "swe_base_episodes.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["task_id", "level", "module", "mutation", "passed", "tests_fraction", "end_reason", "turns", "format_errors",
                    "detail", "commands"])
        for task, ep in episodes:
            w.writerow([task.task_id, task.level, task.module, task.mutation, int(ep.passed), round(fraction(ep), 4), ep.end_reason,
                        ep.turns_used, sum(1 for t in ep.turns if t.action is None), ep.verdict.detail[:200],
                        " || ".join((t.action or "<format error>").replace("\n", "; ")[:80] for t in ep.turns)])
    rows = []
    for level in (*LEVELS, "all"):
        eps = [(t, ep) for t, ep in episodes if level == "all" or t.level == level]
        if not eps:
            continue
        k, n = sum(ep.passed for _, ep in eps), len(eps)
        lo, hi = wilson(k, n)
        turns = sum(ep.turns_used for _, ep in eps)
        ends = Counter(end_kind(ep.end_reason) for _, ep in eps)
        rows.append({"level": level, "n": n, "passed": k, "success": round(k / n, 4), "wilson_lo": round(lo, 4),
                     "wilson_hi": round(hi, 4), "mean_tests_fraction": round(sum(fraction(ep) for _, ep in eps) / n, 4),
                     "mean_turns": round(turns / n, 2),
                     "format_error_turns": round(sum(1 for _, ep in eps for t in ep.turns if t.action is None) / max(1, turns), 4),
                     "submitted": ends["submitted"], "turn_limit": ends["turn_limit"], "hostile": ends["hostile"],
                     "error": ends["error"], **meta, "wall_s": round(wall, 1)})
    with open(args.out / "swe_base.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    for r in rows:
        print(f"level {r['level']}: {r['passed']}/{r['n']} = {r['success']:.1%} [{r['wilson_lo']:.1%}, {r['wilson_hi']:.1%}]  "
              f"tests {r['mean_tests_fraction']:.1%}  turns {r['mean_turns']}  format errors {r['format_error_turns']:.0%}  "
              f"submitted {r['submitted']} turn_limit {r['turn_limit']} hostile {r['hostile']} error {r['error']}")
    print(f"wall {wall:.0f} s on {cpu['model']} ({' '.join(cpu['flags'])}), {dtype}, commit {meta['commit']}")


if __name__ == "__main__":
    main()
