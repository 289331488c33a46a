"""Does sharing a system prompt's KV change a greedy reply? The first user turn of ``multi_turn_base_107``
then ``_122`` (same tools) on one policy with shared-prefix KV, and ``_122`` alone on one without; prints
whether tokens and log-probs are identical, and the seconds of each.

    PYTHONPATH=. OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python -m experiments.bfcl_base.prefix_probe --models-dir <dir>
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models-dir", type=Path, required=True)
    ap.add_argument("--first", default="multi_turn_base_107")
    ap.add_argument("--second", default="multi_turn_base_122")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    args = ap.parse_args()

    import torch

    from tentalis_pipelines.envs.bfcl import BfclEnv, load_official
    from tentalis_pipelines.envs.policies import ChatPolicy
    from tentalis_pipelines.envs.runner import model_messages
    from tentalis_pipelines.inference.models import resolve_model

    torch.set_num_threads(1)
    tasks = {t.task_id: t for t in load_official()}

    def opening(task_id: str) -> list[dict[str, str]]:
        return model_messages(BfclEnv().reset(tasks[task_id]).messages)

    on = ChatPolicy.load(resolve_model("embedded", args.models_dir), device="cpu", dtype="auto", max_new_tokens=args.max_new_tokens)
    off = ChatPolicy(on.model, on.tokenizer, max_new_tokens=args.max_new_tokens, share_prefixes=False)
    t0 = time.perf_counter()
    on(opening(args.first))
    t1 = time.perf_counter()
    shared = on(opening(args.second))
    t2 = time.perf_counter()
    alone = off(opening(args.second))
    t3 = time.perf_counter()
    print(json.dumps({"same_tokens": shared.token_ids == alone.token_ids, "same_logprobs": shared.logprobs == alone.logprobs,
                      "prompt_tokens": len(shared.prompt_token_ids), "s_first": round(t1 - t0, 1),
                      "s_second_shared": round(t2 - t1, 1), "s_second_alone": round(t3 - t2, 1), "text": shared.text}))


if __name__ == "__main__":
    main()
