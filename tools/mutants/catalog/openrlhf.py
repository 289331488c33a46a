"""Planted bugs in the OpenRLHF hand-off: the remote reward contract (parsing, which label a sample is
scored against, the answer's fields), the reward server (statuses, its log, its paths), the export (rows,
labels, the pinned version, the digest) and the adapter's import (never promoted, lineage to its export)."""

RR = "tentalis_pipelines/rewards/remote_reward.py"
RS = "tentalis_pipelines/rewards/reward_server.py"
SP = "tentalis_pipelines/rewards/score_pool.py"
OR = "tentalis_pipelines/training/openrlhf.py"
TS = ["tests/unit/test_reward_server.py"]
TH = ["tests/unit/test_reward_hostile.py", "tests/test_reward_hostile_integration.py"]
PR = "tentalis_pipelines/rewards/process.py"
TC = ["tests/unit/test_launcher_contracts.py"]
TE = ["tests/test_openrlhf_export.py"]

MUTANTS = [
    {"id": "reward-wrong-label", "file": SP, "find": "    for q, p, lab in zip(queries, prompts, labels):\n",
     "replace": "    for q, p, lab in zip(queries, prompts, labels[::-1]):\n", "tests": TS,
     "why": "in a batch each sample is scored against another prompt's label: right answers are punished"},
    {"id": "reward-prompt-counted-as-response", "file": RR, "find": "    if query.startswith(prompt):\n        return query[len(prompt):]\n",
     "replace": "    if query.startswith(prompt):\n        return query\n", "tests": TC,
     "why": "the prompt's numbers are read as the response's: an answer-less response can score the prompt's last number"},
    {"id": "reward-scores-are-rewards", "file": RR, "find": "    return {\"rewards\": [s.reward for s in scored], \"scores\": [s.outcome for s in scored]",
     "replace": "    return {\"rewards\": [s.reward for s in scored], \"scores\": [s.reward for s in scored]", "tests": TS,
     "why": "scores leave [0, 1]: OpenRLHF's dynamic filtering keeps or drops the wrong groups"},
    {"id": "reward-process-none-logged", "file": RR, "find": "             \"process\": [0.0 if s.process is None else s.process for s in scored],\n",
     "replace": "             \"process\": [s.process for s in scored],\n", "tests": TS,
     "why": "a response with no checkable step logs process = null: OpenRLHF's metric logging fails on it"},
    {"id": "request-lengths-unchecked", "file": RR, "find": "    if not len(queries) == len(prompts) == len(labels):\n",
     "replace": "    if len(queries) != len(labels):\n", "tests": TS,
     "why": "a request with fewer prompts than queries is scored on a truncated zip: samples silently get no reward"},
    {"id": "request-unknown-fields-accepted", "file": RR, "find": "    if unknown:\n", "replace": "    if False:\n", "tests": TS,
     "why": "a client sending 'response' instead of 'query' gets rewards for the wrong field without a word"},
    {"id": "request-empty-label-accepted", "file": RR, "find": "        if not lab.strip() or len(lab) > MAX_LABEL_CHARS:\n",
     "replace": "        if len(lab) > MAX_LABEL_CHARS:\n", "tests": TS,
     "why": "a dataset without labels is scored as all wrong instead of refused: training pushes every answer down"},
    {"id": "request-limit-off-by-one", "file": RR, "find": "    if len(queries) > MAX_QUERIES:\n", "replace": "    if len(queries) >= MAX_QUERIES:\n",
     "tests": TS, "why": "a batch of exactly the documented maximum is refused"},
    {"id": "server-bad-json-422", "file": SP, "find": "        return Refused(400, f\"the body is not JSON ({exc}): POST",
     "replace": "        return Refused(422, f\"the body is not JSON ({exc}): POST",
     "tests": TS, "why": "a body that is not JSON gets the contract's 422: a client cannot tell a broken encoder from a bad field"},
    {"id": "server-body-limit-dropped", "file": RS, "find": "        if len(raw) > MAX_BODY_BYTES:\n", "replace": "        if False:\n",
     "tests": TS, "why": "any body size is parsed and scored: one huge request stalls the server for every trainer"},
    {"id": "server-log-label-swapped", "file": RS, "find": "json.dumps({\"at\": now, \"prompt\": p, \"query\": q, \"label\": lab,",
     "replace": "json.dumps({\"at\": now, \"prompt\": lab, \"query\": q, \"label\": p,", "tests": TS,
     "why": "the audit log records the prompt as the label: a run's rewards cannot be checked afterwards"},
    {"id": "server-root-path-missing", "file": RS, "find": "    app.post(\"/\")(get_reward)\n", "replace": "", "tests": TS,
     "why": "clients that post to the server's root (OpenRLHF's serve_rm style URL) get 404 for every sample"},
    {"id": "export-keeps-tasks-without-reference", "file": OR,
     "find": " == \"math\" and (t[\"reference\"] or \"\").strip()]\n", "replace": " == \"math\"]\n", "tests": TE,
     "why": "tasks with no answer key are exported: every sample of them is scored wrong and trains the policy down"},
    {"id": "export-label-is-the-solution", "file": OR, "find": "LABEL_KEY: reference_answer(task[\"reference\"]),",
     "replace": "LABEL_KEY: task[\"reference\"],", "tests": TE,
     "why": "the label is the whole worked solution, not its answer: the export does not round-trip to what the loop checks"},
    {"id": "export-overwrites", "file": OR, "find": "    if (out / MANIFEST_FILE).exists() or (out / PROMPTS_FILE).exists():\n",
     "replace": "    if False:\n", "tests": TE, "why": "a second export overwrites the first: an adapter imported later names a file that changed"},
    {"id": "export-digest-unchecked", "file": OR, "find": "    if digest != manifest.get(\"prompts_sha256\"):\n", "replace": "    if False:\n",
     "tests": TE, "why": "an export edited after the fact is imported as if it were what the manifest names"},
    {"id": "export-verified-at-latest", "file": OR,
     "find": "for t in _tasks(lake, manifest[\"tables\"][\"tasks\"], manifest[\"batches\"])}",
     "replace": "for t in _tasks(lake, lineage.table_versions(lake).get(\"tasks\"), manifest[\"batches\"])}", "tests": TE,
     "why": "verify compares the export with today's tasks, not the version it pinned: an honest export fails once tasks change"},
    {"id": "import-promoted", "file": OR, "find": "\"metrics\": {\"export_rows\": len(rows), **(metrics or {})}, \"promoted\": False}",
     "replace": "\"metrics\": {\"export_rows\": len(rows), **(metrics or {})}, \"promoted\": True}", "tests": TE,
     "why": "an imported adapter is flagged promoted before any benchmark gated it"},
    {"id": "import-lineage-without-digest", "file": OR, "find": "\"samples_digest\": export[\"prompts_sha256\"],",
     "replace": "\"samples_digest\": None,", "tests": TE,
     "why": "the imported checkpoint's lineage does not name the exact prompts file it was trained on"},
    {"id": "hostile-deep-json-uncaught", "file": SP, "find": "    except RecursionError:\n        return Refused(400,",
     "replace": "    except MemoryError:\n        return Refused(400,", "tests": TH,
     "why": "JSON nested past the recursion limit crashes the parse: a 500 (or a dead worker) instead of a 400"},
    {"id": "hostile-query-cap-dropped", "file": RR, "find": "    if max(len(query), len(prompt)) > MAX_QUERY_CHARS:\n",
     "replace": "    if False:\n", "tests": TH, "why": "a query of any length is read: one sample can take seconds to score"},
    {"id": "hostile-equation-terms-uncapped", "file": PR, "find": "    if len(numbers) > MAX_EQUATION_TERMS:\n",
     "replace": "    if False:\n", "tests": TH, "why": "a 3,000-term expression reaches ast.parse: RecursionError, a 500 before"},
    {"id": "hostile-result-digits-uncapped", "file": PR, "find": "    if sum(c.isdigit() for c in raw) > MAX_OPERAND_DIGITS:\n        return None\n    try:",
     "replace": "    try:", "tests": TH, "why": "a 5,000-digit stated result reaches int(): ValueError out of check_steps, a 500 before"},
]
