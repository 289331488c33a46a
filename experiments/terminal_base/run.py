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

Level 0 (the command is named), greedy and sampled (``--samples`` episodes per task at
``--temperature``: the share of tasks whose samples are mixed, 0 < passed < samples, is the share of
GRPO groups with a learning signal), with a prompt ``--variant`` (``VARIANTS``); episodes run in lock
step, ``--batch`` at a time:

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python -m experiments.terminal_base.run --models-dir <dir> \\
        --levels 0 --max-turns 4 --samples 4 --temperature 0.8 --variant default --tag level0
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import time
from collections import Counter
from dataclasses import replace
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


# Prompt variants (level 0 measurements): (system prompt or None = the environment's, worked example or
# None = the environment's). Task contents never change.
ONE_TURN_DEMO = (
    {"role": "user", "content": "Run the command `head -n 1 list.txt` and submit the line it prints with submit."},
    {"role": "assistant", "content": "```bash\nsubmit $(head -n 1 list.txt)\n```"},
)
TWO_TURN_NAMED_DEMO = (
    {"role": "user", "content": "Run the command `head -n 1 list.txt` and submit the line it prints with submit."},
    {"role": "assistant", "content": "```bash\nhead -n 1 list.txt\n```"},
    {"role": "user", "content": "red apple\n[exit code 0]"},
    {"role": "assistant", "content": "```bash\nsubmit red apple\n```"},
)
SHORT_SYSTEM = ("You are a shell agent. Reply with exactly one bash code block holding one command. "
                "To answer, run: submit ANSWER")
VARIANTS = {  # name: (system prompt, worked example); "repeat_notice" also turns the notice on
    "default": (None, None),
    "repeat_notice": (None, None),  # the default prompt; a repeated command is told to submit its output
    "named_demo": (None, TWO_TURN_NAMED_DEMO),  # the example is itself a named-command task
    "submit_subst": (SHORT_SYSTEM + "\nTo submit a command's output in one step: submit $(COMMAND)", ONE_TURN_DEMO),
}


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
    ap.add_argument("--levels", default="1,2,3", help="comma-separated terminal levels (0-3)")
    ap.add_argument("--samples", type=int, default=0, help="also run this many sampled episodes per task")
    ap.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (the policy default)")
    ap.add_argument("--variant", default="default", choices=sorted(VARIANTS))
    ap.add_argument("--no-greedy", action="store_true", help="skip the greedy episodes")
    ap.add_argument("--batch", type=int, default=1, help="episodes in lock step (1: one at a time, as before)")
    ap.add_argument("--tag", default="", help="file name suffix: terminal_base_<tag>.csv (default: the 1-3 files)")
    ap.add_argument("--episodes-tag", default="", help="episodes file suffix (default: --tag); the summary rows are "
                    "appended to terminal_base_<tag>.csv")
    args = ap.parse_args()

    import torch

    from tentalis_pipelines.envs.base import end_kind
    from tentalis_pipelines.envs.policies import ChatPolicy
    from tentalis_pipelines.envs.runner import run_episode, run_episodes
    from tentalis_pipelines.envs.terminal import TerminalConfig, TerminalEnv
    from tentalis_pipelines.envs.terminal_tasks import generate_tasks
    from tentalis_pipelines.hardware import host_cpu
    from tentalis_pipelines.inference.models import resolve_model
    from tentalis_pipelines.settings import Paths
    from tentalis_pipelines.statistics import wilson_interval as wilson

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    models_dir = args.models_dir or Paths.from_env().models
    model_dir = resolve_model(args.model, models_dir)
    levels = tuple(int(x) for x in args.levels.split(","))
    policy = ChatPolicy.load(model_dir, device=args.device, dtype=args.dtype, max_new_tokens=args.max_new_tokens,
                             temperature=0.0)
    dtype = str(policy.model.dtype).replace("torch.", "")
    cpu = host_cpu()
    tasks = [t for t in generate_tasks(test_per_level=args.per_level, per_level=args.per_level, levels=levels)
             if t.split == "test"]
    system, demo = VARIANTS[args.variant]
    config = TerminalConfig(max_turns=args.max_turns)
    config = replace(config, system_prompt=system or config.system_prompt,
                     demonstration_messages=demo or config.demonstration_messages,
                     repeat_notice=args.variant == "repeat_notice")
    meta = {"model": model_dir.name, "dtype": dtype, "device": args.device, "max_turns": args.max_turns,
            "max_new_tokens": args.max_new_tokens, "variant": args.variant, "commit": commit(), "cpu": cpu["model"],
            "cpu_flags": " ".join(cpu["flags"]), "threads": torch.get_num_threads()}
    modes = ([] if args.no_greedy else [("greedy", 0.0, 1)]) + ([("sampled", args.temperature, args.samples)]
                                                                if args.samples > 0 else [])
    start = time.perf_counter()
    episodes = []  # (mode, sample, task, episode)
    for mode, temperature, samples in modes:
        policy.temperature = temperature
        runs = [(mode, g, t) for t in tasks for g in range(samples)]
        if args.batch <= 1:
            for mode_, g, task in runs:
                ep = run_episode(TerminalEnv(config), task, policy)
                episodes.append((mode_, g, task, ep))
                print(f"[{len(episodes)}] {mode_} L{task.level} {task.family:15s} {'PASS' if ep.passed else 'fail'} "
                      f"{ep.end_reason[:40]:40s} turns={ep.turns_used} {time.perf_counter() - start:7.1f}s", flush=True)
        else:
            for i in range(0, len(runs), args.batch):
                chunk = runs[i:i + args.batch]
                eps = run_episodes(lambda: TerminalEnv(config), [t for _, _, t in chunk], policy.generate_batch)
                episodes += [(m, g, t, ep) for (m, g, t), ep in zip(chunk, eps)]
                print(f"[{len(episodes)}/{len(runs)}] {mode}: {sum(ep.passed for ep in eps)}/{len(eps)} passed "
                      f"{time.perf_counter() - start:7.1f}s", flush=True)
    wall = time.perf_counter() - start

    suffix = f"_{args.tag}" if args.tag else ""
    args.out.mkdir(parents=True, exist_ok=True)
    ep_suffix = f"_{args.episodes_tag}" if args.episodes_tag else suffix
    with open(args.out / f"terminal_base{ep_suffix}_episodes.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        head = ["task_id", "level", "family", "passed", "end_reason", "turns", "format_errors", "commands"]
        w.writerow((["variant", "mode", "sample"] if args.tag else []) + head)
        for mode, g, task, ep in episodes:
            w.writerow(([args.variant, mode, g] if args.tag else []) + [
                task.task_id, task.level, task.family, int(ep.passed), ep.end_reason, ep.turns_used,
                sum(1 for t in ep.turns if t.action is None),
                " || ".join((t.action or "<format error>").replace("\n", "; ")[:80] for t in ep.turns)])
    rows = []
    for mode, temperature, samples in modes:
        for level in levels:
            eps = [(t, ep) for m, _, t, ep in episodes if m == mode and t.level == level]
            k, n = sum(ep.passed for _, ep in eps), len(eps)
            lo, hi = wilson(k, n)
            turns = sum(ep.turns_used for _, ep in eps)
            ends = Counter(end_kind(ep.end_reason) for _, ep in eps)
            per_task = Counter(t.task_id for t, ep in eps if ep.passed)
            ntasks = len({t.task_id for t, _ in eps})
            row = {"level": level, "n": n, "passed": k, "success": round(k / n, 4), "wilson_lo": round(lo, 4),
                   "wilson_hi": round(hi, 4), "mean_turns": round(turns / n, 2),
                   "format_error_turns": round(sum(1 for _, ep in eps for t in ep.turns if t.action is None) / max(1, turns), 4),
                   "submitted": ends["submitted"], "turn_limit": ends["turn_limit"], "hostile": ends["hostile"],
                   "error": ends["error"]}
            if args.tag:
                row = {"variant": args.variant, "mode": mode, "temperature": temperature, "samples": samples, **row,
                       "tasks": ntasks, "tasks_any_pass": len(per_task),
                       "mixed_groups": sum(1 for c in per_task.values() if 0 < c < samples)}
            rows.append({**row, **meta, "wall_s": round(wall, 1)})
    out_csv = args.out / f"terminal_base{suffix}.csv"
    append = bool(args.tag) and out_csv.exists()
    with open(out_csv, "a" if append else "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        if not append:
            w.writeheader()
        w.writerows(rows)
    for r in rows:
        print(f"{r.get('mode', 'greedy')} level {r['level']}: {r['passed']}/{r['n']} = {r['success']:.1%} "
              f"[{r['wilson_lo']:.1%}, {r['wilson_hi']:.1%}]  turns {r['mean_turns']}  format errors "
              f"{r['format_error_turns']:.0%}  submitted {r['submitted']} turn_limit {r['turn_limit']} "
              f"hostile {r['hostile']} error {r['error']}  mixed groups {r.get('mixed_groups', '-')}/{r.get('tasks', '-')}")
    print(f"wall {wall:.0f} s on {cpu['model']} ({' '.join(cpu['flags'])}), {dtype}, commit {meta['commit']}")


if __name__ == "__main__":
    main()
