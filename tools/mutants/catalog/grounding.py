"""Planted bugs in the grounding check: the rules' normalisations, the synthetic gold spans and split, the
tagger's span decoding, and the flagged-span policy in training."""

G = "tentalis_pipelines/reviewers/grounding.py"
D = "tentalis_pipelines/reviewers/grounding_data.py"
T = "tentalis_pipelines/reviewers/grounding_tagger.py"
P = "tentalis_pipelines/training/grounding_policy.py"
TU = ["tests/unit/test_grounding.py"]
TE = ["tests/test_grounding_pipeline.py"]
TT = ["tests/test_grounding_tagger.py"]  # the tagger trained on the real MiniLM (a few pairs)  # end to end: landed sessions, the asset, build_training_samples, a checkpoint, replay

MUTANTS = [
    # (Dropping .normalize() is an equivalent mutant: Decimal('3.50') == Decimal('3.5') and they hash alike.)
    {"id": "grounding-commas-not-normalised", "file": G, "find": "        return Decimal(raw.replace(\",\", \"\")).normalize()\n",
     "replace": "        return Decimal(raw).normalize()\n", "tests": TU, "why": "1,000 is no number: its claim is never checked"},
    {"id": "grounding-no-rounding", "file": G, "find": "        return any(d > decimals and any(v.quantize(q, rounding=r, context=_WIDE) == value for r in _HALVES)\n"
             "                   for v, d in self.raw_numbers)\n",
     "replace": "        return False\n", "tests": TU, "why": "72 for 72.41 is flagged"},
    {"id": "grounding-unit-ignored", "file": G, "find": "            if known and unit not in known:\n",
     "replace": "            if False:\n", "tests": TU, "why": "8 km/h passes where the context says 8 mph"},
    {"id": "grounding-date-year-ignored", "file": G, "find": "            if (mo, d) == (kmo, kd) and (y is None or ky is None or y == ky):\n",
     "replace": "            if (mo, d) == (kmo, kd):\n", "tests": TU, "why": "March 5, 2025 passes for 2024-03-05"},
    {"id": "grounding-slash-one-order", "file": G, "find": "        if 1 <= b <= 12 and 1 <= a <= 31:\n            out.add((y, b, a))\n",
     "replace": "", "tests": TU, "why": "05/03/2024 (day first) is flagged against 2024-03-05"},
    {"id": "grounding-names-case-sensitive", "file": G, "find": "        return bool(re.search(r\"(?<![\\w])\" + re.escape(p) + r\"(?![\\w])\", self.text))\n",
     "replace": "        return phrase in self.text\n", "tests": TU, "why": "Maria Lopez is flagged against maria lopez"},
    {"id": "grounding-path-basename-anywhere", "file": G, "find": "        if text not in ev.paths and not (name in ev.paths and (not folder or folder in ev.paths)):\n",
     "replace": "        if text not in ev.paths and name not in ev.paths:\n", "tests": TU,
     "why": "/home/ana/report/q2.csv would pass whenever a q2.csv is listed anywhere"},
    {"id": "grounding-data-gold-shifted", "file": D, "find": "    return answer, sorted((*where[k], kinds[k]) for k in kinds)\n",
     "replace": "    return answer, sorted((where[k][0] + 1, where[k][1], kinds[k]) for k in kinds)\n", "tests": TU,
     "why": "gold spans miss the corrupted value's first character"},
    {"id": "grounding-split-by-pair", "file": D, "find": "    train = [p for p in pairs if not in_test(p.session_id)]\n",
     "replace": "    train = [p for p in pairs if not in_test(p.session_id + p.answer)]\n", "tests": TU,
     "why": "train and test share tool outputs (the split is by pair, not session)"},
    {"id": "grounding-tagger-rules-lose", "file": T, "find": "        if all(t.end <= r.start or t.start >= r.end for r in rules):\n",
     "replace": "        if True:\n", "tests": TU, "why": "a tagger span overlapping a rules flag is added twice"},
    {"id": "grounding-penalty-added", "file": P, "find": "            adv[i] = -float(penalty)\n",
     "replace": "            adv[i] = adv[i] - float(penalty)\n", "tests": TU, "why": "the flagged token keeps part of its positive advantage"},
    {"id": "grounding-penalty-off-by-one", "file": P, "find": "            hit.update(range(int(f[\"token_start\"]), int(f[\"token_end\"])))\n",
     "replace": "            hit.update(range(int(f[\"token_start\"]), int(f[\"token_end\"]) + 1))\n", "tests": TU,
     "why": "the token after a flagged claim is penalised too"},
    {"id": "grounding-block-claim-only", "file": P, "find": "    turns = sorted({(int(f[\"turn_token_start\"]), int(f[\"turn_token_end\"])) for f in flags})\n",
     "replace": "    turns = sorted({(int(f[\"token_start\"]), int(f[\"token_end\"])) for f in flags})\n", "tests": TU,
     "why": "block masks the flagged claim, not its turn"},
    {"id": "grounding-flag-bounds-unchecked", "file": P, "find": "        if not (0 <= us <= ts < te <= ue <= n):\n",
     "replace": "        if False:\n", "tests": TU, "why": "a flag computed on other rollouts edits tokens silently (or IndexErrors)"},
    {"id": "grounding-closing-tag-a-path", "file": G, "find": "PATH_RE = re.compile(r\"(?<![\\w/.<])",
     "replace": "PATH_RE = re.compile(r\"(?<![\\w/.])", "tests": TU,
     "why": "every tool-call turn is flagged for the path '/tool_call' (block drops every tool call from training)"},
    {"id": "grounding-not-applied-in-build-samples", "file": "tentalis_pipelines/training/samples.py",
     "find": "        out, n = apply_flags(sample, flags.get(rollout_id, []), grounding_policy, grounding_penalty, rollout_id=rollout_id)\n",
     "replace": "        out, n = sample, {}\n", "tests": TE, "why": "the flags are written and a checkpoint trains as if they were not"},
    {"id": "grounding-replay-ignores-policy", "file": "tentalis_pipelines/lineage.py",
     "find": "grounding_policy=config.get(\"grounding_policy\", \"off\")", "replace": "grounding_policy=\"off\"", "tests": TE,
     "why": "lineage.replay rebuilds other samples than a grounded checkpoint trained on"},
    {"id": "grounding-tagger-loss-unweighted", "file": T,
     "find": "weight=torch.tensor([1.0, float(weight)], dtype=logits.dtype))", "replace": "weight=torch.tensor([1.0, 1.0], dtype=logits.dtype))",
     "tests": TU, "why": "the rare unsupported tokens weigh no more than the rest: the tagger learns to flag nothing"},
    {"id": "grounding-tagger-weight-inverted", "file": T, "find": "    return neg / pos if pos and neg else 1.0\n",
     "replace": "    return pos / neg if pos and neg else 1.0\n", "tests": TU, "why": "the weight favours the common class"},
    {"id": "grounding-tagger-weight-all-pairs", "file": T,
     "find": "        weight = positive_weight([token_labels(tagger.encode([p.answer], [p.context]), [p]) for p in fit])\n",
     "replace": "        weight = positive_weight([token_labels(tagger.encode([p.answer], [p.context]), [p]) for p in pairs])\n", "tests": TT,
     "why": "the loss weight is counted on the held-out sessions too"},
    {"id": "grounding-tagger-threshold-not-chosen", "file": T,
     "find": "        tagger.threshold, tagger.held_out_f1 = choose_threshold(held, [tagger.probabilities(p.answer, p.context) for p in held])\n",
     "replace": "        pass\n", "tests": TT, "why": "the held-out sessions are set aside but the threshold stays 0.5"},
    {"id": "grounding-tagger-threshold-lowest-tie", "file": T, "find": "    for t in sorted(grid, reverse=True):\n",
     "replace": "    for t in sorted(grid):\n", "tests": TU, "why": "among equally good thresholds the one flagging most wins"},
    {"id": "grounding-tagger-threshold-not-loaded", "file": T,
     "find": "        return cls(tok, model, stored if threshold is None else threshold)\n",
     "replace": "        return cls(tok, model, 0.5 if threshold is None else threshold)\n", "tests": TT,
     "why": "a saved tagger forgets the threshold chosen for it"},
    {"id": "grounding-tagger-split-unsalted", "file": T,
     "find": "seed=config.seed, salt=\"tagger-threshold\")", "replace": "seed=config.seed)", "tests": TT,
     "why": "the threshold's held-out sessions fall where the benchmark's test split already was: none are held out"},
]
