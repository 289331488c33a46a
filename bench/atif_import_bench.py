"""Time `tentalis episodes import` of a large ATIF file (issue 73: a 1,500-trajectory file, 17 MB, must
land in under a minute, all or nothing).

The file is generated here: trajectories shaped like Tentalis's own export (system prompt, instruction,
then agent steps with a ``bash`` tool call, its observation, and the turn's prompt and completion token
ids and log-probs; each prompt extends the last context, as ChatPolicy's do), with a verdict in
``extra.tentalis`` so every trajectory lands a review too. The import runs through the CLI in a fresh
home, once; the figure printed is its wall time, with the host CPU and the command.

    .venv/bin/python -m bench.atif_import_bench                      # 1,500 trajectories, 4 turns each
    .venv/bin/python -m bench.atif_import_bench --trajectories 200 --turns 2
"""

from __future__ import annotations

import argparse
import random
import shlex
import sys
import tempfile
import time
from pathlib import Path

from tentalis_pipelines.envs import atif
from tentalis_pipelines.hardware import host_cpu

VOCAB = 49152  # SmolLM2's: every generated id is below it


def trajectory(k: int, turns: int, rng: random.Random) -> dict:
    """One trajectory as `tentalis episodes export` writes it (about 14 KB at 4 turns)."""
    system, instruction = "You are a careful shell agent. Submit with `submit`.", f"Task {k}: make the tests in /work pass."
    context = [rng.randrange(VOCAB) for _ in range(120)]
    steps: list[dict] = [
        {"step_id": 1, "source": "system", "message": system, "extra": {"tentalis": {"message": {"role": "system", "kind": "system"}}}},
        {"step_id": 2, "source": "user", "message": instruction, "extra": {"tentalis": {"message": {"role": "user", "kind": "instruction"}}}},
    ]
    for t in range(turns):
        command = f"sed -n '{t + 1},{t + 40}p' src/module_{k}.py"
        completion = [rng.randrange(VOCAB) for _ in range(40)]
        observation = "\n".join(f"{n:4d}  value_{n} = compute({n}, {k})" for n in range(t + 1, t + 12))
        steps.append({
            "step_id": len(steps) + 1, "timestamp": "2026-12-01T10:00:00+00:00", "source": "agent", "model_name": "bench",
            "message": f"Looking at lines {t + 1}-{t + 40}.\n```bash\n{command}\n```",
            "tool_calls": [{"tool_call_id": f"call_{t}", "function_name": "bash", "arguments": {"command": command}}],
            "observation": {"results": [{"source_call_id": f"call_{t}", "content": observation}]},
            "metrics": {"prompt_tokens": len(context), "completion_tokens": len(completion), "prompt_token_ids": list(context),
                        "completion_token_ids": completion, "logprobs": [round(-rng.random() * 3, 6) for _ in completion]},
            "extra": {"tentalis": {"finish_reason": "stop", "action": command, "info": {"exit_code": 0},
                                   "seconds_policy": 0.5, "seconds_env": 0.1,
                                   "observation_messages": [{"role": "user", "kind": "observation"}]}},
        })
        context = context + completion + [rng.randrange(VOCAB) for _ in range(20)]  # the next prompt extends this one
    passed = rng.random() < 0.5
    return {"schema_version": atif.SCHEMA_VERSION, "session_id": f"bench-{k:05d}",
            "agent": {"name": "tentalis", "version": "0", "model_name": "bench"}, "steps": steps,
            "final_metrics": {"total_steps": len(steps)},
            "extra": {"tentalis": {"environment": "terminal", "task_id": f"task-{k}", "end_reason": "submitted", "reward": float(passed),
                                   "max_turns": turns, "verdict": {"passed": passed, "reward": float(passed), "detail": "bench"},
                                   "policy_version": "base", "temperature": 1.0, "backend": "transformers"}}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trajectories", type=int, default=1500)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="atif-bench-") as tmp:
        path = Path(tmp) / "trajectories.jsonl"
        atif.write_atif((trajectory(k, args.turns, rng) for k in range(args.trajectories)), path)
        home = Path(tmp) / "home"
        cmd = [sys.executable, "-m", "tentalis_pipelines.cli", "episodes", "import", str(path), "--home", str(home),
               "--vocab-size", str(VOCAB)]
        import subprocess

        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        if done.returncode != 0:
            sys.exit(f"import failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        cpu = host_cpu()
        print(f"host CPU: {cpu['model'] or 'unknown'} ({cpu['cpus']} cores)")
        print(f"command: {shlex.join(cmd)}")
        print(done.stdout.strip())
        print(f"{args.trajectories} trajectories x {args.turns} turns, {path.stat().st_size / 1e6:.1f} MB: "
              f"import {seconds:.1f} s (wall, the CLI process whole: start-up, validation, landing)")


if __name__ == "__main__":
    main()
