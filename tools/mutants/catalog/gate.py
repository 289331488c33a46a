"""Planted bugs in the intervals (statistics.py) and the promotion gate (gate_decision, decide_promotion,
incumbent_for): the ones a tired developer writes (see tools/mutants/mutants.py).

Guarded by tests/unit/test_statistics.py (with its two Wilson properties, moved to
tests/test_statistics_integration.py for their CPU) and tests/unit/test_gate.py (pure: no model, no Dagster run),
which reach the cases fixtures with one checkpoint and clear-cut results never do: intervals straddling
zero, a candidate worse by less than a non-default margin, ties, items paired by id in another order,
and a chain of three checkpoints whose incumbent is neither the base model nor the candidate's parent.

No mutant here is equivalent."""

S = "tentalis_pipelines/statistics.py"
B = "tentalis_pipelines/evaluation/benchmarks.py"
P = "tentalis_pipelines/promotion.py"
T = ["tests/unit/test_statistics.py", "tests/test_statistics_integration.py", "tests/unit/test_gate.py"]

MUTANTS = [
    # ---------------------------------------------------------------- statistics
    {"id": "gate-z-1645", "file": S, "find": "Z95 = 1.96", "replace": "Z95 = 1.645", "tests": T,
     "why": "the one-sided 95% quantile: every Wilson interval is a 90% interval, too narrow"},
    {"id": "gate-bootstrap-one-sided-quantiles", "file": S,
     "find": "return float(np.quantile(means, alpha / 2)), float(np.quantile(means, 1 - alpha / 2))",
     "replace": "return float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha))", "tests": T,
     "why": "one-sided quantiles at each end: a 90% interval reported as 95%, so the gate rejects on noise"},
    {"id": "gate-bootstrap-without-replacement", "file": S,
     "find": "means = v[rng.integers(0, v.size, size=(n_boot, v.size))].mean(axis=1)",
     "replace": "means = v[np.argsort(rng.random((n_boot, v.size)), axis=1)].mean(axis=1)", "tests": T,
     "why": "resamples are permutations: every mean equals the sample mean, the interval collapses to a point"},
    {"id": "gate-newcombe-before-minus-after", "file": S, "find": "    d = p2 - p1\n", "replace": "    d = p1 - p2\n", "tests": T,
     "why": "the difference's sign flips (before minus after) while its half-widths stay: a gain reads as a loss"},
    {"id": "gate-paired-ties-dropped", "file": S, "find": "    diffs = x - y\n", "replace": "    diffs = (x - y)[x != y]\n", "tests": T,
     "why": "ties dropped as 'uninformative': the mean is over discordant items only, one win in 60 reads as +100%"},
    # ---------------------------------------------------------------- gate_decision
    {"id": "gate-lo-hi-swapped", "file": B, "find": "diff, lo, hi = paired_bootstrap(", "replace": "diff, hi, lo = paired_bootstrap(",
     "tests": T, "why": "the interval's ends swapped: the gate tests the lower end, rejecting every interval that reaches below zero"},
    {"id": "gate-margin-sign", "file": B, "find": "worse = hi < -margin", "replace": "worse = hi < margin", "tests": T,
     "why": "the margin's sign: a positive margin demands a gain instead of tolerating a small loss"},
    {"id": "gate-margin-ignored", "file": B, "find": "worse = hi < -margin", "replace": "worse = hi < 0", "tests": T,
     "why": "the margin is accepted, recorded, and ignored: a loss within the margin is rejected"},
    {"id": "gate-straddle-rejected", "file": B, "find": "worse = hi < -margin", "replace": "worse = lo < -margin", "tests": T,
     "why": "an interval straddling zero fails: the gate demands a proven gain, not 'not proven worse'"},
    {"id": "gate-unpaired-order", "file": B, "find": "[float(incumbent[k]) for k in paired]",
     "replace": "[float(v) for k, v in incumbent.items() if k in candidate]", "tests": T,
     "why": "the incumbent's results in its own order: items are paired by position, not id (the mean survives, the interval does not)"},
    {"id": "gate-ties-as-wins", "file": B, "find": "[float(candidate[k]) for k in paired]",
     "replace": "[float(candidate[k] >= incumbent[k]) for k in paired]", "tests": T,
     "why": "an item scores for the candidate when it is at least as good: ties (both wrong too) count as wins"},
    # ---------------------------------------------------------------- promotion
    {"id": "gate-decides-against-base", "file": P, "find": "    inc = item_correctness(lake, incumbent, benchmark)\n",
     "replace": '    inc = item_correctness(lake, "base", benchmark)\n', "tests": T,
     "why": "the incumbent is named but the base model's results are compared: in a chain, a regression against what serves passes"},
    {"id": "gate-incumbent-is-parent", "file": P, "find": "        return parent or \"base\"\n    return current\n",
     "replace": "        return parent or \"base\"\n    return next((r[\"parent_id\"] for r in lake.read(\"checkpoints\").to_pylist() "
                "if r[\"checkpoint_id\"] == checkpoint_id), None) or \"base\"\n", "tests": T,
     "why": "a candidate is compared with its parent, not what serves: the child of a rejected checkpoint only has to beat the reject"},
    {"id": "gate-serving-candidate-vs-base", "file": P, "find": "        return parent or \"base\"\n", "replace": "        return \"base\"\n",
     "tests": T, "why": "a candidate that already serves is compared with the base instead of its parent (third generation on)"},
    {"id": "gate-margin-not-passed", "file": P, "find": "decision = gate_decision(cand, inc, margin=margin)",
     "replace": "decision = gate_decision(cand, inc)", "tests": T,
     "why": "decide_promotion records the margin but decides without it"},
]
