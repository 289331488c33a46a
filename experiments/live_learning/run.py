"""Learning from live work, shown: a user and a manager over the real gateway, the normal machinery trains.

The script starts ``tentalis serve`` (the embedded SmolLM2-135M-Instruct) as a subprocess and plays two
parts with the official ``openai`` client:

* **the user** asks level-1 arithmetic questions (``tasks/arithmetic.py``), one question per chat session
  (``X-Session-Id``), each training question in ``--per-question`` sessions so the sessions of a question
  form a GRPO group (a *family*: same first-call messages, ``training/multiturn.py``);
* **the manager** wants one-line replies: one line that states the result and ends by itself (the base
  model, asked plainly, mostly explains at length past the token limit) and reviews every training session through ``POST /v1/reviews``: a
  score (:func:`manager_review`), a critique and a hint saying what it wants.

Then the normal machinery trains on the reviewed sessions: the ``fresh_sessions`` sensor (evaluated on a
real Dagster instance, settle time 0) cuts them into a ``sessions-…`` task batch, ``rollout_job`` builds
the batch's multi-turn trajectories, ``train_job`` trains a LoRA checkpoint on them (trainer
``promotion=always`` for this experiment: no benchmark gate, the new checkpoint serves at once), and the
gateway switches to the promoted checkpoint (it polls the serving pointer). After every round a fixed
held-out set of sessions (other questions, greedy) is asked through the gateway and scored by the same
rule; every round is one row of ``--csv`` (compliance rate with its Wilson 95% interval, and the paired
difference against round 0 with a bootstrap 95% interval).

    .venv/bin/python scripts/live_learning.py --home /tmp/live-learning --rounds 5   # README: "Learning from live work"
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from tentalis_pipelines.statistics import paired_bootstrap, wilson_interval

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

STYLE = "one line"
_NUMBER = re.compile(r"-?\d+")
CRITIQUE_OK = "One line with the result, as I want it."
CRITIQUE_BAD = "Too long: I want a one-line reply that states the result, and nothing after it."
HINT = "Answer in one short line that states the result, e.g. 'Ben has 3 + 6 = 9 stickers.', then stop."
RUBRIC = "style: the reply is one line that states a number and ends by itself, not cut at max_tokens (0.8); correct: its last number is the right result (0.2)"
HELDOUT_SEED = 1_000_000  # the held-out tasks' seed; training rounds use seeds 1000 * --seed + 1..rounds


def manager_review(reply: str, reference: int, finished: bool) -> dict:
    """The manager's rule. ``styled``: the reply ended by itself (``finished``: finish_reason "stop", not
    cut at ``max_tokens``), is one line (no line break once stripped) and states a number. ``correct``:
    the reply's last number equals the reference. Score = 0.8 styled + 0.2 correct: brevity is what this
    manager mostly wants, and a right result still counts a little."""
    text = (reply or "").strip()
    numbers = _NUMBER.findall(text)
    styled = bool(finished and text and "\n" not in text and numbers)
    correct = bool(numbers) and int(numbers[-1]) == reference
    score = round(0.8 * styled + 0.2 * correct, 4)
    critique = CRITIQUE_OK if styled else CRITIQUE_BAD
    if not correct:
        critique += f" And the result is {reference}."
    return {"score": score, "styled": styled, "correct": correct, "critique": critique, "hint": "" if styled else HINT}


# --------------------------------------------------------------------------- the gateway
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gateway:
    def __init__(self, home: Path, dtype: str):
        self.home, self.dtype = home, dtype
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 180) -> Gateway:
        import httpx

        log = open(self.home / f"serve-{self.port}.log", "ab")  # noqa: SIM115 (the subprocess keeps it)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tentalis_pipelines.cli", "serve", "--port", str(self.port), "--no-auth",
             "--poll-seconds", "1", "--dtype", self.dtype], env={**os.environ, "TENTALIS_HOME": str(self.home)},
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tentalis serve exited; see {log.name}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"tentalis serve did not come up; see {log.name}")

    def health(self) -> dict:
        import httpx

        return httpx.get(self.url + "/health", timeout=30).json()

    def wait_flushed(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while self.health()["wal_pending"]:
            if time.monotonic() > deadline:
                raise TimeoutError("the gateway's WAL did not flush")
            time.sleep(0.2)

    def wait_policy(self, version: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while self.health()["policy_version"] != version:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the gateway did not switch to {version}: {self.health()}")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def ask(client, session_id: str, question: str, *, temperature: float, max_tokens: int, seed: int | None = None) -> tuple[str, bool]:
    """The user: one question in its own chat session. Returns the reply and whether it ended by itself."""
    reply = client.chat.completions.create(
        model="tentalis", messages=[{"role": "user", "content": question}], temperature=temperature, max_tokens=max_tokens,
        seed=seed, extra_headers={"X-Session-Id": session_id})
    choice = reply.choices[0]
    return choice.message.content or "", choice.finish_reason == "stop"


def evaluate(client, tasks, tag: str, *, max_tokens: int) -> list[dict]:
    """The held-out sessions (greedy): each reply scored by the manager's rule, not reviewed (never trained on)."""
    out = []
    for t in tasks:
        text, finished = ask(client, f"heldout-{tag}-{t.task_id}", t.prompt, temperature=0.0, max_tokens=max_tokens)
        out.append({"task_id": t.task_id, "reply": text, **manager_review(text, t.answer, finished)})
    return out


# --------------------------------------------------------------------------- the machinery
def train_on_reviewed_sessions(max_tokens: int) -> dict:
    """The fresh_sessions sensor's cut, then rollout_job on the batch and train_job (promotion=always)."""
    from dagster import DagsterInstance, build_sensor_context

    from assets.resources import LakehouseResource, ReviewResource
    from jobs.runner import run_job
    from jobs.sensors import fresh_sessions
    from tentalis_pipelines.definitions import defs

    config = {"resources": {"policy": {"config": {"max_new_tokens": max_tokens}}, "trainer": {"config": {"promotion": "always"}}},
              "loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
    timings = {}
    with DagsterInstance.get() as instance:
        t0 = time.time()
        ctx = build_sensor_context(instance=instance, resources={"lakehouse": LakehouseResource(home=os.environ["TENTALIS_HOME"]), "review": ReviewResource()})
        result = fresh_sessions(ctx)
        for req in result.dynamic_partitions_requests or []:
            instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        batches = [req.partition_key for req in result.run_requests or []]
        if not batches:
            raise RuntimeError(f"fresh_sessions cut nothing: {result.skip_data}")
        for req in result.run_requests:
            run_job(defs, instance, "rollout_job", partition_key=req.partition_key, run_config=config,
                    tags={**req.tags, "dagster/run_key": req.run_key, "tentalis/trigger": "live-learning"})
        timings["rollout_job_s"] = time.time() - t0
        t1 = time.time()
        run_job(defs, instance, "train_job", run_config=config, tags={"tentalis/trigger": "live-learning"})
        timings["train_job_s"] = time.time() - t1
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.settings import Paths

    lake = Lakehouse(Paths.from_env(None).lakehouse)
    rows = sorted(lake.read("checkpoints").to_pylist(), key=lambda r: r["created_at"])
    return {"batches": batches, "checkpoint_id": rows[-1]["checkpoint_id"], "metrics": json.loads(rows[-1]["metrics"] or "{}"), **timings}


def plot(csv_path: Path, png_path: Path) -> Path:
    """Held-out compliance per round with Wilson 95% intervals, one line per run of the latest run's label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    label = rows[-1]["label"]
    runs: dict[str, list[dict]] = {}
    for r in rows:
        if r["label"] == label:
            runs.setdefault(r["started"], []).append(r)
    fig, ax = plt.subplots(figsize=(4.8, 3.2), dpi=100)
    for i, latest in enumerate(runs.values()):
        x = [int(r["round"]) + 0.06 * i for r in latest]
        rate = [float(r["rate"]) for r in latest]
        err = [[v - float(r["ci_low"]) for v, r in zip(rate, latest)], [float(r["ci_high"]) - v for v, r in zip(rate, latest)]]
        ax.errorbar(x, rate, yerr=err, fmt="o-", capsize=4, label=f"seed {latest[0].get('seed', '?')}: style (Wilson 95%)")
        ax.plot(x, [float(r["heldout_correct"]) for r in latest], "s--", alpha=0.5, label=f"seed {latest[0].get('seed', '?')}: correct")
    ax.set_xticks(sorted({int(r["round"]) for rs in runs.values() for r in rs}))
    ax.set(ylim=(0, 1), xlabel="round (0 = base policy)", ylabel="held-out rate",
           title=f"live sessions, held-out n={rows[-1]['heldout_n']} (greedy)")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png_path)
    plt.close(fig)
    return png_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--home", default=None, help="TENTALIS_HOME for the experiment (a fresh folder: base policy)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--questions", type=int, default=6, help="training questions per round")
    ap.add_argument("--per-question", type=int, default=4, help="sessions per training question (the GRPO group)")
    ap.add_argument("--heldout", type=int, default=32, help="held-out questions (seed 1,000,000, level 1)")
    ap.add_argument("--temperature", type=float, default=1.0, help="the user's sampling temperature in training sessions")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--csv", default=str(HERE / "live_learning.csv"))
    ap.add_argument("--seed", type=int, default=0, help="training questions of round r come from generator seed 1000 * seed + r")
    ap.add_argument("--label", default="", help="recorded with every row")
    ap.add_argument("--png", default=str(HERE / "live_learning.png"), help="the latest run's curve")
    ap.add_argument("--plot-only", action="store_true", help="only redraw --png from --csv's latest run")
    ap.add_argument("--probe", action="store_true", help="only measure the base rate (held-out, greedy, and sampled)")
    args = ap.parse_args(argv)

    if args.plot_only:
        print(plot(Path(args.csv), Path(args.png)))
        return 0
    if not args.home:
        ap.error("--home is required (a fresh folder)")
    home = Path(args.home).resolve()
    # One torch thread in the gateway and in training: on a shared 2-core machine two threads each
    # oversubscribe and ran 4x slower per token here.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["TENTALIS_HOME"] = str(home)
    os.environ["TENTALIS_SESSION_SETTLE_SECONDS"] = "0"  # the script's sessions are finished when it reviews them
    from tentalis_pipelines.cli.common import home_paths

    paths = home_paths(str(home))  # the home folder and its Dagster instance (DAGSTER_HOME)
    if not args.probe and (paths.lakehouse / "checkpoints").exists():
        ap.error(f"{home} already has checkpoints: round 0 must be the base policy, so give a fresh --home")
    from openai import OpenAI

    from tentalis_pipelines.tasks.arithmetic import generate_arithmetic

    heldout = generate_arithmetic(args.heldout, seed=HELDOUT_SEED, levels=(1,), prefix="heldout")
    gw = Gateway(home, args.dtype).start()
    client = OpenAI(base_url=gw.url + "/v1", api_key="unused", timeout=600)
    try:
        if args.probe:
            t0 = time.time()
            greedy = evaluate(client, heldout, "probe", max_tokens=args.max_tokens)
            sampled = [manager_review(*ask(client, f"probe-s-{t.task_id}", t.prompt, temperature=args.temperature,
                                           max_tokens=args.max_tokens), t.answer) for t in heldout]
            for name, rows in (("greedy", greedy), (f"T={args.temperature}", sampled)):
                k = sum(r["styled"] for r in rows)
                print(f"{name}: styled {k}/{len(rows)}  correct {sum(r['correct'] for r in rows)}/{len(rows)}")
            for r in greedy[:4]:
                print(repr(r["reply"]))
            print(f"{time.time() - t0:.0f} s")
            return 0
        return run_rounds(args, gw, client, heldout)
    finally:
        gw.stop()


def run_rounds(args, gw: Gateway, client, heldout) -> int:
    import httpx

    from tentalis_pipelines.tasks.arithmetic import generate_arithmetic

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    if subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, cwd=ROOT).stdout.strip():
        commit += "+dirty"
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    csv_path = Path(args.csv)
    fields = ["started", "commit", "label", "seed", "round", "policy_version", "train_sessions", "train_styled_rate", "train_score_mean",
              "heldout_n", "rate", "ci_low", "ci_high", "diff_vs_round0", "diff_ci_low", "diff_ci_high", "heldout_correct",
              "sessions_s", "rollout_job_s", "train_job_s", "switch_s", "eval_s", "round_s"]
    new_file = not csv_path.exists()
    t_start = time.time()
    base: list[int] = []
    for rnd in range(args.rounds + 1):
        t_round = time.time()
        row = {"started": started, "commit": commit, "label": args.label, "seed": args.seed, "round": rnd}
        if rnd > 0:
            # The user asks, the manager reviews: per_question sessions per question (a GRPO family).
            t0 = time.time()
            scores = []
            for t in generate_arithmetic(args.questions, seed=1000 * args.seed + rnd, levels=(1,), prefix=f"train-s{args.seed}-r{rnd}"):
                for k in range(args.per_question):
                    sid = f"train-r{rnd}-{t.task_id}-{k}"
                    reply, finished = ask(client, sid, t.prompt, temperature=args.temperature, max_tokens=args.max_tokens)
                    review = manager_review(reply, t.answer, finished)
                    scores.append(review)
                    httpx.post(gw.url + "/v1/reviews", timeout=60, json={
                        "session_id": sid, "score": review["score"], "critique": review["critique"], "hint": review["hint"],
                        "reviewer": "style-manager", "rubric": RUBRIC}).raise_for_status()
            gw.wait_flushed()
            row.update(train_sessions=len(scores), train_styled_rate=round(sum(s["styled"] for s in scores) / len(scores), 4),
                       train_score_mean=round(sum(s["score"] for s in scores) / len(scores), 4), sessions_s=round(time.time() - t0, 1))
            trained = train_on_reviewed_sessions(args.max_tokens)
            row.update(rollout_job_s=round(trained["rollout_job_s"], 1), train_job_s=round(trained["train_job_s"], 1))
            t0 = time.time()
            gw.wait_policy(trained["checkpoint_id"])
            row["switch_s"] = round(time.time() - t0, 1)
        t0 = time.time()
        version = gw.health()["policy_version"]
        results = evaluate(client, heldout, f"r{rnd}", max_tokens=args.max_tokens)
        styled = [int(r["styled"]) for r in results]
        if rnd == 0:
            base = styled
        k, n = sum(styled), len(styled)
        lo, hi = wilson_interval(k, n)
        d, dlo, dhi = paired_bootstrap(styled, base, n_boot=10_000)
        row.update(policy_version=version, heldout_n=n, rate=round(k / n, 4), ci_low=round(lo, 4), ci_high=round(hi, 4),
                   diff_vs_round0=round(d, 4), diff_ci_low=round(dlo, 4), diff_ci_high=round(dhi, 4),
                   heldout_correct=round(sum(r["correct"] for r in results) / n, 4), eval_s=round(time.time() - t0, 1),
                   round_s=round(time.time() - t_round, 1))
        print(json.dumps(row), flush=True)
        print(f"  e.g. {results[0]['reply']!r}", flush=True)
        with open(csv_path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            if new_file:
                w.writeheader()
                new_file = False
            w.writerow(row)
    print(f"{args.rounds} round(s) in {time.time() - t_start:.0f} s; curve: {plot(csv_path, Path(args.png))}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
