"""Gateway latency while an idle window trains, against the same gateway idle; and how fast a window yields.

One run, one ``tentalis serve --no-auth`` subprocess, one model, the same chat requests (temperature 0):

* **idle**: ``requests`` calls one after another with nothing else running: p50 and p95 latency;
* **windows**: ``windows`` times, an idle window trains in its own process (``run_window``, the code the
  ``training_windows`` asset runs, on hand-written trajectories of the same tokenizer, many iterations
  so it would train for minutes), and once it has saved progress a burst of ``requests / windows``
  calls arrives. The first call of each burst meets the training run, which yields; the window's
  process exit is timed from that call (``yield_s``). p50/p95 are over every call of every burst.

The must-hold: windows p95 <= 1.2 x idle p95, and every yield within 30 s.
``python -m bench.idle_bench [--tiny] [--requests 24] [--windows 3]`` prints the JSON and writes it to ``--out``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPTS = ("What is 17 + 25? Answer with the number.", "Name a prime number greater than 10.",
           "Write one sentence about the sea.", "What is the capital of France?")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of a non-empty list."""
    xs = sorted(values)
    return xs[max(0, min(len(xs) - 1, int(-(-q * len(xs) // 100)) - 1))]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_trajectories(home: Path, model_dir: Path, batches: int) -> None:
    from transformers import AutoTokenizer

    from tentalis_pipelines.lakehouse import Lakehouse, now_utc
    from tentalis_pipelines.settings import Paths

    tok = AutoTokenizer.from_pretrained(model_dir)
    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    now = now_utc()
    for b in range(batches):
        rollouts, trajectories = [], []
        for i, (text, adv) in enumerate(((" <answer>42</answer>", 1.0), (" 41, I think", -1.0), (" The answer is 42.", 0.5), (" no", -0.5))):
            rid, ids = f"b{b}-r{i}", tok(text, add_special_tokens=False)["input_ids"]
            rollouts.append({"batch_id": f"b{b}", "rollout_id": rid, "task_id": "t", "group_index": i, "policy_version": "base",
                             "prompt_text": PROMPTS[b % len(PROMPTS)], "completion": text, "steps": [], "completion_token_ids": ids,
                             "sampling_logprobs": [-1.0] * len(ids), "temperature": 1.0, "created_at": now})
            trajectories.append({"batch_id": f"b{b}", "rollout_id": rid, "task_id": "t", "group_index": i, "policy_version": "base",
                                 "reward": adv, "outcome_reward": float(adv > 0), "advantage": adv, "kept": True, "created_at": now})
        lake.write_batch("rollouts", f"b{b}", rollouts)
        lake.write_batch("trajectories", f"b{b}", trajectories)


def window_worker(home: str, model_dir: str, idle_since_ns: str) -> None:
    """One idle window in this process (what the ``training_windows`` asset runs), told the activity
    stamp seen before it started, as the sensor tells it."""
    from tentalis_pipelines.activity import activity_path
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.policy import PolicySettings
    from tentalis_pipelines.settings import Paths
    from tentalis_pipelines.stages.idle_window import run_window
    from tentalis_pipelines.training.trainer import GRPOConfig

    paths = Paths.from_env(home).ensure()
    cfg = GRPOConfig(num_iterations=1000, per_step_rows=8, device="cpu")
    out = run_window(Lakehouse(paths.lakehouse), paths, PolicySettings(model=model_dir), cfg, promote=False,
                     activity_file=activity_path(paths.home), idle_since_ns=int(idle_since_ns), progress_every=1,
                     background=True)
    print(json.dumps(out.metadata, default=str))


def idle_benchmark(model_dir: Path, *, requests: int = 24, windows: int = 3, max_tokens: int = 16, home: Path | None = None) -> dict:
    from openai import OpenAI

    from tentalis_pipelines.activity import activity_path, last_activity_ns
    from tentalis_pipelines.hardware import host_cpu
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.settings import Paths
    from tentalis_pipelines.stages.idle_window import progress_path

    home = Path(home or tempfile.mkdtemp(prefix="tentalis-idle-bench-"))
    env = {k: v for k, v in os.environ.items() if k != "TENTALIS_LAKEHOUSE_URI"} | {"TENTALIS_HOME": str(home)}
    _write_trajectories(home, model_dir, batches=4)
    port = _port()
    with open(home / "serve.log", "ab") as log:
        serve = subprocess.Popen([sys.executable, "-m", "tentalis_pipelines.cli", "serve", "--no-auth", "--port", str(port), "--model",
                                  str(model_dir), "--poll-seconds", "0", "--home", str(home)], env=env, stdout=log, stderr=subprocess.STDOUT)
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=300)

    def call(i: int) -> float:
        t = time.perf_counter()
        client.chat.completions.create(model="tentalis", temperature=0, max_tokens=max_tokens,
                                       messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}])
        return time.perf_counter() - t

    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                call(0)
                break
            except Exception:  # noqa: BLE001 - not up yet
                if serve.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"tentalis serve did not start: {(home / 'serve.log').read_text()[-2000:]}") from None
                time.sleep(0.5)
        for i in range(3):  # warm-up
            call(i)
        idle = [call(i) for i in range(requests)]
        during, yields, recorded = [], [], []
        burst = max(1, requests // windows)
        for w in range(windows):
            # The gateway stamps a request's end after the client has its reply: let that stamp land first,
            # or the window sees it as a request that came after the idle time it was started for.
            time.sleep(1.0)
            stamp, started = last_activity_ns(activity_path(home)), time.time()
            worker = subprocess.Popen([sys.executable, "-m", "bench.idle_bench", "--worker", str(home), str(model_dir), str(stamp)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            deadline = time.monotonic() + 600
            saved = progress_path(Paths.from_env(home))
            # Training has begun once this window saved progress (an earlier window's file does not count).
            while (not saved.exists() or saved.stat().st_mtime < started) and worker.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)  # training for a while
            if worker.poll() is not None:
                raise RuntimeError(f"window {w} ended before a request came: {worker.stdout.read()[-2000:]}")
            t_first = time.perf_counter()
            for i in range(burst):
                during.append(call(i))
                if i == 0:
                    worker.wait(timeout=120)
                    yields.append(time.perf_counter() - t_first)
            meta = json.loads(worker.stdout.read().strip().splitlines()[-1])
            recorded.append(meta.get("yield_seconds"))
            time.sleep(0.5)
        rows = Lakehouse(Path(home) / "lakehouse").read("training_windows").to_pylist()
    finally:
        serve.terminate()
        serve.wait(timeout=60)
    ms = lambda xs, q: round(percentile(xs, q) * 1000, 1)  # noqa: E731
    return {
        "host_cpu": host_cpu(), "model": str(model_dir), "requests_idle": len(idle), "requests_during_windows": len(during),
        "windows": windows, "max_tokens": max_tokens,
        "idle_p50_ms": ms(idle, 50), "idle_p95_ms": ms(idle, 95), "window_p50_ms": ms(during, 50), "window_p95_ms": ms(during, 95),
        "p95_ratio": round(percentile(during, 95) / percentile(idle, 95), 3),
        "first_request_ms": [round(during[k * burst] * 1000, 1) for k in range(windows)],
        "yield_s_process_exit": [round(y, 3) for y in yields], "yield_s_recorded": recorded,
        "window_outcomes": [r["outcome"] for r in sorted(rows, key=lambda r: r["started_at"])],
        "window_steps": [r["steps"] for r in sorted(rows, key=lambda r: r["started_at"])],
    }


def main(argv: list[str]) -> None:
    import argparse

    if argv[:1] == ["--worker"]:
        return window_worker(argv[1], argv[2], argv[3])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="the tiny random Llama (seconds) instead of the embedded SmolLM2")
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    from tentalis_pipelines.inference.models import build_tiny_llama, resolve_model
    from tentalis_pipelines.settings import Paths

    models = Paths.from_env().models
    model_dir = resolve_model("embedded", models)
    if a.tiny:
        model_dir = build_tiny_llama(model_dir, models / "tiny-llama")
    result = idle_benchmark(model_dir, requests=a.requests, windows=a.windows, max_tokens=a.max_tokens)
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
