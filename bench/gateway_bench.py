"""What the gateway costs: ``tentalis serve`` next to calling the same backend in-process.

One run, same model, same prompts, same decode path on both sides:

* **Latency.** ``requests`` chat calls, one at a time, alternated: the direct side templates the
  messages with the gateway's own ``render_chat`` and decodes with the gateway's own ``sampler.decode``
  (what ``_decode_all`` does, under the policy's lock), on a policy loaded with the gateway's own
  ``load_policy_version``; the gateway side sends the same request through the official ``openai``
  client to a real ``tentalis serve --no-auth`` subprocess. The difference is the gateway's overhead:
  HTTP and JSON, validation, templating, the WAL append + fsync before the acknowledgement.
* **Turns landed.** ``sessions`` concurrent clients (threads), ``turns_per_session`` turns each (a
  real multi-turn conversation: every reply goes back into the next request), timed from the first
  request to the moment every turn is a row of the Delta ``turns`` table (the flusher has drained).
* **Batched vs one at a time** (``compare_serial``). A second ``tentalis serve`` with
  ``--max-batch-rows 1`` (each call decoded alone, in arrival order: the gateway before continuous
  batching) runs beside the first: its single calls are timed in the same alternation (direct,
  one-at-a-time, batched), and the same concurrent sessions run through it before they run through the
  batched one. ``batching`` holds the ratios: turns/s landed, batched over one at a time, and the p50
  latency of a single call, batched over one at a time.

The gateway runs with a home folder of its own (a fresh temporary one unless given), so its tables
only ever hold the benchmark's turns. ``tentalis bench --parts gateway`` prints the dict.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

PROMPTS = (
    "What is 17 + 25? Answer with the number.",
    "Name a prime number greater than 10.",
    "Write one sentence about the sea.",
    "What is the capital of France?",
    "Give a synonym for 'fast'.",
    "How many legs does a spider have?",
    "Spell the word 'cat' backwards.",
    "What colour is the sky on a clear day?",
)
SYSTEM = "You are a concise assistant."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of a non-empty list."""
    xs = sorted(values)
    k = max(0, min(len(xs) - 1, int(-(-q * len(xs) // 100)) - 1))
    return xs[k]


def _stats_ms(seconds: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {"n": len(ms), "p50_ms": round(percentile(ms, 50), 1), "p99_ms": round(percentile(ms, 99), 1),
            "mean_ms": round(statistics.fmean(ms), 1)}


def _messages(i: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]


class _Gateway:
    """A real ``tentalis serve --no-auth`` subprocess on a free port."""

    def __init__(self, home: Path, model_dir: Path, *, device: str, dtype: str, flush_interval: float, max_batch_rows: int = 64):
        self.home, self.port = home, _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = home / f"serve-{self.port}.log"
        env = {k: v for k, v in os.environ.items() if k != "TENTALIS_LAKEHOUSE_URI"}  # never the real tables
        env["TENTALIS_HOME"] = str(home)
        home.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tentalis_pipelines.cli", "serve", "--no-auth", "--port", str(self.port),
                 "--model", str(model_dir), "--device", device, "--dtype", dtype, "--flush-interval", str(flush_interval),
                 "--poll-seconds", "0", "--max-batch-rows", str(max_batch_rows), "--home", str(home)],
                env=env, stdout=log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 180) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tentalis serve exited ({self.proc.returncode}): {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"tentalis serve not ready after {timeout} s: {self.log.read_text()[-2000:]}")

    def health(self) -> dict[str, Any]:
        import httpx

        return httpx.get(self.url + "/health", timeout=10).json()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _wait_landed(lake, expected: int, timeout: float) -> tuple[int, float]:
    """Poll the Delta ``turns`` table until it holds ``expected`` rows: (rows, perf_counter when seen)."""
    deadline = time.monotonic() + timeout
    rows = lake.count("turns")
    while rows < expected and time.monotonic() < deadline:
        time.sleep(0.02)
        rows = lake.count("turns")
    return rows, time.perf_counter()


def gateway_benchmark(
    model_dir: str | Path, *, requests: int = 32, sessions: int = 32, turns_per_session: int = 2, max_tokens: int = 16,
    warmup: int = 2, device: str = "auto", dtype: str = "auto", flush_interval: float = 0.5, home: str | Path | None = None,
    land_timeout: float = 120, compare_serial: bool = True,
) -> dict[str, Any]:
    """Added latency (p50/p99 of the gateway minus the direct backend) and turns/s landed, in one run;
    with ``compare_serial``, the same for a gateway serving one call at a time, beside it.
    ``home``: the gateway's state folder (default: a temporary one, removed afterwards; the
    one-at-a-time gateway's is its ``serial`` subfolder); it must hold no ``turns`` table yet."""
    if requests < 1 or sessions < 1 or turns_per_session < 1:
        raise ValueError("requests, sessions and turns_per_session must be at least 1")
    kw = dict(requests=requests, sessions=sessions, turns_per_session=turns_per_session, max_tokens=max_tokens, warmup=warmup,
              device=device, dtype=dtype, flush_interval=flush_interval, land_timeout=land_timeout, compare_serial=compare_serial)
    if home is None:
        with tempfile.TemporaryDirectory(prefix="tentalis-gwbench-") as tmp:
            return _run(Path(model_dir), Path(tmp), **kw)
    return _run(Path(model_dir), Path(home), **kw)


def _run(model_dir: Path, home: Path, *, requests: int, sessions: int, turns_per_session: int, max_tokens: int, warmup: int,
         device: str, dtype: str, flush_interval: float, land_timeout: float, compare_serial: bool) -> dict[str, Any]:
    from openai import OpenAI

    from tentalis_pipelines.gateway.chat import render_chat
    from tentalis_pipelines.gateway.policy import load_policy_version
    from tentalis_pipelines.gateway.sampler import decode
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.settings import Paths

    lake_root = Paths.from_env(home).home / "lakehouse"
    lake = Lakehouse(lake_root)
    if lake.exists("turns"):
        raise ValueError(f"{lake_root} already holds a turns table: give the gateway bench an empty home")

    gw = _Gateway(home, model_dir, device=device, dtype=dtype, flush_interval=flush_interval)
    serial = None
    if compare_serial:
        serial = _Gateway(home / "serial", model_dir, device=device, dtype=dtype, flush_interval=flush_interval, max_batch_rows=1)
        serial_lake = Lakehouse(Paths.from_env(home / "serial").home / "lakehouse")
    try:
        # The direct side loads while the gateways start (same loader, same device and dtype).
        policy = load_policy_version(model_dir, "base", None, device=device, dtype=dtype)
        gw.wait_ready()
        client = OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        model_name = client.models.list().data[0].id
        serial_client = None
        if serial is not None:
            serial.wait_ready()
            serial_client = OpenAI(base_url=serial.url + "/v1", api_key="unused", max_retries=0, timeout=300)

        def direct(messages: list[dict[str, str]]) -> tuple[float, list[int]]:
            t0 = time.perf_counter()
            _, ids = render_chat(policy.tokenizer, messages, None)
            choices: list = []
            for _ in decode(policy.model, policy.tokenizer, ids, n=1, max_new_tokens=max_tokens, temperature=0.0, choices=choices):
                pass
            return time.perf_counter() - t0, choices[0].token_ids

        def via_gateway(messages: list[dict[str, str]], session: str, c=client) -> tuple[float, str]:
            t0 = time.perf_counter()
            r = c.chat.completions.create(model=model_name, messages=messages, max_tokens=max_tokens, temperature=0,
                                          extra_headers={"X-Session-Id": session})
            return time.perf_counter() - t0, r.choices[0].message.content or ""

        for i in range(warmup):
            direct(_messages(i))
            via_gateway(_messages(i), f"bench-warmup-{i}")
            if serial_client is not None:
                via_gateway(_messages(i), f"bench-warmup-{i}", serial_client)
        # Sequential latency, alternated call by call so load on a shared machine hits every side alike.
        direct_s, gateway_s, serial_s, same_tokens = [], [], [], 0
        for i in range(requests):
            msgs = _messages(i)
            d, ids = direct(msgs)
            if serial_client is not None:
                serial_s.append(via_gateway(msgs, f"bench-seq-{i}", serial_client)[0])
            g, _ = via_gateway(msgs, f"bench-seq-{i}")
            direct_s.append(d)
            gateway_s.append(g)
            same_tokens += len(ids)
        sequential_turns = warmup + requests
        seq_rows, _ = _wait_landed(lake, sequential_turns, land_timeout)
        if serial is not None:
            _wait_landed(serial_lake, sequential_turns, land_timeout)
            # the same sessions, one call at a time, first (its turns land in its own lakehouse)
            serial_thr = _sessions_run(serial, serial_lake, model_name, sessions, turns_per_session, max_tokens, sequential_turns,
                                       land_timeout)
        thr = _sessions_run(gw, lake, model_name, sessions, turns_per_session, max_tokens, sequential_turns, land_timeout)
    finally:
        gw.stop()
        if serial is not None:
            serial.stop()
    d, g = _stats_ms(direct_s), _stats_ms(gateway_s)
    out = {
        "config": {"model": model_dir.name, "requests": requests, "sessions": sessions, "turns_per_session": turns_per_session,
                   "max_tokens": max_tokens, "temperature": 0, "warmup": warmup, "device": device, "dtype": dtype,
                   "flush_interval": flush_interval, "cpus": os.cpu_count(), "compare_serial": compare_serial},
        "latency": {
            "direct": d, "gateway": g,
            "added_p50_ms": round(g["p50_ms"] - d["p50_ms"], 1), "added_p99_ms": round(g["p99_ms"] - d["p99_ms"], 1),
            "added_mean_ms": round(g["mean_ms"] - d["mean_ms"], 1),
            # each gateway call minus the direct call just before it: robust to load that drifts over the run
            "added_paired_median_ms": round(statistics.median((b - a) * 1000 for a, b in zip(direct_s, gateway_s)), 1),
            "completion_tokens_direct": same_tokens,
            "method": "sequential, alternated direct/gateway per request; direct = render_chat + sampler.decode in-process "
                      "(the gateway's own decoder, a batch of one), gateway = openai client -> tentalis serve, acknowledged after "
                      "WAL fsync",
        },
        "throughput": {**thr, "sequential_turns_landed": seq_rows},
    }
    if serial is not None:
        sg = _stats_ms(serial_s)
        out["latency"]["gateway_one_at_a_time"] = sg
        out["throughput_one_at_a_time"] = serial_thr
        b_rate, s_rate = thr["landed_turns_per_s"], serial_thr["landed_turns_per_s"]
        out["batching"] = {
            "turns_per_s_batched": b_rate, "turns_per_s_one_at_a_time": s_rate,
            "turns_per_s_ratio": round(b_rate / s_rate, 2) if b_rate and s_rate else None,
            "single_call_p50_ms_batched": g["p50_ms"], "single_call_p50_ms_one_at_a_time": sg["p50_ms"],
            "single_call_p50_ratio": round(g["p50_ms"] / sg["p50_ms"], 3),
            "targets": "turns/s ratio >= 4 with 16 sessions; single-call p50 ratio <= 1.10",
            "method": "the same K sessions x T turns through tentalis serve --max-batch-rows 1 (each call decoded alone), then "
                      "through the default gateway (continuous batching); single calls alternated direct / one-at-a-time / batched",
        }
    return out


def _sessions_run(gw: _Gateway, lake, model_name: str, sessions: int, turns_per_session: int, max_tokens: int, landed_before: int,
                  land_timeout: float) -> dict[str, Any]:
    """``sessions`` concurrent clients x ``turns_per_session`` turns through ``gw``; turns/s acknowledged and
    landed in its Delta ``turns`` table (which held ``landed_before`` rows)."""
    from openai import OpenAI

    errors: list[str] = []
    acks: list[float] = []
    ack_lock = threading.Lock()
    barrier = threading.Barrier(sessions + 1)

    def session_worker(k: int) -> None:
        c = OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0, timeout=600)
        messages = _messages(k)
        barrier.wait()
        try:
            for t in range(turns_per_session):
                t0 = time.perf_counter()
                r = c.chat.completions.create(model=model_name, messages=messages, max_tokens=max_tokens, temperature=0,
                                              extra_headers={"X-Session-Id": f"bench-conc-{k}"})
                with ack_lock:
                    acks.append(time.perf_counter() - t0)
                messages = [*messages, {"role": "assistant", "content": r.choices[0].message.content or ""},
                            {"role": "user", "content": f"Thanks. Now say it again in other words ({t + 1})."}]
        except Exception as exc:  # noqa: BLE001 - counted and reported
            with ack_lock:
                errors.append(f"session {k}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=session_worker, args=(k,), daemon=True) for k in range(sessions)]
    for th in threads:
        th.start()
    barrier.wait()
    t_first = time.perf_counter()
    for th in threads:
        th.join()
    t_acked = time.perf_counter()
    sent, acked = sessions * turns_per_session, len(acks)
    total_rows, t_landed = _wait_landed(lake, landed_before + acked, land_timeout)
    health = gw.health()
    deadline = time.monotonic() + land_timeout
    while health.get("wal_pending") and time.monotonic() < deadline:  # the sessions rows commit after the turns
        time.sleep(0.05)
        health = gw.health()
    turns = lake.read("turns", columns=["session_id"])
    concurrent_rows = sum(1 for s in turns["session_id"].to_pylist() if s.startswith("bench-conc-"))
    landed_s = t_landed - t_first
    return {
        "turns_sent": sent, "turns_acknowledged": acked, "errors": errors[:5], "error_count": len(errors),
        "turns_landed": concurrent_rows, "turns_table_rows": total_rows,
        "sessions_table_rows": lake.count("sessions") if lake.exists("sessions") else 0,
        "acknowledged_seconds": round(t_acked - t_first, 3), "landed_seconds": round(landed_s, 3),
        "acknowledged_turns_per_s": round(acked / (t_acked - t_first), 2),
        "landed_turns_per_s": round(concurrent_rows / landed_s, 2) if landed_s > 0 else None,
        "drain_after_last_ack_s": round(t_landed - t_acked, 3),
        "ack_latency": _stats_ms(acks) if acks else None,
        "last_flush_ms": health.get("last_flush_ms"),
        "batching": health.get("batching"),  # the gateway's row limit, the most rows one step decoded, its steps
        "method": "K sessions (threads, one openai client each) x T turns, each reply fed back; timed from the first request "
                  "to every turn counted in the Delta turns table",
    }
