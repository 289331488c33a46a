"""Base success of the embedded model on BFCL: the official ``multi_turn_base`` through BFCL's checker,
and the generated held-out tasks per level.

Each item is one greedy episode (``envs/bfcl.py``): BFCL's default prompt-mode system prompt with the
item's function docs, the user turns in order, replies executed on BFCL's simulators, at most
``--max-steps`` replies with calls per user turn (BFCL: 20) of at most ``--max-new-tokens`` tokens,
scored by BFCL's ``multi_turn_checker``. Episodes run one at a time with the policy's KV cache kept
between turns (on a CPU that is cheaper than lock-step batches, which re-read the whole context each
turn). An item whose prompt does not fit the model's context (8,192 tokens for SmolLM2) fails
(``error: policy failed: ContextTooLong``), as it would in BFCL. One CSV row per episode is appended as it
ends, so a run cut short keeps what it measured.

    PYTHONPATH=. OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python -m experiments.bfcl_base.run \\
        --models-dir <dir> --official 200 --generated-per-level 30 --max-steps 20   # the full run

``--official N`` takes the ``bfcl`` benchmark's seeded subset of N (``load_benchmark("bfcl", N, seed=0)``),
run grouped by their tools (items over the same tools share the system prompt's KV cache). Rerunning the
same command resumes: items already in ``--out`` with the same step limit, reply length and dtype are
skipped.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FIELDS = ["set", "task_id", "level", "family", "classes", "user_turns", "prompt_tokens", "passed", "end_reason", "detail",
          "replies", "replies_with_calls", "seconds", "max_steps", "max_new_tokens", "dtype", "commit", "cpu"]


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                               text=True).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_name() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def done_items(path: Path, *, max_steps: int, max_new_tokens: int, dtype: str) -> set[str]:
    """Task ids already in the episode CSV ``path`` under the same settings (step limit, reply length,
    dtype; not the commit): a rerun with those settings skips them, so a long run resumes where it
    stopped. Rows under other settings do not count (their items run again)."""
    with path.open(newline="") as fh:
        return {r["task_id"] for r in csv.DictReader(fh)
                if (r["max_steps"], r["max_new_tokens"], r["dtype"]) == (str(max_steps), str(max_new_tokens), dtype)}


def summarize(paths: list[Path]) -> list[dict]:
    """Per set (official) and level (generated): n, passed, success and its Wilson 95% interval."""
    from tentalis_pipelines.statistics import wilson_interval

    groups: dict[tuple[str, str], list[int]] = {}
    for path in paths:
        if path.exists():
            with path.open() as fh:
                for r in csv.DictReader(fh):
                    key = (r["set"], "official" if r["set"] == "official" else f"level {r['level']}")
                    groups.setdefault(key, []).append(int(r["passed"]))
    out = []
    for (which, part), ok in sorted(groups.items()):
        lo, hi = wilson_interval(sum(ok), len(ok))
        out.append({"set": which, "part": part, "n": len(ok), "passed": sum(ok), "success": round(sum(ok) / len(ok), 4),
                    "ci_low": round(lo, 4), "ci_high": round(hi, 4)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--summarize", nargs="*", type=Path, default=None,
                    help="print the summary of these episode CSVs (Wilson 95%% intervals) and write summary.csv; run nothing")
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--models-dir", type=Path, default=None)
    ap.add_argument("--official", type=int, default=16, help="official items (seeded subset of multi_turn_base; 200 = all)")
    ap.add_argument("--generated-per-level", type=int, default=5, help="generated held-out tasks per level (of 30)")
    ap.add_argument("--max-steps", type=int, default=5, help="replies with calls per user turn (BFCL: 20)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=HERE / "episodes.csv")
    ap.add_argument("--shard", default=None, metavar="K/N",
                    help="run only the K-th (0-based) of N contiguous blocks of the items not yet in --done-in, so N "
                         "processes (one core each) share a run; each writes its own --out, merge them afterwards")
    ap.add_argument("--done-in", type=Path, nargs="*", default=[],
                    help="episode CSVs whose items (same settings) count as done: the shards' common base")
    args = ap.parse_args()
    if args.summarize is not None:
        rows = summarize(args.summarize or [HERE / "episodes.csv", HERE / "episodes_generated.csv"])
        with (HERE / "summary.csv").open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=["set", "part", "n", "passed", "success", "ci_low", "ci_high"])
            w.writeheader()
            w.writerows(rows)
        for r in rows:
            print(json.dumps(r))
        return

    import torch

    from tentalis_pipelines.envs.bfcl import BfclConfig, BfclEnv, BfclTask
    from tentalis_pipelines.envs.policies import ChatPolicy
    from tentalis_pipelines.envs.runner import run_episode
    from tentalis_pipelines.evaluation.benchmarks import load_benchmark
    from tentalis_pipelines.inference.models import resolve_model
    from tentalis_pipelines.settings import Paths
    from tentalis_pipelines.tasks.batches import bfcl_held_out_tasks

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    model_dir = resolve_model(args.model, args.models_dir or Paths.from_env().models)
    policy = ChatPolicy.load(model_dir, device=args.device, dtype=args.dtype, max_new_tokens=args.max_new_tokens)
    dtype = str(next(policy.model.parameters()).dtype).replace("torch.", "")
    _, items = load_benchmark("bfcl", args.official, seed=0) if args.official else ("bfcl", [])
    official = [BfclTask.from_dict(it.extra["task"]) for it in items]
    # Items over the same tools share their system prompt (the function docs, most of the prompt): run them
    # back to back so the policy prefills it once per group (ChatPolicy's shared-prefix KV); order does not
    # change any item's result.
    official.sort(key=lambda t: "+".join(t.involved_classes))
    # levels interleaved (task 0 of levels 1, 2, 3, then task 1, ...): a run cut short still covers each level
    generated = sorted((t for t in bfcl_held_out_tasks() if int(t.task_id.split("_")[3]) < args.generated_per_level),
                       key=lambda t: (int(t.task_id.split("_")[3]), t.level))
    rev, cpu = commit(), cpu_name()
    new = not args.out.exists()
    done = set() if new else done_items(args.out, max_steps=args.max_steps, max_new_tokens=args.max_new_tokens,
                                        dtype=dtype)
    if args.shard:
        # The split is over the items not done in the common base (--done-in), not in this shard's own --out,
        # so a resumed shard gets the same block as before and shards never overlap.
        k, n = (int(x) for x in args.shard.split("/"))
        base: set[str] = set()
        for path in args.done_in:
            base |= done_items(path, max_steps=args.max_steps, max_new_tokens=args.max_new_tokens, dtype=dtype)
        official, generated = ([t for t in ts if t.task_id not in base] for ts in (official, generated))
        todo = official + generated
        block = set(t.task_id for t in todo[k * len(todo) // n:(k + 1) * len(todo) // n])
        official, generated = ([t for t in ts if t.task_id in block] for ts in (official, generated))
        print(json.dumps({"shard": args.shard, "items": len(block), "base_done": len(base)}), flush=True)
    if done:
        print(json.dumps({"resuming": str(args.out), "done": len(done)}), flush=True)
    with args.out.open("a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        if new:
            w.writeheader()
        for which, tasks in (("official", official), ("generated", generated)):
            for task in tasks:
                if task.task_id in done:
                    continue
                t0 = time.perf_counter()
                ep = run_episode(BfclEnv(BfclConfig(max_steps_per_turn=args.max_steps)), task, policy)
                first = ep.turns[0].prompt_token_ids if ep.turns and ep.turns[0].prompt_token_ids else None
                row = {"set": which, "task_id": task.task_id, "level": task.level, "family": task.family,
                       "classes": "+".join(task.involved_classes), "user_turns": len(task.turns),
                       "prompt_tokens": len(first) if first else "", "passed": int(ep.passed), "end_reason": ep.end_reason,
                       "detail": ep.verdict.detail[:200], "replies": ep.turns_used,
                       "replies_with_calls": sum(t.action is not None for t in ep.turns),
                       "seconds": round(time.perf_counter() - t0, 1), "max_steps": args.max_steps,
                       "max_new_tokens": args.max_new_tokens, "dtype": dtype, "commit": rev, "cpu": cpu}
                w.writerow(row)
                fh.flush()
                print(json.dumps({k: row[k] for k in ("set", "task_id", "passed", "end_reason", "replies", "replies_with_calls",
                                                      "seconds")}), flush=True)


if __name__ == "__main__":
    main()
