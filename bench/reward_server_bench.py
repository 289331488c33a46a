"""The reward server under hostile input (issue 73): the worst score time over hostile samples up to the
per-query cap, and ``/health`` latency while the real server scores long hostile requests.

    .venv/bin/python -m bench.reward_server_bench [--repeats 3] [--health-probes 100] [--out figures.json]

1. Score time: each hostile sample (the issue's stalls and 500s, and the patterns that made the old
   regexes retry from every start) at ``MAX_QUERY_CHARS``, scored in this process after the scorers'
   warm-up against a numeric and a symbolic label; the slowest of ``--repeats`` runs per sample.
2. ``/health`` under load: ``tentalis reward-server`` started as a user starts it (2 workers), two
   clients posting requests of 16 hostile samples back to back, and ``/health`` asked every 20 ms;
   the percentiles of its latency, and the same with the server idle.

Targets (README of the issue): every sample within 1 s, ``/health`` within 100 ms under load. The
host CPU is printed and written with the figures, so figures from different hosts are never compared.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from tentalis_pipelines.hardware import host_cpu
from tentalis_pipelines.rewards.remote_reward import MAX_QUERY_CHARS, score_query, warm_up

PROMPT = "Tom has 12 marbles and finds 7 more. How many marbles does he have?"


def _fill(unit: str, n: int = MAX_QUERY_CHARS - 64) -> str:
    return (unit * (n // len(unit) + 1))[:n]


def hostile_samples() -> dict[str, str]:
    """Name -> a hostile sample of about ``MAX_QUERY_CHARS`` (or as given in the issue)."""
    n = MAX_QUERY_CHARS - 64
    return {
        "issue: 16 KB without '='": "1+" * 8_000,
        "issue: 3,000-term expression": "<step>" + "+".join(["2"] * 3000) + " = 6000</step><answer>6000</answer>",
        "issue: 5,000-digit number": "<step>12 + 7 = 19 and 19 + 1 = " + "9" * 5000 + "</step><answer>" + "9" * 5000 + "</answer>",
        "operators without '='": _fill("1+"),
        "'x' operators without '='": _fill("12 x "),
        "equations, one step": "<step>" + _fill("12 x 7 = 84 ", n - 20) + "</step>",
        "equations, one per line": "".join(f"{i} + {i} = {2 * i}\n" for i in range(20_000))[:n],
        "tagged steps": _fill("<step>3*4=12</step>"),
        "blanks after a number": "1" + " " * (n - 2) + "(",
        "digits": _fill("9"),
        "thousands separators": _fill("1,"),
        "open parentheses": _fill("(1 "),
        "unclosed answer tags": _fill("<answer>"),
        "unclosed boxes": _fill("\\boxed{"),
        "unclosed text commands": "<answer>" + _fill("\\text{", n - 20) + "</answer>",
        "a long answer": "<answer>" + _fill("x+", n - 20) + "1</answer>",
        "exponent tower": "<answer>9^{9^{9^{9}}}</answer>",
        "max factors": "<step>" + "*".join(["9" * 32] * 64) + " = 1</step>",
    }


def score_times(repeats: int) -> list[dict]:
    """The slowest of ``repeats`` score times of each hostile sample, per label kind."""
    warm_up()
    out = []
    for name, query in hostile_samples().items():
        for label in ("19", "x + 1"):
            worst = 0.0
            for _ in range(repeats):
                t0 = time.perf_counter()
                score_query(query, PROMPT, label)
                worst = max(worst, time.perf_counter() - t0)
            out.append({"sample": name, "chars": len(query), "label": label, "worst_s": round(worst, 4)})
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _percentiles(xs: list[float]) -> dict:
    xs = sorted(xs)
    at = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]  # noqa: E731 — nearest rank
    return {"n": len(xs), "p50_ms": round(1000 * at(0.5), 2), "p95_ms": round(1000 * at(0.95), 2), "max_ms": round(1000 * xs[-1], 2)}


def health_under_load(probes: int) -> dict:
    """``/health`` latency with the real server idle, then while two clients post hostile requests."""
    import httpx

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "tentalis_pipelines.cli", "reward-server", "--port", str(port), "--workers", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the reward server did not start")
            time.sleep(0.3)

        def probe(n: int) -> list[float]:
            out = []
            with httpx.Client() as client:
                for _ in range(n):
                    t0 = time.perf_counter()
                    client.get(f"{url}/health", timeout=30).raise_for_status()
                    out.append(time.perf_counter() - t0)
                    time.sleep(0.02)
            return out

        idle = probe(probes)
        samples = list(hostile_samples().values())
        body = {"query": (samples * 2)[:16], "prompts": [PROMPT] * 16, "labels": ["19"] * 16}
        stop, served, statuses = threading.Event(), [0], set()

        def load():
            with httpx.Client() as client:
                while not stop.is_set():
                    statuses.add(client.post(f"{url}/get_reward", json=body, timeout=600).status_code)
                    served[0] += 1

        clients = [threading.Thread(target=load) for _ in range(2)]
        for c in clients:
            c.start()
        time.sleep(1.0)  # both requests sent and being scored
        loaded = probe(probes)
        stop.set()
        for c in clients:
            c.join(timeout=600)
        return {"idle": _percentiles(idle), "under_load": _percentiles(loaded), "requests_served": served[0],
                "statuses": sorted(statuses)}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="Score runs per hostile sample (the slowest is kept).")
    ap.add_argument("--health-probes", type=int, default=100, help="/health requests per phase (idle, under load).")
    ap.add_argument("--out", type=Path, default=None, help="Write the figures as JSON here.")
    args = ap.parse_args()
    report: dict = {"machine": host_cpu()}
    print(f"host: {report['machine']}")
    report["score_times"] = times = score_times(args.repeats)
    for row in times:
        print(f"{row['worst_s'] * 1000:9.1f} ms  {row['chars']:7d} chars  label {row['label']!r:8}  {row['sample']}")
    worst = max(times, key=lambda r: r["worst_s"])
    report["worst_score_s"] = worst["worst_s"]
    print(f"worst score time: {worst['worst_s'] * 1000:.1f} ms ({worst['sample']}, label {worst['label']!r}); target 1000 ms")
    report["health"] = health = health_under_load(args.health_probes)
    print(f"/health idle: {health['idle']}")
    print(f"/health under load: {health['under_load']} ({health['requests_served']} hostile requests of 16 samples served, "
          f"statuses {health['statuses']}); target 100 ms")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
