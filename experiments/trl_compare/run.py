"""Tentalis' GRPO loop vs TRL's GRPOTrainer on the same problem: wall time per update and the reward curve.

    .venv/bin/pip install -e '.[bench]'
    .venv/bin/python -m experiments.trl_compare.run --updates 3 --out trl_compare.json

Same model (the embedded SmolLM2-135M-Instruct), prompts, reward, samples per prompt, completion length,
loss, LoRA shape, learning rate and number of updates on both sides; see
bench/grpo_compare.py for what an update covers.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from bench.grpo_compare import CompareConfig, run_tentalis, run_trl, summarize
from tentalis_pipelines.inference.models import resolve_model
from tentalis_pipelines.settings import Paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=16, help="prompts per update")
    ap.add_argument("--num-generations", type=int, default=8)
    ap.add_argument("--max-completion-length", type=int, default=96)
    ap.add_argument("--learning-rate", type=float, default=2e-4)
    ap.add_argument("--side", choices=["both", "tentalis", "trl"], default="both")
    ap.add_argument("--out", type=Path, default=None, help="write the full result as JSON")
    a = ap.parse_args()
    cfg = CompareConfig(updates=a.updates, prompts_per_update=a.prompts, num_generations=a.num_generations,
                        max_completion_length=a.max_completion_length, learning_rate=a.learning_rate)
    model_dir = resolve_model("embedded", Paths.from_env(None).ensure().models)

    def show(side: str, rec: dict) -> None:
        parts = ", ".join(f"{k} {v:.1f}" for k, v in rec.items() if k.endswith("_seconds"))
        print(f"{side:>8} update {rec['update']}: {rec['seconds']:.1f} s ({parts}), reward {rec.get('reward_mean', float('nan')):.3f}", flush=True)

    result = {"config": asdict(cfg)}
    if a.side in ("both", "tentalis"):
        result["tentalis"] = run_tentalis(model_dir, cfg, on_update=show)
    if a.side in ("both", "trl"):
        result["trl"] = run_trl(model_dir, cfg, on_update=show)
    if a.side == "both":
        result["summary"] = summarize(result["tentalis"], result["trl"])
        print(json.dumps(result["summary"], indent=2))
    if a.out:
        a.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
