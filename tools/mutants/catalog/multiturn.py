"""Planted bugs in multi-turn training: the loss mask, its normalisers, the spans and the pipeline branch."""

T = "tentalis_pipelines/training/trainer.py"
M = "tentalis_pipelines/training/multiturn.py"
P = "tentalis_pipelines/stages/training.py"
SA = "tentalis_pipelines/training/samples.py"
TM = ["tests/test_multiturn.py"]

MUTANTS = [
    {"id": "loss-mask-ignored", "file": T, "find": "    return [1.0 if m else 0.0 for m in s.loss_mask]\n",
     "replace": "    return [1.0] * len(s.completion_ids)\n", "tests": TM,
     "why": "the loss mask is dropped when packing: user, tool and template tokens are trained on"},
    {"id": "loss-on-completion-mask", "file": T, "find": 'mask = batch["loss_mask"]', "replace": 'mask = batch["completion_mask"]',
     "tests": TM, "why": "train_grpo packs the mask but the loss uses every completion token"},
    {"id": "normaliser-counts-masked-tokens", "file": T, "find": "tokens_in_step = sum(trained_tokens(s) for s in step_rows)",
     "replace": "tokens_in_step = sum(len(s.completion_ids) for s in step_rows)", "tests": TM,
     "why": "the token-level normaliser counts context tokens the loss never sees"},
    {"id": "assistant-span-off-by-one", "file": M, "find": "start = len(cur.completion_ids) + len(gap)\n",
     "replace": "start = len(cur.completion_ids) + len(gap) - 1\n", "tests": TM,
     "why": "a later turn's span starts one token early (on the template's last token)"},
    {"id": "multi-turn-rows-trained-as-single", "file": SA, "find": 'if t.get("kind") == "multi_turn":',
     "replace": "if False:", "tests": ["tests/unit/test_sessions.py", "tests/test_sessions_integration.py"],
     "why": "the trainer rebuilds a session as a single-turn row (no mask, no per-turn advantages)"},
]
