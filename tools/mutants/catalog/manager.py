"""Planted bugs in the manager's meta-RL: its reward, the held-out split, what trains, the gate, the
serving pointer of the manager and the reviews it writes."""

M = "tentalis_pipelines/training/manager_rl.py"
ST = "tentalis_pipelines/stages/manager_training.py"
SV = "tentalis_pipelines/training/serving.py"
LM = "tentalis_pipelines/rewards/llm_manager.py"
RV = "tentalis_pipelines/stages/reviews.py"
TU = ["tests/unit/test_manager_rl.py"]
TP = ["tests/test_manager_training.py"]

MUTANTS = [
    {"id": "manager-accuracy-rewarded", "file": M,
     "find": "    return hint_value(outcome, reward) - accuracy_weight * score_error(outcome.score, outcome.verifier_score)\n",
     "replace": "    return hint_value(outcome, reward) + accuracy_weight * score_error(outcome.score, outcome.verifier_score)\n",
     "tests": TU, "why": "a score far from the verifier's is paid instead of charged: the manager learns to mis-grade"},
    {"id": "manager-accuracy-ignored", "file": M,
     "find": "    return hint_value(outcome, reward) - accuracy_weight * score_error(outcome.score, outcome.verifier_score)\n",
     "replace": "    return hint_value(outcome, reward)\n", "tests": TU,
     "why": "no regulariser: helpful but not discriminating (Critique-RL's failure)"},
    {"id": "manager-leaking-hint-paid", "file": M, "find": "    if outcome.hint_decision != opd.USED:\n        return 0.0\n",
     "replace": "    if outcome.hint_decision == opd.NO_HINT:\n        return 0.0\n", "tests": TU,
     "why": "a hint that states the answer earns its rescue: the manager learns to leak"},
    {"id": "manager-unparseable-free", "file": M, "find": "    return 1.0 if score is None else abs(float(score) - float(verifier_score))\n",
     "replace": "    return 0.0 if score is None else abs(float(score) - float(verifier_score))\n", "tests": TU,
     "why": "an unparseable review costs nothing: garbage replies are as good as accurate ones"},
    {"id": "manager-rescue-not-normalised", "file": M, "find": "    return outcome.rescued / outcome.rescue_k if outcome.rescue_k else 0.0\n",
     "replace": "    return float(outcome.rescued)\n", "tests": TU, "why": "the hint's value scales with how many samples were drawn"},
    {"id": "manager-split-leaks", "file": ST,
     "find": "            if x.correct or tid in seen or manager_rl.is_heldout(tid, config.heldout_fraction, config.seed) != heldout:\n",
     "replace": "            if x.correct or tid in seen:\n", "tests": TP,
     "why": "the gate's held-out failures are trained on"},
    {"id": "manager-successes-collected", "file": ST,
     "find": "            if x.correct or tid in seen or manager_rl.is_heldout(tid, config.heldout_fraction, config.seed) != heldout:\n",
     "replace": "            if tid in seen or manager_rl.is_heldout(tid, config.heldout_fraction, config.seed) != heldout:\n", "tests": TP,
     "why": "a rollout the verifier accepted is taken as a failure to write a hint for"},
    {"id": "manager-stale-failures", "file": ST, "find": "            if (x.correct != correct or tid in seen or r[\"rollout_id\"] in exclude\n",
     "replace": "            if (x.correct != correct or tid in seen\n", "tests": TP,
     "why": "a manager update learns again from failures an earlier one already used"},
    {"id": "manager-rescue-without-hint", "file": ST,
     "find": "    prompts = [opd.hinted_prompt(f.prompt_text, f.task_prompt, h) for f, h in items]\n",
     "replace": "    prompts = [f.prompt_text for f, h in items]\n", "tests": TP,
     "why": "the hint's rescue is measured without the hint in the worker's context"},
    {"id": "manager-unusable-hints-measured", "file": ST,
     "find": "            if manager_rl.hint_decision(hint, f.reference) == opd.USED:\n",
     "replace": "            if True:\n", "tests": TP, "why": "generic hints are sent to the worker (and counted as rescues)"},
    {"id": "manager-advantage-dropped", "file": ST,
     "find": "            samples.append(TrainSample(ids, list(g.token_ids), adv, old_logps=list(g.logprobs) if g.logprobs else None,\n",
     "replace": "            samples.append(TrainSample(ids, list(g.token_ids), abs(adv), old_logps=list(g.logprobs) if g.logprobs else None,\n",
     "tests": TP, "why": "every sampled review is reinforced, the useless ones too"},
    {"id": "manager-lineage-missing-samples", "file": ST,
     "find": "                \"manager_samples\": [r[\"sample_id\"] for r in sample_rows],\n",
     "replace": "                \"manager_samples\": [],\n", "tests": TP,
     "why": "a manager checkpoint's lineage does not name the reviews that taught it"},
    {"id": "manager-gate-ignores-drift", "file": ST,
     "find": "    if decision.promote and err[\"cand\"] > err[\"inc\"] + config.score_tolerance:\n",
     "replace": "    if False:\n", "tests": TP, "why": "a manager whose scores drift from the verifier's is promoted for its hints"},
    {"id": "manager-gate-unpaired-worker", "file": ST, "find": "    if len(workers) > 1:\n", "replace": "    if len(workers) > 2:\n",
     "tests": TP, "why": "two managers measured with different workers are compared"},
    {"id": "manager-promote-moves-worker", "file": SV, "find": "    _, table = role_tables(role)\n    if role == \"worker\" and not lake.exists(table):\n        _migrate_legacy(lake)\n    with lakehouse_lock(lake, table):\n",
     "replace": "    _, table = role_tables(\"worker\")\n    if role == \"worker\" and not lake.exists(table):\n        _migrate_legacy(lake)\n    with lakehouse_lock(lake, table):\n",
     "tests": TP, "why": "promoting a manager moves the worker's serving pointer"},
    {"id": "manager-hint-pass-skipped", "file": LM, "find": "        ask = [i for i, p in enumerate(parsed) if p is not None and not p[2].strip()]\n",
     "replace": "        ask = []\n", "tests": ["tests/unit/test_rewards.py"], "why": "a reply without a hint is never asked for one"},
    {"id": "manager-reviewer-unnamed", "file": RV, "find": "                   \"reviewer\": f\"llm-manager:{getattr(llm_manager, 'version', 'base')}\"}\n",
     "replace": "                   \"reviewer\": None}\n", "tests": TP, "why": "a review does not say which manager version wrote it"},
]
