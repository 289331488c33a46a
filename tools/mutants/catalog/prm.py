"""Planted bugs in the PRM head: the consensus filter, the corruption generator, first-error decisions and
the threshold, the head's training and features, versions and the contamination guard, the step scorer."""

LB = "tentalis_pipelines/reviewers/prm_labels.py"
HD = "tentalis_pipelines/reviewers/prm_head.py"
RV = "tentalis_pipelines/reviewers/prm_reviewer.py"
RS = "tentalis_pipelines/resources.py"
TU = ["tests/unit/test_prm_labels.py"]
TP = ["tests/test_prm_head.py"]

MUTANTS = [
    {"id": "prm-consensus-one-source", "file": LB, "find": "    if len(given) < 2:\n", "replace": "    if len(given) < 1:\n",
     "tests": TU, "why": "a solution only one labeller spoke about is kept: no consensus at all"},
    {"id": "prm-consensus-ignores-contradiction", "file": LB,
     "find": "    if any(not agree(a, b) for i, a in enumerate(given) for b in given[i + 1:]):\n",
     "replace": "    if False:\n", "tests": TU, "why": "a corruption that did not change the answer is labelled wrong anyway"},
    {"id": "prm-some-step-agrees-with-correct", "file": LB, "find": "        return a != CORRECT and b != CORRECT\n",
     "replace": "        return True\n", "tests": TU, "why": "'wrong somewhere' is taken to agree with 'all correct'"},
    {"id": "prm-labels-after-error-correct", "file": LB,
     "find": "    return (1,) * first_error + (0,) * (num_steps - first_error)\n",
     "replace": "    return (1,) * first_error + (0,) + (1,) * (num_steps - first_error - 1)\n", "tests": TU,
     "why": "steps built on a wrong value are labelled correct"},
    {"id": "prm-calculator-vouches", "file": LB, "find": "    first = next((i for i, c in enumerate(checks) if c.score == 0.0), None)\n",
     "replace": "    first = next((i for i, c in enumerate(checks) if c.score == 0.0), CORRECT)\n", "tests": TU,
     "why": "a calculator that finds no false equation vouches that every step is right (reasoning errors pass)"},
    {"id": "prm-mc-threshold", "file": LB, "find": "    first = next((i for i, x in enumerate(mc_labels) if x <= 0.0), None)\n",
     "replace": "    first = next((i for i, x in enumerate(mc_labels) if x < 0.5), None)\n", "tests": TU,
     "why": "a prefix from which some continuations still succeed counts as the first error (value, not correctness)"},
    {"id": "prm-corruption-not-carried", "file": LB, "find": "        carried = _carry(ln, subst)\n",
     "replace": "        carried = ln\n", "tests": TU, "why": "later steps keep the old values: the answer never changes"},
    {"id": "prm-corruption-off-by-one", "file": LB, "find": "    return Corruption(tuple(out), new_final, k, kind)\n",
     "replace": "    return Corruption(tuple(out), new_final, k + 1, kind)\n", "tests": TU, "why": "the first wrong step is the one after the change"},
    {"id": "prm-corruption-visible-untouched", "file": LB, "find": "        seg = _substitute(line[pos: m.start()], subst)\n",
     "replace": "        seg = line[pos: m.start()]\n", "tests": TU,
     "why": "the written numbers keep the old values while the calculations changed"},
    {"id": "prm-first-error-inclusive", "file": HD, "find": "    return next((i for i, s in enumerate(scores) if s is not None and s < threshold), -1)\n",
     "replace": "    return next((i for i, s in enumerate(scores) if s is not None and s <= threshold), -1)\n", "tests": TU,
     "why": "a step scoring exactly the threshold counts as wrong"},
    {"id": "prm-first-error-last", "file": HD, "find": "    return next((i for i, s in enumerate(scores) if s is not None and s < threshold), -1)\n",
     "replace": "    return max((i for i, s in enumerate(scores) if s is not None and s < threshold), default=-1)\n", "tests": TU,
     "why": "the last low step is predicted instead of the first"},
    {"id": "prm-flags-ignored", "file": HD, "find": "        if (i < len(flags) and flags[i]) or (s is not None and s < threshold):\n",
     "replace": "        if s is not None and s < threshold:\n", "tests": TU, "why": "the calculator's flags do not count"},
    {"id": "prm-threshold-minimises", "file": HD, "find": "        if f1 > best[1] + 1e-12:\n", "replace": "        if f1 < best[1] or best[1] < 0:\n",
     "tests": TU, "why": "the threshold with the worst held-out F1 is chosen"},
    {"id": "prm-head-unseeded", "file": HD, "find": "    torch.manual_seed(config.seed)\n", "replace": "",
     "tests": TP, "why": "training depends on the global random state: the same labels give other weights"},
    {"id": "prm-head-labels-flipped", "file": HD, "find": "        loss = loss_fn(head(x), y)\n", "replace": "        loss = loss_fn(head(x), 1 - y)\n",
     "tests": TP, "why": "the head learns P(wrong)"},
    {"id": "prm-features-wrong-token", "file": HD, "find": "        ends.append(len(ids) - 1)\n", "replace": "        ends.append(len(ids) - len(piece))\n",
     "tests": TP, "why": "each step is read at its first token, before the model has seen the step"},
    {"id": "prm-store-overwrites", "file": RV, "find": "        name = f\"v{(int(found[-1][1:]) + 1) if found else 1:04d}\"\n",
     "replace": "        name = \"v0001\"\n", "tests": TP, "why": "a new version replaces (or collides with) the first"},
    {"id": "prm-guard-skipped", "file": RV, "find": "    labelled = build_label_set(screened.clean, seed=settings.seed, corruptions=settings.corruptions)\n",
     "replace": "    labelled = build_label_set(problems, seed=settings.seed, corruptions=settings.corruptions)\n", "tests": TP,
     "why": "a ProcessBench problem the guard refused is labelled and trained on anyway"},
    {"id": "prm-scorer-falls-back", "file": RS, "find": "        if scorer == \"prm_head\":\n", "replace": "        if scorer == \"prm-head\":\n",
     "tests": TP, "why": "choosing prm_head without a head silently scores with the calculator"},
]
