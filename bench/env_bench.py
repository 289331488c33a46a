"""Environment overhead per terminal episode, no model: reset (a fresh sandbox with the task's tree), 8
scripted turns (exploring commands, then the task's own solution ending in ``submit``) and the final
check, timed end to end (``run_episode``). The issue's target: p95 <= 2 s per episode on this machine.
``--env swe``: the same for mini-SWE episodes (the exploring commands include a test run; the final
check runs the tests in a second, fresh sandbox).

    PYTHONPATH=. .venv/bin/python -m bench.env_bench --episodes 60 [--env swe]   # prints JSON with the host CPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from tentalis_pipelines.envs.agents import scripted_agent
from tentalis_pipelines.envs.base import SUBMITTED
from tentalis_pipelines.envs.runner import run_episode
from tentalis_pipelines.envs.swe import SweEnv
from tentalis_pipelines.envs.swe_tasks import load_catalogue
from tentalis_pipelines.envs.terminal import TerminalConfig, TerminalEnv
from tentalis_pipelines.envs.terminal_tasks import generate_tasks
from tentalis_pipelines.hardware import host_cpu
from tentalis_pipelines.sandbox import check_sandbox

EXPLORE = ["ls -la", "find . -type f | head -n 20", "wc -l $(find . -type f | head -n 5) 2>/dev/null",
           "cat $(find . -type f | head -n 1)", "pwd; id -u", "du -sk .", "head -n 3 $(find . -type f | head -n 2)"]
SWE_EXPLORE = ["ls -la", "python3 run_tests.py", "grep -n 'def ' *.py | head -n 20", "head -n 30 $(ls *.py | head -n 1)",
               "cat test_*.py | head -n 20"]


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def bench(episodes: int, turns: int = 8, env_name: str = "terminal") -> dict:
    check_sandbox()  # its one-off probe is not part of an episode
    if env_name == "swe":
        from tentalis_pipelines.envs.swe import SweConfig, swe_terminal_config

        tasks, env, explore = load_catalogue(), SweEnv(SweConfig(terminal=swe_terminal_config(turns))), SWE_EXPLORE
    elif env_name == "terminal":
        tasks, env, explore = generate_tasks(), TerminalEnv(TerminalConfig(max_turns=turns)), EXPLORE
    else:
        raise SystemExit(f"--env {env_name!r}: choose terminal or swe")
    totals, resets, steps, finals = [], [], [], []
    for i in range(episodes):
        task = tasks[(i * 37) % len(tasks)]  # all three levels
        commands = explore[: max(0, turns - len(task.solution))] + list(task.solution)
        t0 = time.perf_counter()
        ep = run_episode(env, task, scripted_agent(commands))
        totals.append(time.perf_counter() - t0)
        if not (ep.passed and ep.end_reason == SUBMITTED and ep.turns_used == len(commands)):
            raise SystemExit(f"episode {i} ({task.task_id}) did not pass: {ep.end_reason} {ep.verdict.detail}")
        steps.extend(t.seconds_env for t in ep.turns[:-1])
        finals.append(ep.turns[-1].seconds_env)  # the submitting step: command, final tree read, check, close
        resets.append(totals[-1] - sum(t.seconds_env for t in ep.turns))
    ms = lambda xs, q: round(1000 * percentile(xs, q), 1)  # noqa: E731
    return {
        "what": f"{env_name} episode overhead: reset + {turns} scripted turns + final check, no model",
        "episodes": episodes,
        "turns_per_episode": turns,
        "episode_p50_s": round(percentile(totals, 0.5), 3),
        "episode_p95_s": round(percentile(totals, 0.95), 3),
        "episode_max_s": round(max(totals), 3),
        "episode_mean_s": round(statistics.mean(totals), 3),
        "reset_and_runner_p50_ms": ms(resets, 0.5),
        "reset_and_runner_p95_ms": ms(resets, 0.95),
        "step_p50_ms": ms(steps, 0.5),
        "step_p95_ms": ms(steps, 0.95),
        "final_step_p50_ms": ms(finals, 0.5),
        "final_step_p95_ms": ms(finals, 0.95),
        "target_p95_s": 2.0,
        "meets_target": percentile(totals, 0.95) <= 2.0,
        "host_cpu": host_cpu(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=60)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--env", default="terminal", help="terminal | swe")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args()
    result = bench(args.episodes, args.turns, args.env)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
