"""Planted bugs in rewards, advantages and reward scoring (see tools/mutants/mutants.py)."""

A = "tentalis_pipelines/rewards/advantages.py"
S = "tentalis_pipelines/rewards/scoring.py"
ST = "tentalis_pipelines/rewards/steps.py"
PR = "tentalis_pipelines/rewards/process.py"
LM = "tentalis_pipelines/rewards/llm_manager.py"
PT = "tentalis_pipelines/stages/trajectories.py"
PS = "tentalis_pipelines/stages/step_scores.py"
TR = ["tests/unit/test_rewards.py"]

MUTANTS = [
    {"id": "biased-std", "file": A, "find": "std = g.std(ddof=1) if len(g) > 1 else 0.0", "replace": "std = g.std() if len(g) > 1 else 0.0",
     "tests": TR, "why": "group std without Bessel's correction (TRL uses the unbiased one)"},
    {"id": "std-eps-changed", "file": A, "find": "adv[members] = centred / (std + eps) if scale_rewards == \"group\" else centred",
     "replace": "adv[members] = centred / (std + 1e-2) if scale_rewards == \"group\" else centred", "tests": TR, "why": "eps 1e-2 instead of 1e-4"},
    {"id": "scale-none-scales", "file": A, "find": "adv[members] = centred / (std + eps) if scale_rewards == \"group\" else centred",
     "replace": "adv[members] = centred / (std + eps)", "tests": TR, "why": "scale_rewards='none' still divides by std"},
    {"id": "process-cumsum-forward", "file": A, "find": "out[i] = (np.cumsum(norm[::-1])[::-1] / scored).tolist() if norm else []",
     "replace": "out[i] = (np.cumsum(norm) / scored).tolist() if norm else []", "tests": TR, "why": "prefix instead of suffix sums"},
    {"id": "process-not-normalised-by-steps", "file": A, "find": "out[i] = (np.cumsum(norm[::-1])[::-1] / scored).tolist() if norm else []",
     "replace": "out[i] = np.cumsum(norm[::-1])[::-1].tolist() if norm else []", "tests": TR, "why": "padding with steps inflates the process advantage"},
    {"id": "process-replaces-outcome", "file": A, "find": "return [outcome_advantage + (step_advantages[j]",
     "replace": "return [0.0 * outcome_advantage + (step_advantages[j]", "tests": TR, "why": "process mode drops the outcome advantage"},
    {"id": "answer-tokens-uncredited", "file": A, "find": "if j is not None and j < len(step_advantages) else 0.0) for j in owner]",
     "replace": "if j is not None and j < len(step_advantages) else -outcome_advantage) for j in owner]", "tests": TR,
     "why": "tokens after the last step (the answer) get no advantage"},
    {"id": "manager-weight-dropped", "file": S, "find": "total = weights.outcome * outcome + weights.format * format + weights.manager * manager",
     "replace": "total = weights.outcome * outcome + weights.format * format", "tests": TR, "why": "the review score never reaches the reward"},
    {"id": "process-credit-without-answer", "file": S, "find": "    if answer is None or not checked:\n        return None",
     "replace": "    if not checked:\n        return None", "tests": TR, "why": "steps without an answer earn process credit"},
    {"id": "truncated-fallback-credited", "file": S, "find": "if parsed.parse_mode == \"fallback\" and finish_reason != \"length\":",
     "replace": "if parsed.parse_mode == \"fallback\":", "tests": TR, "why": "truncated untagged text keeps outcome credit"},
    {"id": "format-credit-unhalved-on-truncation", "file": S, "find": "    if finish_reason == \"length\":\n        score *= 0.5",
     "replace": "", "tests": TR, "why": "truncated completions keep full format credit"},
    {"id": "empty-answer-tag-credited", "file": ST, "find": "        if not answer or len(answers) > 1:",
     "replace": "        if len(answers) > 1:", "tests": TR, "why": "an empty answer tag earns format credit"},
    {"id": "answer-spam-accepted", "file": ST, "find": "        if not answer or len(answers) > 1:",
     "replace": "        if not answer:", "tests": TR, "why": "several disagreeing answer tags accepted (first one graded)"},
    {"id": "ungrounded-steps-credited", "file": PR,
     "find": "if value == stated and known is not None and not (numbers_in(lhs.replace(\"x\", \" \").replace(\"×\", \" \")) & known):",
     "replace": "if False:", "tests": TR, "why": "true equations on unrelated numbers earn process credit"},
    {"id": "repeated-steps-credited", "file": PR, "find": "        if key in seen:\n", "replace": "        if False:\n",
     "tests": TR, "why": "a repeated step is scored again"},
    {"id": "results-not-known", "file": PR, "find": "known |= {Fraction(m.group(2).replace(\",\", \"\")) for m in _EQ.finditer(step)}",
     "replace": "pass", "tests": TR, "why": "a step building on an earlier result is not grounded"},
    {"id": "fence-not-escaped", "file": LM, "find": "{fence_safe(completion)}", "replace": "{completion}", "tests": TR,
     "why": "the completion can close the manager's fence"},
    {"id": "llm-score-unbounded", "file": LM, "find": "out.append(Review(bound_by_ground_truth(score, x), critique, hint))",
     "replace": "out.append(Review(score, critique, hint))", "tests": TR, "why": "a wrong answer can be talked up to full marks"},
    {"id": "review-score-ignored-in-trajectories", "file": PT, "find": "        manager = reviews[r[\"rollout_id\"]][\"score\"]",
     "replace": "        manager = 0.0", "tests": TR, "why": "the manager's review never reaches the trajectory"},
    {"id": "calculator-ignores-task", "file": PS, "find": "check_steps(prompts.get(r[\"task_id\"], \"\"), steps)",
     "replace": "check_steps(\"\", steps)", "tests": TR, "why": "step checks not grounded in the task's numbers"},
]
