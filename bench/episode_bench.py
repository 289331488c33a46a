"""A terminal learning cycle's episode decoding, today's decoder against the one before, side by side.

The workload is a level-0 terminal cycle's episodes (issue 74): ``--tasks`` level-0 training tasks x
``--episodes`` sampled episodes each (``--turns`` turns, ``--temperature``, ``--seed``, the policy's
``--max-new-tokens``), then one greedy episode per held-out level-0 task (``--held-out``). Both sides run
the same tasks, seeds and model in the same precision, each in its own subprocess, so that each one's
peak RSS is its own:

* ``old``: the lock-step policy before issue 74 (``bench/legacy_chat_policy.py``, a frozen copy: left
  padding, one KV cache for the whole batch);
* ``new``: ``envs.policies.ChatPolicy`` over the continuous-batching decoder (block mode, the KV budget's
  default or ``--kv-budget-mb``).

Reported per side: wall time of the sampled episodes (and their CPU time: the figure that compares when
other work shares the host) and of the greedy held-out ones, peak RSS (the
subprocess's ``ru_maxrss``), pass counts, the new side's decoder stats (peak KV bytes under its budget);
and whether the greedy held-out episodes are identical (every turn's token ids, and the verdicts). The
sampled episodes draw from other random streams on the two sides (the old policy shared one generator
per batch), so only their pass rates compare. The host CPU is written with the figures.

    PYTHONPATH=. .venv/bin/python -m bench.episode_bench                   # the default recipe (long: a quiet machine)
    PYTHONPATH=. .venv/bin/python -m bench.episode_bench --tasks 1 --episodes 2 --turns 2 --max-new-tokens 8 --held-out 1
    PYTHONPATH=. .venv/bin/python -m bench --parts episodes                # the same, within `python -m bench`
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIDES = ("old", "new")


def _level0(n_train: int, n_held_out: int, seed: int):
    """A level-0 cycle's training tasks (generator seed ``seed + 1``: never a held-out one) and the first
    ``n_held_out`` level-0 items of the terminal benchmark's held-out split."""
    from tentalis_pipelines.tasks.batches import terminal_held_out_tasks, terminal_training_tasks

    held = terminal_held_out_tasks((0,))[:n_held_out]
    if len(held) < n_held_out:
        raise SystemExit(f"level 0 has {len(held)} held-out tasks: ask for at most that many")
    return terminal_training_tasks(seed + 1, n_train, (0,)), held


def run_side(side: str, model_dir: Path, *, tasks: int, episodes: int, turns: int, max_new_tokens: int, temperature: float,
             seed: int, held_out: int, dtype: str, kv_budget_mb: float | None) -> dict:
    """One side's whole workload in this process (the parent runs each side in its own subprocess)."""
    import torch

    from tentalis_pipelines.envs.runner import run_episodes
    from tentalis_pipelines.envs.terminal import TerminalConfig, TerminalEnv
    from tentalis_pipelines.inference.transformers_backend import load_policy
    from tentalis_pipelines.sandbox import check_sandbox

    if side == "old":
        from bench.legacy_chat_policy import ChatPolicy
    elif side == "new":
        from tentalis_pipelines.envs.policies import ChatPolicy
    else:
        raise SystemExit(f"--side {side!r}: choose one of {', '.join(SIDES)}")
    check_sandbox()
    train, held = _level0(tasks, held_out, seed)
    model, tok = load_policy(model_dir, device="cpu", dtype=getattr(torch, dtype) if dtype != "auto" else "auto")
    extra = {}
    if side == "new" and kv_budget_mb is not None:
        extra["kv_budget_bytes"] = int(kv_budget_mb * 2**20)

    def env():
        return TerminalEnv(TerminalConfig(max_turns=turns))

    out: dict = {"side": side}
    sampled = ChatPolicy(model, tok, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, **extra)
    t0, c0 = time.perf_counter(), time.process_time()
    eps = run_episodes(env, [t for t in train for _ in range(episodes)], sampled.generate_batch)
    out["sampled_seconds"] = round(time.perf_counter() - t0, 3)
    out["sampled_cpu_seconds"] = round(time.process_time() - c0, 3)  # this process's CPU: comparable on a loaded host
    out["sampled_passed"] = sum(bool(e.passed) for e in eps)
    out["sampled_episodes"] = len(eps)
    out["sampled_tokens"] = sum(len(t.token_ids or []) for e in eps for t in e.turns)
    greedy = ChatPolicy(model, tok, max_new_tokens=max_new_tokens, temperature=0.0, seed=seed, **extra)
    t0 = time.perf_counter()
    geps = run_episodes(env, held, greedy.generate_batch)
    out["held_out_seconds"] = round(time.perf_counter() - t0, 3)
    out["held_out"] = [{"task_id": e.task_id, "passed": bool(e.passed), "end_reason": e.end_reason,
                        "turn_token_ids": [list(t.token_ids or []) for t in e.turns]} for e in geps]
    out["held_out_passed"] = sum(r["passed"] for r in out["held_out"])
    if side == "new":
        out["decoder_stats"] = {"sampled": sampled.stats, "held_out": greedy.stats}
    out["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)  # KiB on Linux
    return out


def episode_benchmark(model_dir: Path, *, tasks: int = 8, episodes: int = 8, turns: int = 4, max_new_tokens: int = 128,
                      temperature: float = 0.4, seed: int = 0, held_out: int = 8, dtype: str = "float32",
                      kv_budget_mb: float | None = None, threads: int | None = None) -> dict:
    """Both sides, each in a subprocess, old first; the comparison and the host CPU."""
    from tentalis_pipelines.hardware import host_cpu

    args = ["--model", str(model_dir), "--tasks", str(tasks), "--episodes", str(episodes), "--turns", str(turns),
            "--max-new-tokens", str(max_new_tokens), "--temperature", str(temperature), "--seed", str(seed),
            "--held-out", str(held_out), "--dtype", dtype]
    if kv_budget_mb is not None:
        args += ["--kv-budget-mb", str(kv_budget_mb)]
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    sides = {}
    with tempfile.TemporaryDirectory(prefix="tentalis-episode-bench-") as tmp:
        for side in SIDES:
            path = Path(tmp) / f"{side}.json"
            subprocess.run([sys.executable, "-m", "bench.episode_bench", "--side", side, "--json-out", str(path), *args],
                           check=True, env=env, cwd=root)
            sides[side] = json.loads(path.read_text())
    old, new = sides["old"], sides["new"]
    same = [a["turn_token_ids"] == b["turn_token_ids"] and a["passed"] == b["passed"]
            for a, b in zip(old["held_out"], new["held_out"], strict=True)]
    for side in (old, new):  # the comparison is made; the figures are what is kept
        for r in side["held_out"]:
            r["tokens"] = sum(len(t) for t in r.pop("turn_token_ids"))
    return {"machine": host_cpu(),
            "config": {"tasks": tasks, "episodes": episodes, "turns": turns, "max_new_tokens": max_new_tokens,
                       "temperature": temperature, "seed": seed, "held_out": held_out, "dtype": dtype,
                       "kv_budget_mb": kv_budget_mb, "threads": threads or os.environ.get("OMP_NUM_THREADS")},
            "old": old, "new": new,
            "sampled_wall_ratio_new_over_old": round(new["sampled_seconds"] / max(old["sampled_seconds"], 1e-9), 3),
            "sampled_cpu_ratio_new_over_old": round(new["sampled_cpu_seconds"] / max(old["sampled_cpu_seconds"], 1e-9), 3),
            "peak_rss_gb": {"old": old["peak_rss_gb"], "new": new["peak_rss_gb"]},
            "held_out_identical": all(same), "held_out_identical_episodes": sum(same)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="model folder (default: the embedded 135M model)")
    ap.add_argument("--tasks", type=int, default=8, help="level-0 training tasks")
    ap.add_argument("--episodes", type=int, default=8, help="sampled episodes per task (G)")
    ap.add_argument("--turns", type=int, default=4, help="turn limit per episode (level 0: 4)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.4, help="the terminal recipe's (TERMINAL_TEMPERATURE)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--held-out", type=int, default=8, help="held-out level-0 tasks decoded greedily")
    ap.add_argument("--dtype", default="float32", help="float32, bfloat16 or auto")
    ap.add_argument("--kv-budget-mb", type=float, default=None, help="the new side's KV budget (default: ChatPolicy's)")
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for both sides")
    ap.add_argument("--side", choices=SIDES, default=None, help="run one side here (what the parent runs in a subprocess)")
    ap.add_argument("--json-out", type=Path, default=None, help="write the JSON here as well as to stdout")
    a = ap.parse_args(argv)
    model = a.model
    if model is None:
        from tentalis_pipelines.inference.models import resolve_model
        from tentalis_pipelines.settings import Paths

        model = resolve_model("embedded", Paths.from_env(None).models)
    kw = {"tasks": a.tasks, "episodes": a.episodes, "turns": a.turns, "max_new_tokens": a.max_new_tokens,
          "temperature": a.temperature, "seed": a.seed, "held_out": a.held_out, "dtype": a.dtype, "kv_budget_mb": a.kv_budget_mb}
    if a.side is not None:
        result = run_side(a.side, model, **kw)
    else:
        result = episode_benchmark(model, threads=a.threads, **kw)
    text = json.dumps(result, indent=2)
    if a.json_out is not None:
        a.json_out.write_text(text)
    if a.side is None:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
