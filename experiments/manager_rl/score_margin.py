"""How a checkpoint's score adapter decides between `1,` and `10,` (round 17): after the manager's prompt and the first
score token `1`, the mean of log p('0') − log p(',') per class of rollout (above 0: it would write 10).

Usage: python -m experiments.manager_rl.score_margin /work/runs/mgr17b-exp m-cee784d6befe train|held
"""

from __future__ import annotations

import sys

import torch
from transformers import AutoTokenizer

from tentalis_pipelines.inference.models import resolve_model
from tentalis_pipelines.inference.transformers_backend import load_policy
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.rewards.llm_manager import score_adapter_of
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages import manager_training as mt
from tentalis_pipelines.training import checkpoints as ckpt
from tentalis_pipelines.training.manager_rl import ManagerRLConfig


def main() -> None:
    home, cid, side = sys.argv[1], sys.argv[2], sys.argv[3]
    paths = Paths.from_env(home)
    lake = Lakehouse(paths.lakehouse)
    held = side == "held"
    cfg = ManagerRLConfig(accepted_per_task=1)
    rows = mt.collect_failures(lake, heldout=held, config=cfg, limit=40) + mt.collect_accepted(lake, heldout=held, config=cfg, limit=20)
    model_dir = resolve_model("embedded", paths.models)
    tok = AutoTokenizer.from_pretrained(model_dir)
    adapter = ckpt.checkpoint_row(lake, cid, table="manager_checkpoints")["adapter_uri"]
    model, _ = load_policy(model_dir, score_adapter_of(adapter))
    model.eval()
    zero, comma = tok("0", add_special_tokens=False)["input_ids"][0], tok(",", add_special_tokens=False)["input_ids"][0]
    margins: dict[bool, list[float]] = {True: [], False: []}
    with torch.no_grad():
        for f, prompt in zip(rows, mt.manager_prompts(type("T", (), {"tokenizer": tok})(), rows)):
            ids = tok(prompt + "1", add_special_tokens=False)["input_ids"]
            lp = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), -1)
            margins[f.correct].append(float(lp[zero] - lp[comma]))
    for flag, vals in margins.items():
        print(f"{'accepted answers' if flag else 'failures'} ({len(vals)}): mean log p('0') - log p(',') after '1' "
              f"{sum(vals) / len(vals):+.2f}, share above 0 {sum(v > 0 for v in vals) / len(vals):.2f}")


if __name__ == "__main__":
    main()
