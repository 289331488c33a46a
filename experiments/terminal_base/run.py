"""Base success of the embedded model in the terminal environment, per level, on the held-out split.

Every held-out terminal task (the first 30 of each level, ``envs/terminal_tasks.py``) is run once as an
episode in the real sandbox: SmolLM2-135M-Instruct (``resolve_model("embedded")``), greedy, at most
``--max-turns`` turns of at most ``--max-new-tokens`` tokens (a turn also ends once it holds a closed
code block, ``envs/policies.py``), the environment's default prompt (system prompt + one worked
example, ``envs/terminal.py``). Success = the final check passes. Per level: the success rate with its
Wilson 95% interval, and what the episodes did (turns used, format errors, how they ended). The host
CPU, the dtype, the commit and the wall time are in every row.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python -m experiments.terminal_base.run \\
        --models-dir .tentalis/models            # writes experiments/terminal_base/*.csv
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                               text=True).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--models-dir", type=Path, default=None, help="where the converted embedded model lives "
                    "(default $TENTALIS_HOME/models)")
    ap.add_argument("--per-level", type=int, default=30, help="held-out tasks per level")
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()

    import torch

    from tentalis_pipelines.envs.base import end_kind
    from tentalis_pipelines.envs.policies import ChatPolicy
    from tentalis_pipelines.envs.runner import run_episode
    from tentalis_pipelines.envs.terminal import TerminalConfig, TerminalEnv
    from tentalis_pipelines.envs.terminal_tasks import LEVELS, generate_tasks
    from tentalis_pipelines.hardware import host_cpu
    from tentalis_pipelines.inference.models import resolve_model
    from tentalis_pipelines.settings import Paths
    from tentalis_pipelines.statistics import wilson_interval as wilson

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    models_dir = args.models_dir or Paths.from_env().models
    model_dir = resolve_model(args.model, models_dir)
    policy = ChatPolicy.load(model_dir, device=args.device, dtype=args.dtype, max_new_tokens=args.max_new_tokens,
                             temperature=0.0)
    dtype = str(policy.model.dtype).replace("torch.", "")
    cpu = host_cpu()
    tasks = [t for t in generate_tasks(test_per_level=args.per_level, per_level=args.per_level) if t.split == "test"]
    env = TerminalEnv(TerminalConfig(max_turns=args.max_turns))
    meta = {"model": model_dir.name, "dtype": dtype, "device": args.device, "max_turns": args.max_turns,
            "max_new_tokens": args.max_new_tokens, "commit": commit(), "cpu": cpu["model"],
            "cpu_flags": " ".join(cpu["flags"]), "threads": torch.get_num_threads()}
    start = time.perf_counter()
    episodes = []
    for i, task in enumerate(tasks):
        ep = run_episode(env, task, policy)
        episodes.append((task, ep))
        print(f"[{i + 1}/{len(tasks)}] L{task.level} {task.family:15s} {'PASS' if ep.passed else 'fail'} "
              f"{ep.end_reason[:50]:50s} turns={ep.turns_used} {time.perf_counter() - start:7.1f}s", flush=True)
    wall = time.perf_counter() - start

    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "terminal_base_episodes.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["task_id", "level", "family", "passed", "end_reason", "turns", "format_errors", "commands"])
        for task, ep in episodes:
            w.writerow([task.task_id, task.level, task.family, int(ep.passed), ep.end_reason, ep.turns_used,
                        sum(1 for t in ep.turns if t.action is None),
                        " || ".join((t.action or "<format error>").replace("\n", "; ")[:80] for t in ep.turns)])
    rows = []
    for level in LEVELS:
        eps = [ep for t, ep in episodes if t.level == level]
        k, n = sum(ep.passed for ep in eps), len(eps)
        lo, hi = wilson(k, n)
        turns = sum(ep.turns_used for ep in eps)
        ends = Counter(end_kind(ep.end_reason) for ep in eps)
        rows.append({"level": level, "n": n, "passed": k, "success": round(k / n, 4), "wilson_lo": round(lo, 4),
                     "wilson_hi": round(hi, 4), "mean_turns": round(turns / n, 2),
                     "format_error_turns": round(sum(1 for ep in eps for t in ep.turns if t.action is None) / max(1, turns), 4),
                     "submitted": ends["submitted"], "turn_limit": ends["turn_limit"], "hostile": ends["hostile"],
                     "error": ends["error"], **meta, "wall_s": round(wall, 1)})
    with open(args.out / "terminal_base.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    for r in rows:
        print(f"level {r['level']}: {r['passed']}/{r['n']} = {r['success']:.1%} "
              f"[{r['wilson_lo']:.1%}, {r['wilson_hi']:.1%}]  turns {r['mean_turns']}  format errors "
              f"{r['format_error_turns']:.0%}  submitted {r['submitted']} turn_limit {r['turn_limit']} "
              f"hostile {r['hostile']} error {r['error']}")
    print(f"wall {wall:.0f} s on {cpu['model']} ({' '.join(cpu['flags'])}), {dtype}, commit {meta['commit']}")


if __name__ == "__main__":
    main()
