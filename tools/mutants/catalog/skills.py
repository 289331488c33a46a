"""Planted bugs in skills verification: the effect of a skill (``skills/library.py``: skill_effect,
decide, the settings' seed rule) and the stage that measures skills (``stages/skills.py``: which skills a
run picks, the bounds it decides with, what the decision rows record).

Guarded by tests/unit/test_skills_verify.py (pure: the evaluation is a fixed table of right and wrong
answers, no model), which runs the rule with non-default bounds (a minimum interval end above and below
zero, more net wins), several candidates and verified skills at once, and runs that list their items in
other orders.

No mutant here is equivalent."""

L = "tentalis_pipelines/skills/library.py"
S = "tentalis_pipelines/stages/skills.py"
T = ["tests/unit/test_skills_verify.py"]

MUTANTS = [
    {"id": "skills-wins-losses-swapped", "file": L, "find": "sum(a > b for a, b in zip(w, wo)), sum(a < b for a, b in zip(w, wo))",
     "replace": "sum(a < b for a, b in zip(w, wo)), sum(a > b for a, b in zip(w, wo))", "tests": T,
     "why": "wins and losses swapped: a skill that hurts has net wins"},
    {"id": "skills-unpaired-order", "file": L, "find": "    wo = [float(without_skill[k]) for k in keys]\n",
     "replace": "    wo = [float(v) for k, v in without_skill.items() if k in with_skill]\n", "tests": T,
     "why": "the run without the skill in its own order: items paired by position, not id"},
    {"id": "skills-bootstrap-args-swapped", "file": L, "find": "gain, lo, hi = paired_bootstrap(w, wo, seed=seed)",
     "replace": "gain, lo, hi = paired_bootstrap(wo, w, seed=seed)", "tests": T,
     "why": "without minus with: a helpful skill reads as harmful"},
    {"id": "skills-ci-bound-default", "file": L, "find": "if effect.gain > 0 and net >= need and effect.ci_low >= min_ci_low:",
     "replace": "if effect.gain > 0 and net >= need and effect.ci_low >= 0.0:", "tests": T,
     "why": "the interval bound given is ignored (the default 0 used)"},
    {"id": "skills-retire-at-zero", "file": L, "find": "        if effect.gain > 0:\n            return \"verified\"",
     "replace": "        if effect.gain >= 0:\n            return \"verified\"", "tests": T,
     "why": "a verified skill with no gain left is kept"},
    {"id": "skills-gate-seed-allowed", "file": L, "find": "if self.validation_seed < 1_000_000 or self.validation_seed == 1_000_000:",
     "replace": "if self.validation_seed < 1_000_000:", "tests": T,
     "why": "the gate's held-out seed (1,000,000) accepted as a validation seed: skills verified on the gate's items"},
    {"id": "skills-least-supported-first", "file": S, "find": "key=lambda s: (-s[\"support\"], s[\"created_at\"], s[\"skill_id\"]))",
     "replace": "key=lambda s: (s[\"support\"], s[\"created_at\"], s[\"skill_id\"]))", "tests": T,
     "why": "the least supported candidates are measured first"},
    {"id": "skills-remeasure-same-policy", "file": S, "find": "s[\"status\"] == \"candidate\" and s[\"measured_on\"] != policy_version",
     "replace": "s[\"status\"] == \"candidate\"", "tests": T,
     "why": "a candidate measured on this policy is measured again every run, starving the others"},
    {"id": "skills-recheck-count", "file": S, "find": "[: settings.recheck_per_cycle]", "replace": "[: settings.verify_per_cycle]", "tests": T,
     "why": "the re-check budget taken from verify_per_cycle"},
    {"id": "skills-recheck-newest-first", "file": S, "find": "s[\"skill_id\"]))[: settings.recheck_per_cycle]",
     "replace": "s[\"skill_id\"]), reverse=True)[: settings.recheck_per_cycle]", "tests": T,
     "why": "the most recently measured verified skills are re-checked, the stale ones never"},
    {"id": "skills-stage-ci-default", "file": S, "find": "min_ci_low=settings.min_ci_low,\n", "replace": "\n", "tests": T,
     "why": "the stage decides with the default interval bound, not the configured one"},
    {"id": "skills-stage-net-wins-default", "file": S, "find": "                                     min_net_wins=settings.min_net_wins)",
     "replace": "                                     )", "tests": T,
     "why": "the stage decides with the default net wins, not the configured ones"},
    {"id": "skills-verified-at-reset", "file": S, "find": "if status == \"verified\" and skill[\"status\"] != \"verified\":",
     "replace": "if status == \"verified\":", "tests": T,
     "why": "a re-check that keeps a skill resets when it was verified"},
    {"id": "skills-decision-from-status", "file": S, "find": "\"from_status\": skill[\"status\"]", "replace": "\"from_status\": status",
     "tests": T, "why": "the decision row records the new status as the old one: every move reads as no move"},
]
