"""Planted bugs in demonstrations and the warm start: the loss mask over demonstrated turns, the loss itself,
the oracle's verification, the import's error locations and the held-out guard."""

W = "tentalis_pipelines/training/warm_start.py"
D = "tentalis_pipelines/demonstrations.py"
C = "tentalis_pipelines/contamination.py"
S = "tentalis_pipelines/stages/warm_start.py"
UNIT = ["tests/unit/test_demonstrations.py"]
LOSS = ["tests/test_warm_start.py"]
SANDBOX = ["tests/test_demonstrations_integration.py"]

MUTANTS = [
    # The mask.
    {"id": "warm-start-mask-dropped", "file": W,
     "find": "TrainSample(seg.prompt_ids, seg.completion_ids, 1.0, loss_mask=seg.assistant_mask, temperature=1.0)",
     "replace": "TrainSample(seg.prompt_ids, seg.completion_ids, 1.0, loss_mask=[1] * len(seg.completion_ids), temperature=1.0)",
     "tests": UNIT, "why": "observations, user turns and template tokens between the demonstrated turns are trained on"},
    {"id": "warm-start-loss-on-completion-mask", "file": W, "find": '    mask = batch["loss_mask"]\n',
     "replace": '    mask = batch["completion_mask"]\n', "tests": LOSS,
     "why": "the samples carry the mask but the loss sums over every completion token (observations included)"},
    {"id": "warm-start-no-end-of-turn", "file": W, "find": "ids = list(tokenizer(str(m[\"content\"]), add_special_tokens=False)[\"input_ids\"]) + eot",
     "replace": "ids = list(tokenizer(str(m[\"content\"]), add_special_tokens=False)[\"input_ids\"])", "tests": UNIT,
     "why": "a demonstrated turn is trained without the end-of-turn token: the policy never learns to stop"},
    {"id": "warm-start-context-rerendered", "file": W, "find": "        if self.context is not None and full.startswith(self.text):",
     "replace": "        if False:", "tests": UNIT,
     "why": "each turn's prompt is re-rendered instead of extending the last context: one segment per turn, not what the policy saw"},
    {"id": "warm-start-demonstration-prompt-turn-trained", "file": W, "find": "        if is_policy_turn(m):\n            prompt = ctx",
     "replace": "        if m[\"role\"] == \"assistant\":\n            prompt = ctx", "tests": UNIT,
     "why": "a worked example's assistant message in the prompt (kind demonstration) is trained on as a demonstrated turn"},
    {"id": "warm-start-ascends", "file": W, "find": "                (s / n_tokens).backward()", "replace": "                (-s / n_tokens).backward()",
     "tests": LOSS, "why": "gradient ascent on the NLL: the demonstrated turns lose probability"},
    # Verification.
    {"id": "replay-pads-with-last-action", "file": D,
     "find": "        if self.calls >= len(self.actions):\n            raise DemonstrationExhausted",
     "replace": "        if self.calls >= len(self.actions):\n            return self.actions[-1]\n            raise DemonstrationExhausted",
     "tests": SANDBOX, "why": "a demonstration that stops short is padded with its last action instead of failing"},
    {"id": "oracle-keeps-failures", "file": D, "find": "        if ep.passed:\n            rows.append(demonstration_row(batch_id, row, ORACLE",
     "replace": "        if True:\n            rows.append(demonstration_row(batch_id, row, ORACLE", "tests": SANDBOX,
     "why": "oracle demonstrations land whether or not their replay passed the check"},
    {"id": "import-error-without-location", "file": D, "find": '"error": f"{where}: {exc}"', "replace": '"error": str(exc)',
     "tests": UNIT, "why": "an import error does not say which file and line it is about"},
    {"id": "import-skips-replay-check", "file": D, "find": "                if not ep.passed or len(policy_actions(ep)) != len(demo[\"actions\"]):",
     "replace": "                if False:", "tests": SANDBOX, "why": "an imported demonstration that does not solve its task lands"},
    # The held-out guard.
    {"id": "held-out-id-not-checked", "file": C, "find": "        if task_id in ids:\n", "replace": "        if False:\n",
     "tests": UNIT, "why": "a demonstration naming a held-out task id is let through"},
    {"id": "held-out-fingerprint-not-checked", "file": C, "find": "        if fingerprint in prints:\n", "replace": "        if False:\n",
     "tests": UNIT, "why": "a held-out task under another id (same instruction, tree and check) gets a demonstration"},
    {"id": "write-demonstrations-skips-guard", "file": D,
     "find": "        if why:\n            raise ValueError(f\"refused: demonstration",
     "replace": "        if False:\n            raise ValueError(f\"refused: demonstration", "tests": UNIT,
     "why": "write_demonstrations lands a demonstration of a held-out task"},
    {"id": "import-skips-held-out-guard", "file": D, "find": "            if why:\n                raise ValueError(f\"task {demo['task_id']} is held out",
     "replace": "            if False:\n                raise ValueError(f\"task {demo['task_id']} is held out", "tests": UNIT,
     "why": "an imported line naming a held-out task is not refused"},
    {"id": "check-ignores-held-out-rows", "file": D, "find": "    if held or orphans or empty:\n", "replace": "    if orphans or empty:\n",
     "tests": UNIT, "why": "the demonstrations asset's check passes with a held-out task's demonstration in the table"},
    {"id": "warm-start-trains-held-out", "file": S, "find": "    if refused:\n        raise ValueError(f\"refused:",
     "replace": "    if False:\n        raise ValueError(f\"refused:", "tests": UNIT,
     "why": "the warm start trains on a held-out task's demonstration that got into the table"},
]
