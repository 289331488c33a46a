"""Planted bugs in the BFCL and mini-SWE families (issue 28): the safety of reading a model's calls, the
reward from the final check (BFCL's checker, the FAIL_TO_PASS / PASS_TO_PASS verdict), observation
truncation. Guarded by the pure unit tests of each family (no model; BFCL's checker runs in-process)."""

BF = "tentalis_pipelines/envs/bfcl.py"
SW = "tentalis_pipelines/envs/swe.py"
TB = ["tests/unit/test_envs_bfcl.py"]
TS = ["tests/unit/test_envs_swe.py"]

MUTANTS = [
    # ---- BFCL: what a reply may run
    {"id": "bfcl-attribute-call-allowed", "file": BF, "find": "        if not isinstance(node.func, ast.Name):\n",
     "replace": "        if False:\n", "tests": TB, "why": "os.system(...) style attribute calls reach the name check (and crash or run)"},
    {"id": "bfcl-any-tool-name", "file": BF, "find": "        if name not in allowed:\n", "replace": "        if False:\n",
     "tests": TB, "why": "a call to a name outside the task's tools (another class's method, a builtin) is accepted"},
    {"id": "bfcl-positional-accepted", "file": BF, "find": "        if node.args and not positional:\n",
     "replace": "        if False:\n", "tests": TB, "why": "positional arguments from the model are accepted, silently misbound"},
    {"id": "bfcl-kwargs-unpacking", "file": BF, "find": "            if kw.arg is None:\n", "replace": "            if False:\n",
     "tests": TB, "why": "**kwargs unpacking reaches the literal check with a None name"},
    {"id": "bfcl-truncate-no-marker", "file": BF,
     "find": "    return f\"{text[:head]}[... {len(text) - limit:,} characters truncated ...]{text[len(text) - tail:]}\"",
     "replace": "    return text[:limit]", "tests": TB, "why": "a long tool result is cut without the visible marker"},
    # ---- BFCL: the reward
    {"id": "bfcl-fewer-turns-pass", "file": BF, "find": "    if len(decoded) != len(task.ground_truth):\n",
     "replace": "    if len(decoded) > len(task.ground_truth):\n", "tests": TB,
     "why": "an episode that stopped before the last user turn goes to the checker as if complete"},
    {"id": "bfcl-invalid-is-valid", "file": BF, "find": "    if result.get(\"valid\"):\n", "replace": "    if result:\n",
     "tests": TB, "why": "any checker result, valid or not, passes"},
    # ---- mini-SWE: the reward from the tests
    {"id": "swe-fail-to-pass-only", "file": SW, "find": "    if passed == len(required):\n",
     "replace": "    if ok_f2p == len(task.fail_to_pass):\n", "tests": TS,
     "why": "a fix that breaks PASS_TO_PASS tests still passes"},
    {"id": "swe-missing-test-passes", "file": SW, "find": "    ok_p2p = sum(run.results.get(t) == \"PASSED\" for t in task.pass_to_pass)\n",
     "replace": "    ok_p2p = sum(run.results.get(t, \"PASSED\") == \"PASSED\" for t in task.pass_to_pass)\n", "tests": TS,
     "why": "a PASS_TO_PASS test missing from the report (deleted, renamed) counts as passed"},
    {"id": "swe-not-run-passes", "file": SW, "find": "        return Verdict(False, 0.0, f\"tests not run: {run.error}\"), 0, len(required)\n",
     "replace": "        return Verdict(True, 1.0, f\"tests not run: {run.error}\"), 0, len(required)\n", "tests": TS,
     "why": "a run that never produced a report (the module does not import) passes"},
]
