"""What one decoding step of the embedded model costs at the rollout bench's batch, with nothing around it.

The rollout bench (``python -m bench --parts rollouts``) decodes 16 prompts x 8 samples; the batch
decoder's tokens per second there is bounded by the model's own forward pass over those 128 rows. This
times that pass alone: 128 rows, one new token each, a fixed past of ``--past`` positions, and the LM
head alone, in CPU time of this process on ``--threads`` threads (comparable on a loaded host), and
prints the tokens per second a decoder would reach if every step were exactly that pass.

    PYTHONPATH=. .venv/bin/python -m bench.rollout_roofline --threads 1
"""

from __future__ import annotations

import argparse
import json
import time


def main(argv: list[str] | None = None) -> int:
    import torch

    from tentalis_pipelines.hardware import host_cpu
    from tentalis_pipelines.inference.models import resolve_model
    from tentalis_pipelines.inference.transformers_backend import load_policy
    from tentalis_pipelines.settings import Paths

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--past", type=int, default=150, help="positions already in the KV cache")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    model, _ = load_policy(resolve_model("embedded", Paths.from_env(None).models), device="cpu", dtype=getattr(torch, a.dtype))
    rows, past = a.rows, a.past
    out = {"machine": host_cpu(), "config": vars(a)}
    with torch.no_grad():
        cache = model(input_ids=torch.randint(0, 1000, (rows, past)), use_cache=True).past_key_values
        x = torch.randint(0, 1000, (rows, 1))
        hidden = torch.randn(rows, 1, model.config.hidden_size, dtype=getattr(torch, a.dtype))

        def step():
            for layer in cache.layers:  # the past stays at ``past`` positions
                layer.keys, layer.values = layer.keys[:, :, :past], layer.values[:, :, :past]
            model(input_ids=x, past_key_values=cache, use_cache=True, position_ids=torch.full((rows, 1), past))

        for name, fn in (("step", step), ("lm_head", lambda: model.lm_head(hidden))):
            fn()
            c0 = time.process_time()
            for _ in range(a.repeats):
                fn()
            cpu = (time.process_time() - c0) / a.repeats
            out[name] = {"cpu_ms": round(1000 * cpu, 1), "tokens_per_s_if_every_step": round(rows / cpu, 1)}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
