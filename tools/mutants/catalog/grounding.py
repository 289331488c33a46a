"""Planted bugs in the grounding check: the rules' normalisations, the synthetic gold spans and split, the
tagger's span decoding, and the flagged-span policy in training."""

G = "tentalis_pipelines/reviewers/grounding.py"
D = "tentalis_pipelines/reviewers/grounding_data.py"
T = "tentalis_pipelines/reviewers/grounding_tagger.py"
P = "tentalis_pipelines/reviewers/grounding_policy.py"
TU = ["tests/unit/test_grounding.py"]
TE = ["tests/test_grounding_pipeline.py"]  # end to end: landed sessions, the asset, build_samples, a checkpoint, replay

MUTANTS = [
    # (Dropping .normalize() is an equivalent mutant: Decimal('3.50') == Decimal('3.5') and they hash alike.)
    {"id": "grounding-commas-not-normalised", "file": G, "find": "        return Decimal(raw.replace(\",\", \"\")).normalize()\n",
     "replace": "        return Decimal(raw).normalize()\n", "tests": TU, "why": "1,000 is no number: its claim is never checked"},
    {"id": "grounding-no-rounding", "file": G, "find": "        return any(d > decimals and v.quantize(q) == value for v, d in self.raw_numbers)\n",
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
    {"id": "grounding-not-applied-in-build-samples", "file": "tentalis_pipelines/stages/training.py",
     "find": "        out, n = apply_flags(sample, flags.get(rollout_id, []), grounding_policy, grounding_penalty, rollout_id=rollout_id)\n",
     "replace": "        out, n = sample, {}\n", "tests": TE, "why": "the flags are written and a checkpoint trains as if they were not"},
    {"id": "grounding-replay-ignores-policy", "file": "tentalis_pipelines/lineage.py",
     "find": "grounding_policy=config.get(\"grounding_policy\", \"off\")", "replace": "grounding_policy=\"off\"", "tests": TE,
     "why": "lineage.replay rebuilds other samples than a grounded checkpoint trained on"},
]
