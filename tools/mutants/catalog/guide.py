"""Planted bugs in hint-guided resampling: which groups and hints, the guided ratio, the rows that train,
the dense hint reward, lineage and retraction."""

G = "tentalis_pipelines/training/guide.py"
TR = "tentalis_pipelines/training/trainer.py"
L = "tentalis_pipelines/training/losses.py"
ST = "tentalis_pipelines/stages/guided_rollouts.py"
TJ = "tentalis_pipelines/stages/trajectories.py"
P = "tentalis_pipelines/stages/training.py"
HR = "tentalis_pipelines/rewards/hint_reward.py"
LI = "tentalis_pipelines/lineage.py"
RE = "tentalis_pipelines/retraction.py"
TU = ["tests/unit/test_guide.py"]
TP = ["tests/test_guide_pipeline.py"]

MUTANTS = [
    {"id": "guide-groups-with-a-success", "file": G, "find": "        correct[key] = correct[key] or bool(ok)\n",
     "replace": "        correct[key] = correct[key] and bool(ok)\n", "tests": TU,
     "why": "a group that already has a success is resampled (and one that has none may not be)"},
    {"id": "guide-least-frequent-hint", "file": G, "find": "    best = max(votes.values())\n", "replace": "    best = min(votes.values())\n",
     "tests": TU, "why": "the hint fewest reviews gave is used"},
    {"id": "guide-leaking-hint-used", "file": G, "find": "        if decision == opd.USED:\n", "replace": "        if decision != opd.NO_HINT:\n",
     "tests": TU, "why": "a hint that states the answer (or says nothing) guides the resampling: the student learns to copy"},
    {"id": "guide-ratio-recomputed", "file": TR, "find": "                    old = torch.where(guided_rows, behaviour, old)\n",
     "replace": "", "tests": TP, "why": "a guided row's ratio is taken against a recomputation without the hint (always 1)"},
    {"id": "guide-ratio-reversed", "file": TR, "find": "                    old = torch.where(guided_rows, behaviour, old)\n",
     "replace": "                    old = torch.where(guided_rows, 2 * logps.detach() - behaviour, old)\n", "tests": TP,
     "why": "the ratio is pi_b / pi instead of pi / pi_b"},
    {"id": "guide-shaping-ignored", "file": TR, "find": "                        per_token = torch.where(guided_rows, shaped, per_token)\n",
     "replace": "", "tests": TP, "why": "guide_importance = shaping trains with the clipped surrogate"},
    {"id": "guide-shaping-on-every-row", "file": TR, "find": "                        per_token = torch.where(guided_rows, shaped, per_token)\n",
     "replace": "                        per_token = shaped\n", "tests": TP, "why": "on-policy rows get LUFFY's shaping too"},
    {"id": "guide-shaping-gamma-in-numerator", "file": L, "find": "    return -(ratio / (ratio + gamma)) * advantages\n",
     "replace": "    return -(gamma / (ratio + gamma)) * advantages\n", "tests": TU + TP, "why": "f(r) = gamma / (r + gamma) decreases with r"},
    {"id": "guide-failures-become-trajectories", "file": TJ, "find": "    return [g for g in lake.read(\"guided_rollouts\", batch_id=batch_id).to_pylist() if g[\"correct\"]]\n",
     "replace": "    return lake.read(\"guided_rollouts\", batch_id=batch_id).to_pylist()\n", "tests": TP,
     "why": "hinted samples that failed are trained on as if they had succeeded"},
    {"id": "guide-trained-with-the-hint", "file": P, "find": "                    rollouts[g[\"rollout_id\"]] = {**g, \"sampling_logprobs\": g[\"behaviour_logprobs\"], \"guided\": True}\n",
     "replace": "                    rollouts[g[\"rollout_id\"]] = {**g, \"prompt_text\": g[\"behaviour_prompt_text\"], \"sampling_logprobs\": g[\"behaviour_logprobs\"], \"guided\": True}\n",
     "tests": TP, "why": "the student is trained with the hint in its prompt: at test time there is no hint"},
    {"id": "guide-not-flagged", "file": P, "find": "old_logps=ro[\"sampling_logprobs\"], temperature=ro[\"temperature\"], guided=bool(ro.get(\"guided\"))),",
     "replace": "old_logps=ro[\"sampling_logprobs\"], temperature=ro[\"temperature\"]),", "tests": TP,
     "why": "guided samples train as on-policy rows: with old_logprobs = recompute their ratio is 1"},
    {"id": "guide-samples-unhinted", "file": ST, "find": "        generations = backend.generate([hp for _, _, hp in todo], params)\n",
     "replace": "        generations = backend.generate([p for _, p, _ in todo], params)\n", "tests": TP,
     "why": "the group is resampled without its hint"},
    {"id": "guide-ablation-keeps-the-hint", "file": ST,
     "find": "        behaviour = opd.hinted_prompt(prompt_text, tasks[task_id][\"prompt\"], hint.hint) if config.guide_with_hint else prompt_text\n",
     "replace": "        behaviour = opd.hinted_prompt(prompt_text, tasks[task_id][\"prompt\"], hint.hint)\n", "tests": TP,
     "why": "guide_with_hint = false still puts the hint in the context: the ablation measures nothing"},
    {"id": "hint-reward-reversed", "file": HR, "find": "            out[i] = HintReward(w - wo, w, wo, opd.USED)\n",
     "replace": "            out[i] = HintReward(wo - w, w, wo, opd.USED)\n", "tests": TP, "why": "a hint that helps scores below zero"},
    {"id": "hint-reward-leak-paid", "file": HR, "find": "        if decision != opd.USED:\n", "replace": "        if decision == opd.NO_HINT:\n",
     "tests": TU, "why": "a hint that states the answer is scored (and it raises the answer's probability most)"},
    {"id": "lineage-guide-hints-missing", "file": LI, "find": "                        for t in trajectories if t.get(\"guide_hint_id\")],\n",
     "replace": "                        for t in trajectories if False],\n", "tests": TP,
     "why": "a checkpoint's lineage does not name the hints whose guided samples taught it"},
    {"id": "retraction-keeps-guided", "file": RE, "find": "    if lake.exists(\"guided_rollouts\"):  # hinted samples of a hit group copy its hint: they go with it\n",
     "replace": "    if False:\n", "tests": TP, "why": "a retracted review's hint survives in the guided samples it produced"},
    {"id": "hint-reward-solution-tags-scored", "file": HR, "find": "        scored += [flag] * len(piece)\n",
     "replace": "        scored += [True] * len(piece)\n", "tests": TU + TP,
     "why": "the solution's format tags are scored: a hint that mentions the tags raises its own reward (v1's failure)"},
    {"id": "hint-reward-solution-unmasked", "file": HR, "find": "            w = float(sum(lp for lp, m in zip(with_hint, mask) if m))\n",
     "replace": "            w = float(sum(with_hint))\n", "tests": TP, "why": "the hinted side sums every token, the plain side the scored ones"},
    {"id": "hint-reward-steps-ignored", "file": HR, "find": "    if not steps:\n        value = ids(answer_text(reference))",
     "replace": "    if True:\n        value = ids(answer_text(reference))", "tests": TU + TP, "why": "a task's solution is never scored, only its value"},
    {"id": "hint-reward-no-expression", "file": HR, "find": "    return (f\"{expression} = {str(task['reference']).strip()}\",) if expression else ()\n",
     "replace": "    return ()\n", "tests": TU + TP, "why": "a generated task's expression is not read as its solution"},
    {"id": "guide-stage-steps-dropped", "file": ST, "find": "                                        solution_steps(tasks[h.task_id])) for h, p, _ in todo],\n",
     "replace": "                                        ()) for h, p, _ in todo],\n", "tests": TP,
     "why": "guidance stores the answer-only reward for a task that knows its solution"},
    {"id": "manager-failure-steps-dropped", "file": "tentalis_pipelines/stages/manager_training.py",
     "find": "                               r[\"completion\"], x, verifier.review(x).score, solution_steps(tasks[tid])))\n",
     "replace": "                               r[\"completion\"], x, verifier.review(x).score))\n", "tests": ["tests/test_manager_training.py"],
     "why": "the manager's dense reward scores the value alone where the task knows its solution"},
]
